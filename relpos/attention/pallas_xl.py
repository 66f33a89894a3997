"""Transformer-XL attention as fused, tiled Pallas kernels (`implementation='pallas'`).

    score_ij = ((q_i + u)·k_j + (q_i + v)·R[pos_i - j]) / sqrt(d),  causal: j <= pos_i
    pos_i = kv_len - q_len + i,  R = rel_key [kv_len, heads, d]

Forward (grid batch × heads × query tiles; loop over key tiles, online softmax, key tiles
entirely in the causal future of the query tile are skipped by the loop bound). For a (query
tile, key tile) pair the distances pos_i - j span a window of block_q + block_k - 1 rows of R,
so the position term is one matmul (q + v)·R_windowᵀ [block_q, window] followed by a static
skew: pair (i', j') reads column i' - j' + block_k - 1, a register gather
(`pallas_gather.take_columns`). The window is those block_q + block_k - 1 rows padded to a
power of two (`_window`). Only the output and the per-row logsumexp are saved for the backward pass.

Backward (flash-attention-2 style; every kernel recomputes p = exp(s - logsumexp) tile by tile
and delta_i = do_i·o_i per query tile):
- dq kernel, grid over query tiles, loop over key tiles: dq = (Σ_j ds_ij k_j + Σ_j ds_ij
  R[pos_i - j]) / sqrt(d), the second sum as the skewed-back ds [block_q, window]
  (`_unskew`: the skew is one-to-one, so its transpose is a gather with the same index map)
  times R_window. The content and position halves, summed over the tile's rows, are
  per-tile partials of d u and d v [batch, heads, query tiles, 1, d].
- dk/dv kernel, grid over key tiles, loop over the query tiles that can see them.
- d rel_key kernel, grid over tiles of distances t0 .. t0 + block_k - 1, loop over query
  tiles: the keys at those distances from a query tile are one contiguous run of
  block_q + block_k - 1 keys (read as `window` keys), so the content logits and do·vᵀ are
  matmuls on that run, skewed to [block_q, distances]; the position logits need just R's own
  block. dR[t] = Σ ds (q + v) /
  sqrt(d), per batch a partial [batch, distances, heads, d].
The steps outside Pallas: summing those partials over batch (and query tiles), by `jnp.sum` in
the VJP; and the padding around the kernels (`pallas_common`, Layout: the kernels read the
models' [B, L, H, D] layout).

Layout: key, value, mask and R are used as they are, padded on the right only where kv_len is
not whole key tiles (or shorter than one window: `_XLSpec.extended`). A window of R or run of
keys that would start before row 0 or end past the last row is clamped into the axis, and the
gathers that read it shift their columns by as much (`_clamped_rows`): the rows left out belong
to masked pairs. (The kernels used to pad keys, values and R on the left and right instead:
three copies a layer, 0.36 ms of the bf16 enwik8_base step's floor on an H100.) A mask with no
query axis (or one of size 1: keys only, as the character LM's, whose causal part XL adds
itself) stays one row, [.., 1, keys], read by every query tile (`kernel_mask`, `mask_rows`):
O(length) memory at long context, where a [q_len, kv_len] mask would take more than the kernels.
head_dim is padded with zeros to a power of two >= 16.

Native lowering (see `pallas_common` for what was checked): the skews lower to Triton's
register gather `tt.gather` (`pallas_gather`; Mosaic has no rule for it, so these kernels do not
lower for a TPU); the window is a power of two >= 16; default tiles are 32 x 32
(`DEFAULT_XL_BLOCK`). The first design read each skewed column by a one-hot reduction over
[block_q, block_k, window] values in registers: it passed the float64-reference tests on an
H200 but was 82x / 255x vanilla XLA attention's fwd / fwd+bwd time at n = 512 (docs/gpu.md, the
H200 run), and compiled for sm_90a it spilled 19-52 KB per thread; with the gather the same kernels
spill at most 532 bytes (`benchmarks/triton_compile.py`). The gather version has not run on a
GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from relpos.attention.masking import default_query_offset
from relpos.attention.pallas_common import (
  Blocking,
  KernelCall,
  Tiling,
  add_forward_outputs,
  add_sequence_inputs,
  dot,
  dropout_seed,
  finish_softmax,
  from_kernel_layout,
  init_softmax,
  kernel_mask,
  kernel_scalars,
  mask_rows,
  online_softmax_step,
  pad_to,
  positions,
  query_residuals,
  read_scalars,
  sequence_block,
  sequence_tile_map,
  softmax_grads,
  tile_index,
  tile_pairs,
  to_kernel_layout,
  triton_size,
  whole_axis,
)
from relpos.attention.pallas_gather import take_columns

# Default tile along each sequence axis (capped by length). Compiled for sm_90a
# (`benchmarks/triton_compile.py`, n = 2048, mask and dropout), 32 x 32 tiles spill at most 8
# bytes per thread in bf16 (532 in float32, the dR kernel) and take 46-120 KiB of shared
# memory; 64 x 64 tiles spill 0.4-1.7 KB and take 144-336 KiB, over the 227 KiB an H100 or
# H200 block may have.
DEFAULT_XL_BLOCK = 32


def _window(block_q: int, block_k: int) -> int:
  """Rows of R (and keys) the kernels read per (query tile, key tile) pair: the
  block_q + block_k - 1 distances the pair spans, padded to `triton_size` (the extra rows are
  never selected by the skews)."""
  return triton_size(block_q + block_k - 1)


@dataclasses.dataclass(frozen=True)
class _XLSpec:
  """Static description of one problem (hashable: a custom_vjp nondiff argument)."""

  tiling: Tiling
  dropout_rate: float
  scale: float  # 1/sqrt(d) of the real head_dim (the kernels see it padded)

  @property
  def base(self) -> int:
    """pos_0: the absolute position of query 0 (memory comes first)."""
    return default_query_offset(self.tiling.q_len, self.tiling.kv_len)

  @property
  def extended(self) -> int:
    """Length of the key and distance axes in the kernels: whole key tiles, and at least one
    `window`, so that a window clamped into the axis (`_clamped_rows`) fits."""
    return max(self.tiling.kv_padded, self.window)

  @property
  def span(self) -> int:
    """block_q + block_k - 1: the distances (and keys) one (query tile, key tile) pair spans."""
    return self.tiling.block_q + self.tiling.block_k - 1

  @property
  def window(self) -> int:
    return _window(self.tiling.block_q, self.tiling.block_k)


def _first_query_tile(spec, first_key):
  """The first query tile whose last query can see key `first_key` (pos_i >= j)."""
  block_q = spec.tiling.block_q
  return jnp.maximum(0, -((spec.base + block_q - 1 - first_key) // block_q))


def _biased_queries(refs, rows):
  """q + u and q + v for the query `rows` of the refs, in the query's dtype."""
  query = refs.query[rows]
  return (
    query + refs.content_bias[...].astype(query.dtype),
    query + refs.position_bias[...].astype(query.dtype),
  )


