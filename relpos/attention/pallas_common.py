"""What the fused Pallas kernels for Shaw et al. and Transformer-XL attention share.

`relpos.attention.pallas_shaw` and `relpos.attention.pallas_xl` are flash-attention style
kernels (`jax.experimental.pallas`): a grid over (batch, heads, query tiles) or (batch, heads,
key tiles), a loop over the other axis's tiles inside each program, an online softmax, and
never a [q_len, kv_len] array in memory. This module holds the parts both use, one of each:

- the tiling of the sequence axes (`Tiling`), the kernel layout (`to_kernel_layout`,
  `triton_size`), and the mask as int8 tiles (`kernel_mask`);
- a small kernel-call builder that names refs (`KernelCall`), so kernels read `refs.query`,
  and runs them as each platform needs (Triton on GPU, Mosaic on TPU, interpreted elsewhere),
  and the blocking of the inputs both kernels share (`Blocking`, `add_sequence_inputs`);
- in-kernel maths: float32 matmuls (`dot`), the online-softmax step (`online_softmax_step`,
  `finish_softmax`), the recomputed probabilities and logit gradients of the backward pass
  (`softmax_grads`), and which (query, key) pairs of a tile may attend (`tile_pairs`);
- attention dropout from a stateless counter-based hash (`dropout_keep_hashed`), because a
  fused kernel cannot materialise `jax.random.bernoulli` over [batch, heads, q_len, kv_len].

Dropout. Every kept/dropped decision is `hash(seed, b, h, i, j) >= rate·2^32` for batch b, head
h, query i and key j (global indices), where the hash chains the murmur3 32-bit finaliser over
the four indices (`relpos.counter_hash`: uint32 multiply, xor and shift only, so it runs in any
kernel language) and the seed is 32 random bits drawn from `dropout_rng` (`dropout_seed`). The
same function is evaluated on each tile inside the kernels and, materialised, by
`dropout_keep_hashed` (for tests and references). Semantics are `masking.attention_dropout`'s:
p' = p·keep/(1 - rate) with keep probability 1 - rate (up to the 2^-32 rounding of the
threshold), but the bits differ from the 'xla' implementation's `jax.random.bernoulli` draw:
same distribution, different masks.

Layout. The kernels read queries, keys, values, outputs and their gradients in the models'
own layout, [batch, length, heads, dim]: a program's block is (None, rows, None, dim), one
head's rows, which Triton loads with a stride of heads·dim between rows (as JAX's own Pallas
flash attention does). The wrappers only pad, on the right: the length to whole tiles and dim
to a power of two, where they are not already (XL: to at least one window), so at the
models' usual shapes no transpose into or out of the kernels is left for XLA to copy. The
logsumexp is [batch, heads, length, 1]; Shaw's per-row tables are in the queries' layout,
[batch, length, heads, rows] (`pallas_shaw`).

Native lowering. On a GPU the kernels compile through Triton and run. `KernelCall` picks the
lowering per platform with `lax.platform_dependent` (at lowering time, so `jax.export` for
another platform takes that platform's branch): Triton on GPU
(`jax.experimental.pallas.triton.CompilerParams`; JAX 0.10.2's default GPU lowering, Mosaic
GPU, rejects these kernels: its async copies need multiples of 128 bytes and <= 256 elements
per dimension), Mosaic on TPU, interpreted elsewhere. For Triton the wrappers pad head_dim and
XL's window of block_q + block_k - 1 distances to powers of two >= 16 (`triton_size`; zeros,
exact): Triton's blocks and dots need powers of two, dots >= 16. Shaw's 2k+1 buckets are
padded only to a multiple of 8 (`pallas_shaw._table_rows`): its kernels gather and scatter
table entries through pointers and never hold a whole table row. Given `block_sizes` must be
powers of two >= 16 too (others fail to lower).

What was measured, and how (docs/gpu.md has the figures):
- On an NVIDIA H200 (jax 0.11.2) the first design of both kernels passed the float64-reference
  tests natively (tests/test_pallas.py -k pallas_native) and was 6-21x slower than the 'xla'
  kernels: its per-distance lookups were one-hot reductions in registers at 32 x 32 tiles, and
  compiled for sm_90a they spilled 13-50 KB per thread. Shaw's kernels were then rewritten
  to gather from and scatter into per-row tables in memory (`pallas_shaw`), with 64 x 64 tiles;
  compiled the same way (`benchmarks/triton_compile.py`: pip's Triton 3.9 and its ptxas) they
  spill at most 704 bytes per thread; XL's now read their skewed columns with a register
  gather (`pallas_gather`) and spill at most 532. Neither rewrite has run on a GPU yet.
- Lowering for 'cuda' (`jax.export`, no GPU needed): forward and gradient of both kernels,
  float32 and bfloat16, with mask, dropout and memory (Shaw: a query offset), at realistic and
  ragged sizes (tests/test_pallas.py::test_pallas_lowers_for_cuda_with_triton).
- 'tpu': never run. Under an abstract TPU v5p mesh the first design's forward kernels passed
  Pallas's Mosaic lowering; Shaw's gathers and masked scatters at computed addresses, and
  XL's register gathers, are Triton operations, which Mosaic does not lower.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

from relpos import counter_hash
from relpos.attention.masking import MASKED_LOGIT, accumulation_dtype

SCALARS_BLOCK = ((2,), lambda *grid: (0,))  # block shape and index map of the scalars input

# Largest default tile along a sequence axis (capped by length). Not 128: Shaw at k = 0 with
# 128 x 128 float32 tiles compiled (pip's Triton 3.9, sm_90a) to 256 KiB of shared memory, over
# an H100's 227 KiB per block; at 64 x 64 the kernels took at most about 140 KiB.
DEFAULT_BLOCK = 64
MIN_TRITON_DIM = 16  # Triton's smallest dot dimension (tl.dot needs M, N, K >= 16)


def triton_size(n: int) -> int:
  """n rounded up to a power of two, at least MIN_TRITON_DIM: a size Triton accepts for every
  block, tile and dot dimension. The wrappers pad head_dim and XL's distance window to it with
  zeros (exact: zero rows and columns add nothing to any product); Shaw's table rows are
  padded to a multiple of 8 instead (`pallas_shaw._table_rows`)."""
  return max(MIN_TRITON_DIM, 1 << (max(n, 1) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class Tiling:
  """Tiles of the query and key axes: q_len (kv_len) real positions in whole tiles of
  block_q (block_k); the tail of the last tile is padding, masked inside the kernels."""

  q_len: int
  kv_len: int
  block_q: int
  block_k: int

  @classmethod
  def make(
    cls, q_len: int, kv_len: int, block_sizes=None, default_block: int = DEFAULT_BLOCK
  ) -> Tiling:
    """`block_sizes` (block_q, block_k), or by default min(default_block, `triton_size(length)`)
    per axis (powers of two >= 16, which Triton can lower). Given block sizes are kept as they
    are: any positive sizes run interpreted; Triton needs powers of two >= 16.
    """
    if block_sizes is None:
      block_sizes = tuple(min(default_block, triton_size(n)) for n in (q_len, kv_len))
    block_q, block_k = (int(b) for b in block_sizes)
    if block_q < 1 or block_k < 1:
      raise ValueError(f'block_sizes must be two positive ints, got {block_sizes}')
    return cls(q_len, kv_len, block_q, block_k)

  @property
  def num_q_tiles(self) -> int:
    return -(-self.q_len // self.block_q)

  @property
  def num_k_tiles(self) -> int:
    return -(-self.kv_len // self.block_k)

  @property
  def q_padded(self) -> int:
    return self.num_q_tiles * self.block_q

  @property
  def kv_padded(self) -> int:
    return self.num_k_tiles * self.block_k


def triton_warps(tiling: Tiling) -> int:
  """Warps per Triton program: 4 for tiles of up to 64 x 64 pairs, 8 above. Compiled for
  sm_90a (`benchmarks/triton_compile.py`; bf16, k = 16), Shaw's kernels at 128 x 64 spill
  1.0-1.3 KB per thread with 4 warps and at most 44 bytes with 8."""
  return 4 if tiling.block_q * tiling.block_k <= DEFAULT_BLOCK**2 else 8


def pad_to(x, shape):
  """x padded with trailing zeros along every axis up to `shape`."""
  return jnp.pad(x, [(0, size - n) for n, size in zip(x.shape, shape, strict=True)])


def to_kernel_layout(x_BLHD, total_len: int):
  """[batch, len, heads, dim] -> [batch, total_len, heads, triton_size(dim)]: x, then zeros up
  to total_len; dim padded with zeros (module docstring, Layout). No copy where nothing is
  padded."""
  right = total_len - x_BLHD.shape[1]
  extra_dims = triton_size(x_BLHD.shape[3]) - x_BLHD.shape[3]
  if right == extra_dims == 0:
    return x_BLHD
  return jnp.pad(x_BLHD, ((0, 0), (0, right), (0, 0), (0, extra_dims)))


def from_kernel_layout(x_BLHD, length: int, head_dim: int):
  """Inverse of `to_kernel_layout`: [batch, length, heads, head_dim]."""
  if x_BLHD.shape[1] == length and x_BLHD.shape[3] == head_dim:
    return x_BLHD
  return x_BLHD[:, :length, :, :head_dim]


def kernel_mask(mask, batch: int, heads: int, q_len: int, kv_len: int, q_total, kv_total):
  """The bool mask (broadcastable to [batch, heads, q_len, kv_len]) as int8 [batch or 1, heads
  or 1, q_total or 1, kv_total], False (0) in the padding. None stays None. Batch and head axes
  of size 1 stay 1 (`mask_index_map`), and so does a missing or size-1 query axis (keys only,
  e.g. [kv_len], a key-padding [batch, 1, 1, kv_len]): one row that every query tile reads
  (`mask_rows`), O(kv_len) memory instead of a [q_len, kv_len] copy per batch and head."""
  if mask is None:
    return None
  mask = jnp.asarray(mask, jnp.bool_)
  mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  one_row = mask.shape[2] == 1
  mask = jnp.broadcast_to(mask, mask.shape[:2] + (1 if one_row else q_len, kv_len))
  if mask.shape[0] not in (1, batch) or mask.shape[1] not in (1, heads):
    raise ValueError(f'mask {mask.shape} does not broadcast to {(batch, heads, q_len, kv_len)}')
  query_pad = 0 if one_row else q_total - q_len
  mask = jnp.pad(mask, ((0, 0), (0, 0), (0, query_pad), (0, kv_total - kv_len)))
  return mask.astype(jnp.int8)


def mask_rows(mask_ref, rows, columns=slice(None)):
  """The mask tile of query `rows` (and key `columns`) from a kernel's mask block: a one-row
  mask (`kernel_mask`, keys only) gives its one row, [1, columns], which broadcasts
  against the tile."""
  if mask_ref.shape[0] == 1:
    return mask_ref[pl.ds(0, 1), columns]
  return mask_ref[rows, columns]


def mask_index_map(mask_BHQK, index_map):
  """`index_map` (grid -> (b, h, q block, k block)) with b, h pinned to 0 where the mask has a
  single batch / head."""
  single_batch, single_head = mask_BHQK.shape[0] == 1, mask_BHQK.shape[1] == 1

  def mapped(*grid):
    b, h, q, k = index_map(*grid)
    return (0 if single_batch else b, 0 if single_head else h, q, k)

  return mapped


# How `pl.pallas_call` runs on each platform, chosen when lowering (`lax.platform_dependent`;
# a Python test of `jax.default_backend()` would miss `jax.export` for another platform):
# Triton on GPU, Mosaic on TPU, interpreted everywhere else (CPU).
_MOSAIC_TPU = dict(interpret=False, compiler_params=None)
_INTERPRETED = dict(interpret=True, compiler_params=None)


class KernelCall:
  """Named inputs and outputs of one `pl.pallas_call`; the kernel body gets one namespace of
  refs (`refs.query`, ...; optional inputs that were not added read as None)."""

  def __init__(self, tiling, optional=()):
    self._names, self._arrays, self._specs = [], [], []
    self._out_names, self._out_shapes, self._out_specs = [], [], []
    self._optional = tuple(optional)
    self._triton = dict(
      interpret=False, compiler_params=pallas_triton.CompilerParams(num_warps=triton_warps(tiling))
    )

  def input(self, name, array, block_shape, index_map):
    if array is not None:
      self._names.append(name)
      self._arrays.append(array)
      self._specs.append(pl.BlockSpec(block_shape, index_map))

  def output(self, name, shape, dtype, block_shape, index_map):
    self._out_names.append(name)
    self._out_shapes.append(jax.ShapeDtypeStruct(shape, dtype))
    self._out_specs.append(pl.BlockSpec(block_shape, index_map))

  def __call__(self, body, grid, *, name: str, **static):
    """Runs `body(refs, **static)` over `grid` (Triton on GPU, Mosaic on TPU, interpreted
    elsewhere); returns the outputs in the order added."""
    names = self._names + self._out_names
    optional = self._optional

    def kernel(*refs):
      named = dict.fromkeys(optional)
      named.update(zip(names, refs, strict=True))
      body(types.SimpleNamespace(**named), **static)

    def lowered_as(mode):
      return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=self._specs,
        out_specs=self._out_specs,
        out_shape=self._out_shapes,
        name=name,
        **mode,
      )

    return lax.platform_dependent(
      *self._arrays,
      cuda=lowered_as(self._triton),
      rocm=lowered_as(self._triton),
      tpu=lowered_as(_MOSAIC_TPU),
      default=lowered_as(_INTERPRETED),
    )


@dataclasses.dataclass(frozen=True)
class Blocking:
  """The rows of the query and key axes one program reads: block sizes, and block indices as
  functions of the program's tile index (grid axis 2; axes 0 and 1 are batch and head)."""

  query_block: int
  query_index: Callable[[Any], Any]
  key_block: int
  key_index: Callable[[Any], Any]


