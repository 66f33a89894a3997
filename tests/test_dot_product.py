"""dot_product_attention vs the float64 reference."""

import numpy as np
import pytest
import reference
from helpers import assert_close, dead_rows, f32, f32_np, make_mask, qkv, run

pytestmark = pytest.mark.usefixtures('attention_test_config')

S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim): q_len != kv_len, odd sizes
CASES = [
  (S, 'none'),
  (S, 'random'),
  (S, 'causal'),
  (S, 'padding'),
  (S, 'dead_rows'),
  ((2, 9, 9, 2, 8), 'causal'),  # self-attention
  ((1, 1, 11, 3, 4), 'none'),  # single query (decoding)
  ((1, 1, 11, 3, 4), 'padding'),
  ((2, 6, 4, 2, 3), 'dead_rows'),  # q_len > kv_len
]


@pytest.mark.parametrize(
  'shape,mask_kind', CASES, ids=['x'.join(map(str, s)) + '-' + m for s, m in CASES]
)
def test_dot_product_vs_reference(shape, mask_kind):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(100 + CASES.index((shape, mask_kind)))
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  out = run('dot_product', f32(q), f32(k), f32(v), mask=mask)
  assert out.shape == (batch, q_len, heads, dim)
  assert out.dtype == np.float32
  assert_close(out, reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask))
  dead = dead_rows(mask, batch, heads, q_len, kv_len)
  assert np.all(np.asarray(out)[dead] == 0.0)


@pytest.mark.parametrize('mask_shape', ['bhqk', 'b11k', '11qk', 'qk', '1h1k'])
def test_dot_product_mask_broadcasting(mask_shape):
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(7)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  shape = {
    'bhqk': (batch, heads, q_len, kv_len),
    'b11k': (batch, 1, 1, kv_len),
    '11qk': (1, 1, q_len, kv_len),
    'qk': (q_len, kv_len),
    '1h1k': (1, heads, 1, kv_len),
  }[mask_shape]
  mask = rng.random(shape) < 0.6
  out = run('dot_product', f32(q), f32(k), f32(v), mask=mask)
  assert_close(out, reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask))


def test_dot_product_mask_all_true_equals_no_mask():
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(8)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  a = run('dot_product', q, k, v)
  b = run('dot_product', q, k, v, mask=np.ones((batch, heads, q_len, kv_len), dtype=bool))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
