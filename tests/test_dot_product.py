"""dot_product_attention, with and without a logit bias, vs the float64 reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import (
  FWD_TOL,
  assert_close,
  assert_grads_close,
  causal_np,
  dead_rows,
  f32,
  f32_np,
  make_mask,
  qkv,
  randn,
  run,
)
from jax.test_util import check_grads

from relpos import attention

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


# --------------------------------------------------------------------------------------------
# bias: a float logit bias (T5's, ALiBi's), added to q·k/sqrt(d) before masking and softmax.


@jax.jit
def run_bias(query, key, value, bias, mask=None):
  return attention.dot_product_attention(query, key, value, mask=mask, bias=bias)


BIAS_SHAPES = {
  'hqk': lambda b, h, q, k: (h, q, k),
  'bhqk': lambda b, h, q, k: (b, h, q, k),
  'b11k': lambda b, h, q, k: (b, 1, 1, k),
  'qk': lambda b, h, q, k: (q, k),
  '1h1k': lambda b, h, q, k: (1, h, 1, k),
}
BIAS_CASES = [
  (S, 'hqk', 'causal'),
  (S, 'hqk', 'dead_rows'),
  (S, 'bhqk', 'random'),
  (S, 'b11k', 'none'),
  (S, 'qk', 'padding'),
  (S, '1h1k', 'dead_rows'),
  ((1, 1, 11, 3, 4), 'hqk', 'none'),  # single query (decoding)
  ((2, 6, 4, 2, 3), 'hqk', 'dead_rows'),  # q_len > kv_len
]


@pytest.mark.parametrize(
  'shape,bias_shape,mask_kind',
  BIAS_CASES,
  ids=['x'.join(map(str, s)) + f'-{b}-{m}' for s, b, m in BIAS_CASES],
)
def test_dot_product_bias_vs_reference(shape, bias_shape, mask_kind):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(400 + BIAS_CASES.index((shape, bias_shape, mask_kind)))
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  bias = randn(rng, *BIAS_SHAPES[bias_shape](batch, heads, q_len, kv_len), scale=2.0)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  out = run_bias(f32(q), f32(k), f32(v), f32(bias), mask=mask)
  assert out.shape == (batch, q_len, heads, dim) and out.dtype == np.float32
  want = reference.vanilla(f32_np(q), f32_np(k), f32_np(v), mask=mask, bias=f32_np(bias))
  assert_close(out, want)
  dead = dead_rows(mask, batch, heads, q_len, kv_len)
  assert np.all(np.asarray(out)[dead] == 0.0)


def test_dot_product_bias_is_shift_invariant_per_row():
  """A bias constant along the keys of each row cancels in the softmax."""
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(410)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  row_bias = f32(randn(rng, batch, heads, q_len, 1, scale=5.0))
  np.testing.assert_allclose(
    np.asarray(run_bias(q, k, v, row_bias)), np.asarray(run('dot_product', q, k, v)), atol=2e-6
  )


def test_dot_product_bf16_bias_and_inputs():
  """A bf16 bias joins the float32 logits; bf16 q, k, v stay close to the float32 result."""
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(411)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  bias = jnp.asarray(randn(rng, heads, q_len, kv_len), jnp.bfloat16)
  mask = causal_np(q_len, kv_len)
  want = reference.vanilla(
    f32_np(q), f32_np(k), f32_np(v), mask=mask, bias=np.asarray(bias, np.float64)
  )
  assert_close(run_bias(f32(q), f32(k), f32(v), bias, mask=mask), want)
  low = run_bias(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), bias, mask=mask)
  assert low.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(low, np.float32), want, atol=5e-2, rtol=0)


@pytest.mark.parametrize('bias_shape', [(3, 8, 13), (2, 2, 3, 7, 13), (2, 3, 7, 12)])
def test_dot_product_bias_shape_error(bias_shape):
  batch, q_len, kv_len, heads, dim = S
  q, k, v = (jnp.ones(s) for s in [(batch, q_len, heads, dim)] + [(batch, kv_len, heads, dim)] * 2)
  with pytest.raises(ValueError, match='bias'):
    attention.dot_product_attention(q, k, v, bias=jnp.ones(bias_shape))


def _vanilla_f64_jax(query, key, value, bias, mask):
  """softmax(q·k/sqrt(d) + bias) v written out in JAX, for autodiff in float64."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key) / np.sqrt(query.shape[-1]) + bias
  allowed = jnp.broadcast_to(mask, logits.shape)
  logits = jnp.where(allowed, logits, jnp.finfo(logits.dtype).min)
  probs = jnp.where(allowed, jax.nn.softmax(logits, axis=-1), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', probs, value)


def test_dot_product_bias_grads():
  """float32 gradients w.r.t. q, k, v and a [heads, q_len, kv_len] bias (summed over the
  batch it broadcasts across) vs autodiff of a float64 JAX transcription, with fully masked
  rows; then finite differences of the kernel in float64."""
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(420)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  bias = randn(rng, heads, q_len, kv_len)
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  mask[:, 1, 2] = False  # dead in every batch element: no gradient reaches bias[1, 2]
  cot = randn(rng, batch, q_len, heads, dim)

  def grads(fn, *xs):
    return jax.grad(lambda *ys: jnp.sum(fn(*ys, mask) * cot), argnums=(0, 1, 2, 3))(*xs)

  kernel = lambda q, k, v, b, m: attention.dot_product_attention(q, k, v, mask=m, bias=b)  # noqa: E731
  got = jax.jit(functools.partial(grads, kernel))(*(f32(x) for x in (q, k, v, bias)))
  with jax.enable_x64(True):
    want = jax.jit(functools.partial(grads, _vanilla_f64_jax))(
      *(jnp.asarray(f32_np(x)) for x in (q, k, v, bias))
    )
    want = [np.asarray(w) for w in want]
  # float32 vs float64, so the forward tolerance rather than GRAD_TOL (float32 vs float32)
  assert_grads_close(got, want, tol=FWD_TOL, names=('query', 'key', 'value', 'bias'))
  assert np.all(np.asarray(got[3])[1, 2] == 0.0)
  with jax.enable_x64(True):
    check_grads(
      jax.jit(lambda *xs: kernel(*xs, mask)),
      tuple(jnp.asarray(x) for x in (q, k, v, bias)),
      order=1,
      modes=('rev',),
      atol=1e-6,
      rtol=1e-6,
      eps=1e-5,
    )