def tile_index(tile):
  """Block index of a program's own tile."""
  return tile


def whole_axis(tile):
  """Block index of a block spanning the whole axis."""
  del tile
  return 0


def add_sequence_inputs(
  call, blocking, *, scalars, query, key, value, mask, output=None, lse=None, d_output=None
):
  """The inputs every kernel reads, in kernel layout, blocked as `blocking` says: scalars;
  query (and the backward pass's output, logsumexp, output cotangent) by query rows; key and
  value by key rows; the mask by both. None inputs are left out."""
  head_dim = query.shape[-1]

  def rows(index):  # [B, L, H, D] arrays: rows index(tile) of batch b, head h
    return lambda b, h, i: (b, index(i), h, 0)

  def head_rows(index):  # [B, H, L, .] arrays (per-row values)
    return lambda b, h, i: (b, h, index(i), 0)

  call.input('scalars', scalars, *SCALARS_BLOCK)
  query_rows = rows(blocking.query_index)
  for name, array in (('query', query), ('output', output), ('d_output', d_output)):
    call.input(name, array, sequence_block(blocking.query_block, head_dim), query_rows)
  call.input('lse', lse, (None, None, blocking.query_block, 1), head_rows(blocking.query_index))
  for name, array in (('key', key), ('value', value)):
    call.input(name, array, sequence_block(blocking.key_block, head_dim), rows(blocking.key_index))
  if mask is not None:
    if mask.shape[2] == 1:  # one row for every query (`kernel_mask`, keys only)
      index = lambda b, h, i: (b, h, 0, blocking.key_index(i))  # noqa: E731
      block = (None, None, 1, blocking.key_block)
    else:
      index = lambda b, h, i: (b, h, blocking.query_index(i), blocking.key_index(i))  # noqa: E731
      block = (None, None, blocking.query_block, blocking.key_block)
    call.input('mask', mask, block, mask_index_map(mask, index))


