"""The fields of every translation config, with the Transformer base (WMT14 en-de) defaults.

Config files (configs/translate_tiny.py, configs/wmt_base.py, ...) start from
`translate_config()` and change values only. Every field a translation run reads is declared
here, so a typo in a command-line override (`--config.model.max_relative_position=...`) fails
at parse time instead of being ignored. `relpos.training.translation_task` holds the rules of the
fields it reads, the model's typed config (`relpos.models.transformer.TransformerConfig`) those
of config.model.
"""

import ml_collections

from relpos.config.shared import add_shared_eval_fields, add_shared_model_fields


def translate_config() -> ml_collections.ConfigDict:
  """Transformer base (Vaswani et al. 2017) as used by Shaw et al. 2018, on WMT14 en-de."""
  config = ml_collections.ConfigDict()
  config.task = 'translate'  # which relpos.training module train.py / eval.py run
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.kind = 'tfds'  # 'tfds' (prepared tensorflow-datasets) | 'text' (parallel files)
  config.data.tfds_name = 'wmt14_translate/de-en'
  config.data.tfds_data_dir = ml_collections.FieldReference(None, field_type=str)
  config.data.tfds_train_split = 'train'
  config.data.tfds_eval_split = 'test'
  config.data.source_lang = 'en'
  config.data.target_lang = 'de'
  # kind='text': one sentence per line, `.gz` accepted; eval_tgt holds raw references.
  config.data.train_src = ''
  config.data.train_tgt = ''
  config.data.eval_src = ''
  config.data.eval_tgt = ''
  # Moses-tokenised, XML-escaped text (e.g. OpenNMT toy-ende) is detokenised when read.
  config.data.moses_detokenize = False
  config.data.max_train_examples = 0  # 0 = all
  config.data.max_eval_examples = 0  # 0 = all
  config.data.vocab_size = 32_000  # shared SentencePiece vocabulary, trained on train data
  config.data.vocab_train_sentences = 1_000_000  # sentences sampled to train SentencePiece
  config.data.max_length = 256  # pairs with a side longer than this (in pieces) are dropped
  # GLOBAL positions per step and side, padding included, split across all devices of all
  # processes: a batch's rows are a multiple of the device count.
  config.data.max_tokens = 4096
  config.data.length_buckets = 8  # distinct padded lengths, so jit compiles at most this many

  config.model = ml_collections.ConfigDict()
  config.model.position = 'shaw'  # relpos.constants.TRANSLATE_POSITIONS
  config.model.max_relative_position = 16  # k
  config.model.encoder_layers = 6
  config.model.decoder_layers = 6
  config.model.d_model = 512
  config.model.num_heads = 8
  config.model.d_ff = 2048
  config.model.dropout = 0.1
  config.model.attention_dropout = 0.0  # on the attention probabilities
  config.model.pre_layer_norm = False  # False: post-LN, as Vaswani et al. and Shaw et al.
  config.model.max_len = 512  # longest sequence for 'absolute' / 'learned' positions
  add_shared_model_fields(config.model)

  config.optim = ml_collections.ConfigDict()
  # 'rsqrt': learning_rate * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al.)
  config.optim.schedule = 'rsqrt'
  config.optim.learning_rate = 1.0
  config.optim.final_lr = 0.0
  config.optim.warmup_steps = 4000
  config.optim.b1 = 0.9
  config.optim.b2 = 0.98
  config.optim.eps = 1e-9
  config.optim.clip_norm = 0.0  # 0 disables gradient clipping
  config.optim.label_smoothing = 0.1

  config.train = ml_collections.ConfigDict()
  config.train.steps = 100_000
  config.train.log_every = 100
  config.train.eval_every = 5000  # eval loss / perplexity on the eval set
  config.train.checkpoint_every = 5000
  config.train.keep_checkpoints = 5
  config.train.grad_accum_steps = 1  # micro-batches per step, for a batch beyond memory

  config.eval = ml_collections.ConfigDict()
  add_shared_eval_fields(config.eval)
  config.eval.beam_size = 4
  config.eval.length_penalty = 0.6  # alpha of ((5 + length) / 6)^alpha (Wu et al. 2016)
  config.eval.max_decode_extra = 50  # decode up to source length + this many pieces
  config.eval.batch_size = 64  # sentences per decoding batch
  return config
