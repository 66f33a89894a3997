"""config.model of both tasks, declared once: the typed configs the models and their layers read.

`ModelConfig` declares the fields both models have, with the defaults both tasks start from;
`TransformerConfig` (translation, relpos.models.transformer) and `TransformerXLConfig` (the
character LM, relpos.models.transformer_xl) add their own fields and give `position` its
choices and default. Each field is a `relpos.config.fields.field`: its type, default, rule and
doc, and for a field only some position schemes read, those (`read_by`), which makes
`unread_fields`. A task's ConfigDict is generated from these declarations; `from_section`
types config.model back, and construction checks every field, so an invalid value is a
ValueError naming `config.model.<field>` before the model (or a run) starts. A layer takes the
typed config itself and reads the fields it needs: adding a field takes its declaration here
and its use, nothing else.
"""

import dataclasses
from typing import ClassVar, Self

import jax
import jax.numpy as jnp

from relpos import constants
from relpos.attention.implementations import (
  DENSE_MAX_KV_LEN,
  HALF_DTYPES,
  HALF_PRECISION,
  IMPLEMENTATIONS,
  SERVES,
)
from relpos.config import checks
from relpos.config.fields import declared, field, section
from relpos.constants import CHAR_LM_POSITIONS, TRANSLATE_POSITIONS, self_attention_kind

