"""Relation-aware self-attention with clipped relative positions (Shaw et al. 2018).

    e_ij = q_i·(k_j + a^K_ij) / sqrt(d)        z_i = Σ_j α_ij (v_j + a^V_ij)
    a_ij = w[clip(j - pos_i, -k, k) + k]        (w^K, w^V: [2k+1, head_dim], shared by heads)

The efficient kernel never builds a [q_len, kv_len, head_dim] tensor and never scatters. The
relative terms are banded: diagonals with |j - pos_i| < k are moved between relative and
absolute coordinates by pad + reshape (`relpos.attention.skew`), and the two clipped edges are
constant per row (a `where` on the logits, masked row sums on the probabilities). A
`jax.custom_vjp` writes the backward pass with the same dense pieces and saves only the
probabilities, so memory stays close to vanilla attention.
"""

import functools
import operator

import jax
import jax.numpy as jnp

from relpos.attention.dot_product import attend, content_logits
from relpos.attention.masking import default_query_offset, masked_softmax, query_key_distance
from relpos.attention.skew import absolute_to_relative, relative_to_absolute


def relative_buckets(q_len: int, kv_len: int, max_distance: int, *, query_offset=None):
  """Table row of every (query, key) pair: `clip(j - pos_i, -k, k) + k`, int32 [q_len, kv_len].

  Query i sits at absolute position `query_offset + i` (default `kv_len - q_len`), key j at j.
  """
  if query_offset is None:
    query_offset = default_query_offset(q_len, kv_len)
  distance = query_key_distance(q_len, kv_len, query_offset)
  return jnp.clip(distance, -max_distance, max_distance) + max_distance


def _static_int(value):
  """`value` as a Python int when it is concrete, else None (a traced decoding step)."""
  try:
    return operator.index(value)
  except TypeError:
    return None


class _Band:
  """The clipped-relative geometry of one (q_len, kv_len, k, query_offset) problem.

  Moves [.., q_len, 2k+1] per-distance values to [.., q_len, kv_len] per-key values and back.
  """

  def __init__(self, q_len, kv_len, max_distance, query_offset):
    self.kv_len = kv_len
    self.max_distance = k = max_distance
    self.rows = 2 * k + 1
    distance = query_key_distance(q_len, kv_len, query_offset)  # j - pos_i, [Q, K]
    self.left_edge = distance <= -k
    self.right_edge = (distance >= k) & ~self.left_edge  # for k = 0 everything is left
    static_offset = _static_int(query_offset)
    if static_offset is None:
      # Outside this range no diagonal of the band meets a key, and the masks say so.
      lowest, highest = -(q_len - 1) - k, kv_len - 1 + k
      self.start = k - jnp.clip(jnp.asarray(query_offset, jnp.int32), lowest, highest)
      self.start_range = (k - highest, k - lowest)
    else:
      self.start, self.start_range = k - static_offset, None
    row = jnp.arange(self.rows, dtype=jnp.int32)[None, :]
    # Row r of query i is key j = pos_i + r - k; rows 0 and 2k are the edges, summed apart.
    key_of_row = row - self.start + jnp.arange(q_len, dtype=jnp.int32)[:, None]
    self.interior = (row > 0) & (row < 2 * k) & (key_of_row >= 0) & (key_of_row < kv_len)
    self.first_row, self.last_row = row == 0, row == 2 * k

  def to_keys(self, x_BHQR):
    """`out[i, j] = x[i, clip(j - pos_i, -k, k) + k]`: [.., q_len, kv_len]."""
    band = relative_to_absolute(x_BHQR, self.start, self.kv_len, start_range=self.start_range)
    return jnp.where(self.left_edge, x_BHQR[..., :1],
                     jnp.where(self.right_edge, x_BHQR[..., -1:], band))

  def to_rows(self, p_BHQK):
    """`out[i, r] = Σ_{j: clip(j - pos_i, -k, k) + k = r} p[i, j]`: [.., q_len, 2k+1]."""
    band = absolute_to_relative(p_BHQK, self.start, self.rows, start_range=self.start_range)
    band = jnp.where(self.interior, band, 0.0)
    left = jnp.sum(jnp.where(self.left_edge, p_BHQK, 0.0), axis=-1, keepdims=True)
    right = jnp.sum(jnp.where(self.right_edge, p_BHQK, 0.0), axis=-1, keepdims=True)
    return band + jnp.where(self.first_row, left, 0.0) + jnp.where(self.last_row, right, 0.0)