def _skew_index(tiling, columns=None):
  """int32 [block_q, columns (default block_k)]: `i' + block_k - 1 - j'` for row i', column
  j'. Key j' of a tile is column i' + block_k - 1 - j' of its query i''s window over
  distances, and in the dR kernel, distance column j' of query i' is column
  i' + block_k - 1 - j' of the key run. The map is its own inverse: window column c of
  query i' is key i' + block_k - 1 - c (`_unskew`)."""
  shape = (tiling.block_q, columns or tiling.block_k)
  return (
    lax.broadcasted_iota(jnp.int32, shape, 0)
    + tiling.block_k
    - 1
    - lax.broadcasted_iota(jnp.int32, shape, 1)
  )


def _unskew(d_logits_QK, spec, shift):
  """The transpose of the forward skew, [block_q, window]: column c of query i' (of a window
  moved by `shift`, `_clamped_rows`) gets the logit gradient of key
  i' + block_k - 1 - c + shift of the tile, or 0 where that key is outside the tile. Each
  window column of a row holds at most one key, so this is a gather too."""
  key_column = _skew_index(spec.tiling, spec.window) + shift
  inside = (key_column >= 0) & (key_column < spec.tiling.block_k)
  gathered = take_columns(d_logits_QK, jnp.clip(key_column, 0, spec.tiling.block_k - 1))
  return jnp.where(inside, gathered, 0)


