"""The pad-and-reshape "skew" (Music Transformer, Huang et al. 2018; Transformer-XL's shift).

Moves a [.., q_len, R] array indexed by diagonal into [.., q_len, kv_len] indexed by key, with
`c = j - i + start`. Pads, reshapes and slices only: no gather, and the transpose autodiff
builds is again pads and slices (no scatter).
"""

import jax.numpy as jnp
from jax import lax


def relative_to_absolute(x_NQR, start: int, kv_len: int):
  """`out[..., i, j] = x[..., i, j - i + start]` wherever `0 <= j - i + start < R`.

  Cells whose diagonal falls outside `[0, R)` hold unspecified values: callers mask them.

  Args:
    x_NQR: [..., q_len, R] values per query and diagonal.
    start: static int, the diagonal column of key j = i.
    kv_len: number of key columns of the output.
  Returns:
    [..., q_len, kv_len].
  """
  *lead, q_len, rows = x_NQR.shape
  width = max(kv_len + 1, rows)
  x = jnp.pad(x_NQR, [(0, 0)] * len(lead) + [(0, 0), (0, width - rows)])
  flat = x.reshape(*lead, q_len * width)
  # Row i of the result starts at flat index i·(width-1) + start = i·width + (start - i).
  length = q_len * (width - 1)
  front, back = max(0, -start), max(0, start + length - flat.shape[-1])
  flat = jnp.pad(flat, [(0, 0)] * len(lead) + [(front, back)])
  out = lax.slice_in_dim(flat, start + front, start + front + length, axis=-1)
  return out.reshape(*lead, q_len, width - 1)[..., :kv_len]
