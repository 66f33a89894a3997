"""shaw_attention's two implementations vs the float64 reference (Shaw et al. 2018).

'shaw' is `shaw_attention_banded` and 'shaw_dense' the dense form; `shaw_attention`
picks one by the number of keys (test_shaw_attention_picks_the_dense_form_for_short_keys).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import (
  assert_close,
  causal_np,
  dead_rows,
  f32,
  f32_np,
  make_mask,
  qkv,
  randn,
  run,
  run_traced_offset,
)

from relpos import attention
from relpos.attention.implementations import DENSE_MAX_KV_LEN

pytestmark = pytest.mark.usefixtures('attention_test_config')

BOTH = ('shaw', 'shaw_dense')
S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim): q_len != kv_len, odd sizes


def _tables(rng, kmax, dim, drop=None):
  wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
  return (None if drop == 'rel_key' else wk), (None if drop == 'rel_value' else wv)


def _check(name, q, k, v, wk, wv, mask=None, query_offset=None):
  """Run kernel `name` (jitted, static offset) and compare with the float64 reference."""
  out = run(name, f32(q), f32(k), f32(v), f32(wk), f32(wv), mask=mask, query_offset=query_offset)
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  assert out.shape == (batch, q_len, heads, dim)
  assert out.dtype == np.float32
  want = reference.shaw(
    f32_np(q),
    f32_np(k),
    f32_np(v),
    f32_np(wk),
    f32_np(wv),
    mask=mask,
    query_offset=query_offset,
  )
  assert_close(out, want, err_msg=name)
  dead = dead_rows(mask, batch, heads, q_len, kv_len)
  assert np.all(np.asarray(out)[dead] == 0.0), 'fully masked rows must be exactly zero'
  return out


# (shape, k, mask kind, kernels). k = 0, k = 1, k = kv_len, k > kv_len (nothing clipped), ...
CASES = [
  (S, 3, 'none', ('shaw',)),
  (S, 3, 'random', BOTH),
  (S, 3, 'causal', BOTH),
  (S, 3, 'padding', BOTH),
  (S, 3, 'dead_rows', ('shaw',)),
  (S, 0, 'dead_rows', BOTH),
  (S, 1, 'causal', ('shaw',)),
  (S, 13, 'padding', ('shaw',)),
  (S, 20, 'none', ('shaw',)),
  (S, 20, 'dead_rows', BOTH),
  ((2, 9, 9, 2, 8), 2, 'causal', BOTH),  # self-attention
  ((1, 1, 11, 3, 4), 4, 'none', BOTH),  # single query (decoding)
  ((1, 1, 11, 3, 4), 15, 'random', ('shaw',)),
  ((2, 1, 13, 2, 5), 0, 'dead_rows', BOTH),
  ((2, 1, 70, 2, 3), 2, 'padding', ('shaw',)),  # a single query over several prefix blocks
  ((2, 6, 4, 2, 3), 1, 'none', ('shaw',)),  # q_len > kv_len: default offset is negative
  ((2, 6, 4, 2, 3), 5, 'dead_rows', BOTH),
]
CASE_IDS = ['x'.join(map(str, s)) + f'-k{k}-{m}' for s, k, m, _ in CASES]


@pytest.mark.parametrize('shape,kmax,mask_kind,names', CASES, ids=CASE_IDS)
def test_shaw_vs_reference(shape, kmax, mask_kind, names):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(10 + CASES.index((shape, kmax, mask_kind, names)))
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  for name in names:
    _check(name, q, k, v, wk, wv, mask=mask)


# query_offset: 0 (queries are the first positions), negative (queries before every key; with a
# causal mask some rows are then fully masked), past the end (queries after every key), inside.
OFFSETS = [
  (0, 'causal', ('shaw',)),
  (-9, 'causal', BOTH),
  (-3, 'none', ('shaw',)),
  (2, 'causal', ('shaw',)),
  (16, 'none', BOTH),
  (40, 'causal', ('shaw',)),
]


@pytest.mark.parametrize('offset,mask_kind,names', OFFSETS, ids=[f'{o}-{m}' for o, m, _ in OFFSETS])
def test_shaw_query_offset(offset, mask_kind, names):
  batch, q_len, kv_len, heads, dim, kmax = 2, 5, 11, 2, 4, 3
  rng = np.random.default_rng(200 + offset)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=offset)
  for name in names:
    _check(name, q, k, v, wk, wv, mask=mask, query_offset=offset)


def test_shaw_default_offset_is_kv_minus_q():
  name = 'shaw'
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(3)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  wk, wv = (f32(x) for x in _tables(rng, 3, dim))
  default = run(name, q, k, v, wk, wv)
  explicit = run(name, q, k, v, wk, wv, query_offset=kv_len - q_len)
  other = run(name, q, k, v, wk, wv, query_offset=kv_len - q_len - 1)
  np.testing.assert_allclose(np.asarray(default), np.asarray(explicit), rtol=1e-6, atol=1e-6)
  assert not np.allclose(np.asarray(default), np.asarray(other), atol=1e-3)


# keys-only (rel_value=None) and values-only (rel_key=None) ablations
SINGLE = [
  ('rel_value', 0, 'none', ('shaw',)),
  ('rel_value', 2, 'dead_rows', ('shaw',)),
  ('rel_key', 2, 'dead_rows', BOTH),
  ('rel_key', 0, 'causal', ('shaw',)),
  ('rel_key', 15, 'none', ('shaw',)),
]


SINGLE_IDS = [
  ('keys_only' if d == 'rel_value' else 'values_only') + f'-k{k}-{m}' for d, k, m, _ in SINGLE
]


@pytest.mark.parametrize('drop,kmax,mask_kind,names', SINGLE, ids=SINGLE_IDS)
def test_shaw_single_table(drop, kmax, mask_kind, names):
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(300 + SINGLE.index((drop, kmax, mask_kind, names)))
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim, drop=drop)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=2)
  for name in names:
    _check(name, q, k, v, wk, wv, mask=mask, query_offset=2)


def test_shaw_with_library_causal_mask():
  """The mask built by attention.causal_mask plugs straight into the kernel."""
  batch, q_len, kv_len, heads, dim, kmax, off = 2, 5, 11, 2, 4, 3, 2
  rng = np.random.default_rng(4)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  mask = attention.causal_mask(q_len, kv_len, query_offset=off)
  out = run('shaw', f32(q), f32(k), f32(v), f32(wk), f32(wv), mask=mask, query_offset=off)
  want = reference.shaw(
    f32_np(q),
    f32_np(k),
    f32_np(v),
    f32_np(wk),
    f32_np(wv),
    mask=causal_np(q_len, kv_len, off),
    query_offset=off,
  )
  assert_close(out, want)


@pytest.mark.parametrize('name', BOTH)
def test_shaw_traced_query_offset_under_jit(name):
  """query_offset as a traced int32 scalar: one compilation serves every decoding step."""
  batch, kv_len, heads, dim, kmax = 2, 8, 3, 4, 2
  rng = np.random.default_rng(5)
  q_all, k, v = qkv(rng, batch, kv_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  traces = []

  @jax.jit
  def step(q, k, v, wk, wv, off):
    traces.append(1)
    mask = jnp.arange(kv_len)[None, :] <= off + jnp.arange(q.shape[1])[:, None]
    fn = attention.shaw_attention_banded if name == 'shaw' else attention.shaw_attention_dense
    return fn(q, k, v, wk, wv, mask=mask, query_offset=off)

  for t in [0, 3, 7]:
    q = q_all[:, t : t + 1]
    out = step(f32(q), f32(k), f32(v), f32(wk), f32(wv), jnp.int32(t))
    want = reference.shaw(
      f32_np(q),
      f32_np(k),
      f32_np(v),
      f32_np(wk),
      f32_np(wv),
      mask=causal_np(1, kv_len, t),
      query_offset=t,
    )
    assert_close(out, want)
  assert len(traces) == 1, 'query_offset must be usable as a traced value (no retrace)'

  # several queries per call, no mask, offsets before / inside / after the keys, one compile
  q = q_all[:, :3]
  for t in [-6, -2, 0, 4, 9, 30]:
    out = run_traced_offset(
      name, f32(q), f32(k), f32(v), f32(wk), f32(wv), query_offset=jnp.int32(t)
    )
    want = reference.shaw(f32_np(q), f32_np(k), f32_np(v), f32_np(wk), f32_np(wv), query_offset=t)
    assert_close(out, want, err_msg=f'traced offset {t}')


def test_shaw_traced_offset_single_table_and_k0():
  batch, q_len, kv_len, heads, dim = 1, 4, 9, 2, 3
  rng = np.random.default_rng(6)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  for kmax, drop in [(0, None), (2, 'rel_key'), (12, 'rel_value')]:
    wk, wv = _tables(rng, kmax, dim, drop=drop)
    for t in [-5, 3, 11]:
      mask = causal_np(q_len, kv_len, t)
      out = run_traced_offset(
        'shaw',
        f32(q),
        f32(k),
        f32(v),
        f32(wk),
        f32(wv),
        mask=mask,
        query_offset=jnp.int32(t),
      )
      want = reference.shaw(
        f32_np(q), f32_np(k), f32_np(v), f32_np(wk), f32_np(wv), mask=mask, query_offset=t
      )
      assert_close(out, want, err_msg=f'k={kmax} drop={drop} offset={t}')


# Long keys: the blocked kernel sums the clipped edges with block prefix sums (blocks of
# ~4*sqrt(kv_len) keys, 64 here, so 3 blocks). Sweep a traced query_offset across and beyond the
# keys so the edges fall in every block and at every block boundary (one compilation).


@pytest.mark.parametrize('kmax', [2, 40])
def test_blocked_equals_materialized_long_offset_sweep(kmax):
  batch, q_len, kv_len, heads, dim = 1, 9, 150, 2, 4
  rng = np.random.default_rng(7 + kmax)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  args = [f32(x) for x in (q, k, v, wk, wv)]
  for off in range(-60, 220, 7):
    a = run_traced_offset('shaw', *args, mask=mask, query_offset=jnp.int32(off))
    b = run_traced_offset('shaw_dense', *args, mask=mask, query_offset=jnp.int32(off))
    assert_close(a, b, err_msg=f'offset {off}')
    if off in (-4, 60, 129):
      want = reference.shaw(*(f32_np(x) for x in (q, k, v, wk, wv)), mask=mask, query_offset=off)
      assert_close(a, want, err_msg=f'offset {off}')


@pytest.mark.parametrize('make_offset', [np.int64, jnp.int32], ids=['np.int64', 'jnp.int32'])
def test_shaw_offset_as_concrete_array_scalar(make_offset):
  """A concrete NumPy / JAX integer scalar works like the Python int."""
  batch, q_len, kv_len, heads, dim, kmax, off = 2, 5, 11, 2, 4, 3, 2
  rng = np.random.default_rng(8)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  out = jax.jit(lambda *a: attention.shaw_attention(*a, query_offset=make_offset(off)))(
    *(f32(x) for x in (q, k, v, wk, wv))
  )
  want = reference.shaw(*(f32_np(x) for x in (q, k, v, wk, wv)), query_offset=off)
  assert_close(out, want)


@pytest.mark.parametrize(
  'kv_len,dense_max_kv_len',
  [(DENSE_MAX_KV_LEN, None), (DENSE_MAX_KV_LEN + 1, None), (7, 0), (7, 6), (9, 9)],
)
def test_shaw_attention_picks_the_dense_form_for_short_keys(kv_len, dense_max_kv_len):
  """Dense up to DENSE_MAX_KV_LEN keys (or the call's dense_max_kv_len), banded (its custom
  VJP) above; the two agree."""
  batch, q_len, heads, dim, kmax = 1, 3, 2, 4, 5
  rng = np.random.default_rng(kv_len)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  args = [f32(x) for x in (q, k, v, *_tables(rng, kmax, dim))]
  given = {} if dense_max_kv_len is None else {'dense_max_kv_len': dense_max_kv_len}
  call = functools.partial(attention.shaw_attention, **given)
  jaxpr = str(jax.make_jaxpr(call)(*args))
  banded = kv_len > given.get('dense_max_kv_len', DENSE_MAX_KV_LEN)
  assert ('custom_vjp_call' in jaxpr) == banded
  assert attention.shaw.xla_form(kv_len, **given) == ('banded' if banded else 'dense')
  out = jax.jit(call)(*args)
  for fn in (attention.shaw_attention_banded, attention.shaw_attention_dense):
    assert_close(out, jax.jit(fn)(*args), err_msg=fn.__name__)


@pytest.mark.parametrize(
  'kv_len,offset',
  [(13, None), (13, -3), (DENSE_MAX_KV_LEN + 6, 40)],
  ids=['dense-default', 'dense-before-keys', 'banded-inside'],
)
def test_shaw_causal_flag_is_the_causal_mask(kv_len, offset):
  """causal=True with a keys-only mask (a memory's filled slots) is the causal mask and that
  mask, for 'xla' in both its forms, with a static or traced query offset."""
  batch, q_len, heads, dim, kmax = 2, 5, 2, 4, 3
  rng = np.random.default_rng(300 + kv_len)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = _tables(rng, kmax, dim)
  args = [f32(x) for x in (q, k, v, wk, wv)]
  keys = np.arange(kv_len) >= 4
  full = causal_np(q_len, kv_len, offset) & keys
  want = reference.shaw(*(f32_np(x) for x in (q, k, v, wk, wv)), mask=full, query_offset=offset)
  out = jax.jit(
    lambda *a: attention.shaw_attention(
      *a, mask=keys, causal=True, query_offset=offset, implementation='xla'
    )
  )(*args)
  assert_close(out, want)
  if offset is not None:
    traced = jax.jit(
      lambda off, *a: attention.shaw_attention(
        *a, mask=keys, causal=True, query_offset=off, implementation='xla'
      )
    )(jnp.int32(offset), *args)
    assert_close(traced, want)


@pytest.mark.parametrize(
  'q_len,kv_len,offset',
  [(9, 9, None), (70, 70, None), (40, 90, None), (30, 80, 20)],
  ids=['dense', 'banded', 'banded-memory', 'banded-offset'],
)
@pytest.mark.parametrize('implementation', ['xla', 'pallas'])
def test_causal_calls_give_the_later_table_rows_an_exact_zero_gradient(
  q_len, kv_len, offset, implementation
):
  """No causal query reads a table row of a positive distance, so those rows' gradient is 0
  exactly: the banded form took its right edge as the row's rest, a difference of sums whose
  rounding gave them about 1e-6, which Adam turned into drift (a decoder's rows d > 0)."""
  batch, heads, dim, kmax = 1, 2, 8, 6
  rng = np.random.default_rng(q_len + kv_len)
  q, k, v = (f32(x) for x in qkv(rng, batch, q_len, kv_len, heads, dim))
  wk, wv = (f32(x) for x in _tables(rng, kmax, dim))
  keys = jnp.arange(kv_len) >= 3  # a memory's unfilled slots, as a keys-only mask

  def loss(wk, wv):
    out = attention.shaw_attention(
      q, k, v, wk, wv, mask=keys, causal=True, query_offset=offset, implementation=implementation
    )
    return jnp.sum(out * v[:, :q_len])

  d_wk, d_wv = jax.jit(jax.grad(loss, argnums=(0, 1)))(wk, wv)
  assert np.all(np.asarray(d_wk[kmax + 1 :]) == 0) and np.all(np.asarray(d_wv[kmax + 1 :]) == 0)
  assert np.abs(np.asarray(d_wk[: kmax + 1])).max() > 0  # the read rows do learn
