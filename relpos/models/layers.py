"""What both models share besides attention: running a stack of layers, and the dense,
residual and feed-forward layers (parameters in float32, computing in the config's dtype, with
the initializer and LayerNorm epsilon each model's original used). The typed config they read
is declared in `relpos.config.model_fields`.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from relpos import counter_hash
from relpos.config.model_fields import REMAT_POLICIES, ModelConfig


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


class Dropout(nnx.Dropout):
  """nnx.Dropout with a choice of random bits (`config.model.dropout_bits`): 'threefry2x32' is
  nnx.Dropout itself (JAX's jax.random.bernoulli, bit for bit); 'hash' keeps an element where
  `relpos.counter_hash.hashed_keep` says, from the same rng stream's key, at about a sixth of
  threefry's integer work. The state (the rng stream) is nnx.Dropout's either way, so a
  checkpoint restores under both."""

  def __init__(self, rate: float, *, bits: str = 'threefry2x32', rngs: nnx.Rngs):
    super().__init__(rate, rngs=rngs)
    self.bits = bits

  def __call__(self, inputs, *, deterministic: bool):
    if self.bits == 'threefry2x32' or deterministic or self.rate in (0.0, 1.0):
      return super().__call__(inputs, deterministic=deterministic)
    keep_prob = 1.0 - self.rate
    keep = counter_hash.hashed_keep(self.rngs(), inputs.shape, self.rate)
    return lax.select(keep, inputs / keep_prob, jnp.zeros_like(inputs))


class Residual(nnx.Module):
  """LayerNorm and dropout around one sublayer f: post-LN LN(x + drop(f(x))) or pre-LN
  x + drop(f(LN(x))). `residual(x, f)` applies it; a sublayer that needs f's input apart (the
  cached decoder step, the normalised memory of Transformer-XL) calls `inputs(x)`, then
  `outputs(x, f(...))`."""

  def __init__(self, config: ModelConfig, *, epsilon: float, rngs: nnx.Rngs):
    self.pre_layer_norm = config.pre_layer_norm
    dtype = config.compute_dtype
    self.norm = nnx.LayerNorm(config.d_model, epsilon=epsilon, dtype=dtype, rngs=rngs)
    self.dropout = Dropout(config.dropout, bits=config.dropout_bits, rngs=rngs)

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
    self.dropout = Dropout(inner_dropout, bits=config.dropout_bits, rngs=rngs)
    self.residual = Residual(config, epsilon=epsilon, rngs=rngs)

  def __call__(self, x_BTD, *, deterministic: bool) -> jax.Array:
    """[batch, len, d_model] -> [batch, len, d_model], the residual sum included."""

    def block(h_BTD):
      h_BTF = self.dropout(jax.nn.relu(self.inner(h_BTD)), deterministic=deterministic)
      return self.outer(h_BTF)

    return self.residual(x_BTD, block, deterministic=deterministic)