def _clamped_rows(spec, first):
  """(rows, shift): the `window` rows of the key / distance axis from `first`, moved into
  [0, extended) (`pl.ds`), and how far they moved: row first + c is row c + shift of them.

  A window may start before row 0 (the tiles at the causal diagonal: distances below 0, keys
  before the first) or end past the last row (the last query tile's distances). Those rows
  belong to pairs the kernels mask, so instead of padding keys, values and R with zeros on
  both sides (a copy of each per layer), the window is clamped into the axis and the column
  gathers that read it shift their indices by `shift` (`_shifted`). Every row a real pair
  needs stays inside: the pair's span is `span` < `window` rows of [0, extended)."""
  start = jnp.clip(first, 0, spec.extended - spec.window)
  return pl.ds(start, spec.window), first - start


def _shifted(column_QC, shift, size):
  """Gather columns `column + shift`, clipped into [0, size): a clipped column belongs to a
  masked pair (`_clamped_rows`), whose value is never used."""
  return jnp.clip(column_QC + shift, 0, size - 1)


def _rel_window(spec, refs, query_start, key_start):
  """R's window for the tile: rows for distances pos_0' - key_start - (block_k - 1) .. +
  window - 1 [window, D] (the first `span` are the tile's), clamped (`_clamped_rows`), and the
  window's shift."""
  first = spec.base + query_start - key_start - (spec.tiling.block_k - 1)
  rows, shift = _clamped_rows(spec, first)
  return refs.rel_key[rows, :], shift


def _pairs(spec, seed, b, h, query_start, key_index, mask):
  """Allowed pairs (causal, real, mask) and dropout factor; key_index global, broadcastable."""
  query_index = positions(query_start, spec.tiling.block_q, 0)
  allowed, keep_scale = tile_pairs(
    spec.tiling, spec.dropout_rate, seed, b, h, query_index, key_index, mask
  )
  return allowed & (key_index <= spec.base + query_index), keep_scale


def _tile(spec, refs, seed, b, h, q_content, q_position, query_start, key_start, key, mask):
  """Logits [block_q, block_k], allowed pairs, dropout factor and (the R window, its shift:
  `_rel_window`) of one tile."""
  rel_window, shift = _rel_window(spec, refs, query_start, key_start)
  content = dot(q_content, key, transpose_b=True)
  column = _shifted(_skew_index(spec.tiling), shift, spec.window)
  position = take_columns(dot(q_position, rel_window, transpose_b=True), column)
  logits = (content + position) * spec.scale
  key_index = positions(key_start, spec.tiling.block_k, 1)
  allowed, keep_scale = _pairs(spec, seed, b, h, query_start, key_index, mask)
  return logits, allowed, keep_scale, (rel_window, shift)


