"""Attention-probability dropout (dropout_rate / dropout_rng) of every relpos.attention kernel.

The keep mask is regenerated here with the documented call, `jax.random.bernoulli(rng, 1 - rate,
[batch, heads, q_len, kv_len])`, and applied in a float64 NumPy transcription; the gradients of
the efficient Shaw kernel (custom VJP, mask regenerated in its backward pass) are checked against
autodiff of the materialised kernel and against finite differences.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import (
  assert_close,
  assert_grads_close,
  causal_np,
  dead_rows,
  f32,
  f32_np,
  make_mask,
  qkv,
  randn,
  slow_where,
)
from jax.test_util import check_grads

from relpos import attention

pytestmark = pytest.mark.usefixtures('attention_test_config')

KERNELS = {
  'dot_product': attention.dot_product_attention,
  'shaw': attention.shaw_attention_banded,
  'shaw_dense': attention.shaw_attention_dense,
  'xl': attention.xl_attention,
}
SHAW_NAMES = ('query', 'key', 'value', 'rel_key', 'rel_value')
S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim): q_len != kv_len, odd sizes


def keep_mask(rng, rate, batch, heads, q_len, kv_len):
  """The documented keep mask, float64 [batch, heads, q_len, kv_len] (1 = kept)."""
  return np.asarray(jax.random.bernoulli(rng, 1 - rate, (batch, heads, q_len, kv_len)), np.float64)


def dropped_attention(logit, value, allowed, keep, rate, out_shape):
  """z_i = Σ_j p'_ij u_ij, p'_ij = softmax_j(e_ij over the allowed j) keep_ij / (1 - rate).

  `logit(b, h, i, j)` gives e_ij, `value(b, h, i, j)` gives u_ij (v_j, or v_j + a^V_ij for
  Shaw); `allowed` and `keep` are [batch, heads, q_len, kv_len].
  """
  batch, q_len, heads, dim = out_shape
  kv_len = allowed.shape[-1]
  out = np.zeros(out_shape, dtype=np.float64)
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        e = np.array([logit(b, h, i, j) for j in range(kv_len)])
        alpha = reference._softmax_over_allowed(e, allowed[b, h, i])
        for j in range(kv_len):
          out[b, i, h] += alpha[j] * keep[b, h, i, j] / (1.0 - rate) * value(b, h, i, j)
  return out


def expected(name, args, mask, keep, rate, query_offset=None):
  """Float64 transcription of kernel `name` on `args` with the keep mask applied."""
  q, k, v = (f32_np(x) for x in args[:3])
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  allowed = reference._allowed(mask, batch, heads, q_len, kv_len)
  scale = 1.0 / math.sqrt(dim)
  value = lambda b, h, i, j: v[b, j, h]  # noqa: E731
  if name == 'dot_product':
    logit = lambda b, h, i, j: np.dot(q[b, i, h], k[b, j, h]) * scale  # noqa: E731
  elif name == 'xl':
    r, u, vb = (f32_np(x) for x in args[3:])
    allowed = allowed & causal_np(q_len, kv_len)

    def logit(b, h, i, j):
      t = max(kv_len - q_len + i - j, 0)  # distance pos_i - j (future keys are masked)
      content = np.dot(q[b, i, h] + u[h], k[b, j, h])
      return (content + np.dot(q[b, i, h] + vb[h], r[t, h])) * scale

  else:
    wk, wv = f32_np(args[3]), f32_np(args[4])
    kmax = ((wk if wk is not None else wv).shape[0] - 1) // 2
    offset = kv_len - q_len if query_offset is None else query_offset

    def table(w, i, j):
      return 0.0 if w is None else w[reference.shaw_index(i, j, kmax, offset)]

    logit = lambda b, h, i, j: np.dot(q[b, i, h], k[b, j, h] + table(wk, i, j)) * scale  # noqa: E731
    value = lambda b, h, i, j: v[b, j, h] + table(wv, i, j)  # noqa: E731
  return dropped_attention(logit, value, allowed, keep, rate, q.shape)


def _call(name, args, mask, query_offset, dropout_rate, dropout_rng):
  kwargs = dict(mask=mask, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  if query_offset is not None:
    kwargs['query_offset'] = query_offset
  return KERNELS[name](*args, **kwargs)


@functools.partial(jax.jit, static_argnums=0, static_argnames=('query_offset', 'dropout_rate'))
def output_and_grads(name, cotangent, *args, mask, dropout_rate, dropout_rng, query_offset=None):
  """Kernel output, and the gradients of <output, cotangent> w.r.t. every arg (None for None).

  dropout_rate (and query_offset) static, dropout_rng traced.
  """
  fn = lambda *xs: _call(name, xs, mask, query_offset, dropout_rate, dropout_rng)  # noqa: E731
  output, vjp = jax.vjp(fn, *args)
  return output, vjp(cotangent)


def _shaw_args(rng, shape, kmax, drop=None):
  batch, q_len, kv_len, heads, dim = shape
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  wk, wv = randn(rng, 2 * kmax + 1, dim), randn(rng, 2 * kmax + 1, dim)
  wk = None if drop == 'rel_key' else wk
  wv = None if drop == 'rel_value' else wv
  return [f32(x) for x in (q, k, v, wk, wv)]


def _xl_args(rng, shape):
  batch, q_len, kv_len, heads, dim = shape
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  extra = (randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim))
  return [f32(x) for x in (q, k, v, *extra)]


def test_transcription_without_dropout_is_the_reference():
  """The transcription above, with every entry kept and rate 0, equals tests/reference.py."""
  rng = np.random.default_rng(0)
  batch, q_len, kv_len, heads, dim = shape = (1, 3, 5, 2, 3)
  keep = np.ones((batch, heads, q_len, kv_len))
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  shaw = _shaw_args(rng, shape, 1)
  xl = _xl_args(rng, shape)
  want = {
    'dot_product': reference.vanilla(*(f32_np(x) for x in shaw[:3]), mask=mask),
    'shaw': reference.shaw(*(f32_np(x) for x in shaw), mask=mask, query_offset=1),
    'xl': reference.xl(*(f32_np(x) for x in xl), mask=mask),
  }
  got = {
    'dot_product': expected('dot_product', shaw[:3], mask, keep, 0.0),
    'shaw': expected('shaw', shaw, mask, keep, 0.0, query_offset=1),
    'xl': expected('xl', xl, mask, keep, 0.0),
  }
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def _check_output(name, output, args, mask, rng, rate, query_offset=None):
  batch, q_len, heads, _ = args[0].shape
  kv_len = args[1].shape[1]
  keep = keep_mask(rng, rate, batch, heads, q_len, kv_len)
  assert 0 < keep.mean() < 1
  want = expected(name, args, mask, keep, rate, query_offset=query_offset)
  assert_close(output, want, err_msg=name)
  dead = dead_rows(mask, batch, heads, q_len, kv_len)
  assert np.all(np.asarray(output)[dead] == 0.0), 'fully masked rows must be exactly zero'


@pytest.mark.parametrize(
  'name,mask_kind,rate',
  [('dot_product', 'dead_rows', 0.3), ('dot_product', 'padding', 0.6), ('xl', 'dead_rows', 0.3)],
)
def test_dot_product_and_xl_forward(name, mask_kind, rate):
  rng = np.random.default_rng(1 + int(10 * rate))
  batch, q_len, kv_len, heads, dim = S
  args = _shaw_args(rng, S, 1)[:3] if name == 'dot_product' else _xl_args(rng, S)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  key = jax.random.key(7)
  output, grads = output_and_grads(name, cot, *args, mask=mask, dropout_rate=rate, dropout_rng=key)
  _check_output(name, output, args, mask, key, rate)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


# (id, shape, k, mask kind, query_offset, dropped table, rate)
SHAW_CASES = [
  ('dead_rows', S, 3, 'dead_rows', None, None, 0.3),
  ('offset_neg_causal', (2, 5, 8, 2, 4), 1, 'causal', -2, None, 0.5),
  ('k0_random', S, 0, 'random', None, None, 0.2),
  ('keys_only', S, 3, 'dead_rows', 1, 'rel_value', 0.3),
  ('values_only', S, 3, 'dead_rows', 1, 'rel_key', 0.3),
  # kv_len 40: three prefix-sum blocks of 16 keys in the efficient kernel
  ('long_keys', (1, 6, 40, 2, 4), 4, 'dead_rows', 17, None, 0.7),
]


@pytest.mark.parametrize(
  'shape,kmax,mask_kind,offset,drop,rate',
  # Slow tier: k = 0 and keys-only (the mask is drawn as in the other cases; values-only keeps
  # a dropped table in the default run).
  slow_where(
    [c[1:] for c in SHAW_CASES], {'k0_random', 'keys_only'}, [c[0] for c in SHAW_CASES], unpack=True
  ),
)
def test_shaw_forward_and_grads(shape, kmax, mask_kind, offset, drop, rate):
  """Both Shaw kernels vs the transcription; the custom VJP vs autodiff of the materialised one."""
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(
    100 + [c[1:] for c in SHAW_CASES].index((shape, kmax, mask_kind, offset, drop, rate))
  )
  args = _shaw_args(rng, shape, kmax, drop)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=offset)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  key = jax.random.PRNGKey(int(rng.integers(1 << 30)))  # a raw uint32 key
  run = functools.partial(
    output_and_grads, mask=mask, dropout_rate=rate, dropout_rng=key, query_offset=offset
  )
  output, got = run('shaw', cot, *args)
  output_dense, want = run('shaw_dense', cot, *args)
  for name, out in (('shaw', output), ('shaw_dense', output_dense)):
    _check_output(name, out, args, mask, key, rate, query_offset=offset)
  present = [n for n, a in enumerate(args) if a is not None]
  assert all(got[n] is None for n in range(5) if n not in present)
  names = [SHAW_NAMES[n] for n in present]
  assert_grads_close([got[n] for n in present], [want[n] for n in present], names=names)


def test_shaw_finite_differences():
  """The custom VJP with dropout against finite differences of its own forward pass (float64)."""
  rng = np.random.default_rng(21)
  batch, q_len, kv_len, heads, dim, kmax = 1, 4, 21, 2, 3, 2  # two prefix-sum blocks
  args = _shaw_args(rng, (batch, q_len, kv_len, heads, dim), kmax)
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)

  def f(*xs):
    return attention.shaw_attention(
      *xs, mask=mask, query_offset=9, dropout_rate=0.4, dropout_rng=jax.random.key(5)
    )

  with jax.enable_x64(True):
    xs = tuple(jnp.asarray(x, jnp.float64) for x in args)
    check_grads(jax.jit(f), xs, order=1, modes=('rev',), atol=1e-6, rtol=1e-6, eps=1e-5)


def test_rate_zero_is_exactly_no_dropout():
  rng = np.random.default_rng(3)
  batch, q_len, kv_len, heads, dim = S
  inputs = {'shaw': _shaw_args(rng, S, 2), 'xl': _xl_args(rng, S)}
  inputs['dot_product'] = inputs['shaw_dense'] = inputs['shaw']
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  for name, args in sorted(inputs.items()):
    args = args[:3] if name == 'dot_product' else args

    @jax.jit
    def plain_and_zero(*xs, name=name):
      """The plain call and rate 0 without and with an rng: one compile per kernel."""
      fn = functools.partial(KERNELS[name], mask=mask)
      zeros = [fn(*xs, dropout_rate=0.0, dropout_rng=rng) for rng in (None, jax.random.key(1))]
      return fn(*xs), zeros

    plain, zeros = plain_and_zero(*args)
    for zero in zeros:
      np.testing.assert_array_equal(np.asarray(zero), np.asarray(plain), err_msg=name)


@pytest.mark.parametrize('name', sorted(KERNELS))
def test_bad_rate_or_missing_rng(name):
  rng = np.random.default_rng(4)
  shape = (1, 2, 3, 1, 2)
  args = _xl_args(rng, shape) if name == 'xl' else _shaw_args(rng, shape, 1)
  args = args[:3] if name == 'dot_product' else args
  key = jax.random.key(0)
  for rate in (-0.1, 1.0, 1.5):
    with pytest.raises(ValueError, match=r'dropout_rate must be in \[0, 1\)'):
      KERNELS[name](*args, dropout_rate=rate, dropout_rng=key)
  with pytest.raises(ValueError, match='needs a dropout_rng'):
    KERNELS[name](*args, dropout_rate=0.1)


def test_shaw_under_jit_with_traced_rng_and_query_offset():
  """One compilation: rate static, rng and query_offset traced (a decoding step in training)."""
  batch, q_len, kv_len, heads, dim, kmax, rate = 2, 3, 11, 2, 4, 2, 0.4
  rng = np.random.default_rng(5)
  args = _shaw_args(rng, (batch, q_len, kv_len, heads, dim), kmax)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  traces = []

  @functools.partial(jax.jit, static_argnames=('dropout_rate',))
  def step(offset, key, *xs, dropout_rate):
    traces.append(1)
    mask = jnp.arange(kv_len)[None, :] <= offset + jnp.arange(q_len)[:, None]
    outputs_and_grads = []
    for fn in (attention.shaw_attention_banded, attention.shaw_attention_dense):
      kwargs = dict(mask=mask, query_offset=offset, dropout_rate=dropout_rate, dropout_rng=key)
      output, vjp = jax.vjp(lambda *ys, fn=fn, kwargs=kwargs: fn(*ys, **kwargs), *xs)
      outputs_and_grads.append((output, vjp(cot)))
    return outputs_and_grads

  outputs = []
  for offset, seed in [(-2, 0), (4, 1), (4, 2), (9, 3)]:
    key = jax.random.key(seed)
    (output, got), (_, want) = step(jnp.int32(offset), key, *args, dropout_rate=rate)
    mask = causal_np(q_len, kv_len, offset)
    _check_output('shaw', output, args, mask, key, rate, query_offset=offset)
    assert_grads_close(got, want, names=[f'{n} (offset {offset})' for n in SHAW_NAMES])
    outputs.append(np.asarray(output))
  assert len(traces) == 1, 'the rng and query_offset must be usable as traced values'
  assert np.abs(outputs[1] - outputs[2]).max() > 1e-3, 'another rng must drop other entries'


def test_mean_over_rngs_is_the_output_without_dropout():
  """Averaged over many keep masks, the dropped output of each kernel is the plain output."""
  batch, q_len, kv_len, heads, dim, rate, samples = 1, 3, 6, 2, 2, 0.3, 4000
  rng = np.random.default_rng(6)
  shaw = _shaw_args(rng, (batch, q_len, kv_len, heads, dim), 1)
  xl = _xl_args(rng, (batch, q_len, kv_len, heads, dim))
  keys = jax.random.split(jax.random.key(8), samples)
  for name, args in (('dot_product', shaw[:3]), ('shaw', shaw), ('xl', xl)):
    fn = KERNELS[name]
    plain = np.asarray(jax.jit(fn)(*args))  # jitted: op by op it takes seconds
    dropped = jax.jit(
      jax.vmap(lambda key, fn=fn, args=args: fn(*args, dropout_rate=rate, dropout_rng=key))
    )(keys)
    dropped = np.asarray(dropped, np.float64)
    error = np.abs(dropped.mean(0) - plain)
    # 5 standard errors of the mean, estimated from the samples themselves
    assert np.all(error <= 5 * dropped.std(0) / math.sqrt(samples) + 1e-6), name