def _dot(subscripts, a, b):
  """einsum with float32 accumulation; operands keep their dtype (bf16 stays bf16)."""
  return jnp.einsum(subscripts, a, b.astype(a.dtype), preferred_element_type=jnp.float32)


def _shaw_forward(static_offset, query, key, value, rel_key, rel_value, mask, traced_offset):
  """Returns output [B, Q, H, D] float32, probs [B, H, Q, K], probs per table row [B, H, Q, R]."""
  q_len, kv_len, head_dim = query.shape[1], key.shape[1], query.shape[-1]
  table = rel_key if rel_key is not None else rel_value
  band = _Band(q_len, kv_len, (table.shape[0] - 1) // 2,
               static_offset if traced_offset is None else traced_offset)
  logits = content_logits(query, key)
  if rel_key is not None:
    logits += band.to_keys(_dot('bqhd,rd->bhqr', query, rel_key)) * head_dim**-0.5
  probs = masked_softmax(logits, mask)
  output = attend(probs, value)
  prob_rows = None
  if rel_value is not None:
    prob_rows = band.to_rows(probs)
    output += _dot('bhqr,rd->bqhd', prob_rows, rel_value)
  return output, probs, prob_rows


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _shaw(static_offset, query, key, value, rel_key, rel_value, mask, traced_offset):
  output, *_ = _shaw_forward(static_offset, query, key, value, rel_key, rel_value, mask,
                             traced_offset)
  return output.astype(value.dtype)


def _shaw_fwd(static_offset, query, key, value, rel_key, rel_value, mask, traced_offset):
  output, probs, prob_rows = _shaw_forward(static_offset, query, key, value, rel_key,
                                              rel_value, mask, traced_offset)
  residuals = (query, key, value, rel_key, rel_value, mask, traced_offset, output, probs,
               prob_rows)
  return output.astype(value.dtype), residuals


def _shaw_bwd(static_offset, residuals, d_output):
  (query, key, value, rel_key, rel_value, mask, traced_offset, output, probs,
   prob_rows) = residuals
  q_len, kv_len, head_dim = query.shape[1], key.shape[1], query.shape[-1]
  scale = head_dim**-0.5
  table = rel_key if rel_key is not None else rel_value
  band = _Band(q_len, kv_len, (table.shape[0] - 1) // 2,
               static_offset if traced_offset is None else traced_offset)
  d_output = d_output.astype(value.dtype)
  # z_i = Σ_j p_ij (v_j + a^V_ij)  =>  dp_ij = do_i·v_j + do_i·a^V_ij
  d_value = _dot('bhqk,bqhd->bkhd', probs.astype(value.dtype), d_output)
  d_probs = _dot('bqhd,bkhd->bhqk', d_output, value)
  d_rel_value = None
  if rel_value is not None:
    d_rel_value = _dot('bhqr,bqhd->rd', prob_rows, d_output.astype(jnp.float32))
    d_probs += band.to_keys(_dot('bqhd,rd->bhqr', d_output, rel_value))
  # softmax: ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij'), and Σ_j p_ij dp_ij = do_i·z_i.
  row_dot = jnp.einsum('bqhd,bqhd->bhq', d_output.astype(jnp.float32), output)
  d_logits = probs * (d_probs - row_dot[..., None]) * scale
  d_logits_in = d_logits.astype(query.dtype)
  d_query = _dot('bhqk,bkhd->bqhd', d_logits_in, key)
  d_key = _dot('bhqk,bqhd->bkhd', d_logits_in, query)
  d_rel_key = None
  if rel_key is not None:
    logit_rows = band.to_rows(d_logits)
    d_query += _dot('bhqr,rd->bqhd', logit_rows, rel_key.astype(jnp.float32))
    d_rel_key = _dot('bhqr,bqhd->rd', logit_rows, query.astype(jnp.float32))
  cast = lambda grad, like: None if grad is None else grad.astype(like.dtype)  # noqa: E731
  return (cast(d_query, query), cast(d_key, key), cast(d_value, value),
          cast(d_rel_key, rel_key), cast(d_rel_value, rel_value), None, None)