def _visible_key_tiles(spec, query_start):
  """Key tiles with a key some query of the tile may see: the causal loop bound."""
  last_position = spec.base + query_start + spec.tiling.block_q - 1
  return jnp.clip(last_position // spec.tiling.block_k + 1, 0, spec.tiling.num_k_tiles)


def _forward_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, query_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  _, seed = read_scalars(refs.scalars)
  query_start = query_tile * block_q
  q_content, q_position = _biased_queries(refs, ...)
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)

  def body(key_tile, carry):
    max_Q1, norm_Q1, out_QD = carry
    key_start = key_tile * block_k
    rows = pl.ds(key_start, block_k)
    value = refs.value[rows, :]
    mask = None if refs.mask is None else mask_rows(refs.mask, slice(None), rows)
    logits, allowed, keep_scale, _ = _tile(
      spec, refs, seed, b, h, q_content, q_position, query_start, key_start, refs.key[rows, :], mask
    )
    max_Q1, norm_Q1, probs, correction = online_softmax_step(max_Q1, norm_Q1, logits, allowed)
    dropped = probs if keep_scale is None else probs * keep_scale
    out_QD = out_QD * correction + dot(dropped.astype(value.dtype), value)
    return max_Q1, norm_Q1, out_QD

  max_Q1, norm_Q1 = init_softmax(block_q, acc_dtype)
  out_QD = jnp.zeros(q_content.shape, acc_dtype)
  max_Q1, norm_Q1, out_QD = lax.fori_loop(
    0, _visible_key_tiles(spec, query_start), body, (max_Q1, norm_Q1, out_QD)
  )
  inverse_norm, lse = finish_softmax(max_Q1, norm_Q1)
  refs.output[...] = (out_QD * inverse_norm).astype(refs.output.dtype)
  refs.lse[...] = lse


def _load_query_side(refs, rows):
  """q + u, q + v, do, logsumexp [block_q, 1] and delta_i = do_i·o_i for query `rows`."""
  return (*_biased_queries(refs, rows), *query_residuals(refs, rows))


def _tile_grads(spec, refs, seed, b, h, query_side, key_start, key_KD, value_KD, mask_QK):
  """The backward pass of one tile: (its R window and the window's shift, dropped
  probabilities p', logit gradient ds). query_side: (query_start, q + u, q + v, do,
  logsumexp, delta) of the query tile."""
  query_start, q_content, q_position, d_output, lse, delta = query_side
  logits, allowed, keep_scale, window_and_shift = _tile(
    spec, refs, seed, b, h, q_content, q_position, query_start, key_start, key_KD, mask_QK
  )
  d_dropped = dot(d_output, value_KD, transpose_b=True)
  dropped, d_logits = softmax_grads(logits, allowed, lse, d_dropped, delta, keep_scale)
  return window_and_shift, dropped, d_logits


def _d_query_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, query_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  _, seed = read_scalars(refs.scalars)
  query_start = query_tile * block_q
  query_side = (query_start, *_load_query_side(refs, ...))
  q_content = query_side[1]
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)

  def body(key_tile, carry):
    d_content_QD, d_position_QD = carry
    key_start = key_tile * block_k
    rows = pl.ds(key_start, block_k)
    key = refs.key[rows, :]
    mask = None if refs.mask is None else mask_rows(refs.mask, slice(None), rows)
    (rel_window, shift), _, d_logits = _tile_grads(
      spec, refs, seed, b, h, query_side, key_start, key, refs.value[rows, :], mask
    )
    d_content_QD = d_content_QD + dot(d_logits.astype(key.dtype), key)
    d_window = _unskew(d_logits, spec, shift).astype(rel_window.dtype)
    d_position_QD = d_position_QD + dot(d_window, rel_window)
    return d_content_QD, d_position_QD

  zeros = jnp.zeros(q_content.shape, acc_dtype)
  d_content, d_position = lax.fori_loop(
    0, _visible_key_tiles(spec, query_start), body, (zeros, zeros)
  )
  d_content, d_position = d_content * spec.scale, d_position * spec.scale
  refs.d_query[...] = (d_content + d_position).astype(refs.d_query.dtype)
  refs.d_content_bias[...] = jnp.sum(d_content, axis=0, keepdims=True)
  refs.d_position_bias[...] = jnp.sum(d_position, axis=0, keepdims=True)


