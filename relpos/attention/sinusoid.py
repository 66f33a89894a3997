"""Sinusoidal position encodings (Vaswani et al. 2017; Transformer-XL's R)."""

import jax
import jax.numpy as jnp


def sinusoidal_embedding(positions, dim: int) -> jax.Array:
  """`[sin(p·f), cos(p·f)]` with f = 10000^(-2i/dim): float32 [len(positions), dim].

  Transformer-XL's layout (sines then cosines). `positions` may be fractional or negative.
  """
  if dim % 2:
    raise ValueError(f'sinusoidal embedding dim must be even, got {dim}')
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  angles = jnp.asarray(positions, jnp.float32)[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def xl_relative_encoding(kv_len: int, dim: int, *, clamp_len: int | None = None):
  """Transformer-XL's R for distances t = 0..kv_len-1 (row t = R_t): [kv_len, dim].

  Distances beyond `clamp_len` reuse R_clamp_len, as in the original code.
  """
  distance = jnp.arange(kv_len, dtype=jnp.float32)
  if clamp_len is not None:
    distance = jnp.minimum(distance, clamp_len)
  return sinusoidal_embedding(distance, dim)