_shaw.defvjp(_shaw_fwd, _shaw_bwd)


def _check_tables(rel_key, rel_value, head_dim):
  tables = [t for t in (rel_key, rel_value) if t is not None]
  if not tables:
    raise ValueError('shaw_attention needs rel_key, rel_value or both; got neither '
                     '(use dot_product_attention for no relative terms)')
  for table in tables:
    if table.ndim != 2 or table.shape[0] % 2 != 1 or table.shape[1] != head_dim:
      raise ValueError(f'relative tables must be [2k+1, head_dim={head_dim}], got {table.shape}')
  if len(tables) == 2 and rel_key.shape != rel_value.shape:
    raise ValueError(f'rel_key {rel_key.shape} and rel_value {rel_value.shape} differ in k')


def shaw_attention(query, key, value, rel_key, rel_value, *, mask=None,
                   query_offset=None) -> jax.Array:
  """Relation-aware attention with clipped relative positions, without [q, kv, d] tensors.

  Args:
    query: [batch, q_len, heads, head_dim].
    key, value: [batch, kv_len, heads, head_dim].
    rel_key, rel_value: [2k+1, head_dim] tables w^K, w^V shared by all heads; either may be
      None (keys-only / values-only ablation).
    mask: None or bool broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
    query_offset: absolute position of query 0 (int or traced int scalar); keys sit at
      0..kv_len-1. Default kv_len - q_len: queries are the last positions (cache or memory).
  Returns:
    [batch, q_len, heads, head_dim] in value's dtype.
  """
  _check_tables(rel_key, rel_value, query.shape[-1])
  if query_offset is None:
    query_offset = default_query_offset(query.shape[1], key.shape[1])
  static_offset = _static_int(query_offset)
  traced_offset = None if static_offset is not None else jnp.asarray(query_offset, jnp.int32)
  return _shaw(static_offset, query, key, value, rel_key, rel_value, mask, traced_offset)


def shaw_attention_materialized(query, key, value, rel_key, rel_value, *, mask=None,
                                query_offset=None) -> jax.Array:
  """The tensor2tensor formulation: gathers a^K, a^V into [q_len, kv_len, head_dim].

  Same contract as `shaw_attention`; O(q·kv·d) memory. Kept as a reference for tests and
  benchmarks only.
  """
  _check_tables(rel_key, rel_value, query.shape[-1])
  q_len, kv_len, head_dim = query.shape[1], key.shape[1], query.shape[-1]
  table = rel_key if rel_key is not None else rel_value
  buckets = relative_buckets(q_len, kv_len, (table.shape[0] - 1) // 2,
                             query_offset=query_offset)
  logits = content_logits(query, key)
  if rel_key is not None:
    logits += _dot('bqhd,qkd->bhqk', query, rel_key[buckets]) * head_dim**-0.5
  probs = masked_softmax(logits, mask)
  output = attend(probs, value)
  if rel_value is not None:
    output += _dot('bhqk,qkd->bqhd', probs, rel_value[buckets])
  return output.astype(value.dtype)
