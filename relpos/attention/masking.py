"""Masks, the masked softmax and attention-probability dropout shared by every kernel, and the
positions they are computed from: where the queries sit (`default_query_offset`) and how far
Shaw's tables reach (`table_max_distance`)."""

import operator

import jax
import jax.numpy as jnp

# Finite "minus infinity": exp underflows to exactly 0 and a fully masked row stays finite. Every
# kernel's masked logit and running-max start (the fused ones' too: a Python constant there).
MASKED_LOGIT = -1e30


def accumulation_dtype(dtype):
  """float32 for bf16/fp16/fp32 inputs, float64 for float64 ones: softmax and matmul sums."""
  return jnp.promote_types(dtype, jnp.float32)


def static_query_offset(query_offset):
  """`query_offset` as a Python int when it is concrete, else None (a traced decoding step)."""
  try:
    return operator.index(query_offset)
  except TypeError:
    return None


def default_query_offset(q_len: int, kv_len: int) -> int:
  """Absolute position of query 0 when queries are the last q_len of kv_len positions."""
  return kv_len - q_len


def table_max_distance(*tables) -> int:
  """k of Shaw's [..., 2k+1, head_dim] tables: of the first that is not None (rel_key or
  rel_value, either of which a call may leave out; a model's table parameter)."""
  table = next(table for table in tables if table is not None)
  return (table.shape[-2] - 1) // 2


def query_key_distance(q_len, kv_len, query_offset):
  """`j - pos_i` for every query i and key j: int32 [q_len, kv_len].

  `query_offset` (the absolute position of query 0) may be a Python int or a traced scalar.
  """
  key_position = jnp.arange(kv_len, dtype=jnp.int32)[None, :]
  query_position = jnp.arange(q_len, dtype=jnp.int32)[:, None] + jnp.asarray(
    query_offset, jnp.int32
  )
  return key_position - query_position


def causal_mask(q_len: int, kv_len: int, *, query_offset=None) -> jax.Array:
  """bool [q_len, kv_len]: True where key position j <= query position pos_i."""
  if query_offset is None:
    query_offset = default_query_offset(q_len, kv_len)
  return query_key_distance(q_len, kv_len, query_offset) <= 0


def with_causal(mask, q_len: int, kv_len: int, *, query_offset=None) -> jax.Array:
  """`causal_mask` and `mask` (None, or bool broadcastable to [batch, heads, q_len, kv_len]):
  the array mask of a kernel asked to be causal (`causal=True`) that takes no causal flag of
  its own. The caller's mask may then be keys only ([.., 1, kv_len]), O(length)."""
  allowed = causal_mask(q_len, kv_len, query_offset=query_offset)
  return allowed if mask is None else allowed & mask


def masked_softmax(logits_BHQK, mask):
  """Softmax over the last axis in (at least) float32; masked entries and empty rows get 0.

  Args:
    logits_BHQK: [batch, heads, q_len, kv_len], any float dtype.
    mask: None or bool broadcastable to logits, True = may attend.
  Returns:
    probabilities in `accumulation_dtype(logits.dtype)`, same shape as logits.
  """
  logits_BHQK = logits_BHQK.astype(accumulation_dtype(logits_BHQK.dtype))
  if mask is None:
    return jax.nn.softmax(logits_BHQK, axis=-1)
  logits_BHQK = jnp.where(mask, logits_BHQK, MASKED_LOGIT)
  probs = jax.nn.softmax(logits_BHQK, axis=-1)
  return jnp.where(mask, probs, 0.0)


def check_dropout(dropout_rate, dropout_rng) -> float:
  """The validated attention-dropout rate as a Python float (see `attention_dropout`).

  Raises ValueError unless 0 <= dropout_rate < 1, or if dropout_rate > 0 and dropout_rng is None.
  """
  rate = float(dropout_rate)
  if not 0.0 <= rate < 1.0:
    raise ValueError(f'dropout_rate must be in [0, 1), got {dropout_rate}')
  if rate > 0.0 and dropout_rng is None:
    raise ValueError(f'dropout_rate={dropout_rate} > 0 needs a dropout_rng (a jax.random key)')
  return rate


def dropout_keep(dropout_rng, dropout_rate: float, shape) -> jax.Array:
  """bool `shape`: True where a probability is kept, each with chance 1 - dropout_rate."""
  return jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, shape)


def drop(x, keep, dropout_rate: float):
  """`x ∘ keep / (1 - dropout_rate)`, same shape and dtype as x."""
  return jnp.where(keep, x / (1.0 - dropout_rate), 0.0)


def attention_dropout(probs_BHQK, dropout_rate, dropout_rng):
  """Attention-probability dropout ("dropatt"), the same for every kernel in relpos.attention.

  After the masked softmax, the probabilities p [batch, heads, q_len, kv_len] become
  p' = p ∘ keep / (1 - rate) with keep = `jax.random.bernoulli(dropout_rng, 1 - rate, p.shape)`:
  one independent draw per batch, head, query and key. Everything the kernel sums over keys is
  weighted by p' (for Shaw both the values and the a^V term: z_i = Σ_j p'_ij (v_j + a^V_ij)),
  so averaged over keep masks the output is the output without dropout. Rows of p' do not sum
  to 1.

  `dropout_rate` is a Python float (static under jit) in [0, 1); `dropout_rng` is a key, which
  may be traced. Rate 0 is no dropout: the result is exactly `probs`, and the rng is unused and
  may be None. A rate outside [0, 1), or a rate > 0 without an rng, raises ValueError.

  Args:
    probs_BHQK: [batch, heads, q_len, kv_len] probabilities.
    dropout_rate: the probability of dropping each entry.
    dropout_rng: a jax.random key (raw uint32 or typed), or None when dropout_rate is 0.
  Returns:
    p', same shape and dtype as probs_BHQK.
  """
  rate = check_dropout(dropout_rate, dropout_rng)
  if rate == 0.0:
    return probs_BHQK
  return drop(probs_BHQK, dropout_keep(dropout_rng, rate, probs_BHQK.shape), rate)
