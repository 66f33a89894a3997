"""alibi_slopes and alibi_bias vs the float64 reference (Press et al. 2022)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import assert_close, causal_np, dead_rows, f32, f32_np, make_mask, qkv

from relpos import attention

pytestmark = pytest.mark.usefixtures('attention_test_config')


def test_slopes_power_of_two():
  np.testing.assert_array_equal(np.asarray(attention.alibi_slopes(8)), 2.0 ** -np.arange(1, 9))
  np.testing.assert_array_equal(np.asarray(attention.alibi_slopes(1)), [2.0**-8])
  np.testing.assert_allclose(
    np.asarray(attention.alibi_slopes(16)), 2.0 ** (-0.5 * np.arange(1, 17)), rtol=1e-7
  )
  assert attention.alibi_slopes(8).dtype == np.float32


def test_slopes_not_power_of_two():
  """The 4 (8) slopes of 4 (8) heads, then every other slope of 8 (16) heads."""
  np.testing.assert_array_equal(
    np.asarray(attention.alibi_slopes(6)), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
  )
  want_12 = [2.0**-h for h in range(1, 9)] + [2.0 ** -(h / 2) for h in (1, 3, 5, 7)]
  np.testing.assert_allclose(np.asarray(attention.alibi_slopes(12)), want_12, rtol=1e-7)
  assert reference.alibi_slopes(6) == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
  np.testing.assert_allclose(reference.alibi_slopes(12), want_12, rtol=1e-15)


@pytest.mark.parametrize('num_heads', [2, 3, 5, 7, 12, 20, 24, 33])
def test_slopes_vs_reference(num_heads):
  got = np.asarray(attention.alibi_slopes(num_heads))
  want = np.asarray(reference.alibi_slopes(num_heads))
  assert got.shape == (num_heads,) and len(set(want)) == num_heads
  np.testing.assert_array_equal(got, want.astype(np.float32))


def test_slopes_reject_no_heads():
  with pytest.raises(ValueError, match='num_heads'):
    attention.alibi_slopes(0)


def reference_bias(slopes, q_len, kv_len, query_offset=None):
  """-m_h |j - pos_i| from explicit loops: [heads, q_len, kv_len]."""
  if query_offset is None:
    query_offset = kv_len - q_len
  bias = np.zeros((len(slopes), q_len, kv_len))
  for h, slope in enumerate(slopes):
    for i in range(q_len):
      for j in range(kv_len):
        bias[h, i, j] = -slope * abs(j - (query_offset + i))
  return bias


def test_bias_vs_reference():
  """q_len != kv_len, static offsets before, inside and after the keys, and traced ones."""
  slopes = reference.alibi_slopes(6)
  traced = jax.jit(
    lambda off: attention.alibi_bias(attention.alibi_slopes(6), 5, 13, query_offset=off)
  )
  for offset in [None, 0, -7, 4, 20]:
    got = attention.alibi_bias(attention.alibi_slopes(6), 5, 13, query_offset=offset)
    assert got.shape == (6, 5, 13) and got.dtype == np.float32
    want = reference_bias(slopes, 5, 13, offset)
    assert_close(got, want, tol=1e-6, err_msg=f'offset {offset}')
    step = traced(jnp.int32(13 - 5 if offset is None else offset))
    np.testing.assert_array_equal(np.asarray(step), np.asarray(got))


def test_bias_vmap_over_offsets():
  slopes = attention.alibi_slopes(3)
  offsets = [-2, 0, 9]
  got = jax.vmap(lambda off: attention.alibi_bias(slopes, 4, 7, query_offset=off))(
    jnp.array(offsets, jnp.int32)
  )
  for n, off in enumerate(offsets):
    assert_close(got[n], reference_bias(reference.alibi_slopes(3), 4, 7, off), tol=1e-6)


@pytest.mark.parametrize('mask_kind', ['causal', 'dead_rows', 'padding'])
def test_bias_in_attention_vs_reference(mask_kind):
  batch, q_len, kv_len, heads, dim = 2, 7, 13, 3, 5
  rng = np.random.default_rng(60 + len(mask_kind))
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)

  @jax.jit
  def forward(q, k, v):
    bias = attention.alibi_bias(attention.alibi_slopes(heads), q_len, kv_len)
    return attention.dot_product_attention(q, k, v, mask=mask, bias=bias)

  out = forward(f32(q), f32(k), f32(v))
  bias = reference_bias(reference.alibi_slopes(heads), q_len, kv_len)
  assert_close(out, reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask, bias=bias))
  assert np.all(np.asarray(out)[dead_rows(mask, batch, heads, q_len, kv_len)] == 0.0)


def test_causal_attention_matches_paper_bias():
  """Under a causal mask the symmetric bias gives the paper's causal ALiBi, whose bias
  -m_h (pos_i - j) would differ only on the masked future keys (set to anything here)."""
  batch, q_len, kv_len, heads, dim, offset = 1, 4, 9, 2, 3, 3
  rng = np.random.default_rng(61)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  mask = causal_np(q_len, kv_len, offset)
  slopes = reference.alibi_slopes(heads)
  distance = (offset + np.arange(q_len))[:, None] - np.arange(kv_len)[None, :]  # pos_i - j
  paper = -np.asarray(slopes)[:, None, None] * distance  # positive on future keys
  bias = attention.alibi_bias(attention.alibi_slopes(heads), q_len, kv_len, query_offset=offset)
  out = attention.dot_product_attention(f32(q), f32(k), f32(v), mask=mask, bias=bias)
  assert_close(out, reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask, bias=paper))
