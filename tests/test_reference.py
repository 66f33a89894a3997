"""Sanity checks of the float64 reference itself (no relpos): a hand-worked example and a second,
vectorised NumPy transcription of each equation."""

import math

import numpy as np
import pytest
import reference
from helpers import causal_np, qkv, randn


def _softmax_masked(e, allowed):
  e = np.where(allowed, e, -np.inf)
  top = np.max(e, axis=-1, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  w = np.where(allowed, np.exp(e - top), 0.0)
  s = w.sum(-1, keepdims=True)
  return np.where(s > 0, w / np.where(s > 0, s, 1.0), 0.0)


def _shaw_vectorised(q, k, v, wk, wv, mask, off):
  _, q_len, _, d = q.shape
  kv_len = k.shape[1]
  kmax = (wk.shape[0] - 1) // 2
  idx = np.clip(np.arange(kv_len)[None] - (off + np.arange(q_len))[:, None], -kmax, kmax) + kmax
  ak, av = wk[idx], wv[idx]  # [q, kv, d]
  e = (np.einsum('bqhd,bkhd->bhqk', q, k) + np.einsum('bqhd,qkd->bhqk', q, ak)) / math.sqrt(d)
  a = _softmax_masked(e, np.broadcast_to(mask, e.shape))
  return np.einsum('bhqk,bkhd->bqhd', a, v) + np.einsum('bhqk,qkd->bqhd', a, av)


def _xl_vectorised(q, k, v, r, u, vb, mask):
  _, q_len, _, d = q.shape
  kv_len = k.shape[1]
  dist = (kv_len - q_len + np.arange(q_len))[:, None] - np.arange(kv_len)[None]
  rr = r[np.clip(dist, 0, kv_len - 1)]  # [q, kv, h, d]
  e = np.einsum('bqhd,bkhd->bhqk', q + u, k) + np.einsum('bqhd,qkhd->bhqk', q + vb, rr)
  allowed = np.broadcast_to(mask, e.shape) & (dist >= 0)
  return np.einsum('bhqk,bkhd->bqhd', _softmax_masked(e / math.sqrt(d), allowed), v)


def test_hand_worked_shaw():
  # d = 1, one query at position 1, keys at 0, 1, 2, k = 1.
  q = np.array([2.0]).reshape(1, 1, 1, 1)
  k = np.array([1.0, -1.0, 0.5]).reshape(1, 3, 1, 1)
  v = np.array([3.0, 5.0, 7.0]).reshape(1, 3, 1, 1)
  wk = np.array([[0.1], [0.2], [0.3]])  # rows for distance -1, 0, +1
  wv = np.array([[10.0], [20.0], [30.0]])
  e = np.array([2 * (1 + 0.1), 2 * (-1 + 0.2), 2 * (0.5 + 0.3)])
  a = np.exp(e) / np.exp(e).sum()
  expected = a[0] * (3 + 10) + a[1] * (5 + 20) + a[2] * (7 + 30)
  out = reference.shaw(q, k, v, wk, wv, query_offset=1)
  assert out.shape == (1, 1, 1, 1)
  assert out[0, 0, 0, 0] == pytest.approx(expected, rel=1e-12)
  # Only key 0 allowed: output is exactly v_0 + w^V[0].
  mask = np.array([True, False, False]).reshape(1, 1, 1, 3)
  out = reference.shaw(q, k, v, wk, wv, mask=mask, query_offset=1)
  assert out[0, 0, 0, 0] == pytest.approx(13.0, rel=1e-12)


def test_hand_worked_xl():
  # kv_len 2, q_len 1: the query is at position 1; distances 1 (key 0) and 0 (key 1).
  q = np.array([1.0, 0.0]).reshape(1, 1, 1, 2)
  k = np.array([[1.0, 2.0], [0.0, 1.0]]).reshape(1, 2, 1, 2)
  v = np.array([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 2, 1, 2)
  r = np.array([[0.5, 0.0], [0.0, 3.0]]).reshape(2, 1, 2)  # rows: distance 0, distance 1
  u = np.array([[0.0, 1.0]])
  vb = np.array([[1.0, 1.0]])
  e0 = ((1 + 0) * 1 + (0 + 1) * 2 + (1 + 1) * 0.0 + (0 + 1) * 3.0) / math.sqrt(2)  # key 0, t=1
  e1 = ((1 + 0) * 0 + (0 + 1) * 1 + (1 + 1) * 0.5 + (0 + 1) * 0.0) / math.sqrt(2)  # key 1, t=0
  a = np.exp([e0, e1]) / np.exp([e0, e1]).sum()
  out = reference.xl(q, k, v, r, u, vb)
  np.testing.assert_allclose(out[0, 0, 0], a, rtol=1e-12)


@pytest.mark.parametrize('off', [None, 0, -4, 9])
def test_reference_shaw_matches_vectorised(off):
  rng = np.random.default_rng(0)
  q, k, v = qkv(rng, 2, 4, 6, 2, 3)
  wk, wv = randn(rng, 5, 3), randn(rng, 5, 3)
  mask = rng.random((2, 2, 4, 6)) < 0.6
  mask[0, 1, 2] = False
  got = reference.shaw(q, k, v, wk, wv, mask=mask, query_offset=off)
  want = _shaw_vectorised(q, k, v, wk, wv, mask, 6 - 4 if off is None else off)
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
  assert np.all(got[0, 2, 1] == 0)


def test_reference_shaw_none_tables_are_zero_tables():
  rng = np.random.default_rng(1)
  q, k, v = qkv(rng, 1, 3, 5, 2, 4)
  wk, wv = randn(rng, 3, 4), randn(rng, 3, 4)
  z = np.zeros_like(wk)
  np.testing.assert_allclose(
    reference.shaw(q, k, v, None, wv), reference.shaw(q, k, v, z, wv), atol=1e-14
  )
  np.testing.assert_allclose(
    reference.shaw(q, k, v, wk, None), reference.shaw(q, k, v, wk, z), atol=1e-14
  )
  np.testing.assert_allclose(reference.shaw(q, k, v, z, z), reference.vanilla(q, k, v), atol=1e-14)


def test_reference_xl_matches_vectorised():
  rng = np.random.default_rng(2)
  q, k, v = qkv(rng, 2, 3, 7, 2, 4)
  r, u, vb = randn(rng, 7, 2, 4), randn(rng, 2, 4), randn(rng, 2, 4)
  mask = rng.random((2, 1, 3, 7)) < 0.7
  mask[1, 0, 0] = False
  got = reference.xl(q, k, v, r, u, vb, mask=mask)
  np.testing.assert_allclose(got, _xl_vectorised(q, k, v, r, u, vb, mask), atol=1e-12)
  assert np.all(got[1, 0] == 0)


def test_reference_xl_without_position_terms_is_causal_vanilla():
  rng = np.random.default_rng(3)
  q, k, v = qkv(rng, 1, 3, 5, 2, 4)
  z = np.zeros((5, 2, 4))
  got = reference.xl(q, k, v, z, np.zeros((2, 4)), np.zeros((2, 4)))
  np.testing.assert_allclose(got, reference.vanilla(q, k, v, mask=causal_np(3, 5)), atol=1e-14)


def test_reference_sinusoidal():
  got = reference.sinusoidal([0.0, 1.0, 3.0], 4)
  inv = 1.0 / 10000 ** (np.arange(0, 4, 2) / 4)
  p = np.array([0.0, 1.0, 3.0])[:, None] * inv[None]
  np.testing.assert_allclose(got, np.concatenate([np.sin(p), np.cos(p)], -1), atol=1e-15)
