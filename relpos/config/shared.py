"""The config.model fields both tasks declare with the same meaning and the same defaults.

The position-scheme options and the memory options are read by the one attention layer and the
one layer stack (`relpos.models.attention`, `relpos.models.layers`) that both models use, so
they are declared once here and added to each task's config by `add_shared_model_fields`.
"""

import ml_collections


def add_shared_model_fields(model: ml_collections.ConfigDict) -> None:
  """Adds the shared fields, with their defaults, to a task's config.model."""
  model.relative_keys = True  # Shaw's tables w^K and w^V (the paper's Table 3 ablations)
  model.relative_values = True
  model.t5_num_buckets = 32  # position='t5': T5's defaults
  model.t5_max_distance = 128
  model.rope_base = 10000.0  # position='rope'
  model.remat = 'none'  # 'none' | 'full' | 'dots' | 'dots_no_batch' (models/layers.py)
  model.scan_layers = False  # True: each stack runs as one lax.scan over its layers
  model.dtype = 'float32'  # compute dtype: 'float32' | 'bfloat16'