# ------------------------------------------------------------------------------------------
# In-kernel maths. Tiles are 2-D: [block_q, block_k] per (query tile, key tile) pair, per-row
# values as [block_q, 1] columns.


def dot(a, b, *, transpose_a=False, transpose_b=False):
  """a @ b (aᵀ, bᵀ as asked) accumulated in `accumulation_dtype` (float32 for bf16)."""
  operand = jnp.promote_types(a.dtype, b.dtype)
  dimensions = (((0 if transpose_a else 1,), (1 if transpose_b else 0,)), ((), ()))
  return lax.dot_general(
    a.astype(operand),
    b.astype(operand),
    dimensions,
    preferred_element_type=accumulation_dtype(operand),
  )


def positions(start, size: int, axis: int):
  """int32 `start + iota` along `axis` of a [size, 1] (axis 0) or [1, size] (axis 1) array."""
  shape = (size, 1) if axis == 0 else (1, size)
  return start + lax.broadcasted_iota(jnp.int32, shape, axis)


def tile_pairs(tiling, dropout_rate, seed, b, h, query_index, key_index, mask_tile=None):
  """Which (query, key) pairs of a tile may attend, and their dropout factor.

  Args:
    tiling: the `Tiling` (its q_len, kv_len say which indices are real, not padding).
    dropout_rate: static float; 0 means no dropout.
    seed, b, h: dropout seed (uint32), batch and head of the program.
    query_index, key_index: global int32 indices, broadcasting to the tile ([block_q, 1] and
      [1, block_k], or any broadcastable pair).
    mask_tile: the int8 user mask on the tile, or None.
  Returns:
    allowed (bool, the tile's shape): real query, real key and the mask allows it;
    keep/(1 - rate) as float32 (`dropout_keep_scale`), or None without dropout.
  """
  allowed = (query_index >= 0) & (query_index < tiling.q_len)
  allowed = allowed & (key_index >= 0) & (key_index < tiling.kv_len)
  if mask_tile is not None:
    allowed = allowed & (mask_tile != 0)
  if dropout_rate == 0.0:
    return allowed, None
  return allowed, dropout_keep_scale(seed, b, h, query_index, key_index, dropout_rate)


