"""xl_attention vs the float64 reference (Transformer-XL, Dai et al. 2019)."""

import numpy as np
import pytest
import reference
from helpers import assert_close, dead_rows, f32, f32_np, make_mask, qkv, randn, run

pytestmark = pytest.mark.usefixtures('attention_test_config')

S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim): 6 memory positions, odd sizes
CASES = [
  (S, 'none'),
  (S, 'random'),
  (S, 'causal'),  # redundant with the built-in causal mask
  (S, 'padding'),
  (S, 'dead_rows'),
  ((2, 9, 9, 2, 8), 'none'),  # no memory
  ((2, 9, 9, 2, 8), 'padding'),
  ((1, 1, 11, 3, 4), 'none'),  # one query attending to 10 memory positions and itself
  ((1, 1, 11, 3, 4), 'random'),
  ((2, 5, 6, 4, 6), 'dead_rows'),
  ((1, 16, 16, 1, 2), 'none'),
]
CASE_IDS = ['x'.join(map(str, s)) + '-' + m for s, m in CASES]


def xl_inputs(rng, batch, q_len, kv_len, heads, dim):
  """q, k, v, rel_key [kv_len, heads, dim], content_bias u, position_bias v (float64)."""
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  return q, k, v, randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim)


def causal_xl(q_len, kv_len):
  return np.arange(kv_len)[None] <= (kv_len - q_len + np.arange(q_len))[:, None]


@pytest.mark.parametrize('shape,mask_kind', CASES, ids=CASE_IDS)
def test_xl_vs_reference(shape, mask_kind):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(500 + CASES.index((shape, mask_kind)))
  args = xl_inputs(rng, batch, q_len, kv_len, heads, dim)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  out = run('xl', *(f32(a) for a in args), mask=mask)
  assert out.shape == (batch, q_len, heads, dim)
  assert out.dtype == np.float32
  assert_close(out, reference.xl(*(f32_np(a) for a in args), mask=mask))
  allowed = causal_xl(q_len, kv_len) if mask is None else mask & causal_xl(q_len, kv_len)
  dead = dead_rows(allowed, batch, heads, q_len, kv_len)
  assert np.all(np.asarray(out)[dead] == 0.0)


def test_xl_causal_is_builtin():
  """An explicit causal mask changes nothing, and future keys/values never leak in."""
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(9)
  q, k, v, r, u, vb = (f32(a) for a in xl_inputs(rng, batch, q_len, kv_len, heads, dim))
  plain = np.asarray(run('xl', q, k, v, r, u, vb))
  explicit = np.asarray(run('xl', q, k, v, r, u, vb, mask=causal_xl(q_len, kv_len)))
  np.testing.assert_allclose(explicit, plain, rtol=1e-6, atol=1e-6)
  # perturb every key/value after position pos_2: queries 0..2 must not move, 3.. must
  first_future = kv_len - q_len + 3
  k2 = k.at[:, first_future:].add(5.0)
  v2 = v.at[:, first_future:].add(-3.0)
  moved = np.asarray(run('xl', q, k2, v2, r, u, vb))
  np.testing.assert_allclose(moved[:, :3], plain[:, :3], rtol=1e-6, atol=1e-6)
  assert not np.allclose(moved[:, 3:], plain[:, 3:], atol=1e-3)


def test_xl_jax_transcription_matches_reference():
  """The materialised JAX helper used as the gradient reference agrees with the loops."""
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(10)
  args = xl_inputs(rng, batch, q_len, kv_len, heads, dim)
  for mask_kind in ['none', 'dead_rows']:
    mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
    got = run('xl_jax_transcription', *(f32(a) for a in args), mask=mask)
    assert_close(got, reference.xl(*(f32_np(a) for a in args), mask=mask))


@pytest.mark.parametrize('layout', ['heads_major', 'batched'])
def test_position_logits_in_either_layout_match_float64_with_gradients(layout):
  """`_position_logits` lays its matmul out per platform (heads-major on a CPU, batched over
  batch and heads elsewhere): each layout's logits and gradients against float64 einsums, and
  on this CPU the dispatch takes the heads-major one."""
  import jax

  from relpos.attention import xl as xl_module

  rng = np.random.default_rng(11)
  q, r, w = randn(rng, 2, 7, 3, 5), randn(rng, 13, 3, 5), randn(rng, 2, 3, 7, 13)
  logits = getattr(xl_module, f'_position_logits_{layout}')
  scale = 5**-0.5
  assert_close(logits(f32(q), f32(r)), np.einsum('bqhd,thd->bhqt', q, r) * scale)
  dq, dr = jax.grad(lambda q, r: (logits(q, r) * f32(w)).sum(), argnums=(0, 1))(f32(q), f32(r))
  assert_close(dq, np.einsum('bhqt,thd->bqhd', w, r) * scale)
  assert_close(dr, np.einsum('bhqt,bqhd->thd', w, q) * scale)
  on_cpu = jax.jit(xl_module._position_logits)(f32(q), f32(r))
  np.testing.assert_array_equal(on_cpu, xl_module._position_logits_heads_major(f32(q), f32(r)))
