"""What both models share besides attention: the typed config fields they have in common and
their checks, and the dense, residual and feed-forward layers (parameters in float32, computing
in the config's dtype, with the initializer and LayerNorm epsilon each model's original used).
"""

import dataclasses
from typing import ClassVar, Self

import jax
import jax.numpy as jnp
from flax import nnx

from relpos.attention.pallas_common import IMPLEMENTATIONS
from relpos.config import checks

COMPUTE_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
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

# The rules of the fields of ModelConfig (each model adds those of its own fields).
_COMMON_RULES = {
  'd_model': checks.integer(1),
  'num_heads': checks.integer(1),
  'd_ff': checks.integer(1),
  'dropout': checks.fraction(),
  'attention_dropout': checks.fraction(),
  'pre_layer_norm': checks.FLAG,
  'max_relative_position': checks.integer(0),
  'relative_keys': checks.FLAG,
  'relative_values': checks.FLAG,
  'relative_table_init': checks.one_of(*RELATIVE_TABLE_INITS),
  'relative_table_init_scale': checks.positive(),
  't5_num_buckets': checks.integer(4),
  't5_max_distance': checks.integer(1),
  'rope_base': checks.positive(),
  'remat': checks.one_of(*REMAT_POLICIES),
  'scan_layers': checks.FLAG,
  'attention_implementation': checks.one_of(*IMPLEMENTATIONS),
  'dtype': checks.one_of(*COMPUTE_DTYPES),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The fields both models' typed configs have: config.model's plus `vocab_size`.

  Each model subclasses it with its own fields and class constants: its position schemes
  (POSITIONS), those adding sinusoids (which need an even d_model) and those using Shaw's
  tables (which need w^K, w^V or both), and the rules of its own fields. Construction checks
  every field, so an invalid value is a ValueError naming `config.model.<field>` before the
  model (or a run) starts. The defaults live in relpos/config only: every field is required.
  """

  POSITIONS: ClassVar[tuple[str, ...]] = ()
  SINUSOID_POSITIONS: ClassVar[tuple[str, ...]] = ()
  SHAW_POSITIONS: ClassVar[tuple[str, ...]] = ()
  RULES: ClassVar[dict[str, checks.Rule]] = {}

  vocab_size: int
  position: str  # one of POSITIONS
  d_model: int
  num_heads: int
  d_ff: int
  dropout: float  # on embeddings and sublayer outputs
  attention_dropout: float  # on the attention probabilities
  pre_layer_norm: bool  # False: post-LN
  max_relative_position: int  # Shaw's k
  relative_keys: bool  # Shaw's w^K
  relative_values: bool  # Shaw's w^V
  relative_table_init: str  # one of RELATIVE_TABLE_INITS: how w^K and w^V start
  relative_table_init_scale: float  # multiplies the 'kernel' start
  t5_num_buckets: int  # T5's buckets (half per side when bidirectional)
  t5_max_distance: int  # T5's distance where the last (log-spaced) bucket starts
  rope_base: float  # RoPE's frequency base: theta_i = base^(-2i / head_dim)
  remat: str  # a key of REMAT_POLICIES: what each layer keeps for the backward pass
  scan_layers: bool  # run each stack of layers as a lax.scan (`run_stack`)
  attention_implementation: str  # Shaw's and XL's kernels: one of IMPLEMENTATIONS
  dtype: str  # compute dtype, a key of COMPUTE_DTYPES; parameters stay float32

  @classmethod
  def from_section(cls, section, **extra) -> Self:
    """The config of config.model (a ConfigDict) plus the fields from elsewhere (`extra`:
    vocab_size); a field the model lacks or does not read is a ValueError naming it."""
    values = {**section.to_dict(), **extra}
    fields = {field.name for field in dataclasses.fields(cls)}
    missing, unknown = sorted(fields - set(values)), sorted(set(values) - fields)
    if missing:
      raise ValueError(f'config.model.{missing[0]} is missing ({cls.__name__} needs it)')
    if unknown:
      raise ValueError(f'config.model.{unknown[0]} is not a field of {cls.__name__}')
    return cls(**values)

  def __post_init__(self):
    # vocab_size comes from the data, not from config.model.
    checks.check(self.__dict__, {'vocab_size': checks.integer(1)}, prefix=type(self).__name__)
    rules = {'position': checks.one_of(*self.POSITIONS), **_COMMON_RULES, **self.RULES}
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
    if self.position == 't5' and self.t5_max_distance <= self.t5_num_buckets // 2:
      raise ValueError(
        f'config.model.t5_max_distance={self.t5_max_distance} must exceed '
        f'config.model.t5_num_buckets // 2 = {self.t5_num_buckets // 2}, the exact distances'
      )

  def unread_fields(self) -> tuple[str, ...]:
    """The fields this position scheme never reads (Shaw's k and tables off Shaw, T5's
    buckets off T5, RoPE's base off RoPE, the model's own in `position_fields`): a sweep over
    one of them would train the same model."""
    shaw = (
      'max_relative_position',
      'relative_keys',
      'relative_values',
      'relative_table_init',
      'relative_table_init_scale',
    )
    readers = {
      **dict.fromkeys(shaw, self.SHAW_POSITIONS),
      **dict.fromkeys(('t5_num_buckets', 't5_max_distance'), ('t5',)),
      'rope_base': ('rope',),
      'attention_implementation': (*self.SHAW_POSITIONS, 'xl'),
      **self.position_fields(),
    }
    return tuple(field for field, positions in readers.items() if self.position not in positions)

  @classmethod
  def position_fields(cls) -> dict[str, tuple[str, ...]]:
    """The model's own fields that only some positions read: {field: those positions}."""
    return {}

  @property
  def compute_dtype(self):
    return COMPUTE_DTYPES[self.dtype]


def run_stack(stack, call, x, per_layer=None, *, scan: bool, remat: str, collect_inputs=False):
  """x through the layers of `stack` in order: x = call(layer, x, per_layer_l).

  Args:
    stack: a sequence (nnx.List) of layers built alike (same structure, own parameters).
    call: (layer, x, per_layer_l) -> the layer's output, shaped like x.
    x: the first layer's input.
    per_layer: None or a pytree of arrays with a leading axis of one entry per layer;
      per_layer_l is its slice l.
    scan: False, a Python loop: the compiled program holds one copy of the layer per layer.
      True, `jax.lax.scan` over the layers' states stacked along a new leading axis: one copy,
      so a deep model compiles in the time of one layer. The parameters stay one set per layer
      either way (checkpoints are the same), and the results are the same, dropout included:
      every layer keeps its own rng streams.
    remat: a key of REMAT_POLICIES; each layer's call is rematerialised (`nnx.remat`) with
      that policy: its activations are recomputed in the backward pass instead of kept.
    collect_inputs: also return every layer's input, stacked [num_layers, *x.shape].
  Returns:
    The last layer's output, and with collect_inputs the stacked inputs.
  """
  if remat != 'none':
    call = nnx.remat(call, policy=REMAT_POLICIES[remat])
  if not scan:
    inputs = []
    for index, layer in enumerate(stack):
      inputs.append(x)
      x = call(layer, x, jax.tree.map(lambda leaf, i=index: leaf[i], per_layer))
    return (x, jnp.stack(inputs)) if collect_inputs else x
  graphdef = nnx.graphdef(stack[0])
  states = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(nnx.state(layer) for layer in stack))

  def body(x, layer_xs):
    state, per_layer_l = layer_xs
    layer = nnx.merge(graphdef, state)
    y = call(layer, x, per_layer_l)
    return y, (nnx.state(layer), x if collect_inputs else None)

  x, (states, inputs) = jax.lax.scan(body, x, (states, per_layer))
  for index, layer in enumerate(stack):  # the rng counts the layers advanced
    nnx.update(layer, jax.tree.map(lambda leaf, i=index: leaf[i], states))
  return (x, inputs) if collect_inputs else x


