"""Layer constructors both models share: compute dtype from config.model.dtype, parameters in
float32, and the initializer and LayerNorm epsilon each model's original used."""

import jax.numpy as jnp
from flax import nnx

COMPUTE_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def compute_dtype(config):
  """The jnp dtype config.model.dtype names."""
  return COMPUTE_DTYPES[config.dtype]


def check_dtype(config) -> None:
  """Raises ValueError naming config.model.dtype unless it is one of COMPUTE_DTYPES."""
  if config.dtype not in COMPUTE_DTYPES:
    raise ValueError(
      f'config.model.dtype must be one of {tuple(COMPUTE_DTYPES)}, got {config.dtype!r}'
    )


def linear(in_features, out_features, config, rngs, *, kernel_init, use_bias=True) -> nnx.Linear:
  """nnx.Linear computing in the config's dtype, with `kernel_init` and a zero bias."""
  return nnx.Linear(
    in_features,
    out_features,
    use_bias=use_bias,
    dtype=compute_dtype(config),
    kernel_init=kernel_init,
    rngs=rngs,
  )


def layer_norm(config, rngs, *, epsilon: float) -> nnx.LayerNorm:
  """LayerNorm over config.d_model computing in the config's dtype."""
  return nnx.LayerNorm(config.d_model, epsilon=epsilon, dtype=compute_dtype(config), rngs=rngs)
