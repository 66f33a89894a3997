"""Gradients: shaw_attention (custom VJP) vs autodiff of shaw_attention_dense,
xl_attention vs autodiff of a materialised JAX transcription, and finite differences."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_grads_close, f32, grads, make_mask, qkv, randn
from jax.test_util import check_grads

from relpos import attention

pytestmark = pytest.mark.usefixtures('attention_test_config')

SHAW_NAMES = ('query', 'key', 'value', 'rel_key', 'rel_value')
XL_NAMES = ('query', 'key', 'value', 'rel_key', 'content_bias', 'position_bias')
S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim)

# (id, shape, k, mask kind, query_offset, dropped table)
SHAW_CASES = [
  ('plain', S, 3, 'none', None, None),
  ('dead_rows', S, 3, 'dead_rows', None, None),
  ('padding_q1', (2, 1, 11, 3, 4), 4, 'padding', None, None),
  ('q1_blocks_k0', (2, 1, 70, 2, 3), 0, 'dead_rows', 40, None),  # 9 prefix blocks
  ('offset0_causal', S, 2, 'causal', 0, None),
  ('offset_neg_causal_dead_rows', (2, 5, 8, 2, 4), 1, 'causal', -2, None),
  ('k0', S, 0, 'random', None, None),
  ('k_ge_kv', S, 15, 'causal', None, None),
  ('keys_only', S, 3, 'dead_rows', 1, 'rel_value'),
  ('values_only', S, 3, 'dead_rows', 1, 'rel_key'),
  ('larger_self_attention', (2, 40, 40, 2, 8), 6, 'causal', None, None),
]


def _shaw_args(rng, shape, kmax, drop):
  batch, q_len, kv_len, heads, dim = shape
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
  wk = None if drop == 'rel_key' else wk
  wv = None if drop == 'rel_value' else wv
  return [f32(x) for x in (q, k, v, wk, wv)]


@pytest.mark.parametrize(
  'shape,kmax,mask_kind,offset,drop', [c[1:] for c in SHAW_CASES], ids=[c[0] for c in SHAW_CASES]
)
def test_shaw_grads_match_materialized(shape, kmax, mask_kind, offset, drop):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(
    700 + [c[1:] for c in SHAW_CASES].index((shape, kmax, mask_kind, offset, drop))
  )
  args = _shaw_args(rng, shape, kmax, drop)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=offset)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  got = grads('shaw', cot, *args, mask=mask, query_offset=offset)
  want = grads('shaw_dense', cot, *args, mask=mask, query_offset=offset)
  present = [n for n, a in enumerate(args) if a is not None]
  assert all(got[n] is None for n in range(5) if n not in present)
  names = [SHAW_NAMES[n] for n in present]
  assert_grads_close([got[n] for n in present], [want[n] for n in present], names=names)


@pytest.mark.parametrize(
  'shape,kmax,mask_kind,offsets',
  [
    ((1, 3, 9, 2, 4), 2, 'causal', [-6, -1, 0, 2, 7, 12]),
    # long keys: 3 prefix-sum blocks of 64 keys; edges swept through every block
    ((1, 5, 150, 1, 4), 3, 'dead_rows', list(range(-12, 165, 11))),
  ],
  ids=['short', 'long'],
)
def test_shaw_grads_traced_offset(shape, kmax, mask_kind, offsets):
  """Gradients with query_offset traced inside jit (a decoding step), swept over offsets
  before, inside and after the keys; blocked VJP vs autodiff of the materialised kernel."""
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(750 + kv_len)
  args = _shaw_args(rng, shape, kmax, None)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  fixed_mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)

  @functools.partial(jax.jit, static_argnums=0)
  def traced(fn, off, *xs):
    if mask_kind == 'causal':
      mask = jnp.arange(kv_len)[None] <= off + jnp.arange(q_len)[:, None]
    else:
      mask = fixed_mask

    def loss(*ys):
      return jnp.sum(fn(*ys, mask=mask, query_offset=off) * cot)

    return jax.grad(loss, argnums=tuple(range(5)))(*xs)

  for t in offsets:
    got = traced(attention.shaw_attention, jnp.int32(t), *args)
    want = traced(attention.shaw_attention_dense, jnp.int32(t), *args)
    assert_grads_close(got, want, names=[f'{n} (offset {t})' for n in SHAW_NAMES])


XL_CASES = [
  ('plain', S, 'none'),
  ('no_memory', (2, 9, 9, 2, 8), 'none'),
  ('padding', S, 'padding'),
  ('dead_rows', S, 'dead_rows'),
  ('q1', (2, 1, 9, 3, 4), 'none'),
]


@pytest.mark.parametrize('shape,mask_kind', [c[1:] for c in XL_CASES], ids=[c[0] for c in XL_CASES])
def test_xl_grads_match_materialized(shape, mask_kind):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(800 + [c[1:] for c in XL_CASES].index((shape, mask_kind)))
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  extra = (randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim))
  args = [f32(x) for x in (q, k, v, *extra)]
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  got = grads('xl', cot, *args, mask=mask)
  want = grads('xl_jax_transcription', cot, *args, mask=mask)
  assert_grads_close(got, want, names=XL_NAMES)


# --------------------------------------------------------------------------------------------
# Finite differences with x64 enabled. jax.enable_x64 is a context manager in this jax version,
# so the setting does not leak into other tests. float64 inputs are computed in float64 end to
# end (relpos.attention accumulates in promote_types(dtype, float32)), so a central difference
# with step 1e-5 is accurate to ~1e-9 and the tolerance can be tight.

FD = {'order': 1, 'modes': ('rev',), 'atol': 1e-6, 'rtol': 1e-6, 'eps': 1e-5}


def _f64(x):
  return jnp.asarray(x, dtype=jnp.float64)


def test_x64_is_scoped():
  assert not jax.config.read('jax_enable_x64')
  with jax.enable_x64(True):
    assert jnp.asarray(1.0, dtype=jnp.float64).dtype == jnp.float64
  assert not jax.config.read('jax_enable_x64')
  assert jnp.zeros(1).dtype == jnp.float32


def test_shaw_finite_differences():
  """The hand-written VJP of shaw_attention against finite differences of its forward pass."""
  rng = np.random.default_rng(21)
  # kv_len 40 spans three prefix-sum blocks of the efficient kernel.
  batch, q_len, kv_len, heads, dim, kmax = 1, 5, 40, 2, 3, 3
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
  mask = rng.random((batch, heads, q_len, kv_len)) < 0.7
  mask[0, 0, 1] = False  # one fully masked row
  mask[0, 1, 0, 2] = True

  def f(*xs):
    return attention.shaw_attention(*xs, mask=mask, query_offset=17)

  with jax.enable_x64(True):
    check_grads(jax.jit(f), tuple(_f64(x) for x in (q, k, v, wk, wv)), **FD)


def test_xl_finite_differences():
  rng = np.random.default_rng(22)
  batch, q_len, kv_len, heads, dim = 1, 3, 5, 2, 3
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  extra = (randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim))
  mask = rng.random((batch, 1, 1, kv_len)) < 0.7
  mask[..., -1] = True
  with jax.enable_x64(True):
    f = jax.jit(lambda *xs: attention.xl_attention(*xs, mask=mask))
    check_grads(f, tuple(_f64(x) for x in (q, k, v, *extra)), **FD)
