"""The translation config, declared: every field a run reads, with the Transformer base (WMT14
en-de) defaults.

`TranslationConfig` declares the task's sections (`relpos.config.fields`);
`translate_config()` is the ConfigDict generated from it, which config files
(configs/translate_tiny.py, configs/wmt_base.py, ...) start from and change values only. Since
every field is declared, a typo in a command-line override
(`--config.model.max_relative_position=...`) fails at parse time instead of being ignored, and
`relpos.training.translation_task` checks the declared rules before reading any data.
config.model is `relpos.config.model_fields.TransformerConfig`.
"""

import ml_collections

from relpos.config import checks, fields
from relpos.config.fields import field, section, subsection
from relpos.config.model_fields import TransformerConfig
from relpos.config.shared import EvalConfig, OptimConfig, RunFields, TrainConfig
from relpos.data.translation import KIND


def _text(default: str, doc: str, *, path: bool = False):
  return field(default, checks.TEXT, doc, path=path)


@section
class TranslationData:
  """config.data: the parallel text, its SentencePiece vocabulary and its batches."""

  kind: str = field(
    'tfds',
    KIND,
    "'tfds' (prepared tensorflow-datasets) | 'text' (parallel files)",
  )
  tfds_name: str = _text('wmt14_translate/de-en', 'the tensorflow-datasets name')
  tfds_data_dir: str | None = field(
    None, checks.OPTIONAL_TEXT, "tensorflow-datasets' data_dir (None: its default)", path=True
  )
  tfds_train_split: str = _text('train', 'the tfds split trained on')
  tfds_eval_split: str = _text('test', 'the tfds split scored')
  source_lang: str = _text('en', 'the source language')
  target_lang: str = _text(
    'de', "the target language; BLEU tokenises it as sacreBLEU's -l does (13a but zh, ja, ko)"
  )
  train_src: str = _text('', "kind='text': one sentence per line, `.gz` accepted", path=True)
  train_tgt: str = _text('', "kind='text': the training targets", path=True)
  eval_src: str = _text('', "kind='text': the evaluation sources", path=True)
  eval_tgt: str = _text('', "kind='text': the evaluation references, raw", path=True)
  moses_detokenize: bool = field(
    False,
    checks.FLAG,
    'Moses-tokenised, XML-escaped text (e.g. OpenNMT toy-ende) is detokenised when read',
  )
  max_train_examples: int = field(0, checks.integer(0), 'training pairs read (0: all)')
  max_eval_examples: int = field(0, checks.integer(0), 'evaluation pairs read (0: all)')
  vocab_size: int = field(
    32_000, checks.integer(8), 'the shared SentencePiece vocabulary, trained on train data'
  )
  vocab_train_sentences: int = field(
    1_000_000, checks.integer(1), 'sentences sampled to train SentencePiece'
  )
  max_length: int = field(
    256, checks.integer(1), 'pairs with a side longer than this (in pieces) are dropped'
  )
  max_tokens: int = field(
    4096,
    checks.integer(1),
    'GLOBAL positions per step and side, padding included, split across all devices of all '
    "processes: a batch's rows are a multiple of the device count",
  )
  length_buckets: int = field(
    8, checks.integer(1), 'distinct padded lengths, so jit compiles at most this many'
  )


@section
class TranslationOptim(OptimConfig):
  """config.optim of translation: Vaswani et al.'s rsqrt schedule, and label smoothing."""

  schedule = 'rsqrt'
  learning_rate = 1.0
  warmup_steps = 4000
  b2 = 0.98
  eps = 1e-9
  clip_norm = 0.0
  label_smoothing: float = field(0.1, checks.fraction(), 'of the cross-entropy targets')


@section
class TranslationTrain(TrainConfig):
  """config.train of translation."""

  steps = 100_000
  log_every = 100
  eval_every = 5000
  checkpoint_every = 5000
  keep_checkpoints = 5


@section
class TranslationEval(EvalConfig):
  """config.eval of translation: beam search."""

  beam_size: int = field(4, checks.integer(1), 'beams')
  length_penalty: float = field(
    0.6, checks.number(0.0), 'alpha of ((5 + length) / 6)^alpha (Wu et al. 2016)'
  )
  max_decode_extra: int = field(
    50, checks.integer(0), 'decode up to source length + this many pieces'
  )
  batch_size: int = field(64, checks.integer(1), 'sentences per decoding batch')


@section
class TranslationConfig(RunFields):
  """The translation task's config."""

  task = 'translate'
  data: type = subsection(TranslationData, 'the parallel text')
  model: type = subsection(TransformerConfig, 'the encoder-decoder Transformer')
  optim: type = subsection(TranslationOptim, 'the optimizer')
  train: type = subsection(TranslationTrain, 'training')
  eval: type = subsection(TranslationEval, 'evaluation')


def translate_config() -> ml_collections.ConfigDict:
  """Transformer base (Vaswani et al. 2017) as used by Shaw et al. 2018, on WMT14 en-de, as a
  ConfigDict (`TranslationConfig`'s defaults)."""
  return fields.config_dict(TranslationConfig)