def _d_key_value_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, key_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  _, seed = read_scalars(refs.scalars)
  key_start = key_tile * block_k
  key, value = refs.key[...], refs.value[...]  # [block_k, D]
  acc_dtype = jnp.promote_types(value.dtype, jnp.float32)

  def body(query_tile, carry):
    d_key_KD, d_value_KD = carry
    query_start = query_tile * block_q
    rows = pl.ds(query_start, block_q)
    query_side = (query_start, *_load_query_side(refs, (rows, slice(None))))
    _, q_content, _, d_output = query_side[:4]
    mask = None if refs.mask is None else mask_rows(refs.mask, rows)
    _, dropped, d_logits = _tile_grads(
      spec, refs, seed, b, h, query_side, key_start, key, value, mask
    )
    d_value_KD = d_value_KD + dot(dropped.astype(d_output.dtype), d_output, transpose_a=True)
    d_key_KD = d_key_KD + dot(d_logits.astype(q_content.dtype), q_content, transpose_a=True)
    return d_key_KD, d_value_KD

  zeros = jnp.zeros(key.shape, acc_dtype)
  d_key, d_value = lax.fori_loop(
    _first_query_tile(spec, key_start), tiling.num_q_tiles, body, (zeros, zeros)
  )
  refs.d_key[...] = (d_key * spec.scale).astype(refs.d_key.dtype)
  refs.d_value[...] = d_value.astype(refs.d_value.dtype)


def _d_rel_key_kernel(refs, *, spec):
  """dR for the distances t0 .. t0 + block_k - 1 of this program (one batch element)."""
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  run = spec.window  # keys at those distances from one query tile (`span` of them used)
  b, h, distance_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  _, seed = read_scalars(refs.scalars)
  first_distance = distance_tile * block_k
  rel_block = refs.rel_key[...]  # [block_k, D], R[t0 + c]
  # Column c of the skewed layout is distance t0 + c; for query i' that is key
  # run_start + i' + block_k - 1 - c, i.e. column i' + block_k - 1 - c of the run.
  run_column = _skew_index(tiling)
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)

  def body(query_tile, d_rel_CD):
    query_start = query_tile * block_q
    rows = pl.ds(query_start, block_q)
    q_content, q_position, d_output, lse, delta = _load_query_side(refs, (rows, slice(None)))
    run_start = spec.base + query_start - first_distance - (block_k - 1)
    keys, shift = _clamped_rows(spec, run_start)
    column = _shifted(run_column, shift, run)
    mask = None
    if refs.mask is not None:
      mask = mask_rows(refs.mask, rows, keys).astype(jnp.int32)
      mask = take_columns(jnp.broadcast_to(mask, (block_q, run)), column)
    content = take_columns(dot(q_content, refs.key[keys, :], transpose_b=True), column)
    logits = (content + dot(q_position, rel_block, transpose_b=True)) * spec.scale
    allowed, keep_scale = _pairs(spec, seed, b, h, query_start, run_start + run_column, mask)
    d_dropped = take_columns(dot(d_output, refs.value[keys, :], transpose_b=True), column)
    _, d_logits = softmax_grads(logits, allowed, lse, d_dropped, delta, keep_scale)
    return d_rel_CD + dot(d_logits.astype(q_position.dtype), q_position, transpose_a=True)

  d_rel = lax.fori_loop(
    _first_query_tile(spec, first_distance),
    tiling.num_q_tiles,
    body,
    jnp.zeros(rel_block.shape, acc_dtype),
  )
  refs.d_rel_key[...] = d_rel * spec.scale


class _Inputs(NamedTuple):
  """The kernels' inputs in kernel layout (see `_xl_pallas`)."""

  query: jax.Array
  key: jax.Array
  value: jax.Array
  rel_key: jax.Array
  content_bias: jax.Array
  position_bias: jax.Array
  mask: jax.Array | None
  scalars: jax.Array


