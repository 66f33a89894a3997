"""Properties that must hold whatever the implementation: k = 0 reduction, translation
invariance, eager/jit/vmap agreement, bfloat16, fully masked rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import (
  FWD_TOL,
  KERNELS,
  assert_close,
  dead_rows,
  f32,
  f32_np,
  grads,
  make_mask,
  qkv,
  randn,
  run,
  run_traced_offset,
)

pytestmark = pytest.mark.usefixtures('attention_test_config')

SHAW = ('shaw', 'shaw_dense')
ALL = ('dot_product', 'shaw', 'shaw_dense', 'xl')
S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim)


def _extras(name, rng, kv_len, heads, dim, kmax=2):
  """The kernel-specific arguments after (q, k, v), float32."""
  if name == 'dot_product':
    return ()
  if name in SHAW:
    return f32(randn(rng, 2 * kmax + 1, dim)), f32(randn(rng, 2 * kmax + 1, dim))
  return tuple(f32(randn(rng, *s)) for s in [(kv_len, heads, dim), (heads, dim), (heads, dim)])


# --------------------------------------------------------------------------------------------
# Shaw with k = 0: every (i, j) uses the single row, so a^K_ij = w^K_0 adds q_i . w^K_0 to every
# logit of row i (cancels in the softmax) and a^V_ij = w^V_0 adds sum_j alpha_ij w^V_0 = w^V_0.


@pytest.mark.parametrize('name', SHAW)
@pytest.mark.parametrize('mask_kind', ['none', 'causal', 'dead_rows'])
def test_shaw_k0_is_vanilla_plus_value_row(mask_kind, name):
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(40 + len(mask_kind))
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  wk, wv = f32(randn(rng, 1, dim)), f32(randn(rng, 1, dim))
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  shaw = np.asarray(run(name, q, k, v, wk, wv, mask=mask))
  vanilla = np.asarray(run('dot_product', q, k, v, mask=mask))
  dead = dead_rows(mask, batch, heads, q_len, kv_len)
  want = np.where(dead[..., None], 0.0, vanilla + np.asarray(wv)[0])
  np.testing.assert_allclose(shaw, want, rtol=FWD_TOL, atol=FWD_TOL)
  assert np.all(shaw[dead] == 0.0)


# --------------------------------------------------------------------------------------------
# Translation invariance. Shaw: n tokens doing self-attention at positions [0, n)
# (query_offset = 0) give the same output as the same tokens placed at positions [s, s + n) of
# a longer key/value sequence (random other tokens before and after, masked out) with
# query_offset = s. Fails if query_offset is ignored or misapplied, if key positions are not j,
# or if masking lets the surrounding tokens in.


@pytest.mark.parametrize('causal', [False, True], ids=['bidirectional', 'causal'])
@pytest.mark.parametrize(
  'before,after,kmax,names',
  [(3, 2, 2, SHAW), (0, 5, 1, ('shaw',)), (4, 4, 20, ('shaw',))],
  ids=['3-2-k2', '0-5-k1', '4-4-k20'],
)
def test_shaw_translation_invariance(before, after, kmax, names, causal):
  batch, n, heads, dim = 2, 6, 2, 4
  rng = np.random.default_rng(50 + before * 10 + after + kmax + 100 * causal)
  q, k, v = (f32(x) for x in qkv(rng, batch, n, n, heads, dim))
  wk, wv = f32(randn(rng, 2 * kmax + 1, dim)), f32(randn(rng, 2 * kmax + 1, dim))
  base_mask = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)

  kv_len = before + n + after
  k_long = jnp.concatenate(
    [f32(randn(rng, batch, before, heads, dim)), k, f32(randn(rng, batch, after, heads, dim))],
    axis=1,
  )
  v_long = jnp.concatenate(
    [f32(randn(rng, batch, before, heads, dim)), v, f32(randn(rng, batch, after, heads, dim))],
    axis=1,
  )
  mask_long = np.zeros((n, kv_len), bool)
  mask_long[:, before : before + n] = base_mask
  for name in names:
    short = np.asarray(run(name, q, k, v, wk, wv, mask=base_mask, query_offset=0))
    long = run(name, q, k_long, v_long, wk, wv, mask=mask_long, query_offset=before)
    np.testing.assert_allclose(np.asarray(long), short, rtol=FWD_TOL, atol=FWD_TOL)
    if (before, after) != (3, 2):
      continue
    # the same through a traced offset; and a wrong offset must change the answer
    traced = run_traced_offset(
      name, q, k_long, v_long, wk, wv, mask=mask_long, query_offset=jnp.int32(before)
    )
    np.testing.assert_allclose(np.asarray(traced), short, rtol=FWD_TOL, atol=FWD_TOL)
    for wrong_offset in (before - 1, before + 1):
      wrong = run_traced_offset(
        name, q, k_long, v_long, wk, wv, mask=mask_long, query_offset=jnp.int32(wrong_offset)
      )
      assert not np.allclose(np.asarray(wrong), short, atol=1e-3)


# Transformer-XL: prepending m extra memory positions that are masked out (and extending rel_key
# with m arbitrary rows for the new, larger distances) leaves the output unchanged, since every
# surviving (i, j) pair keeps its distance pos_i - j. Fails if rel_key is indexed by anything
# other than pos_i - j (e.g. reversed, or by key position).


@pytest.mark.parametrize('q_len,kv_len,m', [(5, 5, 1), (3, 8, 4), (1, 6, 3)])
def test_xl_translation_invariance(q_len, kv_len, m):
  batch, heads, dim = 2, 3, 4
  rng = np.random.default_rng(60 + 10 * m + kv_len + q_len)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  r, u, vb = _extras('xl', rng, kv_len, heads, dim)
  short = np.asarray(run('xl', q, k, v, r, u, vb))

  k_long = jnp.concatenate([f32(randn(rng, batch, m, heads, dim)), k], axis=1)
  v_long = jnp.concatenate([f32(randn(rng, batch, m, heads, dim)), v], axis=1)
  r_long = jnp.concatenate([r, f32(randn(rng, m, heads, dim))], axis=0)  # distances kv_len..
  keep = np.broadcast_to(np.arange(kv_len + m) >= m, (batch, 1, 1, kv_len + m))
  long = run('xl', q, k_long, v_long, r_long, u, vb, mask=keep)
  np.testing.assert_allclose(np.asarray(long), short, rtol=FWD_TOL, atol=FWD_TOL)
  # the prepended memory does matter when it is not masked out (the test can fail)
  unmasked = run('xl', q, k_long, v_long, r_long, u, vb, mask=np.ones_like(keep))
  assert not np.allclose(np.asarray(unmasked), short, atol=1e-3)


# --------------------------------------------------------------------------------------------
# Eager, jit and vmap agree.


@pytest.mark.parametrize('name', ALL)
def test_eager_matches_jit(name):
  batch, q_len, kv_len, heads, dim = 2, 4, 6, 2, 3
  rng = np.random.default_rng(70)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  extras = _extras(name, rng, kv_len, heads, dim)
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  fn = KERNELS[name]
  eager = fn(q, k, v, *extras, mask=mask)
  jitted = run(name, q, k, v, *extras, mask=mask)
  np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=FWD_TOL, atol=FWD_TOL)


@pytest.mark.parametrize('name', ALL)
def test_vmap_matches_loop(name):
  n_extra, batch, q_len, kv_len, heads, dim = 3, 2, 4, 6, 2, 3
  rng = np.random.default_rng(71)
  qs, ks, vs = (f32(randn(rng, n_extra, batch, t, heads, dim)) for t in (q_len, kv_len, kv_len))
  extras = _extras(name, rng, kv_len, heads, dim)
  masks = rng.random((n_extra, batch, heads, q_len, kv_len)) < 0.7
  masks[..., 0] = True
  masks[1, 0, 1, 2] = False  # a fully masked row inside one vmapped slice
  fn = KERNELS[name]
  batched = jax.jit(jax.vmap(lambda q, k, v, m: fn(q, k, v, *extras, mask=m)))(qs, ks, vs, masks)
  assert batched.shape == (n_extra, batch, q_len, heads, dim)
  for e in range(n_extra):
    single = run(name, qs[e], ks[e], vs[e], *extras, mask=masks[e])
    np.testing.assert_allclose(
      np.asarray(batched[e]), np.asarray(single), rtol=FWD_TOL, atol=FWD_TOL
    )
  assert np.all(np.asarray(batched)[1, 0, 2, 1] == 0.0)


@pytest.mark.parametrize('name', SHAW)
def test_shaw_vmap_over_tables(name):
  """vmap with a different rel table per slice, against the reference."""
  n_extra, batch, q_len, kv_len, heads, dim, kmax = 2, 1, 4, 6, 2, 3, 2
  rng = np.random.default_rng(72)
  qs, ks, vs = (f32(randn(rng, n_extra, batch, t, heads, dim)) for t in (q_len, kv_len, kv_len))
  wks, wvs = (f32(randn(rng, n_extra, 2 * kmax + 1, dim)) for _ in range(2))
  fn = KERNELS[name]
  batched = jax.jit(jax.vmap(lambda *a: fn(*a, query_offset=1)))(qs, ks, vs, wks, wvs)
  for e in range(n_extra):
    want = reference.shaw(*(f32_np(a[e]) for a in (qs, ks, vs, wks, wvs)), query_offset=1)
    assert_close(batched[e], want)


# --------------------------------------------------------------------------------------------
# bfloat16: output dtype is bf16 and within 2e-2 of the float64 answer for the same (rounded)
# inputs.


@pytest.mark.parametrize('name', ALL)
def test_bf16(name):
  batch, q_len, kv_len, heads, dim = 2, 5, 9, 3, 8
  rng = np.random.default_rng(80)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  extras = [np.asarray(x) for x in _extras(name, rng, kv_len, heads, dim)]
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  args = [q, k, v, *extras]
  bf = [jnp.asarray(x, jnp.bfloat16) for x in args]
  rounded = [np.asarray(x.astype(jnp.float32), np.float64) for x in bf]
  offset = {'query_offset': 2} if name in SHAW else {}
  out = run(name, *bf, mask=mask, **offset)
  assert out.dtype == jnp.bfloat16
  ref = {
    'dot_product': reference.vanilla,
    'shaw': reference.shaw,
    'shaw_dense': reference.shaw,
    'xl': reference.xl,
  }[name]
  want = ref(*rounded, mask=mask, **offset)
  out = np.asarray(out.astype(jnp.float32), np.float64)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)
  assert np.all(out[dead_rows(mask, batch, heads, q_len, kv_len)] == 0.0)


# --------------------------------------------------------------------------------------------
# Fully masked rows: exact zeros, no NaN, finite gradients; nothing allowed at all: zero output
# and zero gradients.


@pytest.mark.parametrize('name', ALL)
def test_fully_masked_rows_zero_and_finite_grads(name):
  batch, q_len, kv_len, heads, dim = 2, 4, 6, 2, 3
  rng = np.random.default_rng(90)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  extras = _extras(name, rng, kv_len, heads, dim)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  mask = np.ones((batch, heads, q_len, kv_len), bool)
  mask[0, 1, 2] = False
  mask[1, :, 0] = False  # query (1, 0) is dead in every head
  mask[1, 0, 3] = False

  out = np.asarray(run(name, q, k, v, *extras, mask=mask))
  assert np.all(np.isfinite(out))
  assert np.all(out[0, 2, 1] == 0.0)
  assert np.all(out[1, 0, :] == 0.0)
  assert np.all(out[1, 3, 0] == 0.0)
  assert np.all(out[0, 2, 0] != 0.0)
  g = grads(name, cot, q, k, v, *extras, mask=mask)
  for x in g:
    assert np.all(np.isfinite(np.asarray(x)))
  assert np.all(np.asarray(g[0])[1, 0] == 0.0), 'a dead query must get zero gradient'

  nothing = np.zeros_like(mask)
  out = np.asarray(run(name, q, k, v, *extras, mask=nothing))
  assert np.all(out == 0.0)
  g = grads(name, cot, q, k, v, *extras, mask=nothing)
  for x in g:
    assert np.all(np.asarray(x) == 0.0)
