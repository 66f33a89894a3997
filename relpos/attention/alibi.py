"""ALiBi: attention with linear biases (Press et al. 2022).

    logits_hij += -m_h · |j - pos_i|

No position parameters: head h gets a fixed slope m_h from a geometric sequence (see
`alibi_slopes`), so each head looks back over a different range. The paper's language models
are causal, where the bias is -m_h · (pos_i - j) for the keys j <= pos_i a query may attend
to; |j - pos_i| agrees with that on every such key, and the future keys it also describes are
masked out, so one symmetric formula serves causal attention and, as the common bidirectional
extension, encoders and cross-attention alike.
"""

import math

import jax
import jax.numpy as jnp

from relpos.attention.masking import default_query_offset, query_key_distance


def _power_of_two_slopes(num_heads: int) -> list[float]:
  start = 2.0 ** (-8.0 / num_heads)
  return [start * start**h for h in range(num_heads)]


def _slopes(num_heads: int) -> list[float]:
  if num_heads & (num_heads - 1) == 0:
    return _power_of_two_slopes(num_heads)
  closest = 2 ** math.floor(math.log2(num_heads))
  return _power_of_two_slopes(closest) + _slopes(2 * closest)[0::2][: num_heads - closest]


def alibi_slopes(num_heads: int) -> jax.Array:
  """The paper's head slopes m_h: float32 [num_heads].

  For a power of two n, the geometric sequence 2^(-8/n), 2^(-16/n), .., 2^(-8) (8 heads: 1/2,
  1/4, .., 1/256). Otherwise, as the paper's code does, the n' = 2^floor(log2 n) slopes of n'
  followed by every other slope of 2n' (the ones that interleave them), the first n - n' of
  them. Computed in Python float64 and rounded once.
  """
  if num_heads < 1:
    raise ValueError(f'ALiBi needs num_heads >= 1, got {num_heads}')
  return jnp.asarray(_slopes(num_heads), jnp.float32)


def alibi_bias(slopes_H, q_len: int, kv_len: int, *, query_offset=None) -> jax.Array:
  """`-m_h · |j - pos_i|`: float32 [heads, q_len, kv_len].

  Args:
    slopes_H: [heads] slopes, `alibi_slopes(heads)`.
    q_len, kv_len: query and key counts.
    query_offset: absolute position of query 0 (int or traced int scalar); keys sit at
      0..kv_len-1. Default kv_len - q_len: queries are the last positions.
  Returns:
    float32 [heads, q_len, kv_len], to add to the logits q·k/sqrt(d).
  """
  if query_offset is None:
    query_offset = default_query_offset(q_len, kv_len)
  distance_QK = jnp.abs(query_key_distance(q_len, kv_len, query_offset)).astype(jnp.float32)
  return -jnp.asarray(slopes_H, jnp.float32)[:, None, None] * distance_QK
