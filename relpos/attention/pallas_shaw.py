"""Shaw et al. (2018) attention as fused, tiled Pallas kernels (`implementation='pallas'`).

    e_ij = (q_i·k_j + q_i·w^K[r_ij]) / sqrt(d)      z_i = Σ_j p_ij (v_j + w^V[r_ij])
    r_ij = clip(j - pos_i, -k, k) + k               pos_i = query_offset + i

Each term is split into a flash-attention kernel, which never holds a [q_len, kv_len] array,
and per-row tables of 2k+1 buckets, [batch, heads, q_len, rows], which XLA multiplies by the
shared w^K and w^V outside the kernels. The kernels hold no per-bucket work in registers: they
read and write the per-row tables in memory at computed addresses (Triton gathers and scatters
through pointers), so their tiles are flash attention's (64 x 64 by default).

Forward (grid batch × heads × query tiles; loop over key tiles, online softmax):
- XLA first computes qw = q·w^Kᵀ/sqrt(d) [B, q_len, H, rows]; the kernel adds qw[i, r_ij] to
  each logit. A key tile entirely at distance <= -k (>= k) from its queries sees one table row,
  the left (right) edge, so it adds one column of qw to every key (a rank-1 add); only the few
  tiles that cross the band |j - pos_i| < k read qw at each (i, j)'s bucket (a gather).
- The a^V term needs, per row, the dropped probability mass in each bucket,
  P'_ir = Σ_{j: r_ij = r} p'_ij. An interior bucket (-k < j - pos_i < k) holds one key per row,
  so the kernel writes that key's logit (plus log 1/(1 - rate), or "minus infinity" where
  masked or dropped) into a per-row table `bucket_lse` at (i, r_ij) (a scatter; each entry is
  written by exactly one tile). The two edge buckets sum the probabilities of many keys: the
  kernel carries their sums through the online softmax, rescaled like its normaliser, and
  writes their log-sum-exp into columns 0 and 2k at the end. So `bucket_lse[i, r]` is the
  log-sum-exp of the dropped logits in bucket r, and after the kernel XLA forms
  P' = exp(bucket_lse - logsumexp) and adds P'·w^V to the kernel's value term. Entries no key
  reaches (j outside [0, kv_len)) are never written and are masked by position.
Backward (flash-attention-2 style; both kernels recompute p = exp(s - logsumexp) tile by tile,
with delta_i = do_i·o_i from the saved output, and read qw and do·w^Vᵀ like the forward):
- dq kernel, grid over query tiles, loop over key tiles: dq from the keys, and the logit
  gradient ds summed per bucket, `bucket_ds` [B, q_len, H, rows], written as the forward writes
  `bucket_lse` (interior entries scattered, edge sums at the end);
- dk/dv kernel, grid over key tiles, loop over query tiles: dk, dv.
XLA then adds the table terms: dq += ds_bucket·w^K/sqrt(d), d w^K = Σ ds_bucketᵀ·q/sqrt(d),
d w^V = Σ P'ᵀ·do (summed over batch, heads and rows).

Tiles the mask rules out: before the kernels, XLA reads the mask once per tile and gives each
program the first and one past the last tile of the other axis that the mask allows some pair
of (`_tile_ranges`); the loops run over that range only, so a causal mask's future tiles are
never read, and the per-row table entries of skipped keys are masked by position afterwards.
A mask without a query axis (a key-padding mask: an encoder's) stays one row for every query
tile (`pallas_common.kernel_mask`, `mask_rows`). A causal call (`causal=True`) masks j > pos_i
in the kernels and narrows the same ranges by the causal bound, so causal attention over a
keys-only mask (a memory's filled slots) needs no [q_len, kv_len] array at all.

Memory beyond flash attention: per (batch, head), four per-row tables of `rows` floats (qw,
do·w^Vᵀ, P', ds_bucket: rows = 2k+1 rounded up to a multiple of 8); saved for the backward pass:
the output, the per-row logsumexp and P'. Overall O(n·(d + k)), no [q_len, kv_len] array.

Native lowering: on a GPU through Triton (see `pallas_common`), whose arrays in registers must
have power-of-two shapes: head_dim is padded to one. The per-row tables need not be, as no
kernel loads a whole row of them: they have `_table_rows(k)` columns, 2k+1 rounded up to a
multiple of 8 (the extra columns no bucket reaches). The gathers and scatters are Triton loads
and masked stores at computed pointers (`jax.experimental.pallas.triton.store`), which Mosaic
(TPU) does not lower.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

from relpos.attention.masking import MASKED_LOGIT, default_query_offset, table_max_distance
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
  mask_index_map,
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

# Per-row tables' width is rounded up to a multiple of this: 32-byte rows in float32, so XLA's
# matmuls that make and read the tables keep aligned rows.
TABLE_ROW_MULTIPLE = 8


def _table_rows(max_distance: int) -> int:
  """Columns of every per-row table (qw, do·w^Vᵀ, bucket_lse, bucket_ds) and rows of the
  padded w^K, w^V: the 2k+1 buckets, rounded up to TABLE_ROW_MULTIPLE (buckets 0 .. 2k are
  real). Not a power of two: the kernels never hold a whole table row, only the per-pair
  entries they gather and scatter through pointers and the two edge columns, so Triton's
  power-of-two rule (for arrays in registers) does not apply. A power of two, as before, made
  k = 16's tables 64 wide instead of 40 and k = 64's 256 instead of 136."""
  return -(-(2 * max_distance + 1) // TABLE_ROW_MULTIPLE) * TABLE_ROW_MULTIPLE


@dataclasses.dataclass(frozen=True)
class _ShawSpec:
  """Static description of one problem (hashable: a custom_vjp nondiff argument)."""

  tiling: Tiling
  max_distance: int
  dropout_rate: float
  scale: float  # 1/sqrt(d) of the real head_dim (the kernels see it padded)
  causal: bool = False  # key j > pos_i masked by the kernels themselves

  @property
  def table_rows(self) -> int:
    return _table_rows(self.max_distance)


class _BandTile:
  """Bucket geometry of one (query tile, key tile) pair, and its reads and writes of per-row
  tables.

  `first_distance` is j - pos_i of the tile's first query and first key (traced); in the tile,
  distance_ij = first_distance + j' - i' for local indices i', j', bucket r_ij =
  clip(distance_ij, -k, k) + k. A per-row table is a ref whose row `row_start + i'` holds
  query i''s `table_rows` buckets.
  """

  def __init__(self, max_distance: int, first_distance, block_q, block_k, row_start):
    k = max_distance
    self.k, self.shape = k, (block_q, block_k)
    self.first_distance, self.row_start = first_distance, row_start
    lowest, highest = first_distance - (block_q - 1), first_distance + block_k - 1
    # A tile off the band has every pair on one edge: bucket 0 (left) or 2k (right). (Typed
    # constants: JAX 0.10.2's Triton lowering gives a scalar select's weak literals its
    # predicate's type, bool.)
    self.edge_bucket = jnp.where(highest <= -k, jnp.int32(0), jnp.int32(2 * k))
    self.crosses_band = (highest > -k) & (lowest < k)

  def _local(self):
    """(table rows, distance j - pos_i) [block_q, block_k] int32. Built inside the band
    branches only, so that edge tiles keep no per-pair indices in registers."""
    local_query = lax.broadcasted_iota(jnp.int32, self.shape, 0)
    local_key = lax.broadcasted_iota(jnp.int32, self.shape, 1)
    return self.row_start + local_query, self.first_distance + local_key - local_query

  def _bucket(self, distance_QK):
    return jnp.clip(distance_QK, -self.k, self.k) + self.k

  def _by_band(self, band, edge):
    """band() on tiles crossing the band, edge() on the others (k = 0: all on the edge)."""
    return edge() if self.k == 0 else lax.cond(self.crosses_band, band, edge)

  def spread(self, table_ref):
    """`out[i, j] = table[i, r_ij]` [block_q, block_k]: a gather from the table on band tiles,
    one column of it (a per-row constant) on the others."""

    def band():
      rows_QK, distance_QK = self._local()
      return table_ref[rows_QK, self._bucket(distance_QK)]

    def edge():
      column = table_ref[pl.ds(self.row_start, self.shape[0]), pl.ds(self.edge_bucket, 1)]
      return jnp.broadcast_to(column, self.shape)

    return self._by_band(band, edge)

  def store_interior(self, table_ref, x_QK):
    """`table[i, r_ij] = x_ij` for the pairs in interior buckets (-k < j - pos_i < k), which
    hold one key per query: a masked scatter, only on tiles that cross the band."""
    if self.k == 0:  # no interior buckets
      return

    @pl.when(self.crosses_band)
    def _():
      rows_QK, distance_QK = self._local()
      interior = (distance_QK > -self.k) & (distance_QK < self.k)
      pallas_triton.store(table_ref.at[rows_QK, self._bucket(distance_QK)], x_QK, mask=interior)

  def edge_sums(self, x_QK):
    """(Σ_{j: r_ij = 0} x_ij, Σ_{j: r_ij = 2k, j - pos_i >= k} x_ij), [block_q, 1] each."""

    def band():
      _, distance_QK = self._local()
      return tuple(
        jnp.sum(jnp.where(side, x_QK, 0.0), axis=1, keepdims=True)
        for side in (distance_QK <= -self.k, distance_QK >= self.k)
      )

    def edge():
      total = jnp.sum(x_QK, axis=1, keepdims=True)
      left = self.edge_bucket == 0
      return jnp.where(left, total, 0.0), jnp.where(left, 0.0, total)

    return self._by_band(band, edge)


def _store_edges(spec, table_ref, left_Q1, right_Q1):
  """Columns 0 and 2k of a per-row table: the edge buckets (k = 0: column 0 only, the one
  bucket, which `edge_sums` counts as left)."""
  table_ref[:, pl.ds(0, 1)] = left_Q1
  if spec.max_distance > 0:
    table_ref[:, pl.ds(2 * spec.max_distance, 1)] = right_Q1


def _tile(spec, seed, b, h, offset, query_QD, query_start, key_start, key_KD, mask_QK, refs, row):
  """Logits s = e_ij [block_q, block_k], allowed pairs, dropout factor and band geometry of the
  tile whose first query is `query_start` and first key `key_start`; `row` is the tile's first
  row in the per-row table refs."""
  tiling = spec.tiling
  band = _BandTile(
    spec.max_distance, key_start - (offset + query_start), tiling.block_q, tiling.block_k, row
  )
  logits = dot(query_QD, key_KD, transpose_b=True) * spec.scale
  if refs.query_rows is not None:
    logits = logits + band.spread(refs.query_rows)
  query_index = positions(query_start, tiling.block_q, 0)
  key_index = positions(key_start, tiling.block_k, 1)
  allowed, keep_scale = tile_pairs(
    tiling, spec.dropout_rate, seed, b, h, query_index, key_index, mask_QK
  )
  if spec.causal:
    allowed = allowed & (key_index <= offset + query_index)
  return logits, allowed, keep_scale, band


def _tile_grads(spec, seed, b, h, offset, query_tile, key_tile, mask_QK, refs, row):
  """The backward pass of one tile: (band, dropped probabilities p', logit gradient ds).

  query_tile: (query_start, query [block_q, D], do, logsumexp, delta);
  key_tile: (key_start, key, value [block_k, D]).
  """
  query_start, query, d_output, lse, delta = query_tile
  key_start, key, value = key_tile
  logits, allowed, keep_scale, band = _tile(
    spec, seed, b, h, offset, query, query_start, key_start, key, mask_QK, refs, row
  )
  d_dropped = dot(d_output, value, transpose_b=True)
  if refs.d_output_rows is not None:  # dp'_ij = do_i·(v_j + w^V[r_ij])
    d_dropped = d_dropped + band.spread(refs.d_output_rows)
  dropped, d_logits = softmax_grads(logits, allowed, lse, d_dropped, delta, keep_scale)
  return band, dropped, d_logits


def _tile_loop(refs, num_tiles):
  """(first, stop) of a kernel's loop over the other axis's tiles: those some pair of which the
  mask and the causal bound allow (`refs.tile_range`, `_tile_ranges`), or all without
  either."""
  if refs.tile_range is None:
    return 0, num_tiles
  return refs.tile_range[0], refs.tile_range[1]


def _forward_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, query_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  offset, seed = read_scalars(refs.scalars)
  query = refs.query[...]  # [block_q, D]
  query_start = query_tile * block_q
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)
  log_keep_scale = -math.log1p(-spec.dropout_rate)

  def body(key_tile, carry):
    max_Q1, norm_Q1, out_QD, left_Q1, right_Q1 = carry
    key_start = key_tile * block_k
    value = refs.value[pl.ds(key_start, block_k), :]
    mask = (
      None if refs.mask is None else mask_rows(refs.mask, slice(None), pl.ds(key_start, block_k))
    )
    logits, allowed, keep_scale, band = _tile(
      spec,
      seed,
      b,
      h,
      offset,
      query,
      query_start,
      key_start,
      refs.key[pl.ds(key_start, block_k), :],
      mask,
      refs,
      0,
    )
    max_Q1, norm_Q1, probs, correction = online_softmax_step(max_Q1, norm_Q1, logits, allowed)
    dropped = probs if keep_scale is None else probs * keep_scale
    out_QD = out_QD * correction + dot(dropped.astype(value.dtype), value)
    if refs.bucket_lse is not None:  # the a^V term's bucket weights (module docstring)
      kept = allowed if keep_scale is None else allowed & (keep_scale > 0.0)
      band.store_interior(refs.bucket_lse, jnp.where(kept, logits + log_keep_scale, MASKED_LOGIT))
      left, right = band.edge_sums(dropped)
      left_Q1, right_Q1 = left_Q1 * correction + left, right_Q1 * correction + right
    return max_Q1, norm_Q1, out_QD, left_Q1, right_Q1

  max_Q1, norm_Q1 = init_softmax(block_q, acc_dtype)
  zeros_Q1 = jnp.zeros((block_q, 1), acc_dtype)
  max_Q1, norm_Q1, out_QD, left_Q1, right_Q1 = lax.fori_loop(
    *_tile_loop(refs, tiling.num_k_tiles),
    body,
    (max_Q1, norm_Q1, jnp.zeros(query.shape, acc_dtype), zeros_Q1, zeros_Q1),
  )
  inverse_norm, lse = finish_softmax(max_Q1, norm_Q1)
  refs.output[...] = (out_QD * inverse_norm).astype(refs.output.dtype)
  refs.lse[...] = lse
  if refs.bucket_lse is not None:

    def log_mass(sum_Q1):  # log-sum-exp of a bucket's dropped logits (MASKED_LOGIT if empty)
      filled = sum_Q1 > 0.0
      return jnp.where(filled, max_Q1 + jnp.log(jnp.where(filled, sum_Q1, 1.0)), MASKED_LOGIT)

    _store_edges(spec, refs.bucket_lse, log_mass(left_Q1), log_mass(right_Q1))


def _d_query_kernel(refs, *, spec):
  tiling = spec.tiling
  block_q, block_k = tiling.block_q, tiling.block_k
  b, h, query_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  offset, seed = read_scalars(refs.scalars)
  query = refs.query[...]
  query_tile_data = (query_tile * block_q, query, *query_residuals(refs, ...))
  acc_dtype = jnp.promote_types(refs.value.dtype, jnp.float32)

  def body(key_tile, carry):
    d_query_QD, left_Q1, right_Q1 = carry
    key_start = key_tile * block_k
    keys = pl.ds(key_start, block_k)
    key = refs.key[keys, :]
    mask = None if refs.mask is None else mask_rows(refs.mask, slice(None), keys)
    band, _, d_logits = _tile_grads(
      spec,
      seed,
      b,
      h,
      offset,
      query_tile_data,
      (key_start, key, refs.value[keys, :]),
      mask,
      refs,
      0,
    )
    d_query_QD = d_query_QD + dot(d_logits.astype(key.dtype), key)
    if refs.bucket_ds is not None:  # ds summed per bucket, for the a^K term (module docstring)
      band.store_interior(refs.bucket_ds, d_logits)
      left, right = band.edge_sums(d_logits)
      left_Q1, right_Q1 = left_Q1 + left, right_Q1 + right
    return d_query_QD, left_Q1, right_Q1

  zeros_Q1 = jnp.zeros((block_q, 1), acc_dtype)
  d_query, left_Q1, right_Q1 = lax.fori_loop(
    *_tile_loop(refs, tiling.num_k_tiles),
    body,
    (jnp.zeros(query.shape, acc_dtype), zeros_Q1, zeros_Q1),
  )
  refs.d_query[...] = (d_query * spec.scale).astype(refs.d_query.dtype)
  if refs.bucket_ds is not None:
    _store_edges(spec, refs.bucket_ds, left_Q1, right_Q1)


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
    rows = (pl.ds(query_start, block_q), slice(None))
    query = refs.query[rows]
    d_output, lse, delta = query_residuals(refs, rows)
    mask = None if refs.mask is None else mask_rows(refs.mask, rows[0])
    _, dropped, d_logits = _tile_grads(
      spec,
      seed,
      b,
      h,
      offset,
      (query_start, query, d_output, lse, delta),
      (key_start, key, value),
      mask,
      refs,
      query_start,
    )
    d_value_KD = d_value_KD + dot(dropped.astype(d_output.dtype), d_output, transpose_a=True)
    d_key_KD = d_key_KD + dot(d_logits.astype(query.dtype), query, transpose_a=True)
    return d_key_KD, d_value_KD

  zeros = jnp.zeros(key.shape, acc_dtype)
  d_key, d_value = lax.fori_loop(*_tile_loop(refs, tiling.num_q_tiles), body, (zeros, zeros))
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


def _tile_ranges(mask, tiling, causal_offset=None):
  """Which tiles the kernels visit: per query tile, the first and one past the last key tile
  that the mask (None: every pair) and, given `causal_offset` (the query offset of a causal
  call), the causal bound allow some pair of; per key tile the same range of query tiles.
  int32 [B|1, H|1, num_q_tiles, 2] and [B|1, H|1, num_k_tiles, 2] ([0, 0) where none is
  allowed). Tiles outside the range are never read: under a causal mask, the tiles wholly in a
  query tile's future (about half). Tiles masked whole inside the range are still visited.
  """
  if mask is None:
    allows_QK = jnp.ones((1, 1, tiling.num_q_tiles, tiling.num_k_tiles), bool)
  else:
    batch, heads, query_rows = mask.shape[:3]
    if query_rows == 1:  # one row for every query (kernel_mask, keys only)
      tile_shape = (1, 1, tiling.num_k_tiles, tiling.block_k)
    else:
      tile_shape = (tiling.num_q_tiles, tiling.block_q, tiling.num_k_tiles, tiling.block_k)
    allows_QK = jnp.max(mask.reshape(batch, heads, *tile_shape), axis=(3, 5)) != 0
  if causal_offset is not None:  # a tile's first key at or before its last query's position
    last_query = (jnp.arange(tiling.num_q_tiles, dtype=jnp.int32) + 1) * tiling.block_q - 1
    first_key = jnp.arange(tiling.num_k_tiles, dtype=jnp.int32) * tiling.block_k
    allows_QK = allows_QK & (first_key[None, :] <= causal_offset + last_query[:, None])
  shape = (*allows_QK.shape[:2], tiling.num_q_tiles, tiling.num_k_tiles)
  allows_QK = jnp.broadcast_to(allows_QK, shape)

  def ranges(allows):  # [..., tiles] -> [..., 2]
    index = jnp.arange(allows.shape[-1], dtype=jnp.int32)
    stop = jnp.max(jnp.where(allows, index + 1, 0), axis=-1)
    first = jnp.minimum(jnp.min(jnp.where(allows, index, allows.shape[-1]), axis=-1), stop)
    return jnp.stack([first, stop], axis=-1)

  return ranges(allows_QK), ranges(jnp.swapaxes(allows_QK, 2, 3))


def _kernel_call(spec, inputs, blocking, row_tables, tile_range=None, **residuals):
  """A `KernelCall` with every input (and the backward pass's residuals) blocked as
  `blocking` says, per-row tables (`row_tables`: name -> [B, Qp, H, rows] or None) by query
  rows like the query, and `tile_range` (one of `_tile_ranges`, or None) by the program's
  tile."""
  call = KernelCall(
    spec.tiling,
    optional=('mask', 'tile_range', 'query_rows', 'd_output_rows', 'bucket_lse', 'bucket_ds'),
  )
  if tile_range is not None:
    index = mask_index_map(tile_range, lambda b, h, i: (b, h, i, 0))
    call.input('tile_range', tile_range, (None, None, None, 2), index)
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
  for name, table in row_tables.items():
    call.input(name, table, *_row_table_block(spec, blocking))
  return call


def _row_table_block(spec, blocking):
  """Block shape and index map of a per-row table [B, Qp, H, rows] read by `blocking`'s
  query rows: in the layout of the queries (`pallas_common`, Layout), so that XLA makes and
  reads the tables with plain matmuls against w^K and w^V, no transpose."""
  return (
    sequence_block(blocking.query_block, spec.table_rows),
    lambda b, h, i: (b, blocking.query_index(i), h, 0),
  )


def _query_tiles(tiling):
  """Programs over query tiles reading whole key sequences (forward, dq)."""
  return Blocking(tiling.block_q, tile_index, tiling.kv_padded, whole_axis)


def _table_dot(x_BQHR, table_RD, acc_dtype):
  """x·table [B, Qp, H, D] in `acc_dtype` (XLA, outside the kernels)."""
  return jnp.einsum('bqhr,rd->bqhd', x_BQHR, table_RD, preferred_element_type=acc_dtype)


def _row_table(x_BQHD, table_RD, acc_dtype):
  """x·tableᵀ [B, Qp, H, rows] in `acc_dtype`: qw (times 1/sqrt(d)) and do·w^Vᵀ."""
  return jnp.einsum('bqhd,rd->bqhr', x_BQHD, table_RD, preferred_element_type=acc_dtype)


def _row_tables(spec, inputs, acc_dtype, d_output=None) -> dict:
  """The per-row tables the kernels read: qw = q·w^Kᵀ/sqrt(d) ('query_rows') and, given do,
  do·w^Vᵀ ('d_output_rows'), each where its table exists."""
  tables = {}
  if inputs.rel_key is not None:
    tables['query_rows'] = _row_table(inputs.query, inputs.rel_key, acc_dtype) * spec.scale
  if d_output is not None and inputs.rel_value is not None:
    tables['d_output_rows'] = _row_table(d_output, inputs.rel_value, acc_dtype)
  return tables


def _written(spec, query_offset, key_tiles):
  """bool [B|1, Qp, H|1, rows]: the per-row table entries the kernels write. Interior bucket r
  of row i is key j = pos_i + r - k, written when 0 <= j < kv_len and j's tile is in the row's
  range of visited key tiles (`key_tiles`, or all if None); the edge buckets always."""
  tiling, k = spec.tiling, spec.max_distance
  row = jnp.arange(tiling.q_padded, dtype=jnp.int32)[:, None, None]  # [Qp, 1, 1]
  bucket = jnp.arange(spec.table_rows, dtype=jnp.int32)[None, None, :]  # [1, 1, rows]
  key = query_offset + row + bucket - k
  interior = (bucket > 0) & (bucket < 2 * k) & (key >= 0) & (key < tiling.kv_len)
  if key_tiles is not None:  # [B|1, H|1, q tiles, 2] -> per row [B|1, Qp, H|1, 1]
    first, stop = (
      jnp.swapaxes(jnp.repeat(key_tiles[..., end, None], tiling.block_q, axis=2), 1, 2)
      for end in (0, 1)
    )
    key_tile = key // tiling.block_k
    interior = interior & (key_tile >= first) & (key_tile < stop)
  return interior | (bucket == 0) | (bucket == 2 * k)


def _forward(spec, inputs, tile_ranges):
  """Output [B, Qp, H, D], logsumexp [B, H, Qp, 1] and the a^V term's bucket weights P'
  [B, Qp, H, rows] (None without w^V). `tile_ranges`: `_tile_ranges` of the mask, or None."""
  tiling = spec.tiling
  batch, _, heads, _ = inputs.query.shape
  acc_dtype = jnp.promote_types(inputs.value.dtype, jnp.float32)
  key_tiles = None if tile_ranges is None else tile_ranges[0]
  query_tiles = _query_tiles(tiling)
  call = _kernel_call(spec, inputs, query_tiles, _row_tables(spec, inputs, acc_dtype), key_tiles)
  with_values = inputs.rel_value is not None
  # With w^V, XLA adds P'·w^V to the kernel's output: the kernel's stays in float32 till then.
  add_forward_outputs(
    call, inputs.query, acc_dtype if with_values else inputs.value.dtype, tiling.block_q
  )
  if with_values:
    shape = (batch, tiling.q_padded, heads, spec.table_rows)
    call.output('bucket_lse', shape, acc_dtype, *_row_table_block(spec, query_tiles))
  grid = (batch, heads, tiling.num_q_tiles)
  output, lse, *bucket_lse = call(_forward_kernel, grid, name='shaw_forward', spec=spec)
  if not with_values:
    return output, lse, None
  written = _written(spec, inputs.scalars[0], key_tiles)
  bucket_probs = jnp.where(written, jnp.exp(bucket_lse[0] - jnp.swapaxes(lse, 1, 2)), 0.0)
  output = output + _table_dot(bucket_probs, inputs.rel_value, acc_dtype)
  return output.astype(inputs.value.dtype), lse, bucket_probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _shaw_pallas(spec, inputs):
  """Shaw attention on `_Inputs` in kernel layout: query [B, Qp, H, D], key/value
  [B, Kp, H, D] (padded to whole tiles, D to `triton_size`), tables [`table_rows`, D] or None,
  int8 mask [B|1, H|1, Qp or 1, Kp] or None, int32 scalars [2] (query offset, dropout seed).
  Returns [B, Qp, H, D]."""
  output, _, _ = _forward(spec, inputs, _mask_tile_ranges(spec, inputs))
  return output


def _mask_tile_ranges(spec, inputs):
  """`_tile_ranges` of the inputs' mask and causal bound (None without either): one read of
  the mask per call, its result saved for the backward pass."""
  if inputs.mask is None and not spec.causal:
    return None
  causal_offset = inputs.scalars[0] if spec.causal else None
  return _tile_ranges(inputs.mask, spec.tiling, causal_offset)


def _shaw_pallas_fwd(spec, inputs):
  tile_ranges = _mask_tile_ranges(spec, inputs)
  output, lse, bucket_probs = _forward(spec, inputs, tile_ranges)
  return output, (inputs, output, lse, bucket_probs, tile_ranges)


def _shaw_pallas_bwd(spec, residuals, d_output):
  inputs, output, lse, bucket_probs, tile_ranges = residuals
  tiling = spec.tiling
  batch, _, heads, head_dim = inputs.query.shape
  block_k = tiling.block_k
  acc_dtype = jnp.promote_types(inputs.value.dtype, jnp.float32)
  d_output = d_output.astype(inputs.value.dtype)
  residuals = dict(output=output, lse=lse, d_output=d_output)
  row_tables = _row_tables(spec, inputs, acc_dtype, d_output)
  key_tiles, query_tile_range = (None, None) if tile_ranges is None else tile_ranges

  # dq and the per-bucket sums of ds: grid over query tiles.
  query_tiles = _query_tiles(tiling)
  call = _kernel_call(spec, inputs, query_tiles, row_tables, key_tiles, **residuals)
  with_keys = inputs.rel_key is not None
  call.output(
    'd_query',
    inputs.query.shape,
    acc_dtype if with_keys else inputs.query.dtype,
    sequence_block(tiling.block_q, head_dim),
    sequence_tile_map,
  )
  if with_keys:
    shape = (batch, tiling.q_padded, heads, spec.table_rows)
    call.output('bucket_ds', shape, acc_dtype, *_row_table_block(spec, query_tiles))
  grid = (batch, heads, tiling.num_q_tiles)
  d_query, *bucket_ds = call(_d_query_kernel, grid, name='shaw_backward_dq', spec=spec)
  d_rel_key = d_rel_value = None
  if with_keys:
    bucket_ds = jnp.where(_written(spec, inputs.scalars[0], key_tiles), bucket_ds[0], 0.0)
    d_query = d_query + _table_dot(bucket_ds, inputs.rel_key, acc_dtype) * spec.scale
    d_query = d_query.astype(inputs.query.dtype)
    d_rel_key = jnp.einsum(
      'bqhr,bqhd->rd', bucket_ds, inputs.query, preferred_element_type=acc_dtype
    )
    d_rel_key = (d_rel_key * spec.scale).astype(inputs.rel_key.dtype)
  if bucket_probs is not None:
    d_rel_value = jnp.einsum(
      'bqhr,bqhd->rd', bucket_probs, d_output, preferred_element_type=acc_dtype
    ).astype(inputs.rel_value.dtype)

  # dk, dv: grid over key tiles, whole query sequence per program.
  blocking = Blocking(tiling.q_padded, whole_axis, block_k, tile_index)
  call = _kernel_call(spec, inputs, blocking, row_tables, query_tile_range, **residuals)
  for name, like in (('d_key', inputs.key), ('d_value', inputs.value)):
    call.output(name, like.shape, like.dtype, sequence_block(block_k, head_dim), sequence_tile_map)
  grid = (batch, heads, tiling.num_k_tiles)
  d_key, d_value = call(_d_key_value_kernel, grid, name='shaw_backward_dkv', spec=spec)
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
  causal: bool = False,
  query_offset=None,
  dropout_rate: float = 0.0,
  dropout_rng=None,
  block_sizes=None,
) -> jax.Array:
  """`relpos.attention.shaw_attention(..., implementation='pallas')`, arguments already checked.

  Same contract as `shaw_attention`; `block_sizes` = (block_q, block_k) tiles (default:
  `pallas_common.Tiling.make`'s). Dropout draws its keep mask from
  `pallas_common.dropout_keep_hashed` (same distribution as the 'xla' path, different bits).
  """
  batch, q_len, heads, head_dim = query.shape
  kv_len = key.shape[1]
  max_distance = table_max_distance(rel_key, rel_value)
  tiling = Tiling.make(q_len, kv_len, block_sizes)
  spec = _ShawSpec(tiling, max_distance, float(dropout_rate), head_dim**-0.5, bool(causal))
  table_shape = (spec.table_rows, triton_size(head_dim))
  if query_offset is None:
    query_offset = default_query_offset(q_len, kv_len)
  # Past these offsets every pair is on one edge either way, and every key is in every query's
  # future (or past): clipping keeps the buckets and the causal bound exact and the int32
  # arithmetic in the kernels far from overflow.
  lowest, highest = -tiling.q_padded - max_distance, kv_len - 1 + max_distance
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