COMPUTE_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# Where dropout's random bits come from (`relpos.models.layers.Dropout`).
DROPOUT_BITS = ('threefry2x32', 'hash')
# How Shaw's tables start (`relpos.models.multihead_attention.MultiHeadAttention`).
RELATIVE_TABLE_INITS = ('kernel', 'zeros')
# config.model.remat -> what a layer keeps for the backward pass (jax.checkpoint policies):
# 'none' keeps everything (no remat); 'full' keeps only the layer's inputs and recomputes the
# rest; 'dots' keeps matmul outputs; 'dots_no_batch' keeps those without batch dimensions
# (the weights' products, not attention's).
REMAT_POLICIES = {
  'none': None,
  'full': jax.checkpoint_policies.nothing_saveable,
  'dots': jax.checkpoint_policies.dots_saveable,
  'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# The config.model fields that say how the model is trained, which only training reads:
# dropout is off in evaluation, the initialisation is replaced by the checkpoint's
# parameters, remat acts on the backward pass.
TRAINING_ONLY_FIELDS = (
  'dropout',
  'attention_dropout',
  'dropout_bits',
  'relative_table_init',
  'relative_table_init_scale',
  'remat',
)
# The config.model fields an evaluation may set otherwise than its training run did: those
# only training reads, and those that say how the model is computed (kernels, layer loop,
# compute dtype), not the function its parameters define. Every other field must match the
# run's (`relpos.training.run_config.check_model`).
EVALUATION_FREE_FIELDS = (
  *TRAINING_ONLY_FIELDS,
  'scan_layers',
  'attention_implementation',
  'shaw_dense_max_kv_len',
  'dtype',
)
# Those of them that change an evaluation's numbers beyond rounding: the compute dtype (a char
# LM's bpc scored in bfloat16 is not float32's; some translations differ). An evaluation with
# another one is not the run's own result (`relpos.training.run_results.check_own_result`), and
# eval_results.json records them (`Task._score_into`). The kernels, the layer loop and remat
# give the same scores to rounding, and dropout and the initialisation are not read by an
# evaluation (deterministic, from the checkpoint's parameters).
SCORE_CHANGING_FIELDS = ('dtype',)


@section
class ModelConfig:
  """The fields both models' typed configs have: config.model's plus `vocab_size`.

  Each model extends it with its own fields and class constants: its positions that add
  sinusoids (which need an even d_model) and that use Shaw's tables (which need w^K, w^V or
  both). `vocab_size` comes from the data, so it has no default and is no field of
  config.model.
  """

  SINUSOID_POSITIONS: ClassVar[tuple[str, ...]] = ()
  SHAW_POSITIONS: ClassVar[tuple[str, ...]] = ()

  vocab_size: int
  position: str = field('none', checks.TEXT, 'the position scheme (relpos.constants)')
  d_model: int = field(512, checks.integer(1), 'the width of the residual stream')
  num_heads: int = field(8, checks.integer(1), 'attention heads')
  d_ff: int = field(2048, checks.integer(1), 'the inner width of the feed-forward layers')
  dropout: float = field(0.1, checks.fraction(), 'on embeddings and sublayer outputs')
  attention_dropout: float = field(
    0.0, checks.fraction(), "on the attention probabilities (the original XL's dropatt)"
  )
  dropout_bits: str = field(
    'threefry2x32',
    checks.one_of(*DROPOUT_BITS),
    "where `dropout`'s random bits come from: 'threefry2x32' (JAX's jax.random, as "
    "nnx.Dropout; about 130 integer operations an element) or 'hash' (murmur3's finaliser "
    "over a per-call seed and each element's index, relpos.counter_hash: about 20; other "
    "masks, the same keep rate). Attention dropout keeps its kernels' own bits",
  )
  pre_layer_norm: bool = field(False, checks.FLAG, 'False: post-LN, as the original papers')
  max_relative_position: int = field(
    16, checks.integer(0), "Shaw's k", read_by=constants.SHAW_POSITIONS
  )
  relative_keys: bool = field(
    True,
    checks.FLAG,
    "Shaw's tables w^K (the paper's Table 3 ablations)",
    read_by=constants.SHAW_POSITIONS,
  )
  relative_values: bool = field(
    True, checks.FLAG, "Shaw's tables w^V", read_by=constants.SHAW_POSITIONS
  )
  relative_table_init: str = field(
    'kernel',
    checks.one_of(*RELATIVE_TABLE_INITS),
    "how Shaw's tables start: 'kernel' (the model's weight initializer, which for "
    "translation's Xavier-uniform over [2k+1, head_dim] scales with k) or 'zeros'",
    read_by=constants.SHAW_POSITIONS,
  )
  relative_table_init_scale: float = field(
    1.0,
    checks.positive(),
    "multiplies the 'kernel' start: Xavier-uniform's row norm falls as k grows (1.33 at k = "
    "4, 1.15 at k = 16 with head_dim 64), so 1.1527 at k = 16 starts its rows as k = 4's",
    read_by=constants.SHAW_POSITIONS,
  )
  t5_num_buckets: int = field(
    32, checks.integer(4), "T5's buckets (half per side when bidirectional)", read_by=('t5',)
  )
  t5_max_distance: int = field(
    128,
    checks.integer(1),
    "T5's distance where the last (log-spaced) bucket starts",
    read_by=('t5',),
  )
  rope_base: float = field(
    10000.0,
    # Within float32, in which the frequencies are computed (1e300 overflowed to inf).
    checks.Rule(float, 0.0, 3.0e38, open_minimum=True),
    "RoPE's frequency base: theta_i = base^(-2i / head_dim)",
    read_by=('rope',),
  )
  remat: str = field(
    'none', checks.one_of(*REMAT_POLICIES), 'what each layer keeps for the backward pass'
  )
  scan_layers: bool = field(False, checks.FLAG, 'True: each stack runs as one lax.scan')
  attention_implementation: str = field(
    'auto',
    checks.one_of(*IMPLEMENTATIONS),
    "Shaw's and XL's kernels: 'auto' (on a GPU the fastest, timed at each call's shapes: "
    "relpos.attention.autotune; XLA elsewhere), 'xla', 'pallas', (XL, bfloat16, no "
    "attention dropout) 'cudnn' or (Shaw and XL, bfloat16, no attention dropout; causal "
    "calls, 'xla' at the others) 'mosaic'; 'cudnn' runs on NVIDIA GPUs only, 'pallas' and "
    "'mosaic' on GPUs (interpreted on a CPU), checked against the devices before a run",
    read_by=(*constants.SHAW_POSITIONS, 'xl'),
  )
  shaw_dense_max_kv_len: int = field(
    DENSE_MAX_KV_LEN,
    checks.integer(0),
    "the most keys at which Shaw's 'xla' kernels take the dense form (one-hot matmuls, "
    'faster for short sequences), not the banded one (relpos.attention.shaw; 0: banded at '
    'every length). Both are exact: speed and memory change, not the result',
    read_by=constants.SHAW_POSITIONS,
  )
  dtype: str = field(
    'float32', checks.one_of(*COMPUTE_DTYPES), 'compute dtype; parameters stay float32'
  )

  @classmethod
  def from_section(cls, section, **extra) -> Self:
    """The config of config.model (a ConfigDict) plus the fields from elsewhere (`extra`:
    vocab_size); a field the model lacks or does not read is a ValueError naming it."""
    values = {**section.to_dict(), **extra}
    fields = {f.name for f in dataclasses.fields(cls)}
    missing, unknown = sorted(fields - set(values)), sorted(set(values) - fields)
    if missing:
      raise ValueError(f'config.model.{missing[0]} is missing ({cls.__name__} needs it)')
    if unknown:
      raise ValueError(f'config.model.{unknown[0]} is not a field of {cls.__name__}')
    return cls(**values)

  def __post_init__(self):
    # vocab_size comes from the data, not from config.model.
    checks.check(self.__dict__, {'vocab_size': checks.integer(1)}, prefix=type(self).__name__)
    rules = {f.name: f.metadata['rule'] for f in declared(type(self))}
    checks.check(self.__dict__, rules, prefix='config.model')
    if self.position in self.SINUSOID_POSITIONS and self.d_model % 2:
      raise ValueError(
        f'config.model.position={self.position!r} adds sinusoids: config.model.d_model must '
        f'be even, got {self.d_model}'
      )
    if self.position in self.SHAW_POSITIONS and not (self.relative_keys or self.relative_values):
      raise ValueError(
        f'config.model.position={self.position!r} needs config.model.relative_keys or '
        "relative_values; with neither it has no positions: use position='none'"
      )
    if self.relative_table_init == 'zeros' and self.relative_table_init_scale != 1:
      raise ValueError(
        f'config.model.relative_table_init_scale={self.relative_table_init_scale} scales the '
        "'kernel' start; with relative_table_init='zeros' leave it at 1"
      )
    if self.position == 'rope' and self.head_dim % 2:
      raise ValueError(
        f"config.model.position='rope' rotates pairs of features: the head dimension must be "
        f'even, got {self.head_dim}'
      )
    if self.attention_implementation in HALF_PRECISION:
      self._check_fused(self.attention_implementation)
    if self.position == 't5' and self.t5_max_distance <= self.t5_num_buckets // 2:
      raise ValueError(
        f'config.model.t5_max_distance={self.t5_max_distance} must exceed '
        f'config.model.t5_num_buckets // 2 = {self.t5_num_buckets // 2}, the exact distances'
      )

  def _check_fused(self, implementation: str):
    """'cudnn' is XL's position term as cuDNN's bias (`relpos.attention.xl.xl_attention_cudnn`):
    XL only. 'mosaic' is Shaw's and XL's causal Mosaic GPU kernels (`relpos.attention.
    mosaic_shaw`, `mosaic_xl`) at the calls they serve ('xla' at the others:
    `relpos.attention.mosaic_dispatch`). Both: bfloat16, no attention dropout."""
    where = f'config.model.attention_implementation={implementation!r}'
    served = self_attention_kind(self.position) in SERVES[implementation]
    if implementation == 'cudnn' and not served:
      raise ValueError(
        f"{where} serves position='xl' only (Shaw's a^V term is no additive bias); "
        f'this config has position={self.position!r}'
      )
    if implementation == 'mosaic' and not served:
      raise ValueError(
        f"{where} serves Shaw's and XL's positions {(*self.SHAW_POSITIONS, 'xl')} only; this "
        f'config has position={self.position!r}'
      )
    if self.dtype not in HALF_DTYPES:  # of COMPUTE_DTYPES, bfloat16
      raise ValueError(f"{where} needs config.model.dtype='bfloat16', got {self.dtype!r}")
    if self.attention_dropout:
      raise ValueError(
        f'{where} has no attention dropout: config.model.attention_dropout must be 0, got '
        f'{self.attention_dropout}'
      )

  def unread_fields(self) -> tuple[str, ...]:
    """The fields this position scheme never reads (those whose declaration names the
    positions that read them, `read_by`, without this one): a sweep over one of them would
    train the same model."""
    return tuple(
      f.name
      for f in declared(type(self))
      if 'read_by' in f.metadata and self.position not in f.metadata['read_by']
    )

  @property
  def compute_dtype(self):
    return COMPUTE_DTYPES[self.dtype]


@section
class TransformerConfig(ModelConfig):
  """config.model of the translation Transformer (Vaswani et al. 2017, base, as Shaw et al.
  2018 used it) plus vocab_size. Every head has d_model / num_heads dimensions (`head_dim`)."""

  SINUSOID_POSITIONS = ('absolute', 'shaw_absolute')
  SHAW_POSITIONS = constants.SHAW_POSITIONS

  position: str = field(
    'shaw', checks.one_of(*TRANSLATE_POSITIONS), 'relpos.constants.TRANSLATE_POSITIONS'
  )
  encoder_layers: int = field(6, checks.integer(1), 'layers of the encoder')
  decoder_layers: int = field(6, checks.integer(1), 'layers of the decoder')
  max_len: int = field(
    512, checks.integer(1), "rows of the 'learned' table: the longest sequence it accepts"
  )

  def __post_init__(self):
    super().__post_init__()
    if self.d_model % self.num_heads:
      raise ValueError(
        f'config.model.d_model={self.d_model} must be a multiple of '
        f'config.model.num_heads={self.num_heads} (head_dim = d_model / num_heads)'
      )

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads


@section
class TransformerXLConfig(ModelConfig):
  """config.model of the Transformer-XL character LM, with the enwik8 base defaults (Dai et
  al. 2019, Table 9 / the original code), plus vocab_size."""

  SINUSOID_POSITIONS = ('xl', 'absolute')
  SHAW_POSITIONS = ('shaw',)

  position: str = field(
    'xl', checks.one_of(*CHAR_LM_POSITIONS), 'relpos.constants.CHAR_LM_POSITIONS'
  )
  num_layers: int = field(12, checks.integer(1), 'decoder layers')
  head_dim: int = field(64, checks.integer(1), 'num_heads * head_dim need not equal d_model')
  untie_r: bool = field(True, checks.FLAG, 'per-layer XL biases u, v', read_by=('xl',))
