"""The config.model and config.eval fields both tasks declare with the same meaning and the
same defaults.

The position-scheme options and the memory options are read by the one attention layer and the
one layer stack (`relpos.models.multihead_attention`, `relpos.models.layers`) that both models use,
so
they are declared once here and added to each task's config by `add_shared_model_fields`.
Likewise the evaluation fields `relpos.training.loop.restore_model` reads
(`add_shared_eval_fields`).
"""

import ml_collections

from relpos.config import checks

# The rules of `add_shared_eval_fields`'s own fields (config.eval.step and average_checkpoints
# are every task's: `relpos.training.loop.RULES`).
EVAL_RULES = {'eval.max_relative_position': checks.integer(-1)}  # -1: as trained


def add_shared_model_fields(model: ml_collections.ConfigDict) -> None:
  """Adds the shared fields, with their defaults, to a task's config.model."""
  model.relative_keys = True  # Shaw's tables w^K and w^V (the paper's Table 3 ablations)
  model.relative_values = True
  # How the tables start: 'kernel' (the model's weight initializer, which for translation's
  # Xavier-uniform over [2k+1, head_dim] scales with k) or 'zeros' (every distance alike).
  model.relative_table_init = 'kernel'
  # Multiplies the 'kernel' start: Xavier-uniform's scale falls as k grows (row norm 1.33 at
  # k = 4, 1.15 at k = 16 with head_dim 64), so 1.1527 at k = 16 starts its rows as k = 4's.
  model.relative_table_init_scale = 1.0
  model.t5_num_buckets = 32  # position='t5': T5's defaults
  model.t5_max_distance = 128
  model.rope_base = 10000.0  # position='rope'
  model.remat = 'none'  # 'none' | 'full' | 'dots' | 'dots_no_batch' (models/layers.py)
  model.scan_layers = False  # True: each stack runs as one lax.scan over its layers
  # Shaw's and XL's attention kernels: 'auto' (on a GPU the faster, timed at each call's shapes;
  # XLA elsewhere: relpos.attention.autotune), 'xla' or 'pallas'.
  model.attention_implementation = 'auto'
  model.dtype = 'float32'  # compute dtype: 'float32' | 'bfloat16'


def add_shared_eval_fields(eval_section: ml_collections.ConfigDict) -> None:
  """Adds the fields of the checkpoint evaluation restores, with their defaults, to a task's
  config.eval."""
  eval_section.step = 0  # 0 = latest checkpoint
  eval_section.average_checkpoints = 1  # average the parameters of the last N checkpoints
  # >= 0: score with Shaw's distances clipped at this k instead of the trained
  # model.max_relative_position (the trained tables' rows -k..k); -1: as trained.
  eval_section.max_relative_position = -1


def check_eval_fields(config: ml_collections.ConfigDict, unread_model_fields) -> None:
  """Raises ValueError naming the field for a config.eval.max_relative_position the model
  cannot honour: a clip with no Shaw tables (max_relative_position among the model's
  `unread_model_fields`), or beyond the trained k."""
  clipped = config.eval.max_relative_position
  if clipped >= 0 and 'max_relative_position' in unread_model_fields:
    raise ValueError(
      f"config.eval.max_relative_position={clipped} clips Shaw's tables, but "
      f'config.model.position={config.model.position!r} has none: leave it at -1'
    )
  if clipped > config.model.max_relative_position:
    raise ValueError(
      f'config.eval.max_relative_position={clipped} must be <= the trained '
      f'config.model.max_relative_position={config.model.max_relative_position}: the '
      'tables have no rows beyond it'
    )
