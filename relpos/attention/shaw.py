"""Relation-aware self-attention with clipped relative positions (Shaw et al. 2018).

    e_ij = q_i·(k_j + a^K_ij) / sqrt(d)        z_i = Σ_j α_ij (v_j + a^V_ij)
    a_ij = w[clip(j - pos_i, -k, k) + k]        (w^K, w^V: [2k+1, head_dim], shared by heads)

Besides the fused kernels ('pallas': `relpos.attention.pallas_shaw`; 'mosaic', causal calls
only: `relpos.attention.mosaic_shaw` through `_shaw_mosaic`), two exact XLA implementations,
chosen by `shaw_attention`'s 'xla' from the number of keys:

- `shaw_attention_dense`, the dense form for short sequences (at most
  `DENSE_MAX_KV_LEN` keys): one-hot [q_len, 2k+1, kv_len] matmuls select the table rows, so
  forward and backward are matmuls, with O(q·kv·(d + 2k+1)) memory shared by batch and heads.
- `shaw_attention_banded`, for long ones: it never builds a [q_len, kv_len, head_dim] tensor
  and never scatters. Both relative terms go through per-row tables of 2k+1 values: `q_i·w^K_r`
  is computed as [q_len, 2k+1] and spread over keys by a gather of buckets; probabilities are
  summed per row r (the transpose, which autodiff would make a scatter) by gathering the band
  |j - pos_i| < k as diagonals and reading the two clipped edges from blocked prefix sums. A
  `jax.custom_vjp` writes the backward pass from the same dense pieces and saves only the
  probabilities, so memory stays close to vanilla attention. With attention dropout it also
  saves the rng and regenerates the keep mask in the backward pass.

At a few dozen keys the band's fixed costs (index arithmetic, diagonal gathers, transposes)
outweigh the dense matmuls they avoid, and a band as wide as the sequence (k >= kv_len) is
all overhead; from a few hundred keys the dense form's per-pair work dominates.

What matters for the banded kernel's speed on XLA:CPU (benchmarks/attention.py, docs/kernels.md):
the
logit gradient ds is needed on the band's diagonals as well as whole; gathering the diagonals
from ds made XLA recompute ds inside the gather and therefore materialise the spread a^V term, a
[Q·K, B, H] array written out and read back transposed. So the diagonals of ds are computed from
the diagonals of its inputs instead. The block prefix sums take `blocks` extra matmul columns
(no column for the always-empty first prefix), in a [B, H, Q, ·] output.
"""

import functools
import math
import typing

import jax
import jax.numpy as jnp

from relpos.attention import autotune, mosaic_dispatch, mosaic_shaw
from relpos.attention.dot_product import attend, check_qkv, content_logits
from relpos.attention.implementations import DENSE_MAX_KV_LEN, resolve_implementation
from relpos.attention.masking import (
  accumulation_dtype,
  attention_dropout,
  causal_mask,
  check_dropout,
  default_query_offset,
  drop,
  dropout_keep,
  masked_softmax,
  query_key_distance,
  static_query_offset,
  table_max_distance,
  with_causal,
)
from relpos.attention.pallas_shaw import shaw_attention_pallas


def relative_buckets(q_len: int, kv_len: int, max_distance: int, *, query_offset=None):
  """Table row of every (query, key) pair: `clip(j - pos_i, -k, k) + k`, int32 [q_len, kv_len].

  Query i sits at absolute position `query_offset + i` (default `kv_len - q_len`), key j at j.
  """
  if query_offset is None:
    query_offset = default_query_offset(q_len, kv_len)
  distance = query_key_distance(q_len, kv_len, query_offset)
  return jnp.clip(distance, -max_distance, max_distance) + max_distance


def _prefix_block_size(kv_len: int) -> int:
  """Keys per block of the blocked prefix sums: sqrt(kv_len) rounded up to a power of two.

  Each block adds a column to a matmul and each key of the partial block a gathered
  diagonal: sqrt(kv_len) balances the two (docs/kernels.md has the measurements).
  """
  return 2 ** math.ceil(math.log2(max(1.0, math.sqrt(kv_len))))


