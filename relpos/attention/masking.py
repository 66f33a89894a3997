"""Masks and the masked softmax shared by every attention kernel."""

import jax
import jax.numpy as jnp

# Finite "minus infinity": exp underflows to exactly 0 and a fully masked row stays finite.
_MASKED_LOGIT = -1e30


def accumulation_dtype(dtype):
  """float32 for bf16/fp16/fp32 inputs, float64 for float64 ones: softmax and matmul sums."""
  return jnp.promote_types(dtype, jnp.float32)


def default_query_offset(q_len: int, kv_len: int) -> int:
  """Absolute position of query 0 when queries are the last q_len of kv_len positions."""
  return kv_len - q_len


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
  logits_BHQK = jnp.where(mask, logits_BHQK, _MASKED_LOGIT)
  probs = jax.nn.softmax(logits_BHQK, axis=-1)
  return jnp.where(mask, probs, 0.0)
