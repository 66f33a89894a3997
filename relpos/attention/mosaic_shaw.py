"""Causal Shaw et al. (2018) attention as Pallas Mosaic GPU kernels, forward and backward
(prototype).

    e_ij = (q_i·k_j + q_i·w^K[r_ij]) / sqrt(d)      z_i = Σ_j p_ij (v_j + w^V[r_ij])
    r_ij = clip(j - pos_i, -k, k) + k               causal: j <= pos_i = kv_len - q_len + i

Below, n is q_len and i stands for pos_i, and everything is as written for q_len == kv_len
(offset 0) but for the last paragraph before "The backward": queries over a memory.

A flash-attention kernel on Hopper's tensor cores (`plgpu.wgmma`, operands in shared memory
loaded by TMA), with XLA doing the per-bucket work before and after it, because Mosaic GPU has no
gathers or scatters inside a kernel. Differentiable: a `jax.custom_vjp` around the kernel alone,
whose backward is two more kernels (below); JAX differentiates XLA's parts before and after.

Why band tiles. With causal masking, query i sees keys j <= i. Every key with j - i <= -k falls in
bucket 0, so its bias is q_i·w^K[0]/sqrt(d) =: c_i, one constant per row. A key tile whose every
(i, j) pair has j - i <= -k (a "far" tile) is therefore plain attention plus a row constant. Only
the few "band" tiles that meet -k < j - i <= 0 for some pair need a full [block_q, block_kv]
bias. For query tile t the band is the `nb` key tiles ending at the diagonal (nb = the most any
tile needs: 1 + ceil((k - 1) / block_kv) when block_q == block_kv, or all tiles when k is large);
the tiles before them are far.

Why no row constant in the kernel. Softmax is unchanged by subtracting a per-row constant from
every logit, so the kernel works with e'_ij = e_ij - c_i: far tiles get no bias at all (they are
exactly flash attention) and band tiles get b'_ij = q_i·(w^K[r_ij] - w^K[0])/sqrt(d). XLA adds
c_i back to the logsumexp the kernel returns.

XLA before the kernel: qw = q·w^Kᵀ/sqrt(d) [B, H, n, k'+1] (the table rows causal attention
reaches, below); the band bias [B, H, n, nb·block_kv], gathered from qw minus its column 0 (c_i)
with a constant index pattern (the same for every query tile), with -inf where j > i (causal)
or j < 0 (band tiles before the start of the sequence; the kernel loads tile 0 in their place
and their -inf logits contribute nothing). So the causal mask lives
in the bias: the kernel never builds an iota mask.

The kernel (grid heads × query tiles × batch; one warpgroup that both issues the TMA copies and
computes: no warp specialisation, unlike JAX's FA3 example `attention_mgpu.py`): band tiles first
(a static loop from the diagonal down), then the far tiles (a dynamic loop), each: K and V tiles
TMA-copied to shared memory (two slots: the next tile's copies are issued before this tile's
matmuls), S = Q·Kᵀ/sqrt(d) by wgmma, plus the band bias (band tiles: also TMA-copied, and the
biased logits TMA-stored), online softmax in base 2 (running max starting at -1e30, not -inf, so
a row that has seen only masked keys rescales by 1), P to shared memory, acc += P·V by wgmma.
K is transposed by XLA ([B, H, d, n]) so that both wgmma operands are plain shared-memory tiles.
Outputs: the value term Σ_j p_ij v_j [B, n, H, d] (input dtype), the logsumexp of e' and the
probability of the far tiles (all bucket 0) [B, H, n], and the band tiles' logits e'
[B, H, n, nb·block_kv] (float32).

`warp_specialized=True` (after JAX's FA3 example; the same `_forward_kernel` builds both):
three warpgroups per program, two computing (block_q rows each of a 2·block_q-row query tile,
as above) and one only issuing the TMA copies, two slots ahead, refilling a slot when both
compute warpgroups have arrived on its `consumed` barrier. The band is that of the
2·block_q-row tile, so both compute warpgroups walk the same key tiles (the first one's last
band tile is fully masked). It has no ping-pong schedule barrier and no wgmma/softmax overlap
yet.

XLA after the kernel: band probabilities p = exp(e' - logsumexp'), folded into buckets with a
constant one-hot [block_q, nb·block_kv, k'+1] einsum (causal attention uses only the k' + 1
table rows for j - i = -k' .. 0, k' = min(k, n - 1)), plus the far mass in bucket 0, gives
P_ir = Σ_{j: r_ij = r} p_ij; z = Σ_j p_ij v_j + P·w^V. The logsumexp returned is that of the
true logits e (lse' + c_i), for a backward kernel.

Queries over a memory (Transformer-XL: enwik8_base attends 512 queries over 1,024 keys, the
previous segment's 512 first). Key and value may be longer than the query, [B, kv_len, H, d],
with memory = kv_len - q_len a multiple of block_kv (so that every query tile's band is whole
key tiles: its tile pattern of j - pos_i, `_band_offsets`, is the offset-0 one), query i at
position pos_i = memory + i (`shaw_attention`'s default query_offset). Query tile t's diagonal
key tile moves right by m = memory / block_kv tiles: kv_end = m + (t + 1)·tile_q/block_kv in
all three kernels (the band, `band_tiles(..., offset=memory)`, is the nb tiles before kv_end,
every tile before them is far: the whole memory when k <= block_kv; no tile at or after kv_end
is visited), and the dk/dv kernel's key tile j is seen by the query tiles t >= (j - m)/kv_per_q
(all of them for j < m) and in the band of those with (t + 1)·kv_per_q <= j - m + nb. XLA's
bias masks j < 0 with j = pos_i + (j - pos_i), and the table is cut at k' = min(k, kv_len - 1).
The outputs keep the query's rows; dk and dv the key's. memory = 0 is the case above.

Cost beyond flash attention: the band tiles' bias read and logits write (nb·block_kv floats per
row each way) and the one-hot fold (n·nb·block_kv·(k'+1) multiply-adds per head): O(n·k) memory,
and for k >= n (every tile in the band) this degenerates to a materialised [n, n] bias.

The backward. The custom_vjp wraps K(q, k, v, band bias) -> (z, lse', f, band logits e'), where
z_i = Σ_j p_ij v_j (the value term), f_i = Σ_{j far} p_ij, p_ij = exp(e'_ij - lse'_i), e'_ij =
q_i·k_j/sqrt(d) + b_ij (b = 0 on far tiles; the band bias, -inf where masked, on band tiles).
With g_z, g_lse, g_f, g_band the cotangents of its four outputs (custom_vjp materialises symbolic
zeros), and dp_ik/de'_ij = p_ik (δ_jk - p_ij):

    dL/de'_ij = dS_ij = p_ij (dP_ij - D_i) + g_band_ij [j in a band tile]
    dP_ij = g_z_i·v_j + g_f_i [j in a far tile]
    D_i = Σ_k p_ik dP_ik - g_lse_i = g_z_i·z_i + g_f_i·f_i - g_lse_i
    dq_i = Σ_j dS_ij k_j / sqrt(d)   dk_j = Σ_i dS_ij q_i / sqrt(d)   dv_j = Σ_i p_ij g_z_i
    d band bias = dS on the band tiles (0 where masked: p = 0 there and so is g_band, the
    gradient of exp(e' - lse') at e' = -inf)

So far tiles are flash-attention backward with D_i - g_f_i in place of D_i, and band tiles add
the bias to the recomputed logits and g_band to dS. XLA computes D (from the kernel's z, saved
in the input dtype, as flash attention does), then (FA2's split, as JAX's `attention_mgpu.py`
`_attention_bwd`; no atomics, so no fused kernel):
- the dq kernel, a program per 64 query rows (a sub-tile of the forward's tile, whose band and
  far tiles it walks in the forward's order, band tiles statically): S = q·kᵀ (kᵀ as in the
  forward), + the TMA-loaded bias on band tiles, p = exp(S - lse'), dP = g_z·vᵀ (vᵀ transposed
  by XLA), dS as above (the TMA-loaded g_band tile added and dS TMA-stored, float32, on band
  tiles), dq += dS·k (dS through shared memory, 16-bit);
- XLA: the band p = exp(e' - lse') from the saved band logits and the dq kernel's band dS,
  each transposed per forward tile to [B, H, tiles, nb·block_kv, tile_q], 16-bit;
- the dk/dv kernel, a program per key tile: for the 64-row query sub-tiles whose forward tile
  has it in the band (a dynamic loop), dv += pᵀ·g_z and dk += dSᵀ·q straight from those
  TMA-loaded transposed tiles (two matmuls, no recomputation); for those for which it is far,
  Sᵀ = k·qᵀ and dPᵀ = v·g_zᵀ (qᵀ and g_zᵀ transposed by XLA), pᵀ = exp(Sᵀ - lse'),
  dSᵀ = pᵀ (dPᵀ - (D - g_f)), then the same two matmuls (pᵀ and dSᵀ through shared memory).
Both kernels have one warpgroup that copies and computes, two slots, the next step's TMA copies
issued before this step's matmuls, as the forward. A far tile pair costs 7 tile matmuls (dq 3,
dk/dv 4, as FA2), a band pair 5. The transposed copies (kᵀ, vᵀ, qᵀ, g_zᵀ) are there because the
interpreter has no `transpose_ref` (below); on a GPU, transposed views would do.

Memory. Saved for the backward: q, k, v, the band bias and band logits (float32, [B, H, n,
nb·block_kv] each), z (the kernel's value term), lse' and f. During it: D and three row
statistics, g_band, the band dS (float32) and the 16-bit transposed band p and dS, the four
transposed 16-bit inputs: O(n·d + n·nb·block_kv) per head, no [n, n] array (but for k >= n,
where the band is every tile). Shared memory: the dq kernel holds per slot three 16-bit key
tiles and two float32 [64, block_kv] tiles, so the backward fits an H100's 227 KiB for
block_kv = 64 and head_dim <= 128 only (`_bwd_smem_bytes`; a larger one raises ValueError when
the gradient is traced). The forward's block_q and warp specialisation only set the band
structure the backward follows (its query steps are always 64 rows).

Interpret mode (`interpret=True`, CPU): Mosaic GPU's interpreter (jax 0.10) runs a subset of the
language, and the kernels keep to it, so that the program it checks is the one that lowers:
- no `pl.run_state`: each matmul gets a fresh `pl.run_scoped(..., plgpu.ACC)` accumulator whose
  value is added to a register carry (acc = alpha·acc + P·V, one [block_q, d] add more per tile);
- wgmma operands are shared-memory refs without a transpose transform: P goes through shared
  memory (no register A operand) and K is transposed by XLA (no `plgpu.transpose_ref`);
- shared memory is read without dynamic slices (the band tiles are a Python loop; a dynamic
  integer index, a slot or a warpgroup, is fine; the dk/dv kernel's dynamic band loop reads
  whole slots);
- the two layout-only calls the interpreter lacks, `plgpu.layout_cast` and `plgpu.load(...,
  layout=)`, are replaced by the identity and a plain read when interpreting (see `layout` and
  `load` in the kernel): the one difference between the interpreted and the lowered program;
- a thread must observe every phase of a barrier it waits on before the barrier is freed: the
  copying warpgroup waits for the compute warpgroups' last releases too (harmless on a GPU).
What the interpreter cannot check: that the layouts given by `layout_cast` and `plgpu.load`
(row vectors, WGMMA.reduce(1), in the forward and dq kernels; column vectors, WGMMA.reduce(0),
broadcast along rows in the dk/dv kernel) compile and are right; asynchrony (its TMA copies and
wgmma are synchronous, so a missing wait, e.g. before a slot or the band dS tile is reused,
goes unseen; its race detector sees only threads, and the backward kernels have one); register
pressure and spills (the dq kernel holds dq [64, d] and four [64, block_kv] float32 tiles, the
dk/dv kernel two [block_kv, d] accumulators and four [block_kv, 64] tiles); the real shared
memory size against `_smem_bytes`/`_bwd_smem_bytes`; approx_math's exp2; speed. `jax.export`
checks that all three kernels lower to the Mosaic GPU custom call, not that the PTX runs. What
it does check beyond the arithmetic: it fills buffers with NaN and raises on out-of-bounds
reads, so a tile read before it was copied, or an output tile never written (e.g. a band dS
block), shows in the tests.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from relpos.attention.masking import MASKED_LOGIT, table_max_distance
from relpos.attention.mosaic_common import (
  COMPILER_PARAMS,
  LOG2E,
  SMEM_BYTES,
  SMEM_RESERVE,
  matmuls,
  named,
  register_ops,
)


def band_tiles(length: int, max_distance: int, block_q: int, block_kv: int, offset: int = 0) -> int:
  """How many key tiles, ending at the one holding the diagonal, some query tile must treat as
  band (full bias) tiles, for `length` queries at positions offset + i over offset + length
  keys. The others, "far", have every pair visible (j <= pos_i) and in bucket 0
  (j - pos_i <= -k)."""
  num = 1
  for t in range(length // block_q):
    end = (offset + (t + 1) * block_q) // block_kv  # one past the last key tile with j <= pos_i
    # Far tiles kt < far: (kt + 1)·block_kv - 1 - (offset + t·block_q) <= -k.
    far = max(0, (offset + t * block_q - max_distance + 1) // block_kv)
    num = max(num, end - far)
  return min(num, (offset + length) // block_kv)


def _band_offsets(block_q: int, block_kv: int, num_band: int) -> np.ndarray:
  """j - i for row a of a query tile and column w of its band: the same for every tile."""
  rows = np.arange(block_q)[:, None]
  cols = np.arange(num_band * block_kv)[None, :]
  return block_q - num_band * block_kv + cols - rows


def _check(query, key, value, rel_key, rel_value, block_q, block_kv, warp_specialized):
  if (
    query.ndim != 4
    or key.shape != value.shape
    or key.ndim != 4
    or query.shape[::2] != key.shape[::2]
    or query.shape[3] != key.shape[3]
  ):
    raise ValueError(
      f'query [batch, q_len, heads, head_dim] and key, value [batch, kv_len, heads, head_dim] '
      f'must agree, got {query.shape}, {key.shape}, {value.shape}'
    )
  dtypes = {jnp.dtype(x.dtype) for x in (query, key, value)}
  if len(dtypes) != 1 or dtypes.pop() not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f'query, key, value must all be bfloat16 or all float16, got {query.dtype}')
  _, length, _, head_dim = query.shape
  if head_dim % 64:
    raise ValueError(f'head_dim must be a multiple of 64, got {head_dim}')
  if block_q % 64 or block_kv % 64 or block_q % block_kv:
    raise ValueError(
      f'block_q and block_kv must be multiples of 64 and block_q a multiple of block_kv, got '
      f'{block_q}, {block_kv}'
    )
  tile_q = 2 * block_q if warp_specialized else block_q
  if length % tile_q:
    what = '2·block_q' if warp_specialized else 'block_q'
    raise ValueError(f'length must be a multiple of {what}={tile_q}, got {length}')
  memory = key.shape[1] - length
  if memory < 0 or memory % block_kv:
    raise ValueError(
      f'kv_len - q_len (the memory before the queries) must be a non-negative multiple of '
      f'block_kv={block_kv}, got {key.shape[1]} - {length}'
    )
  if rel_key.ndim != 2 or rel_key.shape != rel_value.shape or rel_key.shape[0] % 2 != 1:
    raise ValueError(
      f'rel_key, rel_value must share one [2k+1, head_dim] shape, got {rel_key.shape}, '
      f'{rel_value.shape}'
    )
  if rel_key.shape[1] != head_dim:
    raise ValueError(f'rel_key has {rel_key.shape[1]} columns, head_dim is {head_dim}')
  if (smem := _smem_bytes(head_dim, block_q, block_kv, warp_specialized)) > SMEM_BYTES:
    raise ValueError(
      f'block_q={block_q}, block_kv={block_kv}, head_dim={head_dim} need {smem} bytes of shared '
      f'memory, more than the {SMEM_BYTES} of an H100'
    )


def _smem_bytes(head_dim: int, block_q: int, block_kv: int, warp_specialized: bool) -> int:
  """Shared memory the kernel allocates: per compute warpgroup 16-bit q and p, float32 band bias
  (two slots), band logits and two row statistics; 16-bit kᵀ and v (two slots); plus
  `SMEM_RESERVE` for barriers and alignment."""
  rows = 2 * block_q if warp_specialized else block_q
  buffers = 2 * (rows * head_dim + 4 * block_kv * head_dim + rows * block_kv)
  return buffers + 4 * (3 * rows * block_kv + 2 * rows) + SMEM_RESERVE


def _forward_kernel(
  q, key_t, v, band_bias, *, block_q, block_kv, num_band, warp_specialized, interpret
):
  """The Mosaic GPU kernel (see the module docstring). key_t is the key transposed, [B, H, d, n].
  Returns the value term Σ_j p_ij v_j (input dtype), lse' (natural log) and the far mass
  [B, H, n], and the band logits e' [B, H, n, num_band·block_kv].

  One warpgroup that copies and computes, or (warp_specialized) two compute warpgroups ("wg" 0
  and 1, block_q rows each of a 2·block_q-row query tile) and a copying one (wg 2) that fills
  the two slots ahead, refilling a slot once both compute warpgroups have arrived on its
  `consumed` barrier. The band is the program's, so all compute warpgroups walk the same tiles.
  """
  batch, length, heads, head_dim = q.shape
  dtype = q.dtype
  band_width = num_band * block_kv
  memory_tiles = (key_t.shape[3] - length) // block_kv  # key tiles before query 0's position
  scale = 1.0 / math.sqrt(head_dim)
  compute_wgs = 2 if warp_specialized else 1
  tile_q = compute_wgs * block_q  # query rows per program
  kv_per_q = tile_q // block_kv
  slots = 2

  layout, load = register_ops(interpret)

  def slot_of(step):
    return step % slots if isinstance(step, int) else lax.rem(step, slots)

  def kernel(q_ref, k_ref, v_ref, bias_ref, out_ref, lse_ref, far_ref, logits_ref, scratch):
    smem, barriers = scratch
    q_smems, k_smem, v_smem, p_smems, bias_smem, logit_smems, stat_smems = smem
    q_barriers, kv_barriers, bias_barriers, consumed = barriers
    b = lax.axis_index('batch')
    h = lax.axis_index('heads')
    t = lax.axis_index('q_seq')
    kv_end = memory_tiles + (t + 1) * kv_per_q  # one past the diagonal's key tile
    # Steps 0 .. num_band - 1: band tiles kv_end - 1 - step (diagonal first; below 0 they load
    # tile 0, all -inf in the bias). Steps num_band .. num_steps - 1: far tiles step - num_band.
    num_far = jnp.maximum(kv_end - num_band, 0)
    num_steps = num_band + num_far

    def issue(step):
      """TMA copies of step `step`'s key and value tiles (and band bias, for a band step: those
      are static) into its slot."""
      band = isinstance(step, int) and step < num_band
      slot = slot_of(step)
      tile = jnp.maximum(kv_end - 1 - step, 0) if band else step - num_band
      cols = pl.ds(tile * block_kv, block_kv)
      plgpu.copy_gmem_to_smem(k_ref.at[b, h, :, cols], k_smem.at[slot], kv_barriers.at[slot])
      plgpu.copy_gmem_to_smem(v_ref.at[b, cols, h], v_smem.at[slot], kv_barriers.at[slot])
      if band:
        band_cols = pl.ds((num_band - 1 - step) * block_kv, block_kv)
        for w in range(compute_wgs):
          rows = pl.ds(t * tile_q + w * block_q, block_q)
          plgpu.copy_gmem_to_smem(
            bias_ref.at[b, h, rows, band_cols], bias_smem.at[slot, w], bias_barriers.at[slot]
          )

    def compute(wg):
      q_smem, p_smem, logit_smem, stat_smem = (
        ref.at[wg] for ref in (q_smems, p_smems, logit_smems, stat_smems)
      )
      rows = pl.ds(t * tile_q + wg * block_q, block_q)
      plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem, q_barriers.at[wg])
      if not warp_specialized:
        issue(0)
      plgpu.barrier_wait(q_barriers.at[wg])

      def step_body(step, carry):
        """One key tile: a static `step` is a band step."""
        acc, m_i, l_i, far_i = carry
        band = isinstance(step, int)
        slot = slot_of(step)
        if not warp_specialized:  # prefetch the next step's tiles into the other slot
          if band and step + 1 < num_band:
            issue(step + 1)
          else:
            pl.when(step + 1 < num_steps)(lambda: issue(step + 1))
        plgpu.barrier_wait(kv_barriers.at[slot])

        def compute_qk(acc_ref):
          plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot])
          return acc_ref[...]

        s = pl.run_scoped(compute_qk, plgpu.ACC((block_q, block_kv), jnp.float32)) * scale
        if band:
          plgpu.barrier_wait(bias_barriers.at[slot])
          s = s + load(bias_smem.at[slot, wg], plgpu.Layout.WGMMA)
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last band logits left SMEM
          logit_smem[...] = s
          plgpu.commit_smem()
          band_cols = pl.ds((num_band - 1 - step) * block_kv, block_kv)
          plgpu.copy_smem_to_gmem(logit_smem, logits_ref.at[b, h, rows, band_cols])
        m_new = jnp.maximum(m_i, s.max(axis=1) * LOG2E)
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(m_new, s.shape, [0]))
        p_sum = p.sum(axis=1)
        l_i = l_i * alpha + p_sum
        far_i = far_i * alpha if band else far_i * alpha + p_sum
        p_smem[...] = p.astype(dtype)
        plgpu.commit_smem()

        def compute_pv(acc_ref):
          plgpu.wgmma(acc_ref, p_smem, v_smem.at[slot])
          return acc_ref[...]

        pv = pl.run_scoped(compute_pv, plgpu.ACC((block_q, head_dim), jnp.float32))
        if warp_specialized:
          plgpu.barrier_arrive(consumed.at[slot])  # this warpgroup is done with the slot
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv
        return acc, m_new, l_i, far_i

      def vector(value):
        return layout(jnp.full((block_q,), value, jnp.float32), plgpu.Layout.WGMMA.reduce(1))

      # The running max starts finite (in log2 units), so a row that has seen only masked keys
      # (-inf logits) so far rescales by 1, not by exp2(-inf + inf).
      carry = (
        layout(jnp.zeros((block_q, head_dim), jnp.float32), plgpu.Layout.WGMMA),
        vector(MASKED_LOGIT),
        vector(0.0),
        vector(0.0),
      )
      for step in range(num_band):
        carry = step_body(step, carry)
      acc, m_i, l_i, far_i = lax.fori_loop(num_band, num_steps, step_body, carry)

      q_smem[...] = (acc / lax.broadcast_in_dim(l_i, acc.shape, [0])).astype(dtype)  # q is done
      stat_smem.at[0][...] = (m_i + jnp.log2(l_i)) / LOG2E
      stat_smem.at[1][...] = far_i / l_i
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(q_smem, out_ref.at[b, rows, h])
      plgpu.copy_smem_to_gmem(stat_smem.at[0], lse_ref.at[b, h, rows])
      plgpu.copy_smem_to_gmem(stat_smem.at[1], far_ref.at[b, h, rows])
      plgpu.wait_smem_to_gmem(0)

    def copy():
      """The copying warpgroup: every step's tiles, a slot refilled once both compute
      warpgroups have released it."""
      for step in range(num_band):
        if step >= slots:
          plgpu.barrier_wait(consumed.at[slot_of(step)])
        issue(step)

      @pl.loop(num_band, num_steps)
      def _(step):
        pl.when(step >= slots)(lambda: plgpu.barrier_wait(consumed.at[slot_of(step)]))
        issue(step)

      # Wait for the last uses of the slots too: unneeded on the GPU, but the interpreter wants
      # every barrier phase a thread waits on observed by it before the barrier is freed.
      @pl.loop(jnp.maximum(num_steps - slots, 0), num_steps)
      def _(step):
        plgpu.barrier_wait(consumed.at[slot_of(step)])

    if not warp_specialized:
      compute(0)
      return
    wg = lax.axis_index('wg')

    @pl.when(wg < compute_wgs)
    def _():
      plgpu.set_max_registers(232, action='increase')
      compute(wg)

    @pl.when(wg == compute_wgs)
    def _():
      plgpu.set_max_registers(40, action='decrease')
      copy()

  def entry(*refs):
    # 128-byte swizzled tiles (64 16-bit or 32 32-bit columns): bank-conflict-free register
    # transfers and wgmma operands.
    tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    tiled32 = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
    wgs = compute_wgs
    smem = [
      plgpu.SMEM((wgs, block_q, head_dim), dtype, transforms=tiled),  # q, then the output
      plgpu.SMEM((slots, head_dim, block_kv), dtype, transforms=tiled),  # kᵀ
      plgpu.SMEM((slots, block_kv, head_dim), dtype, transforms=tiled),  # v
      plgpu.SMEM((wgs, block_q, block_kv), dtype, transforms=tiled),  # p
      plgpu.SMEM((slots, wgs, block_q, block_kv), jnp.float32, transforms=tiled32),  # band bias
      plgpu.SMEM((wgs, block_q, block_kv), jnp.float32, transforms=tiled32),  # band logits
      plgpu.SMEM((wgs, 2, block_q), jnp.float32),  # lse', far mass
    ]
    barriers = (
      plgpu.Barrier(num_barriers=wgs),  # q
      plgpu.Barrier(num_arrivals=2, num_barriers=slots),  # k and v
      plgpu.Barrier(num_arrivals=wgs, num_barriers=slots),  # band bias, a copy per warpgroup
      # consumed: each compute warpgroup arrives when done with a slot.
      plgpu.Barrier(num_arrivals=wgs, num_barriers=slots) if warp_specialized else None,
    )
    collective = {'collective_axes': 'wg'} if warp_specialized else {}
    pl.run_scoped(lambda *scratch: kernel(*refs, scratch), smem, barriers, **collective)

  out_type = (
    jax.ShapeDtypeStruct((batch, length, heads, head_dim), dtype),
    jax.ShapeDtypeStruct((batch, heads, length), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, length), jnp.float32),
    jax.ShapeDtypeStruct((batch, heads, length, band_width), jnp.float32),
  )
  threads = {'num_threads': compute_wgs + 1, 'thread_name': 'wg'} if warp_specialized else {}
  return plgpu.kernel(
    named(entry, 'relpos_shaw_forward'),
    out_type=out_type,
    grid=(heads, length // tile_q, batch),
    grid_names=('heads', 'q_seq', 'batch'),
    compiler_params=COMPILER_PARAMS,
    interpret=interpret or False,
    **threads,
  )(q, key_t, v, band_bias)


_BWD_BLOCK_Q = 64  # query rows per step of both backward kernels (a sub-tile of the forward's)


def _bwd_smem_bytes(head_dim: int, block_kv: int) -> int:
  """Shared memory of the larger backward kernel. dq: 16-bit q and g_z, three row statistics;
  per slot (two) 16-bit kᵀ, vᵀ and k and float32 band bias and g_band; a 16-bit and a float32
  dS. dk/dv: 16-bit k and v; per slot q, g_z, qᵀ, g_zᵀ, the band pair's Pᵀ and dSᵀ (16-bit) and
  two row statistics; 16-bit Pᵀ and dSᵀ. Plus `SMEM_RESERVE` for barriers and alignment."""
  bq, bk, d = _BWD_BLOCK_Q, block_kv, head_dim
  dq = 2 * 2 * bq * d + 4 * 3 * bq + 2 * (3 * 2 * d * bk + 2 * 4 * bq * bk) + 2 * bq * bk
  dq += 4 * bq * bk
  dkv = 2 * 2 * bk * d + 2 * (4 * 2 * bq * d + 2 * 2 * bk * bq + 4 * 2 * bq) + 2 * 2 * bk * bq
  return max(dq, dkv) + SMEM_RESERVE


def _div(x, n: int):
  """x // n for a non-negative traced integer (lax.div truncates, which Mosaic GPU lowers)."""
  return lax.div(x, jnp.asarray(n, x.dtype))