def init_softmax(block_q: int, dtype):
  """Running max m (at MASKED_LOGIT) and normaliser l (0), both [block_q, 1]."""
  return jnp.full((block_q, 1), MASKED_LOGIT, dtype), jnp.zeros((block_q, 1), dtype)


def online_softmax_step(max_Q1, norm_Q1, logits_QK, allowed_QK):
  """One key tile of the online softmax.

  Returns the new running max and normaliser, the tile's unnormalised probabilities
  p = exp(s - m_new) (0 where not allowed) and the factor exp(m_old - m_new) [block_q, 1] by
  which everything accumulated so far must be rescaled.
  """
  logits_QK = jnp.where(allowed_QK, logits_QK, MASKED_LOGIT)
  new_max = jnp.maximum(max_Q1, jnp.max(logits_QK, axis=1, keepdims=True))
  correction = jnp.exp(max_Q1 - new_max)
  probs = jnp.where(allowed_QK, jnp.exp(logits_QK - new_max), 0.0)
  new_norm = norm_Q1 * correction + jnp.sum(probs, axis=1, keepdims=True)
  return new_max, new_norm, probs, correction


def finish_softmax(max_Q1, norm_Q1):
  """1/l (0 for a row that attended to nothing) and the logsumexp m + log l (0 there), the
  one residual the backward kernels need to recompute p = exp(s - logsumexp)."""
  alive = norm_Q1 > 0.0
  safe = jnp.where(alive, norm_Q1, 1.0)
  return jnp.where(alive, 1.0 / safe, 0.0), jnp.where(alive, max_Q1 + jnp.log(safe), 0.0)


