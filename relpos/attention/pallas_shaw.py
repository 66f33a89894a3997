"""Shaw et al. (2018) attention as fused, tiled Pallas kernels (`implementation='pallas'`).

    e_ij = (q_i·k_j + q_i·w^K[r_ij]) / sqrt(d)      z_i = Σ_j p_ij (v_j + w^V[r_ij])
    r_ij = clip(j - pos_i, -k, k) + k               pos_i = query_offset + i

Forward (grid batch × heads × query tiles; loop over key tiles, online softmax). Per query tile
qw = q·w^Kᵀ/sqrt(d) [block_q, 2k+1] is computed once. Each key tile is classified by the range
of j - pos_i it holds: a tile entirely at distance <= -k (or >= k) from all its queries sees one
table row, the left (right) edge, so its a^K term is a per-row constant (a rank-1 add of one
column of qw), and its a^V contribution is (row sum of p over the tile)·w^V_edge. Only tiles
that cross the band |j - pos_i| < k do per-distance work: read qw at each (i, j)'s bucket, and
sum p into buckets [block_q, 2k+1], both as one-hot reductions over the buckets
([block_q, block_k, buckets]: `gather_columns`, `scatter_add_columns`). The per-bucket sums of
p' (edges included: columns 0 and 2k) are carried through the online softmax next to the value
accumulator, with the same rescaling, and multiplied by w^V once at the end. Memory per
program beyond flash attention's [block_q, block_k] tile: O(block_q·(2k+1)) (qw and the bucket
sums), and the band tiles' one-hot intermediates, O(block_q·block_k·(2k+1)); saved for the
backward pass: only the output and the per-row logsumexp [B, H, q_len]
(besides the inputs), no [q_len, kv_len] array anywhere. Overall O(n·(d + k)).

Backward (flash-attention-2 style, all three Pallas kernels recompute p = exp(s - logsumexp)
tile by tile, with delta_i = do_i·o_i recomputed per query tile from the saved output):
- dq kernel, grid over query tiles, loop over key tiles: dq, and per program the bucket sums of
  ds (for dq's a^K term and d w^K) and of p' (for d w^V), written as per-tile partials
  [batch, heads, query tiles, 2k+1, d] of d w^K and d w^V;
- dk/dv kernel, grid over key tiles, loop over query tiles: dk, dv. The a^V term of
  dp'_ij = do_i·(v_j + w^V[r_ij]) comes from do·w^Vᵀ [block_q, 2k+1], spread like qw.
The one step outside Pallas: the partial table gradients are summed over (batch, heads, query
tiles) by `jnp.sum` in the VJP (the tables are shared by every program; GPU programs cannot
accumulate into one block). Layout changes (transpose to [B, H, L, D], padding to whole tiles,
slicing) are XLA ops around the kernels and differentiated by JAX.

Native lowering (see `pallas_common` for what was checked): the 2k+1 table rows (and
head_dim) are padded with zero rows (columns) to a power of two >= 16 (`_table_rows`), which
buckets 0 .. 2k never reach, so every per-bucket array is [block_q, `table_rows`]; the bucket
reads and sums are one-hot reductions, which Triton lowers (it has no gather); the default
tiles keep [block_q, block_k, table_rows] within `pallas_common.ONE_HOT_BUDGET` elements. The
per-tile `lax.cond` (band vs edge) is what skips the per-bucket work. Forward and backward
lower for 'cuda' through Triton, compile and run on a GPU (H200: correct, 21x vanilla XLA
attention's fwd+bwd time at n = 2048, k = 16; README, On a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

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
  gather_columns,
  init_softmax,
  kernel_mask,
  kernel_scalars,
  online_softmax_step,
  pad_to,
  positions,
  query_residuals,
  read_scalars,
  scatter_add_columns,
  sequence_tile_map,
  softmax_grads,
  tile_index,
  tile_pairs,
  to_kernel_layout,
  triton_size,
  whole_axis,
)


def _table_rows(max_distance: int) -> int:
  """Rows of w^K, w^V and of every per-bucket array in the kernels: the 2k+1 buckets, padded
  with zero rows to `triton_size` (buckets 0 .. 2k are the real rows)."""
  return triton_size(2 * max_distance + 1)


@dataclasses.dataclass(frozen=True)
class _ShawSpec:
  """Static description of one problem (hashable: a custom_vjp nondiff argument)."""

  tiling: Tiling
  max_distance: int
  dropout_rate: float
  scale: float  # 1/sqrt(d) of the real head_dim (the kernels see it padded)

  @property
  def table_rows(self) -> int:
    return _table_rows(self.max_distance)


class _BandTile:
  """Bucket geometry of one (query tile, key tile) pair.

  `first_distance` is j - pos_i of the tile's first query and first key (traced); in the tile,
  distance_ij = first_distance + j' - i' for local indices i', j', bucket r_ij =
  clip(distance_ij, -k, k) + k. Per-bucket arrays have `table_rows` columns (2k+1 used).
  """

  def __init__(self, max_distance: int, table_rows: int, first_distance, block_q, block_k):
    k = max_distance
    self.k, self.table_rows, self.shape = k, table_rows, (block_q, block_k)
    local_key = lax.broadcasted_iota(jnp.int32, self.shape, 1)
    local_query = lax.broadcasted_iota(jnp.int32, self.shape, 0)
    self.bucket_QK = jnp.clip(first_distance + local_key - local_query, -k, k) + k
    lowest, highest = first_distance - (block_q - 1), first_distance + block_k - 1
    # A tile off the band has every pair on one edge: bucket 0 (left) or 2k (right). (Typed
    # constants: JAX 0.10.2's Triton lowering gives a scalar select's weak literals its
    # predicate's type, bool.)
    self.edge_bucket = jnp.where(highest <= -k, jnp.int32(0), jnp.int32(2 * k))
    self.crosses_band = (highest > -k) & (lowest < k)

  def _by_band(self, band, edge):
    """band() on tiles crossing the band, edge() on the others (k = 0: all on the edge)."""
    return edge() if self.k == 0 else lax.cond(self.crosses_band, band, edge)

  def spread(self, x_QR):
    """`out[i, j] = x[i, r_ij]`: per-row table values [block_q, rows] -> [block_q, block_k]."""

    def band():
      return gather_columns(x_QR, self.bucket_QK)

    def edge():  # one column for the whole tile: a per-row constant
      edge_column = gather_columns(x_QR, jnp.full((1, 1), self.edge_bucket))
      return jnp.broadcast_to(edge_column, self.shape)

    return self._by_band(band, edge)

  def collect(self, p_QK):
    """`out[i, r] = Σ_{j: r_ij = r} p_ij`: per-key values -> per-bucket sums [block_q, rows]."""

    def band():
      return scatter_add_columns(p_QK, self.bucket_QK, self.table_rows)

    def edge():
      bucket = lax.broadcasted_iota(jnp.int32, (1, self.table_rows), 1)
      return jnp.where(bucket == self.edge_bucket, jnp.sum(p_QK, axis=1, keepdims=True), 0.0)

    return self._by_band(band, edge)


def _tile(spec, seed, b, h, offset, query_QD, qw_QR, query_start, key_start, key_KD, mask_QK):
  """Logits s = e_ij [block_q, block_k], allowed pairs, dropout factor and band geometry of the
  tile whose first query is `query_start` and first key `key_start`."""
  tiling = spec.tiling
  band = _BandTile(
    spec.max_distance,
    spec.table_rows,
    key_start - (offset + query_start),
    tiling.block_q,
    tiling.block_k,
  )
  logits = dot(query_QD, key_KD, transpose_b=True) * spec.scale
  if qw_QR is not None:
    logits = logits + band.spread(qw_QR)
  allowed, keep_scale = tile_pairs(
    tiling,
    spec.dropout_rate,
    seed,
    b,
    h,
    positions(query_start, tiling.block_q, 0),
    positions(key_start, tiling.block_k, 1),
    mask_QK,
  )
  return logits, allowed, keep_scale, band


def _row_tables(spec, refs, query_QD, d_output_QD=None):
  """qw = q·w^Kᵀ/sqrt(d) and (given do) do·w^Vᵀ, [block_q, rows] each, None without a table."""
  query_rows = None
  if refs.rel_key is not None:
    query_rows = dot(query_QD, refs.rel_key[...], transpose_b=True) * spec.scale
  d_output_rows = None
  if d_output_QD is not None and refs.rel_value is not None:
    d_output_rows = dot(d_output_QD, refs.rel_value[...], transpose_b=True)
  return query_rows, d_output_rows


def _query_side(spec, refs, query_start, rows):
  """What the backward pass reads of the query tile at `rows` (an index of the query-side refs),
  which starts at query `query_start`: (query_start, q, do, logsumexp, delta, qw, do·w^Vᵀ)."""
  query = refs.query[rows]
  d_output, lse, delta = query_residuals(refs, rows)
  return (query_start, query, d_output, lse, delta, *_row_tables(spec, refs, query, d_output))


def _tile_grads(spec, seed, b, h, offset, query_tile, key_tile, mask_QK):
  """The backward pass of one tile: (band, dropped probabilities p', logit gradient ds).

  query_tile: (query_start, query [block_q, D], do, logsumexp, delta, qw, do·w^Vᵀ);
  key_tile: (key_start, key, value [block_k, D]).
  """
  query_start, query, d_output, lse, delta, query_rows, d_output_rows = query_tile
  key_start, key, value = key_tile
  logits, allowed, keep_scale, band = _tile(
    spec, seed, b, h, offset, query, query_rows, query_start, key_start, key, mask_QK
  )
  d_dropped = dot(d_output, value, transpose_b=True)
  if d_output_rows is not None:
    d_dropped = d_dropped + band.spread(d_output_rows)
  dropped, d_logits = softmax_grads(logits, allowed, lse, d_dropped, delta, keep_scale)
  return band, dropped, d_logits


def _forward_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, query_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  offset, seed = read_scalars(refs.scalars)
  query = refs.query[...]  # [block_q, D]
  query_start = query_tile * block_q
  query_rows, _ = _row_tables(spec, refs, query)
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)

  def body(key_tile, carry):
    max_Q1, norm_Q1, out_QD, value_rows_QR = carry
    key_start = key_tile * block_k
    value = refs.value[pl.ds(key_start, block_k), :]
    mask = None if refs.mask is None else refs.mask[:, pl.ds(key_start, block_k)]
    logits, allowed, keep_scale, band = _tile(
      spec,
      seed,
      b,
      h,
      offset,
      query,
      query_rows,
      query_start,
      key_start,
      refs.key[pl.ds(key_start, block_k), :],
      mask,
    )
    max_Q1, norm_Q1, probs, correction = online_softmax_step(max_Q1, norm_Q1, logits, allowed)
    dropped = probs if keep_scale is None else probs * keep_scale
    out_QD = out_QD * correction + dot(dropped.astype(value.dtype), value)
    if value_rows_QR is not None:
      value_rows_QR = value_rows_QR * correction + band.collect(dropped)
    return max_Q1, norm_Q1, out_QD, value_rows_QR

  max_Q1, norm_Q1 = init_softmax(block_q, acc_dtype)
  out_QD = jnp.zeros(query.shape, acc_dtype)
  value_rows = None if refs.rel_value is None else jnp.zeros((block_q, spec.table_rows), acc_dtype)
  max_Q1, norm_Q1, out_QD, value_rows = lax.fori_loop(
    0, tiling.num_k_tiles, body, (max_Q1, norm_Q1, out_QD, value_rows)
  )
  if value_rows is not None:
    out_QD = out_QD + dot(value_rows, refs.rel_value[...].astype(acc_dtype))
  inverse_norm, lse = finish_softmax(max_Q1, norm_Q1)
  refs.output[...] = (out_QD * inverse_norm).astype(refs.output.dtype)
  refs.lse[...] = lse


def _d_query_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, query_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  offset, seed = read_scalars(refs.scalars)
  query_side = _query_side(spec, refs, query_tile * block_q, ...)
  _, query, d_output = query_side[:3]
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)

  def body(key_tile, carry):
    d_query_QD, logit_rows_QR, prob_rows_QR = carry
    key_start = key_tile * block_k
    keys = pl.ds(key_start, block_k)
    key = refs.key[keys, :]
    mask = None if refs.mask is None else refs.mask[:, keys]
    band, dropped, d_logits = _tile_grads(
      spec, seed, b, h, offset, query_side, (key_start, key, refs.value[keys, :]), mask
    )
    d_query_QD = d_query_QD + dot(d_logits.astype(key.dtype), key)
    if logit_rows_QR is not None:
      logit_rows_QR = logit_rows_QR + band.collect(d_logits)
    if prob_rows_QR is not None:
      prob_rows_QR = prob_rows_QR + band.collect(dropped)
    return d_query_QD, logit_rows_QR, prob_rows_QR

  zeros_rows = jnp.zeros((block_q, spec.table_rows), acc_dtype)
  d_query, logit_rows, prob_rows = lax.fori_loop(
    0,
    tiling.num_k_tiles,
    body,
    (
      jnp.zeros(query.shape, acc_dtype),
      None if refs.rel_key is None else zeros_rows,
      None if refs.rel_value is None else zeros_rows,
    ),
  )
  scale = spec.scale
  if logit_rows is not None:
    d_query = d_query + dot(logit_rows, refs.rel_key[...].astype(acc_dtype))
    refs.d_rel_key[...] = dot(logit_rows, query.astype(acc_dtype), transpose_a=True) * scale
  if prob_rows is not None:
    refs.d_rel_value[...] = dot(prob_rows, d_output.astype(acc_dtype), transpose_a=True)
  refs.d_query[...] = (d_query * scale).astype(refs.d_query.dtype)


def _d_key_value_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, key_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  offset, seed = read_scalars(refs.scalars)
  key_start = key_tile * block_k
  key, value = refs.key[...], refs.value[...]  # [block_k, D]
  acc_dtype = jnp.promote_types(value.dtype, jnp.float32)

  def body(query_tile, carry):
    d_key_KD, d_value_KD = carry
    query_start = query_tile * block_q
    rows = pl.ds(query_start, block_q)
    query_side = _query_side(spec, refs, query_start, (rows, slice(None)))
    _, query, d_output = query_side[:3]
    mask = None if refs.mask is None else refs.mask[rows, :]
    _, dropped, d_logits = _tile_grads(
      spec, seed, b, h, offset, query_side, (key_start, key, value), mask
    )
    d_value_KD = d_value_KD + dot(dropped.astype(d_output.dtype), d_output, transpose_a=True)
    d_key_KD = d_key_KD + dot(d_logits.astype(query.dtype), query, transpose_a=True)
    return d_key_KD, d_value_KD

  zeros = jnp.zeros(key.shape, acc_dtype)
  d_key, d_value = lax.fori_loop(0, tiling.num_q_tiles, body, (zeros, zeros))
  refs.d_key[...] = (d_key * spec.scale).astype(refs.d_key.dtype)
  refs.d_value[...] = d_value.astype(refs.d_value.dtype)


class _Inputs(NamedTuple):
  """The kernels' inputs in kernel layout (see `_shaw_pallas`)."""

  query: jax.Array
  key: jax.Array
  value: jax.Array
  rel_key: jax.Array | None
  rel_value: jax.Array | None
  mask: jax.Array | None
  scalars: jax.Array


def _kernel_call(inputs, blocking, **residuals):
  """A `KernelCall` with every input (and the backward pass's residuals) blocked as
  `blocking` says; the tables are read whole."""
  call = KernelCall(optional=('rel_key', 'rel_value', 'mask', 'd_rel_key', 'd_rel_value'))
  for name, table in (('rel_key', inputs.rel_key), ('rel_value', inputs.rel_value)):
    if table is not None:
      call.input(name, table, table.shape, lambda b, h, i: (0, 0))
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


def _query_tiles(tiling):
  """Programs over query tiles reading whole key sequences (forward, dq)."""
  return Blocking(tiling.block_q, tile_index, tiling.kv_padded, whole_axis)


def _forward(spec, inputs):
  """Output [B, H, Qp, D] and logsumexp [B, H, Qp, 1]."""
  tiling = spec.tiling
  batch, heads = inputs.query.shape[:2]
  call = _kernel_call(inputs, _query_tiles(tiling))
  add_forward_outputs(call, inputs.query, inputs.value.dtype, tiling.block_q)
  grid = (batch, heads, tiling.num_q_tiles)
  return call(_forward_kernel, grid, name='shaw_forward', spec=spec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _shaw_pallas(spec, inputs):
  """Shaw attention on `_Inputs` in kernel layout: query [B, H, Qp, D], key/value
  [B, H, Kp, D] (padded to whole tiles, D to `triton_size`), tables [`table_rows`, D] or None,
  int8 mask
  [B|1, H|1, Qp, Kp] or None, int32 scalars [2] (query offset, dropout seed). Returns
  [B, H, Qp, D]."""
  output, _ = _forward(spec, inputs)
  return output


def _shaw_pallas_fwd(spec, inputs):
  output, lse = _forward(spec, inputs)
  return output, (inputs, output, lse)


def _shaw_pallas_bwd(spec, residuals, d_output):
  inputs, output, lse = residuals
  tiling = spec.tiling
  batch, heads, _, head_dim = inputs.query.shape
  block_q, block_k = tiling.block_q, tiling.block_k
  acc_dtype = jnp.promote_types(inputs.value.dtype, jnp.float32)
  residuals = dict(output=output, lse=lse, d_output=d_output.astype(inputs.value.dtype))

  # dq, and per-query-tile partials of the table gradients: grid over query tiles.
  call = _kernel_call(inputs, _query_tiles(tiling), **residuals)
  call.output(
    'd_query',
    inputs.query.shape,
    inputs.query.dtype,
    (None, None, block_q, head_dim),
    sequence_tile_map,
  )
  for name, table in (('d_rel_key', inputs.rel_key), ('d_rel_value', inputs.rel_value)):
    if table is not None:
      call.output(
        name,
        (batch, heads, tiling.num_q_tiles, spec.table_rows, head_dim),
        acc_dtype,
        (None, None, None, spec.table_rows, head_dim),
        lambda b, h, i: (b, h, i, 0, 0),
      )
  grid = (batch, heads, tiling.num_q_tiles)
  d_query, *table_partials = call(_d_query_kernel, grid, name='shaw_backward_dq', spec=spec)
  table_grads = []
  for table in (inputs.rel_key, inputs.rel_value):
    if table is None:
      table_grads.append(None)
    else:  # the tables are shared by every batch, head and query tile
      table_grads.append(jnp.sum(table_partials.pop(0), axis=(0, 1, 2)).astype(table.dtype))

  # dk, dv: grid over key tiles, whole query sequence per program.
  blocking = Blocking(tiling.q_padded, whole_axis, block_k, tile_index)
  call = _kernel_call(inputs, blocking, **residuals)
  for name, like in (('d_key', inputs.key), ('d_value', inputs.value)):
    call.output(name, like.shape, like.dtype, (None, None, block_k, head_dim), sequence_tile_map)
  grid = (batch, heads, tiling.num_k_tiles)
  d_key, d_value = call(_d_key_value_kernel, grid, name='shaw_backward_dkv', spec=spec)
  d_rel_key, d_rel_value = table_grads
  return (_Inputs(d_query, d_key, d_value, d_rel_key, d_rel_value, None, None),)


_shaw_pallas.defvjp(_shaw_pallas_fwd, _shaw_pallas_bwd)


def shaw_attention_pallas(
  query,
  key,
  value,
  rel_key,
  rel_value,
  *,
  mask=None,
  query_offset=None,
  dropout_rate: float = 0.0,
  dropout_rng=None,
  block_sizes=None,
) -> jax.Array:
  """`relpos.attention.shaw_attention(..., implementation='pallas')`, arguments already checked.

  Same contract as `shaw_attention`; `block_sizes` = (block_q, block_k) tiles (default:
  `pallas_common.Tiling.make`'s, which Triton can lower). Dropout draws its keep mask from
  `pallas_common.dropout_keep_hashed` (same distribution as the 'xla' path, different bits).
  """
  batch, q_len, heads, head_dim = query.shape
  kv_len = key.shape[1]
  table = rel_key if rel_key is not None else rel_value
  max_distance = (table.shape[0] - 1) // 2
  # The band tiles' one-hot reductions are [block_q, block_k, table_rows]; k = 0 has none.
  one_hot_columns = 1 if max_distance == 0 else _table_rows(max_distance)
  tiling = Tiling.make(q_len, kv_len, block_sizes, lambda block_q, block_k: one_hot_columns)
  spec = _ShawSpec(tiling, max_distance, float(dropout_rate), head_dim**-0.5)
  table_shape = (spec.table_rows, triton_size(head_dim))
  if query_offset is None:
    query_offset = kv_len - q_len
  # Past these offsets every pair is on one edge either way: clipping keeps the buckets exact
  # and the int32 arithmetic in the kernels far from overflow.
  lowest, highest = -(tiling.q_padded - 1) - max_distance, kv_len - 1 + max_distance
  try:
    query_offset = min(max(operator.index(query_offset), lowest), highest)
  except TypeError:  # traced
    query_offset = jnp.clip(jnp.asarray(query_offset, jnp.int32), lowest, highest)
  seed = dropout_seed(dropout_rng) if spec.dropout_rate > 0.0 else None
  inputs = _Inputs(
    query=to_kernel_layout(query, tiling.q_padded),
    key=to_kernel_layout(key, tiling.kv_padded),
    value=to_kernel_layout(value, tiling.kv_padded),
    rel_key=None if rel_key is None else pad_to(rel_key, table_shape),
    rel_value=None if rel_value is None else pad_to(rel_value, table_shape),
    mask=kernel_mask(mask, batch, heads, q_len, kv_len, tiling.q_padded, tiling.kv_padded),
    scalars=kernel_scalars(query_offset, seed),
  )
  output = _shaw_pallas(spec, inputs)
  return from_kernel_layout(output, q_len, head_dim)