class _Band:
  """The clipped-relative geometry of one (q_len, kv_len, k, query_offset) problem.

  `to_keys` spreads per-row values [.., q_len, 2k+1] over keys [.., q_len, kv_len];
  `to_rows` is its transpose, summing per-key values into rows. Both are dense: `to_keys` is a
  gather and `to_rows` reads the band's diagonals with a gather and the two clipped edges from
  blocked prefix sums (no scatter, no masked reduction over [q_len, kv_len], each of which costs
  a full extra pass over memory on CPU). The prefix sums over whole blocks of keys ride along
  in a matmul the kernel does anyway: `key_block_indicator` columns appended to V (forward) and
  to K (backward) make `p @ [V | C]` also return Σ_{j < n·block} p_ij.
  """

  def __init__(self, q_len, kv_len, max_distance, query_offset, causal=False):
    self.q_len, self.kv_len = q_len, kv_len
    # Causal: no key lies right of any query's band, so that edge is 0, not the rest of the
    # row (a difference of sums, whose rounding would give the tables' later rows, which no
    # causal query reads, a gradient of about 1e-6 and let Adam move them).
    self.causal = causal
    self.max_distance = k = max_distance
    self.rows = 2 * k + 1
    # Past these offsets every pair is an edge either way: clipping keeps the buckets exact.
    lowest, highest = -(q_len - 1) - k, kv_len - 1 + k
    static_offset = static_query_offset(query_offset)
    if static_offset is None:
      self.offset = jnp.clip(jnp.asarray(query_offset, jnp.int32), lowest, highest)
    else:
      self.offset = min(max(static_offset, lowest), highest)
    self.query_position = jnp.arange(q_len, dtype=jnp.int32)[:, None] + self.offset  # [Q, 1]
    distance = jnp.arange(kv_len, dtype=jnp.int32)[None, :] - self.query_position
    self.buckets = jnp.clip(distance, -k, k) + k  # [Q, K]
    self.block = _prefix_block_size(kv_len)
    self.blocks = -(-kv_len // self.block)
    self.boundary = jnp.arange(1, self.blocks + 1, dtype=jnp.int32) * self.block  # [n]
    # What `diagonals` reads: distances -k-block+1 .. k from each query, i.e. the partial block
    # left of the band, then the band |j - pos_i| < k and one more.
    window_distance = jnp.arange(self.block + 2 * k, dtype=jnp.int32) - k - self.block + 1
    self.window_buckets = jnp.clip(window_distance, -k, k) + k  # [W]
    self.window_key = self.query_position + window_distance[None, :]  # [Q, W]

  def key_block_indicator(self, dtype):
    """C[j, n] = [j < (n + 1)·block]: [kv_len, blocks]; `p @ C` gives block prefix sums, the
    last column the row total."""
    return (jnp.arange(self.kv_len)[:, None] < self.boundary[None, :]).astype(dtype)

  def to_keys(self, x_BHQR):
    """`out[i, j] = x[i, clip(j - pos_i, -k, k) + k]`: [.., q_len, kv_len]."""
    return x_BHQR[..., jnp.arange(self.q_len)[:, None], self.buckets]

  def diagonals(self, x_BHQK):
    """`out[i, c] = x[i, window_key[i, c]]`, 0 (False) where that key does not exist:
    [.., q_len, W] in x's dtype, W = block + 2k, what `to_rows` reads of per-key values."""
    key = self.window_key
    gathered = x_BHQK[..., jnp.arange(self.q_len)[:, None], jnp.clip(key, 0, self.kv_len - 1)]
    return jnp.where((key >= 0) & (key < self.kv_len), gathered, jnp.zeros((), x_BHQK.dtype))

  def window_rows(self, x_BHQR):
    """Per-row values [.., q_len, 2k+1] laid out like `diagonals`, [.., q_len, W]: the bucket
    of a diagonal does not depend on the row, so this is a static gather on the last axis."""
    return x_BHQR[..., self.window_buckets]

  def to_rows(self, diagonals_BHQW, block_prefix_BHQN):
    """`out[i, r] = Σ_{j: clip(j - pos_i, -k, k) + k = r} p[i, j]`: [.., q_len, 2k+1].

    Args:
      diagonals_BHQW: [.., q_len, W], `diagonals(p)` of per-key values p.
      block_prefix_BHQN: [.., q_len, blocks], `p @ key_block_indicator()`.
    """
    k, block = self.max_distance, self.block
    row = jnp.arange(self.rows)
    band = jnp.where((row > 0) & (row < 2 * k), diagonals_BHQW[..., block - 1 :], 0.0)
    # Left edge Σ_{j <= pos_i - k} p_ij = whole blocks before the boundary + the partial block.
    last_left = self.query_position - k  # [Q, 1]
    full_blocks_end = jnp.clip((last_left + 1) // block, 0, self.blocks) * block
    whole = jnp.where(self.boundary == full_blocks_end, block_prefix_BHQN, 0.0)
    partial = jnp.where(
      self.window_key[:, :block] >= full_blocks_end, diagonals_BHQW[..., :block], 0.0
    )
    left = jnp.sum(whole, axis=-1, keepdims=True) + jnp.sum(partial, axis=-1, keepdims=True)
    # Right edge: the rest of the row (for k = 0, rows 0 and 2k coincide and get the total);
    # none under a causal mask.
    if self.causal:
      return band + jnp.where(row == 0, left, 0.0)
    right = block_prefix_BHQN[..., -1:] - left - jnp.sum(band, axis=-1, keepdims=True)
    return band + jnp.where(row == 0, left, 0.0) + jnp.where(row == 2 * k, right, 0.0)


def _dot(subscripts, a, b):
  """einsum accumulated in (at least) float32; operands keep a's dtype (bf16 stays bf16)."""
  return jnp.einsum(
    subscripts, a, b.astype(a.dtype), preferred_element_type=accumulation_dtype(a.dtype)
  )


def _dot_with_block_prefix(p_BHQK, values_BKHD, band):
  """`Σ_j p_ij values_j` [B, Q, H, D] and block prefix sums of p [B, H, Q, blocks].

  With several queries, one matmul: laid out [B, H, Q, D + blocks] (as its operand p), then
  the first D columns are transposed, because an output in [B, Q, H, ..] order makes XLA:CPU
  stride across the matmul's memory; the appended columns ride along in the transposed copy
  of the values that the matmul needs anyway. A decoding step (one query) reads a cache laid
  out for the matmul, where appending would copy the whole cache per step: two matmuls then.
  """
  batch, kv_len, heads, head_dim = values_BKHD.shape
  indicator = band.key_block_indicator(values_BKHD.dtype)
  p_BHQK = p_BHQK.astype(values_BKHD.dtype)
  if band.q_len == 1:
    block_prefix = _dot('bhqk,kn->bhqn', p_BHQK, indicator)
    return _dot('bhqk,bkhd->bqhd', p_BHQK, values_BKHD), block_prefix
  indicator = jnp.broadcast_to(indicator, (batch, heads, kv_len, indicator.shape[-1]))
  values_BHKD = jnp.transpose(values_BKHD, (0, 2, 1, 3))
  both = _dot('bhqk,bhkd->bhqd', p_BHQK, jnp.concatenate([values_BHKD, indicator], axis=-1))
  return jnp.transpose(both[..., :head_dim], (0, 2, 1, 3)), both[..., head_dim:]


def _heads_first(x_BQHD):
  """[B, Q, H, D] -> [B, H, Q, D]: the layout the content matmuls transpose q and do to anyway.

  The small table matmuls (q·w^K, do·w^V and their transposes) written on it share that copy
  and give [B·H·Q, 2k+1] row-major outputs; written on [B, Q, H, D] they made XLA:CPU transpose
  q and do once more and lay the output out [2k+1, B·Q·H] (docs/kernels.md).
  """
  return jnp.transpose(x_BQHD, (0, 2, 1, 3))


class _Static(typing.NamedTuple):
  """What `_shaw` takes as static (hashable; no cotangent): the query offset where it is known
  at trace time (else None, and the traced one is an operand), the dropout rate, and whether
  the mask hides every key after its query (`causal`: the band's right edge is then empty)."""

  query_offset: int | None
  dropout_rate: float
  causal: bool


def _band_for(static: _Static, traced_offset, query, key, rel_key, rel_value):
  return _Band(
    query.shape[1],
    key.shape[1],
    table_max_distance(rel_key, rel_value),
    static.query_offset if traced_offset is None else traced_offset,
    static.causal,
  )


def _shaw_forward(static: _Static, query, key, value, rel_key, rel_value, mask, traced_offset, rng):
  """Returns output [B, Q, H, D], probs [B, H, Q, K] before dropout, and the probs after
  dropout summed per table row [B, H, Q, R] (None without rel_value).

  All three in `accumulation_dtype(value.dtype)`: float32 for bf16 inputs.
  """
  band = _band_for(static, traced_offset, query, key, rel_key, rel_value)
  logits = content_logits(query, key)
  if rel_key is not None:
    rel_logits = _dot('bhqd,rd->bhqr', _heads_first(query), rel_key) * query.shape[-1] ** -0.5
    logits += band.to_keys(rel_logits)
  probs = masked_softmax(logits, mask)
  dropped = attention_dropout(probs, static.dropout_rate, rng)
  if rel_value is None:
    return attend(dropped, value), probs, None
  output, block_prefix = _dot_with_block_prefix(dropped, value, band)
  prob_rows = band.to_rows(band.diagonals(dropped), block_prefix)
  return output + _dot('bhqr,rd->bqhd', prob_rows, rel_value), probs, prob_rows


# rng (None when the dropout rate is 0) gets no cotangent.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _shaw(static: _Static, query, key, value, rel_key, rel_value, mask, traced_offset, rng):
  operands = (query, key, value, rel_key, rel_value, mask, traced_offset, rng)
  output, _, _ = _shaw_forward(static, *operands)
  return output.astype(value.dtype)


def _shaw_fwd(static: _Static, query, key, value, rel_key, rel_value, mask, traced_offset, rng):
  operands = (query, key, value, rel_key, rel_value, mask, traced_offset, rng)
  output, probs, prob_rows = _shaw_forward(static, *operands)
  return output.astype(value.dtype), (*operands, output, probs, prob_rows)


def _shaw_bwd(static: _Static, residuals, d_output):
  (query, key, value, rel_key, rel_value, mask, traced_offset, rng, output, probs, prob_rows) = (
    residuals
  )
  band = _band_for(static, traced_offset, query, key, rel_key, rel_value)
  dropout_rate = static.dropout_rate
  scale = query.shape[-1] ** -0.5
  d_output = d_output.astype(value.dtype)
  acc = accumulation_dtype(value.dtype)
  # The forward pass weighted by p' = p ∘ keep / (1 - rate) (p' = p without dropout). The keep
  # mask is regenerated from the rng, so the residual is a key, not a [B, H, Q, K] mask; when
  # forward and backward share one jit, XLA merges the two identical draws into one.
  keep = None if dropout_rate == 0.0 else dropout_keep(rng, dropout_rate, probs.shape)
  dropped = probs if keep is None else drop(probs, keep, dropout_rate)
  # z_i = Σ_j p'_ij (v_j + a^V_ij)  =>  dp'_ij = do_i·v_j + do_i·a^V_ij
  d_value = _dot('bhqk,bqhd->bkhd', dropped.astype(value.dtype), d_output)
  d_probs = _dot('bqhd,bkhd->bhqk', d_output, value)
  d_rel_value = d_probs_rows = None
  if rel_value is not None:
    d_output_BHQD = _heads_first(d_output)
    d_rel_value = _dot('bhqr,bhqd->rd', prob_rows, d_output_BHQD.astype(acc))
    d_probs_rows = _dot('bhqd,rd->bhqr', d_output_BHQD, rel_value)

  def logit_grads(probs, d_probs, rel_d_probs, keep):
    """ds from p and dp' (content part, + the a^V part spread from per-row values).

    softmax: ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij'), where dp_ij = dp'_ij keep_ij / (1 - rate)
    and Σ_j p_ij dp_ij = Σ_j p'_ij dp'_ij = do_i·z_i.
    """
    if rel_d_probs is not None:
      d_probs = d_probs + rel_d_probs
    if keep is not None:
      d_probs = drop(d_probs, keep, dropout_rate)
    return (probs * (d_probs - row_dot[..., None]) * scale).astype(query.dtype)

  row_dot = jnp.einsum('bqhd,bqhd->bhq', d_output.astype(acc), output)
  d_logits = logit_grads(
    probs, d_probs, None if d_probs_rows is None else band.to_keys(d_probs_rows), keep
  )
  d_key = _dot('bhqk,bqhd->bkhd', d_logits, query)
  d_rel_key = None
  if rel_key is None:
    d_query = _dot('bhqk,bkhd->bqhd', d_logits, key)
  else:
    d_query, block_prefix = _dot_with_block_prefix(d_logits, key, band)
    # ds on the band's diagonals, from the diagonals of its inputs: reading them from ds
    # itself made XLA recompute ds there and so materialise the spread a^V term.
    d_logits_diagonals = logit_grads(
      band.diagonals(probs),
      band.diagonals(d_probs),
      None if d_probs_rows is None else band.window_rows(d_probs_rows),
      None if keep is None else band.diagonals(keep),
    )
    logit_rows = band.to_rows(d_logits_diagonals, block_prefix)
    d_query += _dot('bhqr,rd->bqhd', logit_rows, rel_key.astype(acc))
    d_rel_key = _dot('bhqr,bhqd->rd', logit_rows, _heads_first(query).astype(acc))
  cast = lambda grad, like: None if grad is None else grad.astype(like.dtype)  # noqa: E731
  return (
    cast(d_query, query),
    cast(d_key, key),
    cast(d_value, value),
    cast(d_rel_key, rel_key),
    cast(d_rel_value, rel_value),
    None,
    None,
    None,
  )


_shaw.defvjp(_shaw_fwd, _shaw_bwd)


def _check_tables(rel_key, rel_value, head_dim):
  tables = [t for t in (rel_key, rel_value) if t is not None]
  if not tables:
    raise ValueError(
      'shaw_attention needs rel_key, rel_value or both; got neither '
      '(use dot_product_attention for no relative terms)'
    )
  for table in tables:
    if table.ndim != 2 or table.shape[0] % 2 != 1 or table.shape[1] != head_dim:
      raise ValueError(f'relative tables must be [2k+1, head_dim={head_dim}], got {table.shape}')
  if len(tables) == 2 and rel_key.shape != rel_value.shape:
    raise ValueError(f'rel_key {rel_key.shape} and rel_value {rel_value.shape} differ in k')


def _check(query, key, value, rel_key, rel_value, dropout_rate, dropout_rng) -> float:
  """Validates a Shaw call; returns the dropout rate as a Python float."""
  check_qkv(query, key, value)
  _check_tables(rel_key, rel_value, query.shape[-1])
  return check_dropout(dropout_rate, dropout_rng)


def xla_form(kv_len: int, dense_max_kv_len: int = DENSE_MAX_KV_LEN) -> str:
  """'dense' or 'banded': the form `shaw_attention`'s 'xla' implementation uses for kv_len keys
  with the dense form up to `dense_max_kv_len` keys."""
  return 'dense' if kv_len <= dense_max_kv_len else 'banded'


def _shaw_mosaic(query, key, value, rel_key, rel_value, mask, causal, dense_max_kv_len):
  """'mosaic': `mosaic_shaw.shaw_attention_mosaic` where the call is causal when the step
  runs, else `shaw_attention` with `mosaic_dispatch.fallback`'s implementation
  (`relpos.attention.mosaic_dispatch`; checked by its `serves_call` first). Causal means: with
  `causal`, a `mask` that allows every causal pair (None, or e.g. a memory's filled slots);
  without, a `mask` equal to the causal mask. A missing table is a zero table (adds nothing)."""
  q_len, kv_len = query.shape[1], key.shape[1]

  def kernel(query, key, value, rel_key, rel_value, mask):
    del mask
    table = rel_key if rel_key is not None else rel_value
    rel_key, rel_value = (jnp.zeros_like(table) if t is None else t for t in (rel_key, rel_value))
    out = mosaic_shaw.shaw_attention_mosaic(
      *mosaic_dispatch.pad_to_tiles(q_len, query, key, value),
      rel_key.astype(query.dtype),
      rel_value.astype(query.dtype),
      block_q=mosaic_dispatch.BLOCK,
      block_kv=mosaic_dispatch.BLOCK,
      interpret=mosaic_dispatch.interpret(),
    )
    return out[:, :q_len].astype(value.dtype)

  def other(query, key, value, rel_key, rel_value, mask):
    implementation = mosaic_dispatch.fallback(kv_len)
    out = shaw_attention(
      query,
      key,
      value,
      rel_key,
      rel_value,
      mask=mask,
      causal=causal,
      implementation=implementation,
      dense_max_kv_len=dense_max_kv_len,
    )
    return out.astype(value.dtype)

  if causal:
    use_kernel = mosaic_dispatch.allows_causal(mask, q_len, kv_len)
  else:
    use_kernel = jnp.all(mask == causal_mask(q_len, kv_len))
  operands = (query, key, value, rel_key, rel_value, mask)
  return mosaic_dispatch.run(use_kernel, kernel, other, *operands)


def _tuned(
  query, key, rel_key, rel_value, mask, causal, dropout_rate, block_sizes, dense_max_kv_len
) -> str:
  """'auto' for this call: the autotuner's choice at its shapes and the caller's tiles
  ('xla', 'pallas' or 'pallas@QxK'; `relpos.attention.autotune`), 'xla' timed in the form the
  caller's `dense_max_kv_len` gives it."""
  return autotune.choose(
    lambda: autotune.shaw_signature(
      query,
      key,
      rel_key,
      rel_value,
      mask,
      dropout_rate,
      block_sizes,
      causal=causal,
      xla_form=xla_form(key.shape[1], dense_max_kv_len),
    ),
    lambda signature: autotune.timed_candidates(
      functools.partial(shaw_attention, dense_max_kv_len=dense_max_kv_len), signature
    ),
  )


def shaw_attention(
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
  implementation: str = 'auto',
  block_sizes=None,
  dense_max_kv_len: int = DENSE_MAX_KV_LEN,
) -> jax.Array:
  """Relation-aware attention with clipped relative positions, without [q, kv, d] gathers.

  Args:
    query: [batch, q_len, heads, head_dim].
    key, value: [batch, kv_len, heads, head_dim].
    rel_key, rel_value: [2k+1, head_dim] tables w^K, w^V shared by all heads; either may be
      None (keys-only / values-only ablation).
    mask: None or bool broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
    causal: also mask every key after its query (key position j > pos_i), as the kernel's
      own bound: the fused kernels then skip the future's tiles without a [q_len, kv_len]
      mask, so with a keys-only `mask` ([.., 1, kv_len]: padding, a memory's unfilled slots)
      the call needs O(length) memory ('xla' builds the causal mask as an array).
    query_offset: absolute position of query 0 (int or traced int scalar); keys sit at
      0..kv_len-1. Default kv_len - q_len: queries are the last positions (cache or memory).
    dropout_rate, dropout_rng: attention-probability dropout, see
      `relpos.attention.masking.attention_dropout`; the dropped probabilities weight both the
      values and the a^V term. Rate 0 (the default) needs no rng.
    implementation: 'xla' (`shaw_attention_dense` for at most `dense_max_kv_len` keys,
      where the band's bookkeeping costs more than the dense one-hot matmuls it replaces, and
      `shaw_attention_banded` above; both draw the same dropout bits), 'pallas' (the fused,
      tiled kernels of `relpos.attention.pallas_shaw`; interpreted on CPU, Triton on GPU) or
      'mosaic' (the causal Mosaic GPU kernel, `relpos.attention.mosaic_shaw`, where it
      serves and the call, when the step runs, is causal: `causal` with a mask that allows
      every causal pair, or a mask equal to the causal one; 'xla' elsewhere:
      `relpos.attention.mosaic_dispatch`)
      or 'auto' (the default): on a GPU the fastest of 'xla', 'pallas' at a few tilings and
      (where it serves) 'mosaic', timed forward and backward at this call's shapes on first
      use and cached (`relpos.attention.autotune`); 'xla' elsewhere. With dropout, 'pallas'
      draws its keep mask from a hash (`pallas_common.dropout_keep_hashed`): same
      distribution, different bits than 'xla'.
    block_sizes: (block_q, block_k) tiles of the 'pallas' implementation (None: its default,
      which Triton can lower, or under 'auto' the tuned tiles; given sizes must be powers of
      two >= 16 for GPU, and 'auto' then tunes only 'xla' against 'pallas' at them); unused
      by 'xla'.
    dense_max_kv_len: the most keys 'xla' takes its dense form at (`DENSE_MAX_KV_LEN`, 64, by
      default; 0: the banded kernel at every length). Both forms are exact: it changes speed
      and memory, not the result beyond rounding.
  Returns:
    [batch, q_len, heads, head_dim] in value's dtype.
  """
  # Checked here too, before key.shape picks the form: a malformed call fails with its message.
  dropout_rate = _check(query, key, value, rel_key, rel_value, dropout_rate, dropout_rng)
  if isinstance(dense_max_kv_len, bool) or not isinstance(dense_max_kv_len, int):
    raise TypeError(f'dense_max_kv_len must be an int, got {dense_max_kv_len!r}')
  implementation, block_sizes = resolve_implementation(
    implementation,
    block_sizes,
    lambda: _tuned(
      query, key, rel_key, rel_value, mask, causal, dropout_rate, block_sizes, dense_max_kv_len
    ),
    kernel='shaw',
  )
  if implementation == 'mosaic' and mosaic_dispatch.serves_call(
    'shaw', query, key, value, mask, dropout_rate, query_offset, causal=causal
  ):
    return _shaw_mosaic(query, key, value, rel_key, rel_value, mask, causal, dense_max_kv_len)
  if implementation == 'pallas':
    return shaw_attention_pallas(
      query,
      key,
      value,
      rel_key,
      rel_value,
      mask=mask,
      causal=causal,
      query_offset=query_offset,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
      block_sizes=block_sizes,
    )
  dense = xla_form(key.shape[1], dense_max_kv_len) == 'dense'
  kernel = shaw_attention_dense if dense else shaw_attention_banded
  return kernel(
    query,
    key,
    value,
    rel_key,
    rel_value,
    mask=mask,
    causal=causal,
    query_offset=query_offset,
    dropout_rate=dropout_rate,
    dropout_rng=dropout_rng,
  )


def shaw_attention_banded(
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
) -> jax.Array:
  """The banded kernel (module docstring): O(q·kv) memory like vanilla attention, for long
  sequences. Same contract as `shaw_attention` ('xla'): `causal` also tells the band that no
  key lies right of it, so the tables' later rows get an exact zero gradient."""
  dropout_rate = _check(query, key, value, rel_key, rel_value, dropout_rate, dropout_rng)
  rng = dropout_rng if dropout_rate > 0.0 else None
  if query_offset is None:
    query_offset = default_query_offset(query.shape[1], key.shape[1])
  if causal:
    mask = with_causal(mask, query.shape[1], key.shape[1], query_offset=query_offset)
  static_offset = static_query_offset(query_offset)
  traced_offset = None if static_offset is not None else jnp.asarray(query_offset, jnp.int32)
  static = _Static(static_offset, dropout_rate, causal)
  return _shaw(static, query, key, value, rel_key, rel_value, mask, traced_offset, rng)


def shaw_attention_dense(
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
) -> jax.Array:
  """The dense form, for short sequences: per-pair tensors selected by one-hot matmuls.

  `one_hot[i, r, j] = [clip(j - pos_i, -k, k) + k = r]` ([q_len, 2k+1, kv_len]) turns both
  relative terms into matmuls: `Σ_r (q_i·w^K_r) one_hot[i, r, j]` spreads the per-row logits
  over keys (or, when 2k+1 > head_dim, `q_i·a^K_ij` with a^K = one_hot·w^K is the smaller
  contraction), and `Σ_j p_ij a^V_ij` with a^V = one_hot·w^V ([q_len, kv_len, head_dim]) adds
  the value term. Every selection sums one table row and zeros, so it is exact, and autodiff's
  backward pass is matmuls too: no gather, hence no scatter. O(q·kv·(head_dim + 2k+1))
  memory, shared by the batch and heads. Same contract as `shaw_attention`; tested against
  the float64 reference and used by it for short keys.
  """
  dropout_rate = _check(query, key, value, rel_key, rel_value, dropout_rate, dropout_rng)
  q_len, kv_len, head_dim = query.shape[1], key.shape[1], query.shape[-1]
  if causal:
    mask = with_causal(mask, q_len, kv_len, query_offset=query_offset)
  max_distance = table_max_distance(rel_key, rel_value)
  buckets = relative_buckets(q_len, kv_len, max_distance, query_offset=query_offset)
  rows = jnp.arange(2 * max_distance + 1)
  one_hot_QRK = (buckets[:, None, :] == rows[None, :, None]).astype(query.dtype)
  logits = content_logits(query, key)
  if rel_key is not None:
    if rel_key.shape[0] <= head_dim:
      rel_logits = _dot('bqhd,rd->bhqr', query, rel_key)
      logits += _dot('bhqr,qrk->bhqk', rel_logits, one_hot_QRK) * head_dim**-0.5
    else:
      rel_key_QKD = _dot('qrk,rd->qkd', one_hot_QRK, rel_key)
      logits += _dot('bqhd,qkd->bhqk', query, rel_key_QKD) * head_dim**-0.5
  probs = attention_dropout(masked_softmax(logits, mask), dropout_rate, dropout_rng)
  output = attend(probs, value)
  if rel_value is not None:
    rel_value_QKD = _dot('qrk,rd->qkd', one_hot_QRK, rel_value)
    output += _dot('bhqk,qkd->bqhd', probs, rel_value_QKD)
  return output.astype(value.dtype)
