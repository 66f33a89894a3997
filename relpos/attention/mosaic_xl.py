"""Causal Transformer-XL attention as Pallas Mosaic GPU kernels, forward and backward (prototype).

    score_ij = ((q_i + u)·k_j + (q_i + v)·R[pos_i - j]) / sqrt(d)    causal: j <= pos_i
    pos_i = kv_len - q_len + i,  R = rel_key [kv_len, heads, d],  u, v [heads, d]

A flash-attention kernel on Hopper's tensor cores (`plgpu.wgmma`, TMA copies), one warpgroup
per program, grid heads × query tiles × batch, built like `mosaic_shaw`'s one-warpgroup forward
(whose helpers it imports): two slots, the next key tile's copies issued before this one's
matmuls, online softmax in base 2 with a running max starting at -1e30, P through shared memory
for the P·V wgmma. The content term is plain flash attention on (q + u); what is new is the
position term, which needs a relative shift that Mosaic GPU cannot do in registers.

Why a window matmul and a skew. For a query tile (rows i0..i0+bq-1, positions p0 + a) and a key
tile (keys j0 + b) the distances pos_i - j span W = bq + bk - 1 consecutive rows of R, so one
wgmma x·Rwinᵀ ([bq, d] × [d, W'], x = q + v, W' = bq + bk) gives every product the tile needs,
but indexed by (query, distance), and the logits need (query, key): a per-row shift of the
columns ("relative shift", skew). Triton's XL kernel (`pallas_xl`) does it with a register
gather; Mosaic GPU has no gather in a kernel, and its register layouts cannot be sliced per row.

How the skew is done: through shared memory, with only reshapes and slices of a flat ref. XLA
prepares R reversed and transposed, Rrev [heads, d, kv_len + bq] (column s is distance
kv_len - 1 - s; columns past kv_len, negative distances, are zeros), so the window is one
contiguous TMA box: columns s0 .. s0 + W' - 1 with s0 = q_len - i0 - bq + j0 (a multiple of 64).
Then column c of P' = x·Rwin is distance t_hi - c, t_hi = p0 + bq - 1 - j0, and the tile's
position term is

    out[a, b] = P'[a, b + (bq - 1 - a)].

P' is stored (WGMMA register layout) into a flat float32 shared buffer B viewed as [bq, S]
(S = W' + 8: row stride, the 8 only to spread the rows over the memory banks), so P'[a, c] =
B[a·S + c], and then out[a, b] = B[(bq - 1) + a·(S - 1) + b]: the [bq, bk] corner of the view
B[bq - 1 : bq - 1 + bq·(S - 1)].reshape(bq, S - 1), read back into registers. No index array,
no gather: a ref reshape and two slices, which Mosaic GPU lowers to a strided memref.

What the lowering accepts and refuses (jax 0.10.2 and 0.11.2, the GPU's, in Lane semantics;
checked by `jax.export(..., platforms=['cuda'])`, which runs the Pallas → Mosaic GPU lowering in
Python; 0.11's default Warpgroup semantics, whose layout solver refuses the cast below, is why
every kernel names Lane, `mosaic_common.COMPILER_PARAMS`):
- the store of the wgmma accumulator, WGMMA layout, into a 2-D view of the flat ref (row stride
  S even): accepted;
- reading the skewed view (row stride S - 1, odd; offset bq - 1, odd) in the WGMMA layout:
  refused, "Tiled strides must be a multiple of the vector length, except for the vector
  dimension" (the WGMMA layout moves two float32 per access, and an odd stride would misalign
  them);
- reading it in the WGMMA layout with a vector length of 1 (`plgpu.Layout._WGMMA_ACC_32BIT`,
  a private member "temporarily exposed" in jax 0.10 and 0.11; the same thread ownership as
  WGMMA, one float per access) with `optimized=False`, then `plgpu.layout_cast` to WGMMA (a register
  repacking Mosaic GPU implements): accepted. That is what the kernel does;
- also accepted, one more shared-memory round trip: reading it in `WG_STRIDED(vec_size=1)`,
  storing that into a contiguous [bq, bk] buffer and reading the buffer in the WGMMA layout, the
  last with `optimized=False` (with the default `optimized=True` it raises "Failed to
  synthesize a transfer pattern that avoids bank conflicts").
- TMA cannot do the skew (global strides and addresses must be multiples of 16 bytes: one
  float is 4).
- the backward's inverse: storing a [bq, bk] register array (cast to `_WGMMA_ACC_32BIT`) into
  the odd-strided view, then reading the even-strided [bq, W'] view in the WGMMA layout
  (`optimized=False`): accepted.

Interpret mode (`interpret=True`, CPU, Mosaic GPU's interpreter). The interpreter accepts only
static slices of refs (no `reshape` transform: "Unsupported transform: ReshapeTransform"), so there
the skew's store writes P' (its two halves joined) padded to S columns with NaN as one flat value,
and its load reads the contiguous range B[bq - 1 : bq - 1 + bq·(S - 1)] and reshapes the value: the
same addresses as the lowered ref views (and a read of a padding column would put NaN in the
output), but not the same program. With `mosaic_shaw`'s `layout_cast` and `plgpu.load(layout=)`
replaced by the identity and plain reads, this is where the interpreted and lowered kernels differ;
what the interpreter checks is the index arithmetic of the skew, the window offsets, the masking and
the online softmax, against float64.

Tiles are square, block = bq = bk = 64 (`_smem_bytes`: tiles of 128 need a [128, 264] float32
skew buffer, 135 KB, and more than an H100's 227 KB in all); the forward takes head_dim 64 or
128, the backward 64 (`_bwd_smem_bytes`, checked when the gradient is traced).

Masking and order. With memory = kv_len - q_len a multiple of block, a query tile's last key
tile (the diagonal) is the only one holding keys with j > pos_i, always with the same
(j - pos_i) pattern; it is visited first and masked with an iota comparison, then the key tiles
below it, from the diagonal down, fully visible (a dynamic loop, no mask); none after it.

The carried window. Going down one key tile moves the window down by `block` columns of Rrev: a
step's upper half [bq, block..2·block) is the last step's lower half [bq, 0..block), the same
q + v against the same columns of R. So each step after the first multiplies only the lower
half (one [bq, d] × [d, block] wgmma, against one [d, block] tile of R that TMA brings with the
key tile) and carries its product to the next step in registers ([block, block] float32, 32
registers a thread); step 0 also multiplies its upper half, copied with q. The skew buffer takes
the two halves as two stores into its rows. Per tile pair the forward does 3 tile matmuls
(content, the position half, P·V) against flash attention's 2, plus 1 per query tile. The
backward does not carry: dk/dv's query tile, so q + v, changes every step, d rel's window is the
same for every step, and dq, already at 255 registers a thread, spilled 344 to 424 bytes with
its carried half (ptxas for sm_90a, `benchmarks/gpu_compile.py kernels`, 2026-11-28), while
moving the half through shared memory (16 KB read and written a step) costs more than the
64 × 64 × 64 wgmma it saves.

Cost beyond flash attention, per (query tile, key tile): the window's new half (one tile
matmul), its TMA copy, and the skew: bq·2·bk float32 stored and bq·bk loaded through shared
memory (bank conflicts not measured). No [q_len, kv_len] array exists anywhere.

The backward. A `jax.custom_vjp` around the kernel K(q + u, q + v, k, v, Rrevᵀ) -> (z, lse);
JAX differentiates the XLA ops around it (the two bias adds, R's reversal, padding and
transposition). With D_i = g_z_i·z_i - g_lse_i (XLA), each kernel recomputes, per (query tile,
key tile) pair, s (content + skewed position term, masked), p = exp(s - lse), dP = g_z·vᵀ and
dS = p (dP - D), then: the position term's gradient needs dS back in (query, distance)
coordinates, dP'[a, c] = dS[a, c - (bq - 1 - a)] (zero outside the band), the same flat buffer
in reverse: once the skewed logits are read, the buffer's rows are zeroed (one constant store)
and dS stored into its skewed view, then the [bq, W'] rows read back. (A second buffer, zeroed
once per program, cost 34 KB of shared memory that the second slot below needs; masking the
rows as read instead took two [bq, W'] index arrays in registers, and dq and d rel spilled
about 300 bytes a thread with them.) The gradients accumulate along three different index
orders, so there are three kernels, each with its own register accumulators and no atomics:
- dq (a program per query tile, over its key tiles): d(q + u) += dS·k, d(q + v) += dP'·Rwin
  (R's window also in [W', d] orientation, a second XLA copy of the table);
- dk/dv (a program per key tile, over the query tiles that see it): dkᵀ += (q + u)ᵀ·dS and
  dvᵀ += g_zᵀ·p, accumulated transposed ([d, bk]) so that no wgmma operand is transposed (the
  interpreter has no `transpose_ref`); (q + u)ᵀ and g_zᵀ are transposed by XLA;
- d rel (a program per R window: with square tiles the window depends on kt - t only, so
  a program walks one diagonal of tile pairs): d(Rwinᵀ) += (q + v)ᵀ·dP', [d, 2·bk] float32 per
  window; adjacent windows overlap by bk columns and XLA adds the halves.
So a tile pair costs, in tile-matmuls' worth, 4 recomputing (s, the double-width P', dP) in each
kernel, plus 3 (dq), 2 (dk/dv) and 2 (d rel): 19 against flash attention's 7 (FA2's split),
and three skews and two inverse skews. Memory stays O(n·d) per head (plus [windows, d, 2·bk]
float32 for d rel): no [q_len, kv_len] array. Each backward kernel double-buffers the tiles it
copies every step, as the forward does: step + 1's TMA copies are issued before step's
matmuls, into the other slot (`_SLOTS`, `_bwd_buffers`: 183 to 200 KB of shared memory at
head_dim 64 with both slots; the first version, with one slot, waited for every step's copies).

Not verified without a GPU: that the PTX runs and is right (the odd-strided scalar loads and
stores of the skew in particular), speed, bank conflicts (ptxas's register counts and spills
are in docs/kernels.md), the real shared-memory size against
`_smem_bytes`/`_bwd_smem_bytes`, and that `_WGMMA_ACC_32BIT` (private) stays available.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from relpos.attention.masking import MASKED_LOGIT
from relpos.attention.mosaic_common import (
  COMPILER_PARAMS,
  LOG2E,
  SMEM_BYTES,
  SMEM_RESERVE,
  matmuls,
  named,
  register_ops,
  smem_load,
)

_BANK_PAD = 8  # extra float32 per row of the skew buffer: rows start 8 banks apart


def _skew_ops(interpret: bool, block: int):
  """The relative shift through a flat float32 shared buffer B [block·S] (module docstring), for
  square tiles of `block` rows and columns (W' = 2·block): `store(B, p)` writes P' = p [block, W']
  at B[a·S + c] (`store(B, lower, upper)`: P' = [lower | upper], in two halves); `load(B)`
  returns out[a, b] = B[(block - 1) + a·(S - 1) + b], [block, block], WGMMA layout. And its
  inverse, for the backward: `unstore(B, ds)` writes ds [block, block] at those skewed addresses
  and `unload(B)` reads the [block, W'] rows back, zero off the band where no ds landed
  (`unstore` zeroes the rows first: the backward reuses the forward skew's buffer)."""
  window = 2 * block
  stride = window + _BANK_PAD
  start, length = block - 1, block * (stride - 1)

  def store(flat_ref, p, upper=None):
    if interpret:  # no ref reshapes in the interpreter: one flat value, padding NaN
      if upper is not None:
        p = jnp.concatenate([p, upper], axis=1)
      padded = jnp.pad(p, ((0, 0), (0, stride - window)), constant_values=jnp.nan)
      flat_ref[...] = padded.reshape(-1)
    elif upper is None:
      flat_ref.reshape(block, stride).at[:, :window][...] = p
    else:
      rows = flat_ref.reshape(block, stride)
      rows.at[:, :block][...] = p
      rows.at[:, block:window][...] = upper

  def skewed_view(flat_ref):
    return flat_ref.at[pl.ds(start, length)].reshape(block, stride - 1).at[:, :block]

  def load(flat_ref):
    if interpret:
      return flat_ref[pl.ds(start, length)].reshape(block, stride - 1)[:, :block]
    # One float per access (the odd stride rules out WGMMA's pairs), then repacked as WGMMA.
    skewed = smem_load(skewed_view(flat_ref), plgpu.Layout._WGMMA_ACC_32BIT, optimized=False)
    return plgpu.layout_cast(skewed, plgpu.Layout.WGMMA)

  def unstore(flat_ref, ds):
    # The buffer holds the forward skew's P' (the backward reuses it): zero its rows first, so
    # that the rows read back are zero off the band (a constant store: masking the read instead
    # took two [block, 2·block] index arrays in registers, and dq and d rel spilled with them).
    if interpret:  # read-modify-write of the contiguous range the skewed view spans
      flat_ref[...] = jnp.zeros(flat_ref.shape, jnp.float32)
      region = flat_ref[pl.ds(start, length)].reshape(block, stride - 1)
      flat_ref[pl.ds(start, length)] = region.at[:, :block].set(ds).reshape(-1)
    else:
      zeros = plgpu.layout_cast(jnp.zeros((block, window), jnp.float32), plgpu.Layout.WGMMA)
      flat_ref.reshape(block, stride).at[:, :window][...] = zeros
      skewed_view(flat_ref)[...] = plgpu.layout_cast(ds, plgpu.Layout._WGMMA_ACC_32BIT)

  def unload(flat_ref):
    if interpret:
      return flat_ref[...].reshape(block, stride)[:, :window]
    view = flat_ref.reshape(block, stride).at[:, :window]
    return smem_load(view, plgpu.Layout.WGMMA, optimized=False)

  return store, load, unstore, unload


def _smem_bytes(head_dim: int, block: int) -> int:
  """Shared memory the forward kernel allocates: 16-bit q + u, q + v and p; per slot (two)
  16-bit kᵀ, v and the lower half of the R window, [d, block]; step 0's upper half (in p's
  buffer where head_dim = block); the float32 skew buffer [block, 2·block + 8] and the logsumexp
  row; plus `SMEM_RESERVE` for barriers and alignment (as `mosaic_shaw._smem_bytes`). 113 KB at
  head_dim = block = 64: two blocks fit an SM's 228 KB."""
  buffers = 2 * (2 * block * head_dim + block * block)
  buffers += 2 * 2 * 3 * block * head_dim
  if head_dim != block:
    buffers += 2 * head_dim * block
  return buffers + 4 * (block * (2 * block + _BANK_PAD) + block) + SMEM_RESERVE


def _check(query, key, value, rel_key, content_bias, position_bias, block):
  if query.ndim != 4 or key.ndim != 4 or key.shape != value.shape:
    raise ValueError(
      f'query [batch, q_len, heads, head_dim] and key, value [batch, kv_len, heads, head_dim] '
      f'must be 4-D, key and value alike, got {query.shape}, {key.shape}, {value.shape}'
    )
  batch, q_len, heads, head_dim = query.shape
  if (key.shape[0], key.shape[2], key.shape[3]) != (batch, heads, head_dim):
    raise ValueError(
      f'query and key must agree in batch, heads and head_dim, got {query.shape}, {key.shape}'
    )
  kv_len = key.shape[1]
  if rel_key.shape != (kv_len, heads, head_dim):
    raise ValueError(
      f'rel_key must be [kv_len, heads, head_dim] = {(kv_len, heads, head_dim)}, got '
      f'{rel_key.shape}'
    )
  for name, bias in (('u (content_bias)', content_bias), ('v (position_bias)', position_bias)):
    if bias.shape != (heads, head_dim):
      raise ValueError(f'{name} must be [heads, head_dim] = {(heads, head_dim)}, got {bias.shape}')
  dtypes = {jnp.dtype(x.dtype) for x in (query, key, value)}
  if len(dtypes) != 1 or dtypes.pop() not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(
      f'query, key, value must all be bfloat16 or all float16, got {query.dtype}, {key.dtype}, '
      f'{value.dtype}'
    )
  if head_dim % 64:
    raise ValueError(f'head_dim must be a multiple of 64, got {head_dim}')
  if block < 64 or block % 64:
    raise ValueError(f"block (the tiles' rows and columns) must be a multiple of 64, got {block}")
  if q_len % block:
    raise ValueError(f'q_len must be a multiple of block={block}, got {q_len}')
  memory = kv_len - q_len
  if memory < 0 or memory % block:
    raise ValueError(
      f'kv_len - q_len (the memory before the queries) must be a non-negative multiple of '
      f'block={block}, got {kv_len} - {q_len}'
    )
  if (smem := _smem_bytes(head_dim, block)) > SMEM_BYTES:
    raise ValueError(
      f'block={block}, head_dim={head_dim} need {smem} bytes of shared memory, more than the '
      f'{SMEM_BYTES} of an H100'
    )


def _reversed_table(rel_key, block, dtype):
  """R reversed and transposed, [heads, d, kv_len + block]: column s is distance
  kv_len - 1 - s, columns from kv_len on (negative distances, only ever masked) are zero."""
  rel_rev = jnp.pad(rel_key[::-1].astype(dtype), ((0, block), (0, 0), (0, 0)))
  return rel_rev.transpose(1, 2, 0)


def _forward_kernel(q_u, q_v, key_t, value, rel_t, *, block, interpret):
  """The forward kernel (module docstring). q_u = q + u and q_v = q + v [B, n, H, d], key_t
  [B, H, d, kv_len], value [B, kv_len, H, d], rel_t = `_reversed_table` [H, d, kv_len + bq].
  Returns z [B, n, H, d] (input dtype) and the logsumexp [B, H, n] (float32, natural log).

  Tiles are square (block queries, block keys), and the key tiles are visited from the diagonal
  down, so that each step's window of R is the last one moved down by one tile: its upper half
  is the last step's lower half, carried in registers, and only its lower half is a new wgmma
  ([block, d] x [d, block], against one [d, block] tile of R that TMA brings with the keys)."""
  batch, q_len, heads, head_dim = q_u.shape
  dtype = q_u.dtype
  kv_len = key_t.shape[3]
  memory_tiles = (kv_len - q_len) // block
  scale = 1.0 / math.sqrt(head_dim)
  slots = 2

  layout, load = register_ops(interpret)
  skew_store, skew_load, _, _ = _skew_ops(interpret, block)

  def iota(dimension):
    shape = (block, block)
    if interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dimension)
    return plgpu.broadcasted_iota(jnp.int32, shape, dimension, layout=plgpu.Layout.WGMMA)

  def kernel(qu_ref, qv_ref, kt_ref, v_ref, rt_ref, out_ref, lse_ref, smem, barriers):
    qu_smem, qv_smem, kt_smem, v_smem, rt_smem, p_smem, flat_smem, stat_smem, *upper_smem = smem
    # Step 0's upper half shares p's buffer where their shapes agree: its wgmma is done (and
    # waited for) before step 0 first writes p. That keeps the forward at two blocks per SM.
    rt_upper = upper_smem[0] if upper_smem else p_smem
    q_barrier, kv_barriers = barriers
    b = lax.axis_index('batch')
    h = lax.axis_index('heads')
    t = lax.axis_index('q_seq')
    rows = pl.ds(t * block, block)
    # Step `step` visits key tile memory_tiles + t - step: step 0 the diagonal (masked), the
    # rest fully visible; none after the diagonal.
    num_steps = memory_tiles + t + 1
    # The window's first column for step `step` (a multiple of block): q_len - (t + 1)·block
    # + tile·block, falling by one tile a step; the diagonal tile's is kv_len - block for every t.
    first_column = kv_len - block

    def issue(step):
      """TMA copies of step `step`'s kᵀ, v and the lower half of its R window into its slot."""
      slot = step % slots if isinstance(step, int) else lax.rem(step, slots)
      cols = pl.ds((memory_tiles + t - step) * block, block)
      barrier = kv_barriers.at[slot]
      plgpu.copy_gmem_to_smem(kt_ref.at[b, h, :, cols], kt_smem.at[slot], barrier)
      plgpu.copy_gmem_to_smem(v_ref.at[b, cols, h], v_smem.at[slot], barrier)
      lower = pl.ds(first_column - step * block, block)
      plgpu.copy_gmem_to_smem(rt_ref.at[h, :, lower], rt_smem.at[slot], barrier)

    plgpu.copy_gmem_to_smem(qu_ref.at[b, rows, h], qu_smem, q_barrier.at[0])
    plgpu.copy_gmem_to_smem(qv_ref.at[b, rows, h], qv_smem, q_barrier.at[0])
    # Step 0's upper half, the only one no earlier step computes.
    upper = pl.ds(first_column + block, block)
    plgpu.copy_gmem_to_smem(rt_ref.at[h, :, upper], rt_upper, q_barrier.at[0])
    issue(0)
    plgpu.barrier_wait(q_barrier.at[0])
    # On the diagonal tile, key j is visible from query row a iff j - pos_i = b - a <= 0.
    visible = iota(1) <= iota(0)

    def step_body(step, carry):
      acc, m_i, l_i, position_upper = carry
      first = isinstance(step, int)
      slot = 0 if first else lax.rem(step, slots)
      pl.when(step + 1 < num_steps)(lambda: issue(step + 1))
      plgpu.barrier_wait(kv_barriers.at[slot])
      if first:
        content, position_lower, position_upper = matmuls(
          (qu_smem, kt_smem.at[slot], (block, block)),
          (qv_smem, rt_smem.at[slot], (block, block)),
          (qv_smem, rt_upper, (block, block)),
        )
      else:
        content, position_lower = matmuls(
          (qu_smem, kt_smem.at[slot], (block, block)),
          (qv_smem, rt_smem.at[slot], (block, block)),
        )
      skew_store(flat_smem, position_lower, position_upper)
      s = (content + skew_load(flat_smem)) * scale
      if first:
        s = jnp.where(visible, s, -jnp.inf)
      m_new = jnp.maximum(m_i, s.max(axis=1) * LOG2E)
      alpha = jnp.exp2(m_i - m_new)
      p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(m_new, s.shape, [0]))
      l_i = l_i * alpha + p.sum(axis=1)
      p_smem[...] = p.astype(dtype)
      plgpu.commit_smem()
      pv = matmuls((p_smem, v_smem.at[slot], (block, head_dim)))
      acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv
      return acc, m_new, l_i, position_lower  # the next step's upper half

    def vector(value):
      return layout(jnp.full((block,), value, jnp.float32), plgpu.Layout.WGMMA.reduce(1))

    carry = (
      layout(jnp.zeros((block, head_dim), jnp.float32), plgpu.Layout.WGMMA),
      vector(MASKED_LOGIT),  # finite: a row that has seen only masked keys rescales by 1
      vector(0.0),
      None,  # step 0 computes its upper half
    )
    carry = step_body(0, carry)
    acc, m_i, l_i, _ = lax.fori_loop(1, num_steps, step_body, carry)
    qu_smem[...] = (acc / lax.broadcast_in_dim(l_i, acc.shape, [0])).astype(dtype)  # q is done
    stat_smem[...] = (m_i + jnp.log2(l_i)) / LOG2E
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(qu_smem, out_ref.at[b, rows, h])
    plgpu.copy_smem_to_gmem(stat_smem, lse_ref.at[b, h, rows])
    plgpu.wait_smem_to_gmem(0)

  # 128-byte swizzled tiles (64 16-bit columns): wgmma operands and TMA boxes.
  tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  smem = [
    plgpu.SMEM((block, head_dim), dtype, transforms=tiled),  # q + u, then the output
    plgpu.SMEM((block, head_dim), dtype, transforms=tiled),  # q + v
    plgpu.SMEM((slots, head_dim, block), dtype, transforms=tiled),  # kᵀ
    plgpu.SMEM((slots, block, head_dim), dtype, transforms=tiled),  # v
    plgpu.SMEM((slots, head_dim, block), dtype, transforms=tiled),  # R window, lower half
    plgpu.SMEM((block, block), dtype, transforms=tiled),  # p (and step 0's upper half)
    plgpu.SMEM((block * (2 * block + _BANK_PAD),), jnp.float32),  # the skew buffer B
    plgpu.SMEM((block,), jnp.float32),  # logsumexp
  ]
  if head_dim != block:
    smem.append(plgpu.SMEM((head_dim, block), dtype, transforms=tiled))  # step 0's upper half
  barriers = (
    plgpu.Barrier(num_arrivals=3, num_barriers=1),  # q + u, q + v, step 0's upper half
    plgpu.Barrier(num_arrivals=3, num_barriers=slots),  # kᵀ, v, R window's lower half
  )
  out_type = (
    jax.ShapeDtypeStruct((batch, q_len, heads, head_dim), dtype),
    jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32),
  )
  return plgpu.kernel(
    named(kernel, 'relpos_xl_forward'),
    out_type=out_type,
    scratch_types=[smem, barriers],
    grid=(heads, q_len // block, batch),
    grid_names=('heads', 'q_seq', 'batch'),
    compiler_params=COMPILER_PARAMS,
    interpret=interpret or False,
  )(q_u, q_v, key_t, value, rel_t)


_MODES = ('dq', 'dkv', 'drel')


_SLOTS = 2  # the backward kernels' per-step tiles are double-buffered: step + 1's copies
# are issued before step's matmuls, as in the forward

# Which tiles each backward kernel copies once per program ('fixed') and once per step.
_FIXED = {'dq': ('q_u', 'q_v', 'g_z', 'stats'), 'dkv': ('k_t', 'v_t'), 'drel': ('r_t',)}
_PER_STEP = {
  'dq': ('k_t', 'v_t', 'k', 'r_t', 'r_rows'),
  'dkv': ('q_u', 'q_v', 'g_z', 'q_u_t', 'g_z_t', 'stats', 'r_t'),
  'drel': ('q_u', 'q_v', 'g_z', 'q_v_t', 'k_t', 'v_t', 'stats'),
}


def _bwd_buffers(mode: str, head_dim: int, block: int, dtype) -> dict:
  """{name: (shape, dtype)} of a backward kernel's shared-memory buffers: the fixed tiles; the
  per-step tiles, each with a leading slot axis; the float32 skew buffer (the forward's skew of
  P' and, in dq and d rel, the inverse skew of dS, one after the other in the same buffer);
  16-bit dS, p and dP' for the second matmuls; d rel's float32 [d, 2·block] output."""
  window = 2 * block
  shapes = {
    'q_u': (block, head_dim),
    'q_v': (block, head_dim),
    'g_z': (block, head_dim),
    'q_u_t': (head_dim, block),
    'q_v_t': (head_dim, block),
    'g_z_t': (head_dim, block),
    'k': (block, head_dim),
    'k_t': (head_dim, block),
    'v_t': (head_dim, block),
    'r_t': (head_dim, window),
    'r_rows': (window, head_dim),
  }

  def tile(name):
    return ((2, block), jnp.float32) if name == 'stats' else (shapes[name], dtype)

  buffers = {name: tile(name) for name in _FIXED[mode]}
  for name in _PER_STEP[mode]:
    shape, kind = tile(name)
    buffers[name] = ((_SLOTS, *shape), kind)
  buffers['skew'] = ((block * (window + _BANK_PAD),), jnp.float32)
  if mode in ('dq', 'drel'):
    buffers['dp_window'] = ((block, window), dtype)  # dP', 16-bit
  if mode in ('dq', 'dkv'):
    buffers['ds'] = ((block, block), dtype)
  if mode == 'dkv':
    buffers['p'] = ((block, block), dtype)
  if mode == 'drel':
    buffers['d_r_t'] = ((head_dim, window), jnp.float32)
  return buffers


def _bwd_smem_bytes(head_dim: int, block: int) -> int:
  """Shared memory of the largest backward kernel (`_bwd_buffers`, 16-bit inputs), plus
  `SMEM_RESERVE` for barriers and alignment."""
  largest = 0
  for mode in _MODES:
    buffers = _bwd_buffers(mode, head_dim, block, jnp.bfloat16).values()
    largest = max(largest, sum(math.prod(shape) * jnp.dtype(d).itemsize for shape, d in buffers))
  return largest + SMEM_RESERVE


def _backward_kernel(mode, operands, *, q_len, block, interpret):
  """One of the three backward kernels (module docstring), each walking (query tile t, key
  tile kt) pairs with j <= pos_i somewhere and recomputing, per pair, s, p = exp(s - lse),
  dP = g_z·vᵀ and dS = p (dP - D) with the forward's skew:
  - 'dq': a program per query tile, kt = 0 .. diagonal: d(q + u) += dS·k and, with dP' the
    inverse skew of dS, d(q + v) += dP'·Rwin;
  - 'dkv': a program per key tile, t = first seeing it .. last: dkᵀ += (q + u)ᵀ·dS and
    dvᵀ += g_zᵀ·p (transposed accumulators, so no transposed operand is needed);
  - 'drel': a program per R window (windows depend on kt - t only, square tiles), the
    pairs on that diagonal: d(Rwinᵀ) += (q + v)ᵀ·dP', [d, 2·block] float32 per window, the
    overlapping windows summed by XLA.
  One warpgroup; the per-step tiles in two slots, the next step's copies issued before this
  step's matmuls. `operands` is a dict of the arrays (see `_kernel_bwd`)."""
  batch, _, heads, head_dim = operands['q_u'].shape
  dtype = operands['q_u'].dtype
  kv_len = operands['k'].shape[1]
  bq = bk = block
  window = 2 * block
  q_tiles = q_len // bq
  memory_tiles = (kv_len - q_len) // bk
  scale = 1.0 / math.sqrt(head_dim)
  layout, load = register_ops(interpret)
  skew_store, skew_load, unskew_store, unskew_load = _skew_ops(interpret, block)
  names = tuple(operands)
  row = plgpu.Layout.WGMMA.reduce(1)

  def iota(dimension):
    shape = (bq, bk)
    if interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dimension)
    return plgpu.broadcasted_iota(jnp.int32, shape, dimension, layout=plgpu.Layout.WGMMA)

  fixed, per_step = _FIXED[mode], _PER_STEP[mode]
  tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  tiled32 = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))

  def spec(name, shape, kind):
    if name in ('stats', 'skew'):
      return plgpu.SMEM(shape, kind)
    return plgpu.SMEM(shape, kind, transforms=tiled32 if kind == jnp.float32 else tiled)

  buffers = _bwd_buffers(mode, head_dim, block, dtype)
  smem = {name: spec(name, *buffer) for name, buffer in buffers.items()}
  barriers = (
    plgpu.Barrier(num_arrivals=len(fixed), num_barriers=1),
    plgpu.Barrier(num_arrivals=len(per_step), num_barriers=_SLOTS),
  )

  def kernel(*refs):
    ins = dict(zip(names, refs[: len(names)], strict=True))
    outs = refs[len(names) : -2]
    sm, (fixed_barrier, step_barrier) = refs[-2:]
    b = lax.axis_index('batch')
    h = lax.axis_index('heads')
    p_id = lax.axis_index('program')
    if mode == 'dq':  # t fixed, kt = step
      first, num_steps = 0, memory_tiles + p_id + 1
    elif mode == 'dkv':  # kt fixed, t = first + step
      first = jnp.maximum(p_id - memory_tiles, 0)
      num_steps = q_tiles - first
    else:  # window w = kt - t + q_tiles - 1 fixed, t = first + step
      first = jnp.maximum(q_tiles - 1 - p_id, 0)
      num_steps = q_tiles - first

    def pair(step):
      if mode == 'dq':
        return p_id, step
      if mode == 'dkv':
        return first + step, p_id
      return first + step, first + step + p_id - (q_tiles - 1)

    def copy(names, t, kt, barrier, slot=None):
      rows, cols = pl.ds(t * bq, bq), pl.ds(kt * bk, bk)
      start = q_len - (t + 1) * bq + kt * bk  # the R window's first column (row of r_rows)
      sources = {
        'q_u': lambda r: r.at[b, rows, h],
        'q_v': lambda r: r.at[b, rows, h],
        'g_z': lambda r: r.at[b, rows, h],
        'q_u_t': lambda r: r.at[b, h, :, rows],
        'q_v_t': lambda r: r.at[b, h, :, rows],
        'g_z_t': lambda r: r.at[b, h, :, rows],
        'stats': lambda r: r.at[b, h, :, rows],
        'k': lambda r: r.at[b, cols, h],
        'k_t': lambda r: r.at[b, h, :, cols],
        'v_t': lambda r: r.at[b, h, :, cols],
        'r_t': lambda r: r.at[h, :, pl.ds(start, window)],
        'r_rows': lambda r: r.at[h, pl.ds(start, window), :],
      }
      for name in names:
        target = sm[name] if slot is None else sm[name].at[slot]
        plgpu.copy_gmem_to_smem(sources[name](ins[name]), target, barrier)

    def issue(step):
      """Step `step`'s per-step copies into its slot."""
      slot = lax.rem(step, _SLOTS)
      copy(per_step, *pair(step), step_barrier.at[slot], slot)

    t0, kt0 = pair(0)
    copy(fixed, t0, kt0, fixed_barrier.at[0])
    issue(0)
    plgpu.barrier_wait(fixed_barrier.at[0])
    offsets = iota(1) - iota(0)  # b - a

    def stats(ref):
      lse = load(ref.at[0], row) * LOG2E
      return lse, load(ref.at[1], row)

    fixed_stats = stats(sm['stats']) if mode == 'dq' else None

    def step_body(step, accs):
      t, kt = pair(step)
      slot = lax.rem(step, _SLOTS)
      pl.when(step + 1 < num_steps)(lambda: issue(step + 1))
      plgpu.barrier_wait(step_barrier.at[slot])
      # This step's tiles: the fixed ones, and the per-step ones in this step's slot.
      tiles = {name: sm[name] for name in fixed}
      tiles.update({name: sm[name].at[slot] for name in per_step})
      s, position, dp = matmuls(
        (tiles['q_u'], tiles['k_t'], (bq, bk)),
        (tiles['q_v'], tiles['r_t'], (bq, window)),
        (tiles['g_z'], tiles['v_t'], (bq, bk)),
      )
      lse, delta = fixed_stats or stats(tiles['stats'])
      skew_store(sm['skew'], position)
      s = (s + skew_load(sm['skew'])) * scale
      # Key kt·bk + b is visible from query position memory + t·bq + a iff b - a <= limit.
      s = jnp.where(offsets <= (memory_tiles + t - kt) * bk, s, -jnp.inf)
      p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(lse, s.shape, [0]))
      ds = p * (dp - lax.broadcast_in_dim(delta, s.shape, [0]))
      if mode in ('dq', 'drel'):  # the skew buffer again: dS into the band, rows read back
        unskew_store(sm['skew'], ds)
        sm['dp_window'][...] = unskew_load(sm['skew']).astype(dtype)
      if mode in ('dq', 'dkv'):
        sm['ds'][...] = ds.astype(dtype)
      if mode == 'dkv':
        sm['p'][...] = p.astype(dtype)
      plgpu.commit_smem()
      if mode == 'dq':
        out = matmuls(
          (sm['ds'], tiles['k'], (bq, head_dim)),
          (sm['dp_window'], tiles['r_rows'], (bq, head_dim)),
        )
      elif mode == 'dkv':
        out = matmuls(
          (tiles['q_u_t'], sm['ds'], (head_dim, bk)), (tiles['g_z_t'], sm['p'], (head_dim, bk))
        )
      else:
        out = (matmuls((tiles['q_v_t'], sm['dp_window'], (head_dim, window))),)
      return tuple(acc + x for acc, x in zip(accs, out, strict=True))

    def zeros(shape):
      return layout(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)

    if mode == 'dq':
      accs = (zeros((bq, head_dim)), zeros((bq, head_dim)))
    elif mode == 'dkv':
      accs = (zeros((head_dim, bk)), zeros((head_dim, bk)))
    else:
      accs = (zeros((head_dim, window)),)
    accs = lax.fori_loop(0, num_steps, step_body, accs)
    t, kt = pair(0)
    rows, cols = pl.ds(t * bq, bq), pl.ds(kt * bk, bk)
    if mode == 'dq':  # q + u and q + v are done: their buffers stage d(q + u), d(q + v)
      staging = (sm['q_u'], sm['q_v'])
      targets = tuple(out.at[b, rows, h] for out in outs)
    elif mode == 'dkv':  # kᵀ and vᵀ are done
      staging = (sm['k_t'], sm['v_t'])
      targets = tuple(out.at[b, h, :, cols] for out in outs)
    else:
      staging = (sm['d_r_t'],)
      targets = (outs[0].at[b, h, p_id],)
    factors = {'dq': (scale, scale), 'dkv': (scale, 1.0), 'drel': (scale,)}[mode]
    for acc, buffer, factor in zip(accs, staging, factors, strict=True):
      buffer[...] = (acc * factor).astype(buffer.dtype)
    plgpu.commit_smem()
    for buffer, target in zip(staging, targets, strict=True):
      plgpu.copy_smem_to_gmem(buffer, target)
    plgpu.wait_smem_to_gmem(0)

  q_shape = operands['q_u'].shape
  kt_shape = operands['k_t'].shape
  out_type, programs = {
    'dq': ((jax.ShapeDtypeStruct(q_shape, dtype),) * 2, q_tiles),
    'dkv': ((jax.ShapeDtypeStruct(kt_shape, dtype),) * 2, kv_len // bk),
    'drel': (
      (
        jax.ShapeDtypeStruct((batch, heads, q_tiles + memory_tiles, head_dim, window), jnp.float32),
      ),
      q_tiles + memory_tiles,
    ),
  }[mode]
  return plgpu.kernel(
    named(kernel, f'relpos_xl_backward_{mode}'),
    out_type=out_type,
    scratch_types=[smem, barriers],
    grid=(heads, programs, batch),
    grid_names=('heads', 'program', 'batch'),
    compiler_params=COMPILER_PARAMS,
    interpret=interpret or False,
  )(*operands.values())


class _Config(NamedTuple):
  """The kernels' static arguments (hashable: a custom_vjp nondiff argument)."""

  block: int
  interpret: object  # False or an InterpretGPUParams


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _kernel(config, q_u, q_v, key, value, rel_t):
  """K(q + u, q + v, k, v, Rrevᵀ) -> (z, lse): the forward kernel, the backward kernels as its
  VJP (JAX differentiates the XLA ops around it: the biases, the reversal and padding of R)."""
  return _forward_kernel(
    q_u,
    q_v,
    key.transpose(0, 2, 3, 1),
    value,
    rel_t,
    block=config.block,
    interpret=config.interpret,
  )


def _kernel_fwd(config, q_u, q_v, key, value, rel_t):
  z, lse = _kernel(config, q_u, q_v, key, value, rel_t)
  return (z, lse), (q_u, q_v, key, value, rel_t, z, lse)


def _kernel_bwd(config, residuals, cotangents):
  """D_i = g_z_i·z_i - g_lse_i by XLA, then the three backward kernels; XLA transposes dkᵀ and
  dvᵀ back and sums the overlapping d(Rwinᵀ) windows into d Rrevᵀ."""
  q_u, q_v, key, value, rel_t, z, lse = residuals
  g_z, g_lse = cotangents
  _, q_len, _, head_dim = q_u.shape
  dtype = q_u.dtype
  block = config.block
  if (smem := _bwd_smem_bytes(head_dim, block)) > SMEM_BYTES:
    raise ValueError(
      f'the backward kernels with block={block}, head_dim={head_dim} need {smem} bytes of '
      f'shared memory, more than the {SMEM_BYTES} of an H100'
    )
  g_z = g_z.astype(dtype)
  delta = jnp.einsum('bnhd,bnhd->bhn', g_z.astype(jnp.float32), z.astype(jnp.float32)) - g_lse
  transposed = lambda x: x.transpose(0, 2, 3, 1)  # noqa: E731  [B, n, H, d] -> [B, H, d, n]
  operands = {
    'q_u': q_u,
    'q_v': q_v,
    'g_z': g_z,
    'q_u_t': transposed(q_u),
    'q_v_t': transposed(q_v),
    'g_z_t': transposed(g_z),
    'k': key,
    'k_t': transposed(key),
    'v_t': transposed(value),
    'r_t': rel_t,
    'r_rows': rel_t.transpose(0, 2, 1),
    'stats': jnp.stack([lse, delta], axis=2),
  }
  run = functools.partial(
    _backward_kernel, operands=operands, q_len=q_len, block=block, interpret=config.interpret
  )
  d_q_u, d_q_v = run('dq')
  d_key_t, d_value_t = run('dkv')
  (d_windows,) = run('drel')  # [B, H, windows, d, 2·block]: columns w·block .. (w + 2)·block
  batch, heads, windows = d_windows.shape[:3]
  halves = d_windows.reshape(batch, heads, windows, head_dim, 2, block).sum(0)
  first = jnp.pad(halves[:, :, :, 0], ((0, 0), (0, 1), (0, 0), (0, 0)))
  second = jnp.pad(halves[:, :, :, 1], ((0, 0), (1, 0), (0, 0), (0, 0)))
  d_rel_t = (first + second).transpose(0, 2, 1, 3).reshape(rel_t.shape)
  return (
    d_q_u,
    d_q_v,
    d_key_t.transpose(0, 3, 1, 2),
    d_value_t.transpose(0, 3, 1, 2),
    d_rel_t.astype(rel_t.dtype),
  )


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


def xl_attention_mosaic(
  query,
  key,
  value,
  rel_key,
  u,
  v,
  *,
  block=64,
  interpret=False,
  return_lse=False,
):
  """Causal Transformer-XL attention with a Mosaic GPU kernel (see the module docstring).

  query: [batch, q_len, heads, head_dim]; key, value: [batch, kv_len, heads, head_dim], the
  memory (kv_len - q_len positions, a multiple of block) first, query i at position
  kv_len - q_len + i; bf16 or f16, head_dim a multiple of 64, q_len a multiple of block (the
  tiles' rows and columns, a multiple of 64; only 64 fits in shared memory). rel_key: [kv_len,
  heads, head_dim], row t for distance t; u, v: [heads, head_dim] (the content and position
  biases); these three are cast to the query's dtype, as `xl_attention(implementation='xla')`
  does. Returns z [batch, q_len, heads, head_dim] in the input dtype, and with return_lse=True
  also the logsumexp of each row's logits [batch, heads, q_len] (float32). interpret=True runs
  Mosaic GPU's interpreter (CPU), as does an `InterpretGPUParams` (e.g. with detect_races=True).
  Raises ValueError (one line) for shapes, dtypes or tiles it does not support.
  """
  _check(query, key, value, rel_key, u, v, block)
  if interpret is True:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    interpret = InterpretGPUParams()
  dtype = query.dtype
  z, lse = _kernel(
    _Config(block, interpret),
    query + u.astype(dtype),
    query + v.astype(dtype),
    key,
    value,
    _reversed_table(rel_key, block, dtype),
  )
  return (z, lse) if return_lse else z