def sequence_block(rows: int, head_dim: int):
  """Block shape of a [B, L, H, D] array read by one (batch, head) program: `rows` rows of one
  head (module docstring, Layout)."""
  return (None, rows, None, head_dim)


def sequence_tile_map(b, h, i):
  """Index map of a [B, L, H, D] array blocked `sequence_block(tile, D)` by grid (b, h, tile
  i)."""
  return (b, i, h, 0)


def head_tile_map(b, h, i):
  """Index map of a [B, H, L, .] array (per-row values) blocked (None, None, tile, .) by grid
  (b, h, tile i)."""
  return (b, h, i, 0)


def add_forward_outputs(call, query_BQHD, value_dtype, block_q: int) -> None:
  """Declares the two outputs of a forward kernel over query tiles: `output` [B, Qp, H, D] in
  the value's dtype and the per-row logsumexp `lse` [B, H, Qp, 1] (at least float32), the
  residuals the backward kernels read."""
  batch, q_padded, heads, head_dim = query_BQHD.shape
  call.output(
    'output', query_BQHD.shape, value_dtype, sequence_block(block_q, head_dim), sequence_tile_map
  )
  call.output(
    'lse',
    (batch, heads, q_padded, 1),
    jnp.promote_types(value_dtype, jnp.float32),
    (None, None, block_q, 1),
    head_tile_map,
  )


