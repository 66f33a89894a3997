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


def vanilla(query, key, value, mask=None):
  """Scaled dot-product attention (Vaswani et al. 2017).

  e_ij = q_i . k_j / sqrt(d);  z_i = sum_j softmax_j(e_ij) v_j.
  """
  q, k, v = _f64(query), _f64(key), _f64(value)
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  allowed = _allowed(mask, batch, heads, q_len, kv_len)
  out = np.zeros((batch, q_len, heads, dim), dtype=np.float64)
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        e = np.zeros(kv_len)
        for j in range(kv_len):
          e[j] = np.dot(q[b, i, h], k[b, j, h]) / math.sqrt(dim)
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