def _kernel_call(spec, inputs, blocking, rel_blocking, **residuals):
  """A `KernelCall` with every input (and the backward pass's residuals) blocked as
  `blocking` says, and rel_key as `rel_blocking` = (rows, block index of the tile)."""
  call = KernelCall(spec.tiling, optional=('mask',))
  head_dim = inputs.query.shape[-1]
  rel_rows, rel_index = rel_blocking
  call.input(
    'rel_key', inputs.rel_key, (rel_rows, None, head_dim), lambda b, h, i: (rel_index(i), h, 0)
  )
  for name, bias in (
    ('content_bias', inputs.content_bias),
    ('position_bias', inputs.position_bias),
  ):
    call.input(name, bias, (None, 1, head_dim), lambda b, h, i: (h, 0, 0))
  add_sequence_inputs(
    call,
    blocking,
    scalars=inputs.scalars,
    query=inputs.query,
    key=inputs.key,
    value=inputs.value,
    mask=inputs.mask,
    **residuals,
  )
  return call


def _query_tiles(spec):
  """Programs over query tiles reading whole key sequences and R (forward, dq)."""
  blocking = Blocking(spec.tiling.block_q, tile_index, spec.extended, whole_axis)
  return blocking, (spec.extended, whole_axis)


def _forward(spec, inputs):
  """Output [B, Qp, H, D] and logsumexp [B, H, Qp, 1]."""
  tiling = spec.tiling
  batch, _, heads, _ = inputs.query.shape
  call = _kernel_call(spec, inputs, *_query_tiles(spec))
  add_forward_outputs(call, inputs.query, inputs.value.dtype, tiling.block_q)
  grid = (batch, heads, tiling.num_q_tiles)
  return call(_forward_kernel, grid, name='xl_forward', spec=spec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _xl_pallas(spec, inputs):
  """Transformer-XL attention on `_Inputs` in kernel layout (D padded to `triton_size`):
  query [B, Qp, H, D]; key, value
  [B, E, H, D] and rel_key [E, H, D] (E = `spec.extended`: kv_len padded on the right);
  biases [H, 1, D]; int8 mask [B|1, H|1, Qp, E] or None; int32 scalars [2]. Returns
  [B, Qp, H, D]."""
  output, _ = _forward(spec, inputs)
  return output


def _xl_pallas_fwd(spec, inputs):
  output, lse = _forward(spec, inputs)
  return output, (inputs, output, lse)


def _extend_keys(spec, x):
  """Pads axis -3 (of [.., L, H, D]) from kv_padded keys (distances) to the inputs' `extended`
  (no copy where they are the same: every length of at least one window)."""
  right = spec.extended - spec.tiling.kv_padded
  if right == 0:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(0, right), (0, 0), (0, 0)])


