"""Moving banded terms between relative and absolute coordinates with pad + reshape only.

The Music Transformer "skew" (Huang et al. 2018), generalised to any diagonal offset and to a
start that may be traced (a decoding step). No gathers and no scatters: both directions are
pads, reshapes and slices, which XLA keeps dense forward and backward.

Relative coordinates index a query row by a diagonal `c`; absolute ones by key `j`; the two are
tied by `c = j - i + start`.
"""

import jax.numpy as jnp
from jax import lax


def _start_bounds(start, start_range):
  """(lowest, highest) values `start` can take: a static start is its own bound."""
  if isinstance(start, int):
    return start, start
  if start_range is None:
    raise ValueError('a traced start needs static start_range=(lowest, highest)')
  return start_range


def _read_flat(flat, start, length, lowest, highest):
  """`flat[..., start:start + length]`, zero-padded where the window leaves the array.

  `start` may be traced; it must then lie in [lowest, highest] (callers clip it).
  """
  front = max(0, -lowest)
  back = max(0, highest + length - flat.shape[-1])
  pad = [(0, 0)] * (flat.ndim - 1) + [(front, back)]
  flat = jnp.pad(flat, pad)
  if isinstance(start, int):
    return lax.slice_in_dim(flat, start + front, start + front + length, axis=-1)
  return lax.dynamic_slice_in_dim(flat, start + front, length, axis=-1)


def relative_to_absolute(x_NQR, start, kv_len: int, *, start_range=None):
  """Skew: `out[..., i, j] = x[..., i, j - i + start]` wherever `0 <= j - i + start < R`.

  Cells whose diagonal falls outside `[0, R)` hold unspecified values: callers mask them.

  Args:
    x_NQR: [..., q_len, R] values per query and diagonal.
    start: int or traced int32 scalar.
    kv_len: number of key columns of the output.
    start_range: (lowest, highest) static bounds of a traced `start`.
  Returns:
    [..., q_len, kv_len].
  """
  *lead, q_len, rows = x_NQR.shape
  width = max(kv_len + 1, rows)
  lowest, highest = _start_bounds(start, start_range)
  x = jnp.pad(x_NQR, [(0, 0)] * len(lead) + [(0, 0), (0, width - rows)])
  flat = x.reshape(*lead, q_len * width)
  out = _read_flat(flat, start, q_len * (width - 1), lowest, highest)
  return out.reshape(*lead, q_len, width - 1)[..., :kv_len]


def absolute_to_relative(p_NQK, start, rows: int, *, start_range=None):
  """Unskew: `out[..., i, c] = p[..., i, i + c - start]` wherever `0 <= i + c - start < kv_len`.

  Cells whose key falls outside `[0, kv_len)` hold unspecified values: callers mask them.

  Args:
    p_NQK: [..., q_len, kv_len] values per query and key.
    start: int or traced int32 scalar (the same start as the matching skew).
    rows: R, the number of diagonals of the output.
    start_range: (lowest, highest) static bounds of a traced `start`.
  Returns:
    [..., q_len, rows].
  """
  *lead, q_len, kv_len = p_NQK.shape
  width = max(kv_len + 1, rows)
  lowest, highest = _start_bounds(start, start_range)
  p = jnp.pad(p_NQK, [(0, 0)] * len(lead) + [(0, 0), (0, width - 1 - kv_len)])
  flat = p.reshape(*lead, q_len * (width - 1))
  out = _read_flat(flat, -start, q_len * width, -highest, -lowest)
  return out.reshape(*lead, q_len, width)[..., :rows]

