"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer).

Queries and keys are rotated before the dot product, feature pair by feature pair, by angles
proportional to their absolute positions:

    RoPE(x, m) = R(m·θ) x        θ_i = base^(-2i/head_dim),  i = 0 .. head_dim/2 - 1

Each R(m·θ_i) is a 2-D rotation, and R(a)ᵀ R(b) = R(b - a), so
RoPE(q, m)·RoPE(k, n) = q·R((n - m)·θ) k depends on the positions only through n - m: plain
`dot_product_attention` on rotated queries and keys is relative-position attention, with no
parameters and nothing added to the logits. Values are not rotated.

Pairing: "rotate half", as GPT-NeoX, LLaMA and x-transformers: feature i is paired with
feature i + head_dim/2, rather than RoFormer's adjacent (2i, 2i+1). This is the RoFormer
rotation up to a fixed permutation of the features, which the learned query and key
projections absorb, so the two are the same model; the halves are contiguous slices, where
interleaved pairs would need strided ones.
"""

import jax
import jax.numpy as jnp

from relpos.attention.masking import accumulation_dtype


def apply_rope(x, positions, *, base: float = 10000.0) -> jax.Array:
  """Rotates x's feature pairs (i, i + head_dim/2) by position·θ_i, θ_i = base^(-2i/head_dim).

  out[.., i]              = x[.., i] cos(p·θ_i) - x[.., i + head_dim/2] sin(p·θ_i)
  out[.., i + head_dim/2] = x[.., i + head_dim/2] cos(p·θ_i) + x[.., i] sin(p·θ_i)

  The angles and the rotation are computed in float32 (float64 for float64 x), so bf16 inputs
  are rounded once, on the way out.

  Args:
    x: [batch, len, heads, head_dim], head_dim even.
    positions: int [len] (shared by the batch) or [batch, len], the absolute position of each
      row; may be traced (a decoding step) and negative.
    base: the frequency base.
  Returns:
    [batch, len, heads, head_dim] in x's dtype.
  """
  if x.ndim != 4:
    raise ValueError(f'apply_rope expects x [batch, len, heads, head_dim], got {x.shape}')
  batch, length, _, head_dim = x.shape
  if head_dim % 2:
    raise ValueError(f'RoPE rotates pairs of features: head_dim must be even, got {head_dim}')
  positions = jnp.asarray(positions)
  if positions.shape not in ((length,), (batch, length)):
    raise ValueError(
      f'positions must be [len={length}] or [batch={batch}, len={length}], got {positions.shape}'
    )
  dtype = accumulation_dtype(x.dtype)
  half = head_dim // 2
  inv_freq_F = base ** (-jnp.arange(0, head_dim, 2, dtype=dtype) / head_dim)  # θ_i: [half]
  angles = positions.astype(dtype)[..., None, None] * inv_freq_F  # [(batch,) len, 1, half]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  first, second = x[..., :half].astype(dtype), x[..., half:].astype(dtype)
  rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  return rotated.astype(x.dtype)
