"""Vanilla scaled dot-product attention (Vaswani et al. 2017), with an optional logit bias."""

import jax
import jax.numpy as jnp

from relpos.attention.masking import accumulation_dtype, attention_dropout, masked_softmax


def check_qkv(query, key, value):
  """Raises ValueError unless query [B, Q, H, D] and key, value [B, K, H, D] agree."""
  if query.ndim != 4 or key.shape != value.shape or key.ndim != 4:
    raise ValueError(
      'expected query [batch, q_len, heads, head_dim] and key, value '
      f'[batch, kv_len, heads, head_dim]; got {query.shape}, {key.shape}, '
      f'{value.shape}'
    )
  if (query.shape[0], query.shape[2:]) != (key.shape[0], key.shape[2:]):
    raise ValueError(f'query {query.shape} and key {key.shape} differ in batch, heads or head_dim')


def content_logits(query_BQHD, key_BKHD):
  """`q_i·k_j / sqrt(d)` accumulated in (at least) float32: [batch, heads, q_len, kv_len]."""
  scale = query_BQHD.shape[-1] ** -0.5
  logits = jnp.einsum(
    'bqhd,bkhd->bhqk',
    query_BQHD,
    key_BKHD,
    preferred_element_type=accumulation_dtype(query_BQHD.dtype),
  )
  return logits * scale


def attend(probs_BHQK, value_BKHD):
  """`Σ_j p_ij v_j` accumulated in (at least) float32: [batch, q_len, heads, head_dim]."""
  return jnp.einsum(
    'bhqk,bkhd->bqhd',
    probs_BHQK.astype(value_BKHD.dtype),
    value_BKHD,
    preferred_element_type=accumulation_dtype(value_BKHD.dtype),
  )


def _check_bias(bias, logits_shape):
  """Raises ValueError unless bias broadcasts to the logits [batch, heads, q_len, kv_len]."""
  try:
    shape = jnp.broadcast_shapes(jnp.shape(bias), logits_shape)
  except ValueError:
    shape = None
  if shape != logits_shape:
    raise ValueError(
      f'bias {jnp.shape(bias)} does not broadcast to the logits [batch, heads, q_len, '
      f'kv_len] = {logits_shape}'
    )


def dot_product_attention(
  query, key, value, *, mask=None, bias=None, dropout_rate: float = 0.0, dropout_rng=None
) -> jax.Array:
  """softmax(q kᵀ / sqrt(d) + bias) v.

  Args:
    query: [batch, q_len, heads, head_dim].
    key, value: [batch, kv_len, heads, head_dim].
    mask: None or bool broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
      A fully masked query row returns zeros.
    bias: None or float broadcastable to [batch, heads, q_len, kv_len] (e.g. T5's or ALiBi's
      [heads, q_len, kv_len]), added to the scaled logits in their float32 (float64) before
      masking and softmax; masked entries stay masked whatever their bias.
    dropout_rate, dropout_rng: attention-probability dropout, see
      `relpos.attention.masking.attention_dropout`; rate 0 (the default) needs no rng.
  Returns:
    [batch, q_len, heads, head_dim] in value's dtype.
  """
  check_qkv(query, key, value)
  logits = content_logits(query, key)
  if bias is not None:
    _check_bias(bias, logits.shape)
    logits = logits + jnp.asarray(bias).astype(logits.dtype)
  probs = masked_softmax(logits, mask)
  probs = attention_dropout(probs, dropout_rate, dropout_rng)
  return attend(probs, value).astype(value.dtype)
