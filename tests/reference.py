"""Float64 NumPy transcriptions of the attention equations, for tests only.

These are deliberately naive: explicit Python loops over batch, head, query i and key j, one
line per equation, so that each can be checked against the paper by eye. They do not import
`relpos`. Sizes in the tests are small, so speed does not matter.

Conventions (same as the kernels under test):
  query  [batch, q_len, heads, head_dim]
  key    [batch, kv_len, heads, head_dim]
  value  [batch, kv_len, heads, head_dim]
  mask   bool, broadcastable to [batch, heads, q_len, kv_len]; True = may attend.
  Logits are scaled by 1/sqrt(head_dim). A query row with no key it may attend to returns zeros.
"""

from __future__ import annotations

import math

import numpy as np


def _allowed(mask, batch, heads, q_len, kv_len):
  """The mask broadcast to [batch, heads, q_len, kv_len] (all True when mask is None)."""
  if mask is None:
    return np.ones((batch, heads, q_len, kv_len), dtype=bool)
  return np.broadcast_to(np.asarray(mask, dtype=bool), (batch, heads, q_len, kv_len))


def _softmax_over_allowed(logits, allowed):
  """softmax_j(logits_j) restricted to the j where allowed[j]; zeros elsewhere.

  Returns all zeros when no j is allowed (a fully masked row).
  """
  weights = np.zeros(len(logits), dtype=np.float64)
  if not allowed.any():
    return weights
  top = max(logits[j] for j in range(len(logits)) if allowed[j])
  for j in range(len(logits)):
    if allowed[j]:
      weights[j] = math.exp(logits[j] - top)
  return weights / weights.sum()


def _f64(x):
  return None if x is None else np.asarray(x, dtype=np.float64)


def vanilla(query, key, value, mask=None, bias=None):
  """Scaled dot-product attention (Vaswani et al. 2017), with an optional logit bias.

  e_ij = q_i . k_j / sqrt(d) + bias_ij;  z_i = sum_j softmax_j(e_ij) v_j.
  bias (T5's, ALiBi's) is broadcastable to [batch, heads, q_len, kv_len]; None means 0.
  """
  q, k, v = _f64(query), _f64(key), _f64(value)
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  allowed = _allowed(mask, batch, heads, q_len, kv_len)
  if bias is None:
    bias = np.zeros((batch, heads, q_len, kv_len))
  bias = np.broadcast_to(_f64(bias), (batch, heads, q_len, kv_len))
  out = np.zeros((batch, q_len, heads, dim), dtype=np.float64)
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        e = np.zeros(kv_len)
        for j in range(kv_len):
          e[j] = np.dot(q[b, i, h], k[b, j, h]) / math.sqrt(dim) + bias[b, h, i, j]
        alpha = _softmax_over_allowed(e, allowed[b, h, i])
        for j in range(kv_len):
          out[b, i, h] += alpha[j] * v[b, j, h]
  return out


def shaw_index(i, j, max_distance, query_offset):
  """Row of the [2k+1, d] table used for query i, key j: clip(j - pos_i, -k, k) + k."""
  pos_i = query_offset + i
  return min(max(j - pos_i, -max_distance), max_distance) + max_distance


def shaw(query, key, value, rel_key=None, rel_value=None, mask=None, query_offset=None):
  """Self-attention with relative position representations (Shaw et al. 2018, eqs. 3-5).

  e_ij = q_i . (k_j + a^K_ij) / sqrt(d)
  z_i  = sum_j alpha_ij (v_j + a^V_ij)
  a_ij = w[clip(j - pos_i, -k, k) + k],  pos_i = query_offset + i (default kv_len - q_len).

  rel_key / rel_value are [2k+1, d] tables shared by all heads; either may be None, which
  drops that term (a^K = 0 or a^V = 0).
  """
  q, k, v = _f64(query), _f64(key), _f64(value)
  wk, wv = _f64(rel_key), _f64(rel_value)
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  if query_offset is None:
    query_offset = kv_len - q_len
  query_offset = int(query_offset)
  rows = {t.shape[0] for t in (wk, wv) if t is not None}
  assert len(rows) <= 1, 'rel_key and rel_value must have the same number of rows'
  max_distance = (rows.pop() - 1) // 2 if rows else 0
  allowed = _allowed(mask, batch, heads, q_len, kv_len)
  out = np.zeros((batch, q_len, heads, dim), dtype=np.float64)
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        e = np.zeros(kv_len)
        for j in range(kv_len):
          r = shaw_index(i, j, max_distance, query_offset)
          a_k = wk[r] if wk is not None else 0.0
          e[j] = np.dot(q[b, i, h], k[b, j, h] + a_k) / math.sqrt(dim)
        alpha = _softmax_over_allowed(e, allowed[b, h, i])
        for j in range(kv_len):
          r = shaw_index(i, j, max_distance, query_offset)
          a_v = wv[r] if wv is not None else 0.0
          out[b, i, h] += alpha[j] * (v[b, j, h] + a_v)
  return out