def _xl_pallas_bwd(spec, residuals, d_output):
  inputs, output, lse = residuals
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  batch, q_padded, heads, head_dim = inputs.query.shape
  acc_dtype = jnp.promote_types(inputs.key.dtype, jnp.float32)
  residuals = dict(output=output, lse=lse, d_output=d_output.astype(inputs.value.dtype))
  # dq, and per-query-tile partials of d u and d v: grid over query tiles.
  call = _kernel_call(spec, inputs, *_query_tiles(spec), **residuals)
  call.output(
    'd_query',
    inputs.query.shape,
    inputs.query.dtype,
    sequence_block(block_q, head_dim),
    sequence_tile_map,
  )
  for name in ('d_content_bias', 'd_position_bias'):
    call.output(
      name,
      (batch, heads, tiling.num_q_tiles, 1, head_dim),
      acc_dtype,
      (None, None, None, 1, head_dim),
      lambda b, h, i: (b, h, i, 0, 0),
    )
  grid = (batch, heads, tiling.num_q_tiles)
  d_query, d_content_bias, d_position_bias = call(
    _d_query_kernel, grid, name='xl_backward_dq', spec=spec
  )

  # dk, dv: grid over key tiles.
  blocking = Blocking(q_padded, whole_axis, block_k, tile_index)
  call = _kernel_call(spec, inputs, blocking, (spec.extended, whole_axis), **residuals)
  for name, like in (('d_key', inputs.key), ('d_value', inputs.value)):
    shape = (batch, tiling.kv_padded, heads, head_dim)
    call.output(name, shape, like.dtype, sequence_block(block_k, head_dim), sequence_tile_map)
  grid = (batch, heads, tiling.num_k_tiles)
  d_key, d_value = call(_d_key_value_kernel, grid, name='xl_backward_dkv', spec=spec)

  # dR: grid over tiles of distances, per batch element (summed over batch below).
  blocking = Blocking(q_padded, whole_axis, spec.extended, whole_axis)
  call = _kernel_call(spec, inputs, blocking, (block_k, tile_index), **residuals)
  call.output(
    'd_rel_key',
    (batch, tiling.kv_padded, heads, head_dim),
    acc_dtype,
    sequence_block(block_k, head_dim),
    sequence_tile_map,
  )
  grid = (batch, heads, tiling.num_k_tiles)  # distances 0 .. kv_padded - 1, block_k a tile
  (d_rel_key,) = call(_d_rel_key_kernel, grid, name='xl_backward_drel', spec=spec)

  def bias_grad(partial, like):  # a bias is shared by every batch element and query tile
    return jnp.sum(partial, axis=(0, 2)).astype(like.dtype)

  return (
    _Inputs(
      query=d_query,
      key=_extend_keys(spec, d_key),
      value=_extend_keys(spec, d_value),
      rel_key=_extend_keys(spec, jnp.sum(d_rel_key, axis=0)).astype(inputs.rel_key.dtype),
      content_bias=bias_grad(d_content_bias, inputs.content_bias),
      position_bias=bias_grad(d_position_bias, inputs.position_bias),
      mask=None,
      scalars=None,
    ),
  )


_xl_pallas.defvjp(_xl_pallas_fwd, _xl_pallas_bwd)


def xl_attention_pallas(
  query,
  key,
  value,
  rel_key,
  content_bias,
  position_bias,
  *,
  mask=None,
  dropout_rate: float = 0.0,
  dropout_rng=None,
  block_sizes=None,
) -> jax.Array:
  """`relpos.attention.xl_attention(..., implementation='pallas')`, arguments already checked.

  Same contract as `xl_attention`; `block_sizes` = (block_q, block_k) tiles (default:
  `pallas_common.Tiling.make`'s, which Triton can lower). Dropout draws its keep mask from
  `pallas_common.dropout_keep_hashed` (same distribution as the 'xla' path, different bits).
  """
  batch, q_len, heads, head_dim = query.shape
  kv_len = key.shape[1]
  tiling = Tiling.make(q_len, kv_len, block_sizes, DEFAULT_XL_BLOCK)
  spec = _XLSpec(tiling, float(dropout_rate), head_dim**-0.5)
  bias_shape = (heads, 1, triton_size(head_dim))
  seed = dropout_seed(dropout_rng) if spec.dropout_rate > 0.0 else None
  extended = functools.partial(to_kernel_layout, total_len=spec.extended)
  inputs = _Inputs(
    query=to_kernel_layout(query, spec.tiling.q_padded),
    key=extended(key),
    value=extended(value),
    rel_key=extended(rel_key[None])[0],
    content_bias=pad_to(content_bias[:, None, :], bias_shape),
    position_bias=pad_to(position_bias[:, None, :], bias_shape),
    mask=kernel_mask(
      mask,
      batch,
      heads,
      q_len,
      kv_len,
      spec.tiling.q_padded,
      spec.extended,
    ),
    scalars=kernel_scalars(0, seed),
  )
  output = _xl_pallas(spec, inputs)
  return from_kernel_layout(output, q_len, head_dim)
