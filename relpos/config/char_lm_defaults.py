"""The character-LM config, declared: every field a run reads, with the Transformer-XL enwik8
base defaults (Dai et al. 2019, Table 9 / the original code).

`CharLMConfig` declares the task's sections (`relpos.config.fields`); `char_lm_config()` is
the ConfigDict generated from it, which config files (configs/char_tiny.py,
configs/enwik8_base.py, ...) start from and change values only. Since every field is declared,
a typo in a command-line override (`--config.train.mem_len=...`) fails at parse time instead of
being ignored, and `relpos.training.char_lm_task` checks the declared rules before reading any
data. config.model is `relpos.config.model_fields.TransformerXLConfig`.
"""

import ml_collections

from relpos.config import checks, fields
from relpos.config.fields import field, section, subsection
from relpos.config.model_fields import TransformerXLConfig
from relpos.config.shared import EvalConfig, OptimConfig, RunFields, TrainConfig
from relpos.data import enwik8
from relpos.data.char_corpus import CHOICES


@section
class CharLMData:
  """config.data: the text and its vocabulary."""

  kind: str = field(
    'enwik8', CHOICES['kind'], "'enwik8' (enwik8 or enwik8.zip) | 'text' (any file, 90/5/5)"
  )
  path: str = field(
    str(enwik8.prepared_path()),
    checks.TEXT,
    f'the file (default: where `{enwik8.PREPARE_COMMAND}` writes it)',
    path=True,
  )
  vocab: str = field(
    'bytes',
    CHOICES['vocab'],
    "'bytes' (256) | 'original' (drops newlines; the bytes of all three splits)",
  )
  max_bytes: int | None = field(
    None, checks.integer(1, optional=True), 'read only the first bytes (None: all)'
  )


@section
class Span:
  """The segment and memory settings of training and of evaluation (config.train /
  config.eval)."""

  tgt_len: int = field(512, checks.integer(1), 'segment length')
  mem_len: int = field(512, checks.integer(0), 'memory length (0: no memory)')
  clamp_len: int = field(-1, checks.integer(), 'XL distances clamped to this (<= 0: none)')
  same_length: bool = field(False, checks.FLAG, 'every query sees the same number of keys')


@section
class CharLMTrain(TrainConfig, Span):
  """config.train of the character LM."""

  batch_size: int = field(
    22,
    checks.integer(1),
    'GLOBAL rows per step, split across all devices of all processes (a multiple of their '
    'count); per-device batch = batch_size / device count',
  )


@section
class CharLMEval(EvalConfig, Span):
  """config.eval of the character LM: the split, and its segment and memory settings."""

  split: str = field('test', checks.one_of('valid', 'test'), 'the split scored')
  batch_size: int = field(10, checks.integer(1), 'rows of segments scored at once')
  tgt_len = 80
  mem_len = 2100
  clamp_len = 820
  same_length = True
  max_segments_during_training: int = field(
    0, checks.integer(0), 'periodic validation scores only this many segments (0: the split)'
  )


@section
class CharLMConfig(RunFields):
  """The character-LM task's config."""

  task = 'char_lm'
  data: type = subsection(CharLMData, 'the text')
  model: type = subsection(TransformerXLConfig, 'the Transformer-XL LM')
  optim: type = subsection(OptimConfig, 'the optimizer')
  train: type = subsection(CharLMTrain, 'training')
  eval: type = subsection(CharLMEval, 'evaluation')


def char_lm_config() -> ml_collections.ConfigDict:
  """The Transformer-XL enwik8 base settings, as a ConfigDict (`CharLMConfig`'s defaults)."""
  return fields.config_dict(CharLMConfig)