def linear(in_features, out_features, dtype, rngs, *, kernel_init, use_bias=True) -> nnx.Linear:
  """nnx.Linear computing in `dtype`, with `kernel_init` and a zero bias."""
  return nnx.Linear(
    in_features, out_features, use_bias=use_bias, dtype=dtype, kernel_init=kernel_init, rngs=rngs
  )


class Residual(nnx.Module):
  """LayerNorm and dropout around one sublayer f: post-LN LN(x + drop(f(x))) or pre-LN
  x + drop(f(LN(x))). `residual(x, f)` applies it; a sublayer that needs f's input apart (the
  cached decoder step, the normalised memory of Transformer-XL) calls `inputs(x)`, then
  `outputs(x, f(...))`."""

  def __init__(self, config: ModelConfig, *, epsilon: float, rngs: nnx.Rngs):
    self.pre_layer_norm = config.pre_layer_norm
    dtype = config.compute_dtype
    self.norm = nnx.LayerNorm(config.d_model, epsilon=epsilon, dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

  def inputs(self, x_BTD):
    return self.norm(x_BTD) if self.pre_layer_norm else x_BTD

  def outputs(self, x_BTD, h_BTD, *, deterministic: bool):
    x_BTD = x_BTD + self.dropout(h_BTD, deterministic=deterministic)
    return x_BTD if self.pre_layer_norm else self.norm(x_BTD)

  def __call__(self, x_BTD, sublayer, *, deterministic: bool):
    """x [batch, len, d_model] through the sublayer f ([batch, len, d_model] -> same)."""
    return self.outputs(x_BTD, sublayer(self.inputs(x_BTD)), deterministic=deterministic)


class FeedForward(nnx.Module):
  """The position-wise sublayer with its Residual: Linear, ReLU, dropout (`inner_dropout`,
  Transformer-XL's; 0 for translation), Linear."""

  def __init__(
    self, config: ModelConfig, *, inner_dropout: float, epsilon: float, kernel_init, rngs
  ):
    dtype = config.compute_dtype
    self.inner = linear(config.d_model, config.d_ff, dtype, rngs, kernel_init=kernel_init)
    self.outer = linear(config.d_ff, config.d_model, dtype, rngs, kernel_init=kernel_init)
    self.dropout = nnx.Dropout(inner_dropout, rngs=rngs)
    self.residual = Residual(config, epsilon=epsilon, rngs=rngs)

  def __call__(self, x_BTD, *, deterministic: bool) -> jax.Array:
    """[batch, len, d_model] -> [batch, len, d_model], the residual sum included."""

    def block(h_BTD):
      h_BTF = self.dropout(jax.nn.relu(self.inner(h_BTD)), deterministic=deterministic)
      return self.outer(h_BTF)

    return self.residual(x_BTD, block, deterministic=deterministic)