def query_residuals(refs, rows):
  """do, logsumexp [block_q, 1] and delta_i = do_i·o_i (float32) of query `rows` of the refs."""
  d_output = refs.d_output[rows]
  acc_dtype = jnp.promote_types(refs.output.dtype, jnp.float32)
  delta = jnp.sum(
    refs.output[rows].astype(acc_dtype) * d_output.astype(acc_dtype), axis=1, keepdims=True
  )
  return d_output, refs.lse[rows], delta


def softmax_grads(logits_QK, allowed_QK, lse_Q1, d_dropped_QK, delta_Q1, keep_scale_QK):
  """Recomputed probabilities after dropout p' and the logit gradient ds of one tile.

  p = exp(s - logsumexp) (0 where not allowed), p' = p·keep_scale (keep/(1 - rate), or p
  without dropout). With dp' = ∂L/∂p', the softmax backward is
  ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij'), dp_ij = dp'_ij·keep_scale_ij, and the row sum is
  delta_i = do_i·o_i (Σ_j p_ij dp_ij = Σ_j p'_ij dp'_ij = do_i·z_i).
  """
  probs = jnp.where(allowed_QK, jnp.exp(logits_QK - lse_Q1), 0.0)
  if keep_scale_QK is None:
    return probs, probs * (d_dropped_QK - delta_Q1)
  return probs * keep_scale_QK, probs * (d_dropped_QK * keep_scale_QK - delta_Q1)


# ------------------------------------------------------------------------------------------
# Dropout from a counter-based hash.


def dropout_bits(seed, batch_index, head_index, query_index, key_index):
  """uint32 hash of (seed, b, h, i, j), broadcasting the (int) indices against each other
  (`relpos.counter_hash.chain`, one round per index)."""
  bits = jnp.asarray(seed).astype(jnp.uint32)
  for index in (batch_index, head_index, query_index, key_index):
    bits = counter_hash.chain(bits, index)
  return bits


def dropout_keep_scale(seed, batch_index, head_index, query_index, key_index, rate: float):
  """keep/(1 - rate) as float32 for one tile (global indices, broadcast to the tile)."""
  bits = dropout_bits(seed, batch_index, head_index, query_index, key_index)
  return jnp.where(bits >= counter_hash.keep_threshold(rate), jnp.float32(1.0 / (1.0 - rate)), 0.0)


def dropout_keep_hashed(seed, batch: int, heads: int, q_len: int, kv_len: int, rate: float):
  """The Pallas kernels' keep mask, materialised: bool [batch, heads, q_len, kv_len].

  `seed` is the uint32 the kernels draw from the dropout rng (`dropout_seed`). For tests and
  references only: it is the [B, H, Q, K] array the kernels never build.
  """
  index = [
    np.arange(n).reshape([-1 if axis == a else 1 for a in range(4)])
    for axis, n in enumerate((batch, heads, q_len, kv_len))
  ]
  return dropout_bits(seed, *index) >= counter_hash.keep_threshold(rate)


def dropout_seed(dropout_rng):
  """32 random bits (uint32 scalar) from a jax.random key (typed or raw)."""
  return jax.random.bits(dropout_rng, (), jnp.uint32)


def kernel_scalars(query_offset, seed):
  """int32 [2]: the (traced) query offset and the dropout seed's bits, the kernels' scalars."""
  seed = jnp.uint32(0) if seed is None else seed
  return jnp.stack(
    [jnp.asarray(query_offset, jnp.int32), lax.bitcast_convert_type(seed, jnp.int32)]
  )


def read_scalars(scalars_ref):
  """(query offset int32, dropout seed uint32) inside a kernel."""
  return scalars_ref[0], lax.bitcast_convert_type(scalars_ref[1], jnp.uint32)