def xl(query, key, value, rel_key, content_bias, position_bias, mask=None):
  """Transformer-XL relative attention (Dai et al. 2019, sec. 3.3), terms (a)+(b)+(c)+(d).

  The q_len queries are the last q_len of the kv_len positions (memory first), so
  pos_i = kv_len - q_len + i. rel_key[t, h] is W_kR R_t for head h and distance t = pos_i - j.
  score_ij = ((q_i + u) . k_j + (q_i + v) . rel_key[pos_i - j]) / sqrt(d)
  Keys with j > pos_i are never attended to (causal); `mask` restricts further.
  """
  q, k, v = _f64(query), _f64(key), _f64(value)
  r, u, vb = _f64(rel_key), _f64(content_bias), _f64(position_bias)
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  assert r.shape == (kv_len, heads, dim), r.shape
  assert u.shape == (heads, dim) and vb.shape == (heads, dim)
  allowed = _allowed(mask, batch, heads, q_len, kv_len)
  out = np.zeros((batch, q_len, heads, dim), dtype=np.float64)
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        pos_i = kv_len - q_len + i
        e = np.zeros(kv_len)
        ok = np.zeros(kv_len, dtype=bool)
        for j in range(kv_len):
          if j > pos_i:
            continue  # causal: future keys are never attended to
          t = pos_i - j
          content = np.dot(q[b, i, h] + u[h], k[b, j, h])  # (a) + (c)
          position = np.dot(q[b, i, h] + vb[h], r[t, h])  # (b) + (d)
          e[j] = (content + position) / math.sqrt(dim)
          ok[j] = allowed[b, h, i, j]
        alpha = _softmax_over_allowed(e, ok)
        for j in range(kv_len):
          out[b, i, h] += alpha[j] * v[b, j, h]
  return out


def sinusoidal(positions, dim):
  """Transformer-XL PositionalEmbedding: [sin(p * inv_freq), cos(p * inv_freq)]."""
  positions = np.asarray(positions, dtype=np.float64)
  out = np.zeros((len(positions), dim), dtype=np.float64)
  half = dim // 2
  for n, p in enumerate(positions):
    for m in range(half):
      inv_freq = 1.0 / 10000 ** ((2 * m) / dim)
      out[n, m] = math.sin(p * inv_freq)
      out[n, half + m] = math.cos(p * inv_freq)
  return out


def t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
  """T5's `_relative_position_bucket` (mesh-tensorflow; HF transformers' T5 is the same) for
  one relative position j - pos_i, line by line.

  T5 computes the log part in float32, so it is done here in np.float32: the float32 quotient
  n / max_exact, its log rounded to float32 (math.log of it, i.e. the correctly rounded float32
  log; TF's and PyTorch's may be an ulp off), float32 division and multiplication, then int()
  truncates like tf.to_int32. Only n >= max_exact reaches the log, so never log(0).
  """
  ret = 0
  n = -int(relative_position)
  if bidirectional:
    num_buckets //= 2
    ret += num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  # now n is in the range [0, inf)
  max_exact = num_buckets // 2
  if n < max_exact:  # half of the buckets are for exact increments in positions
    return ret + n
  # the other half are log-spaced bins up to max_distance
  log_ratio = np.float32(math.log(np.float32(n) / np.float32(max_exact)))
  val_if_large = max_exact + int(
    log_ratio / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact)
  )
  return ret + min(val_if_large, num_buckets - 1)


def alibi_slopes(n):
  """ALiBi's head slopes (Press et al. 2022), the paper's official `get_slopes`, transcribed."""

  def get_slopes_power_of_2(n):
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    ratio = start
    return [start * ratio**i for i in range(n)]

  if math.log2(n).is_integer():
    return get_slopes_power_of_2(n)
  closest_power_of_2 = 2 ** math.floor(math.log2(n))
  return (
    get_slopes_power_of_2(closest_power_of_2)
    + alibi_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
  )


def rope(x, positions, base=10000.0):
  """Rotary position embedding (Su et al. 2021), "rotate half" pairing.

  x [batch, len, heads, head_dim]; positions [len] or [batch, len]. Feature pair
  (i, i + head_dim/2) of row t is rotated by the angle positions[t] * base^(-2i/head_dim):
    out_i          = x_i cos - x_{i+half} sin
    out_{i+half}   = x_{i+half} cos + x_i sin
  """
  x = _f64(x)
  batch, length, heads, dim = x.shape
  positions = np.broadcast_to(np.asarray(positions, dtype=np.float64), (batch, length))
  half = dim // 2
  out = np.zeros_like(x)
  for b in range(batch):
    for t in range(length):
      for h in range(heads):
        for i in range(half):
          angle = positions[b, t] * base ** (-2 * i / dim)
          c, s = math.cos(angle), math.sin(angle)
          first, second = x[b, t, h, i], x[b, t, h, i + half]
          out[b, t, h, i] = first * c - second * s
          out[b, t, h, i + half] = second * c + first * s
  return out