def _dq_kernel(
  q, g_z, key_t, value_t, key, stats, bias, g_band, *, tile_q, block_kv, num_band, interpret
):
  """dq and the band tiles' dS (see the module docstring). One warpgroup per program, a program
  per _BWD_BLOCK_Q query rows (a sub-tile of the forward's tile_q-row tile, whose band it
  walks, like the forward: band tiles from the diagonal down, then the far tiles). key_t and
  value_t are [B, H, d, n]; stats [B, H, 3, n] holds lse', D and D - g_f. Returns dq (input
  dtype) and dS on the band [B, H, n, num_band·block_kv] (float32)."""
  batch, length, heads, head_dim = q.shape
  dtype = q.dtype
  bq = _BWD_BLOCK_Q
  subtiles = tile_q // bq
  kv_per_q = tile_q // block_kv
  band_width = num_band * block_kv
  memory_tiles = (key.shape[1] - length) // block_kv
  scale = 1.0 / math.sqrt(head_dim)
  slots = 2

  layout, load = register_ops(interpret)

  def kernel(
    q_ref,
    gz_ref,
    kt_ref,
    vt_ref,
    k_ref,
    stats_ref,
    bias_ref,
    gband_ref,
    dq_ref,
    ds_ref,
    smem,
    barriers,
  ):
    q_smem, gz_smem, stat_smem, kt_smem, vt_smem, k_smem, bias_smem, gband_smem = smem[:8]
    ds_smem, ds_out_smem = smem[8:]
    row_barrier, kv_barriers, band_barriers = barriers
    b = lax.axis_index('batch')
    h = lax.axis_index('heads')
    u = lax.axis_index('q_seq')
    rows = pl.ds(u * bq, bq)
    # The forward tile's: one past the diagonal.
    kv_end = memory_tiles + (_div(u, subtiles) + 1) * kv_per_q
    num_far = jnp.maximum(kv_end - num_band, 0)
    num_steps = num_band + num_far

    def issue(step):
      band = isinstance(step, int) and step < num_band
      slot = step % slots if isinstance(step, int) else lax.rem(step, slots)
      tile = jnp.maximum(kv_end - 1 - step, 0) if band else step - num_band
      cols = pl.ds(tile * block_kv, block_kv)
      plgpu.copy_gmem_to_smem(kt_ref.at[b, h, :, cols], kt_smem.at[slot], kv_barriers.at[slot])
      plgpu.copy_gmem_to_smem(vt_ref.at[b, h, :, cols], vt_smem.at[slot], kv_barriers.at[slot])
      plgpu.copy_gmem_to_smem(k_ref.at[b, cols, h], k_smem.at[slot], kv_barriers.at[slot])
      if band:
        band_cols = pl.ds((num_band - 1 - step) * block_kv, block_kv)
        for src, dst in ((bias_ref, bias_smem), (gband_ref, gband_smem)):
          plgpu.copy_gmem_to_smem(
            src.at[b, h, rows, band_cols], dst.at[slot], band_barriers.at[slot]
          )

    plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem, row_barrier.at[0])
    plgpu.copy_gmem_to_smem(gz_ref.at[b, rows, h], gz_smem, row_barrier.at[0])
    plgpu.copy_gmem_to_smem(stats_ref.at[b, h, :, rows], stat_smem, row_barrier.at[0])
    issue(0)
    plgpu.barrier_wait(row_barrier.at[0])
    row = plgpu.Layout.WGMMA.reduce(1)
    lse = load(stat_smem.at[0], row) * LOG2E
    delta_band = load(stat_smem.at[1], row)
    delta_far = load(stat_smem.at[2], row)

    def step_body(step, dq_acc):
      band = isinstance(step, int)
      slot = step % slots if band else lax.rem(step, slots)
      if band and step + 1 < num_band:
        issue(step + 1)
      else:
        pl.when(step + 1 < num_steps)(lambda: issue(step + 1))
      plgpu.barrier_wait(kv_barriers.at[slot])
      shape = (bq, block_kv)
      s, dp = matmuls((q_smem, kt_smem.at[slot], shape), (gz_smem, vt_smem.at[slot], shape))
      s = s * scale
      if band:
        plgpu.barrier_wait(band_barriers.at[slot])
        s = s + load(bias_smem.at[slot], plgpu.Layout.WGMMA)
      p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(lse, shape, [0]))
      if band:
        ds = p * (dp - lax.broadcast_in_dim(delta_band, shape, [0]))
        ds = ds + load(gband_smem.at[slot], plgpu.Layout.WGMMA)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last band dS left SMEM
        ds_out_smem[...] = ds
      else:
        ds = p * (dp - lax.broadcast_in_dim(delta_far, shape, [0]))
      ds_smem[...] = ds.astype(dtype)
      plgpu.commit_smem()
      if band:
        band_cols = pl.ds((num_band - 1 - step) * block_kv, block_kv)
        plgpu.copy_smem_to_gmem(ds_out_smem, ds_ref.at[b, h, rows, band_cols])
      return dq_acc + matmuls((ds_smem, k_smem.at[slot], (bq, head_dim)))

    dq_acc = layout(jnp.zeros((bq, head_dim), jnp.float32), plgpu.Layout.WGMMA)
    for step in range(num_band):
      dq_acc = step_body(step, dq_acc)
    dq_acc = lax.fori_loop(num_band, num_steps, step_body, dq_acc)
    q_smem[...] = (dq_acc * scale).astype(dtype)  # q is done
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[b, rows, h])
    plgpu.wait_smem_to_gmem(0)

  tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  tiled32 = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
  smem = [
    plgpu.SMEM((bq, head_dim), dtype, transforms=tiled),  # q, then dq
    plgpu.SMEM((bq, head_dim), dtype, transforms=tiled),  # g_z
    plgpu.SMEM((3, bq), jnp.float32),  # lse', D, D - g_f
    plgpu.SMEM((slots, head_dim, block_kv), dtype, transforms=tiled),  # kᵀ
    plgpu.SMEM((slots, head_dim, block_kv), dtype, transforms=tiled),  # vᵀ
    plgpu.SMEM((slots, block_kv, head_dim), dtype, transforms=tiled),  # k
    plgpu.SMEM((slots, bq, block_kv), jnp.float32, transforms=tiled32),  # band bias
    plgpu.SMEM((slots, bq, block_kv), jnp.float32, transforms=tiled32),  # g_band
    plgpu.SMEM((bq, block_kv), dtype, transforms=tiled),  # dS, the dq matmul's operand
    plgpu.SMEM((bq, block_kv), jnp.float32, transforms=tiled32),  # band dS, written out
  ]
  barriers = (
    plgpu.Barrier(num_arrivals=3, num_barriers=1),  # q, g_z, statistics
    plgpu.Barrier(num_arrivals=3, num_barriers=slots),  # kᵀ, vᵀ, k
    plgpu.Barrier(num_arrivals=2, num_barriers=slots),  # band bias, g_band
  )
  out_type = (
    jax.ShapeDtypeStruct(q.shape, dtype),
    jax.ShapeDtypeStruct((batch, heads, length, band_width), jnp.float32),
  )
  return plgpu.kernel(
    named(kernel, 'relpos_shaw_backward_dq'),
    out_type=out_type,
    scratch_types=[smem, barriers],
    grid=(heads, length // bq, batch),
    grid_names=('heads', 'q_seq', 'batch'),
    compiler_params=COMPILER_PARAMS,
    interpret=interpret or False,
  )(q, g_z, key_t, value_t, key, stats, bias, g_band)


def _dkv_kernel(
  q, q_t, g_z, g_z_t, key, value, stats, p_t, ds_t, *, tile_q, block_kv, num_band, interpret
):
  """dk and dv (see the module docstring). One warpgroup per program, a program per key tile,
  walking the _BWD_BLOCK_Q-row query sub-tiles that see it: first those whose forward tile has
  it in the band (their Pᵀ and dSᵀ tiles read from p_t and ds_t, [B, H, tiles, band_width,
  tile_q], 16-bit: two matmuls), then those for which it is far (recomputed in transposed form,
  Sᵀ = k·qᵀ: four matmuls). q_t and g_z_t are [B, H, d, n]; stats [B, H, 2, n] holds lse' and
  D - g_f."""
  batch, length, heads, head_dim = q.shape
  dtype = q.dtype
  bq = _BWD_BLOCK_Q
  subtiles = tile_q // bq
  kv_per_q = tile_q // block_kv
  num_sub = length // bq
  memory_tiles = (key.shape[1] - length) // block_kv
  scale = 1.0 / math.sqrt(head_dim)
  slots = 2

  layout, load = register_ops(interpret)

  def kernel(
    q_ref,
    qt_ref,
    gz_ref,
    gzt_ref,
    k_ref,
    v_ref,
    stats_ref,
    pt_ref,
    dst_ref,
    dk_ref,
    dv_ref,
    smem,
    barriers,
  ):
    k_smem, v_smem, q_smem, gz_smem, qt_smem, gzt_smem, stat_smem = smem[:7]
    pt_smem, dst_smem, p_smem, ds_smem = smem[7:]
    kv_barrier, row_barriers, band_barriers, far_barriers = barriers
    b = lax.axis_index('batch')
    h = lax.axis_index('heads')
    j = lax.axis_index('kv_seq')
    kv_cols = pl.ds(j * block_kv, block_kv)
    plgpu.copy_gmem_to_smem(k_ref.at[b, kv_cols, h], k_smem, kv_barrier.at[0])
    plgpu.copy_gmem_to_smem(v_ref.at[b, kv_cols, h], v_smem, kv_barrier.at[0])
    # Query sub-tiles u >= first see key tile j (their tile's diagonal is at or after it: all of
    # them for a memory tile, j < memory_tiles); it is in their tile's band for u < far
    # (j >= kv_end - num_band), far after.
    first = _div(jnp.maximum(j - memory_tiles, 0), kv_per_q) * subtiles
    far = _div(jnp.maximum(j + num_band - memory_tiles, 0), kv_per_q) * subtiles
    far = jnp.minimum(far, num_sub)
    num_band_steps = far - first
    num_steps = num_sub - first

    def issue(step):
      u = first + step
      slot = lax.rem(step, slots)
      rows = pl.ds(u * bq, bq)
      plgpu.copy_gmem_to_smem(q_ref.at[b, rows, h], q_smem.at[slot], row_barriers.at[slot])
      plgpu.copy_gmem_to_smem(gz_ref.at[b, rows, h], gz_smem.at[slot], row_barriers.at[slot])

      @pl.when(step < num_band_steps)
      def _():
        t = _div(u, subtiles)
        band_rows = pl.ds((num_band - memory_tiles - (t + 1) * kv_per_q + j) * block_kv, block_kv)
        cols = pl.ds(lax.rem(u, subtiles) * bq, bq)
        for src, dst in ((pt_ref, pt_smem), (dst_ref, dst_smem)):
          plgpu.copy_gmem_to_smem(
            src.at[b, h, t, band_rows, cols], dst.at[slot], band_barriers.at[slot]
          )

      @pl.when(step >= num_band_steps)
      def _():
        for src, dst in ((qt_ref, qt_smem), (gzt_ref, gzt_smem), (stats_ref, stat_smem)):
          plgpu.copy_gmem_to_smem(src.at[b, h, :, rows], dst.at[slot], far_barriers.at[slot])

    issue(0)
    plgpu.barrier_wait(kv_barrier.at[0])
    out_shape = (block_kv, head_dim)

    def prologue(step):
      pl.when(step + 1 < num_steps)(lambda: issue(step + 1))
      slot = lax.rem(step, slots)
      plgpu.barrier_wait(row_barriers.at[slot])
      return slot

    def band_body(step, carry):
      dk_acc, dv_acc = carry
      slot = prologue(step)
      plgpu.barrier_wait(band_barriers.at[slot])
      dk, dv = matmuls(
        (dst_smem.at[slot], q_smem.at[slot], out_shape),
        (pt_smem.at[slot], gz_smem.at[slot], out_shape),
      )
      return dk_acc + dk, dv_acc + dv

    def far_body(step, carry):
      dk_acc, dv_acc = carry
      slot = prologue(step)
      plgpu.barrier_wait(far_barriers.at[slot])
      shape = (block_kv, bq)
      s_t, dp_t = matmuls((k_smem, qt_smem.at[slot], shape), (v_smem, gzt_smem.at[slot], shape))
      column = plgpu.Layout.WGMMA.reduce(0)
      lse = load(stat_smem.at[slot, 0], column) * LOG2E
      delta_far = load(stat_smem.at[slot, 1], column)
      p_t = jnp.exp2(s_t * (scale * LOG2E) - lax.broadcast_in_dim(lse, shape, [1]))
      ds_t = p_t * (dp_t - lax.broadcast_in_dim(delta_far, shape, [1]))
      p_smem[...] = p_t.astype(dtype)
      ds_smem[...] = ds_t.astype(dtype)
      plgpu.commit_smem()
      dk, dv = matmuls((ds_smem, q_smem.at[slot], out_shape), (p_smem, gz_smem.at[slot], out_shape))
      return dk_acc + dk, dv_acc + dv

    zeros = layout(jnp.zeros(out_shape, jnp.float32), plgpu.Layout.WGMMA)
    carry = lax.fori_loop(0, num_band_steps, band_body, (zeros, zeros))
    dk_acc, dv_acc = lax.fori_loop(num_band_steps, num_steps, far_body, carry)
    k_smem[...] = (dk_acc * scale).astype(dtype)  # k and v are done
    v_smem[...] = dv_acc.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, kv_cols, h])
    plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, kv_cols, h])
    plgpu.wait_smem_to_gmem(0)

  tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  smem = [
    plgpu.SMEM((block_kv, head_dim), dtype, transforms=tiled),  # k, then dk
    plgpu.SMEM((block_kv, head_dim), dtype, transforms=tiled),  # v, then dv
    plgpu.SMEM((slots, bq, head_dim), dtype, transforms=tiled),  # q
    plgpu.SMEM((slots, bq, head_dim), dtype, transforms=tiled),  # g_z
    plgpu.SMEM((slots, head_dim, bq), dtype, transforms=tiled),  # qᵀ
    plgpu.SMEM((slots, head_dim, bq), dtype, transforms=tiled),  # g_zᵀ
    plgpu.SMEM((slots, 2, bq), jnp.float32),  # lse', D - g_f
    plgpu.SMEM((slots, block_kv, bq), dtype, transforms=tiled),  # band Pᵀ
    plgpu.SMEM((slots, block_kv, bq), dtype, transforms=tiled),  # band dSᵀ
    plgpu.SMEM((block_kv, bq), dtype, transforms=tiled),  # far Pᵀ
    plgpu.SMEM((block_kv, bq), dtype, transforms=tiled),  # far dSᵀ
  ]
  barriers = (
    plgpu.Barrier(num_arrivals=2, num_barriers=1),  # k, v
    plgpu.Barrier(num_arrivals=2, num_barriers=slots),  # q, g_z
    plgpu.Barrier(num_arrivals=2, num_barriers=slots),  # band Pᵀ, dSᵀ
    plgpu.Barrier(num_arrivals=3, num_barriers=slots),  # qᵀ, g_zᵀ, statistics
  )
  out_type = (jax.ShapeDtypeStruct(key.shape, dtype), jax.ShapeDtypeStruct(key.shape, dtype))
  return plgpu.kernel(
    named(kernel, 'relpos_shaw_backward_dkv'),
    out_type=out_type,
    scratch_types=[smem, barriers],
    grid=(heads, key.shape[1] // block_kv, batch),
    grid_names=('heads', 'kv_seq', 'batch'),
    compiler_params=COMPILER_PARAMS,
    interpret=interpret or False,
  )(q, q_t, g_z, g_z_t, key, value, stats, p_t, ds_t)


class _Config(NamedTuple):
  """The kernels' static arguments (hashable: a custom_vjp nondiff argument)."""

  block_q: int
  block_kv: int
  num_band: int
  warp_specialized: bool
  interpret: object  # False or an InterpretGPUParams


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _kernel(config, query, key, value, bias):
  """K(q, k, v, band bias) -> (z, lse', far mass, band logits): the forward kernel, with the
  backward kernels as its VJP."""
  return _forward_kernel(
    query,
    key.transpose(0, 2, 3, 1),
    value,
    bias,
    block_q=config.block_q,
    block_kv=config.block_kv,
    num_band=config.num_band,
    warp_specialized=config.warp_specialized,
    interpret=config.interpret,
  )


def _kernel_fwd(config, query, key, value, bias):
  out = _kernel(config, query, key, value, bias)
  z, lse, far, logits = out
  return out, (query, key, value, bias, z, lse, far, logits)


def _kernel_bwd(config, residuals, cotangents):
  """The module docstring's backward: D by XLA, then the dq kernel (dq, band dS), XLA's
  transposed band Pᵀ and dSᵀ, then the dk/dv kernel."""
  query, key, value, bias, z, lse, far, logits = residuals
  g_z, g_lse, g_far, g_band = cotangents
  batch, length, heads, head_dim = query.shape
  dtype = query.dtype
  if (smem := _bwd_smem_bytes(head_dim, config.block_kv)) > SMEM_BYTES:
    raise ValueError(
      f'the backward kernels with block_kv={config.block_kv}, head_dim={head_dim} need {smem} '
      f'bytes of shared memory, more than the {SMEM_BYTES} of an H100'
    )
  tile_q = 2 * config.block_q if config.warp_specialized else config.block_q
  tiles = length // tile_q
  g_z = g_z.astype(dtype)
  g_z32 = g_z.astype(jnp.float32)
  delta = jnp.einsum('bnhd,bnhd->bhn', g_z32, z.astype(jnp.float32)) + g_far * far - g_lse
  kernel_args = {
    'tile_q': tile_q,
    'block_kv': config.block_kv,
    'num_band': config.num_band,
    'interpret': config.interpret,
  }
  d_query, d_bias = _dq_kernel(
    query,
    g_z,
    key.transpose(0, 2, 3, 1),
    value.transpose(0, 2, 3, 1),
    key,
    jnp.stack([lse, delta, delta - g_far], axis=2),
    bias,
    g_band.astype(jnp.float32),
    **kernel_args,
  )

  def by_key(x):  # [B, H, n, band_width] -> [B, H, tiles, band_width, tile_q], 16-bit
    x = x.reshape(batch, heads, tiles, tile_q, -1)
    return x.swapaxes(-1, -2).astype(dtype)

  d_key, d_value = _dkv_kernel(
    query,
    query.transpose(0, 2, 3, 1),
    g_z,
    g_z.transpose(0, 2, 3, 1),
    key,
    value,
    jnp.stack([lse, delta - g_far], axis=2),
    by_key(jnp.exp(logits - lse[..., None])),
    by_key(d_bias),
    **kernel_args,
  )
  return d_query, d_key, d_value, d_bias


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


def shaw_attention_mosaic(
  query,
  key,
  value,
  rel_key,
  rel_value,
  *,
  block_q=64,
  block_kv=64,
  warp_specialized=False,
  interpret=False,
  return_lse=False,
):
  """Causal Shaw attention with Mosaic GPU kernels (differentiable); see the module docstring.

  query: [batch, len, heads, head_dim]; key, value: [batch, kv_len, heads, head_dim], kv_len =
  len + a memory of a multiple of block_kv positions before the queries (query i at position
  kv_len - len + i; kv_len = len for self-attention); bf16 or f16, head_dim a multiple of 64, len
  a multiple of block_q (2·block_q when warp_specialized; block_q a multiple of block_kv, both
  multiples of 64). rel_key, rel_value: [2k+1, head_dim], shared by all heads. Returns z [batch,
  len, heads, head_dim] in the input dtype, and with return_lse=True also the logsumexp of each
  row's logits [batch, heads, len] (float32). warp_specialized picks the FA3-style kernel (see
  the module docstring); interpret=True runs Mosaic GPU's interpreter (CPU), as does an
  `InterpretGPUParams` (e.g. with detect_races=True). Raises ValueError (one line) for shapes,
  dtypes or tiles it does not support; the gradient's trace raises ValueError where the backward
  kernels would not fit in shared memory (block_kv > 64 or head_dim > 128).
  """
  _check(query, key, value, rel_key, rel_value, block_q, block_kv, warp_specialized)
  batch, length, heads, head_dim = query.shape
  kv_len = key.shape[1]
  memory = kv_len - length  # query i sits at position memory + i
  max_distance = table_max_distance(rel_key)
  tile_q = 2 * block_q if warp_specialized else block_q  # query rows per program
  num_band = band_tiles(length, max_distance, tile_q, block_kv, memory)
  offsets = _band_offsets(tile_q, block_kv, num_band)  # j - pos_i, [block_q, band_width]
  # Causal attention uses only table rows first..k (j - pos_i from -min(k, kv_len - 1) to 0):
  # the tables are cut to those and the buckets counted from `first`.
  first = max(0, max_distance - (kv_len - 1))
  buckets = np.clip(offsets, -max_distance, 0) + max_distance - first
  rel_key, rel_value = rel_key[first : max_distance + 1], rel_value[first : max_distance + 1]
  tiles = length // tile_q

  # Before: qw minus its column 0 (the far tiles' row constant, bucket 0; when first > 0 there
  # are no far tiles and it is just a shift), gathered into the band bias.
  qw = jnp.einsum(
    'bnhd,rd->bhnr', query.astype(jnp.float32), rel_key.astype(jnp.float32)
  ) / math.sqrt(head_dim)
  row_constant = qw[..., 0]
  shifted = (qw - qw[..., :1]).reshape(batch, heads, tiles, tile_q, -1)
  index = jnp.broadcast_to(jnp.asarray(buckets), (batch, heads, tiles) + buckets.shape)
  bias = jnp.take_along_axis(shifted, index, axis=-1)
  # Keys j = pos_i + offset: masked where j > pos_i or j < 0 (band tiles before key 0).
  query_pos = memory + np.arange(tiles)[:, None, None] * tile_q + np.arange(tile_q)[:, None]
  key_pos = query_pos + offsets
  visible = (offsets <= 0)[None] & (key_pos >= 0)
  bias = jnp.where(visible, bias, -jnp.inf).reshape(batch, heads, length, -1)

  if interpret is True:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    interpret = InterpretGPUParams()
  config = _Config(block_q, block_kv, num_band, warp_specialized, interpret)
  out, lse, far, logits = _kernel(config, query, key, value, bias)

  # After: band probabilities folded into buckets (constant one-hot), plus the far mass.
  p_band = jnp.exp(logits - lse[..., None]).reshape(batch, heads, tiles, tile_q, -1)
  one_hot = jax.nn.one_hot(buckets, rel_key.shape[0], dtype=jnp.float32)
  buckets_p = jnp.einsum('bhtaw,awr->bhtar', p_band, one_hot).reshape(batch, heads, length, -1)
  buckets_p = buckets_p.at[..., 0].add(far)  # far mass is 0 when first > 0 (no far tiles)
  z = out + jnp.einsum('bhnr,rd->bnhd', buckets_p, rel_value.astype(jnp.float32))
  z = z.astype(query.dtype)
  return (z, lse + row_constant) if return_lse else z
