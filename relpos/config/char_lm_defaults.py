"""The fields of every character-LM config, with the Transformer-XL enwik8 base defaults.

Config files (configs/char_tiny.py, configs/enwik8_base.py, ...) start from `char_lm_config()`
and change values only. Every field a character-LM run reads is declared here, so a typo in a
command-line override (`--config.train.mem_len=...`) fails at parse time instead of being
ignored. `relpos.training.char_lm_task` holds the rules of the fields it reads, the model's typed
config (`relpos.models.transformer_xl.TransformerXLConfig`) those of config.model.
"""

import ml_collections

from relpos.config.shared import add_shared_eval_fields, add_shared_model_fields


def char_lm_config() -> ml_collections.ConfigDict:
  """The Transformer-XL enwik8 base settings (Dai et al. 2019, Table 9 / the original code)."""
  config = ml_collections.ConfigDict()
  config.task = 'char_lm'  # which relpos.training module train.py / eval.py run
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.kind = 'enwik8'  # 'enwik8' (enwik8 or enwik8.zip) | 'text' (any file, 90/5/5)
  config.data.path = 'enwik8'
  config.data.vocab = 'bytes'  # 'bytes' (256) | 'original' (drops newlines: 204 on enwik8)
  config.data.max_bytes = ml_collections.FieldReference(None, field_type=int)

  config.model = ml_collections.ConfigDict()
  config.model.position = 'xl'  # relpos.constants.CHAR_LM_POSITIONS
  config.model.num_layers = 12
  config.model.d_model = 512
  config.model.num_heads = 8
  config.model.head_dim = 64
  config.model.d_ff = 2048
  config.model.dropout = 0.1
  config.model.attention_dropout = 0.0  # on the attention probabilities (the original's dropatt)
  config.model.untie_r = True  # per-layer XL biases u, v
  config.model.pre_layer_norm = False
  config.model.max_relative_position = 16  # k, for position='shaw'
  add_shared_model_fields(config.model)

  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 2.5e-4
  config.optim.final_lr = 0.0
  config.optim.schedule = 'cosine'  # 'cosine' | 'constant'
  config.optim.warmup_steps = 0
  config.optim.b1 = 0.9
  config.optim.b2 = 0.999
  config.optim.eps = 1e-8
  config.optim.clip_norm = 0.25

  config.train = ml_collections.ConfigDict()
  # GLOBAL rows per step, split across all devices of all processes (a multiple of their
  # count); per-device batch = batch_size / device count.
  config.train.batch_size = 22
  config.train.tgt_len = 512  # segment length
  config.train.mem_len = 512  # memory length (0: no memory)
  config.train.clamp_len = -1  # XL distances clamped to this (<= 0: no clamping)
  config.train.same_length = False  # every query sees the same number of keys
  config.train.steps = 400_000
  config.train.log_every = 200
  config.train.eval_every = 4000
  config.train.checkpoint_every = 4000
  config.train.keep_checkpoints = 3
  config.train.grad_accum_steps = 1  # micro-batches per step, for a batch beyond memory

  config.eval = ml_collections.ConfigDict()
  config.eval.split = 'test'  # 'valid' | 'test'
  add_shared_eval_fields(config.eval)
  config.eval.batch_size = 10
  config.eval.tgt_len = 80
  config.eval.mem_len = 2100
  config.eval.clamp_len = 820
  config.eval.same_length = True
  # Periodic validation during training scores only this many segments (0 = the whole split).
  config.eval.max_segments_during_training = 0
  return config
