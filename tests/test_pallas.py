"""implementation='pallas' of shaw_attention and xl_attention (fused, tiled Pallas kernels, run
in interpret mode on CPU) against the float64 references.

Outputs are compared with tests/reference.py (NumPy loops); gradients of a random
cotangent-weighted sum, with respect to every input, with float64 autodiff of the dense JAX
transcriptions below (themselves checked against reference.py), which also give the dropout
reference: the same equations with the kernels' hashed keep mask (`dropout_keep_hashed`).
Tiles are forced small (`block_sizes`), so with q_len 7 and kv_len 13 there are several query
and key tiles, padded tails, band-crossing and out-of-band key tiles (Shaw) and key tiles in the
causal future (XL).
Interpret-mode Pallas compiles slowly: each case is one jit of output and gradients together.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import (
  FWD_TOL,
  GRAD_TOL,
  assert_close,
  assert_grads_close,
  causal_np,
  dead_rows,
  f32,
  make_mask,
  qkv,
  randn,
  slow_where,
)

from relpos import attention
from relpos.attention.implementations import resolve_implementation
from relpos.attention.masking import MASKED_LOGIT
from relpos.attention.pallas_common import dropout_keep_hashed, dropout_seed

pytestmark = pytest.mark.usefixtures('attention_test_config')

S = (2, 7, 13, 3, 5)  # (batch, q_len, kv_len, heads, head_dim)
BLOCKS = (4, 4)  # 2 query tiles (1 padded row), 4 key tiles (3 padded keys)
SHAW_NAMES = ('query', 'key', 'value', 'rel_key', 'rel_value')
XL_NAMES = ('query', 'key', 'value', 'rel_key', 'content_bias', 'position_bias')
# float32 vs float64: helpers' FWD_TOL and GRAD_TOL. Measured on CPU: outputs within 3e-7,
# gradients within 1.2e-6 (scaled as in assert_grads_close). bf16 inputs (float32 accumulation)
# vs float64 on the same bf16 values: measured within 6e-3; 3x headroom.
BF16_TOL = 2e-2


# --------------------------------------------------------------------------------------------
# Dense float64 JAX transcriptions (gradient references), with an optional dropout keep mask.


def _softmax_dropout(logits_BHQK, allowed_BHQK, keep, rate):
  probs = jax.nn.softmax(jnp.where(allowed_BHQK, logits_BHQK, MASKED_LOGIT), axis=-1)
  probs = jnp.where(allowed_BHQK, probs, 0.0)
  return probs if keep is None else jnp.where(keep, probs / (1.0 - rate), 0.0)


def shaw_dense(q, k, v, wk, wv, *, mask=None, query_offset=None, keep=None, rate=0.0):
  """Shaw et al. eqs. 3-5 with a^K, a^V gathered into [q_len, kv_len, d]."""
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  offset = kv_len - q_len if query_offset is None else query_offset
  kmax = ((wk if wk is not None else wv).shape[0] - 1) // 2
  distance = jnp.arange(kv_len)[None, :] - (offset + jnp.arange(q_len))[:, None]
  buckets = jnp.clip(distance, -kmax, kmax) + kmax
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k)
  if wk is not None:
    logits += jnp.einsum('bqhd,qkd->bhqk', q, wk[buckets])
  allowed = jnp.ones((batch, heads, q_len, kv_len), bool)
  if mask is not None:
    allowed = allowed & jnp.asarray(mask)
  probs = _softmax_dropout(logits / math.sqrt(dim), allowed, keep, rate)
  out = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
  if wv is not None:
    out += jnp.einsum('bhqk,qkd->bqhd', probs, wv[buckets])
  return out


def xl_dense(q, k, v, r, u, vb, *, mask=None, keep=None, rate=0.0):
  """Transformer-XL's score with rel_key gathered per (i, j) (index clipped where masked)."""
  batch, q_len, heads, dim = q.shape
  kv_len = k.shape[1]
  distance = (kv_len - q_len + jnp.arange(q_len))[:, None] - jnp.arange(kv_len)[None, :]
  logits = jnp.einsum('bqhd,bkhd->bhqk', q + u, k)
  logits += jnp.einsum('bqhd,qkhd->bhqk', q + vb, r[jnp.clip(distance, 0, kv_len - 1)])
  allowed = jnp.broadcast_to(distance >= 0, (batch, heads, q_len, kv_len))
  if mask is not None:
    allowed = allowed & jnp.asarray(mask)
  probs = _softmax_dropout(logits / math.sqrt(dim), allowed, keep, rate)
  return jnp.einsum('bhqk,bkhd->bqhd', probs, v)


DENSE = {'shaw': shaw_dense, 'xl': xl_dense}
KERNELS = {'shaw': attention.shaw_attention, 'xl': attention.xl_attention}


@functools.partial(
  jax.jit,
  static_argnums=0,
  static_argnames=('query_offset', 'dropout_rate', 'block_sizes', 'causal'),
)
def output_and_grads(
  name,
  cotangent,
  *args,
  mask=None,
  query_offset=None,
  dropout_rate=0.0,
  dropout_rng=None,
  block_sizes=BLOCKS,
  causal=False,
):
  """KERNELS[name](*args, implementation='pallas') and the gradients of <output, cotangent>
  w.r.t. every arg (None for None args). query_offset and causal (Shaw only): None means the
  default offset; causal=True asks the kernel for its own causal bound."""
  kwargs = {} if query_offset is None else {'query_offset': query_offset}
  if causal:
    kwargs['causal'] = True

  def fn(*xs):
    return KERNELS[name](
      *xs,
      mask=mask,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
      implementation='pallas',
      block_sizes=block_sizes,
      **kwargs,
    )

  output, vjp = jax.vjp(fn, *args)
  return output, vjp(cotangent)


@functools.partial(jax.jit, static_argnums=0)
def _dense_grads(name, cotangent, xs, kwargs):
  """Gradients w.r.t. the tuple xs (None for None) of <DENSE[name](*xs, **kwargs), cotangent>,
  and the output. One jit for every call: mask, keep, rate and query_offset are traced, so calls
  of one shape (the offsets of a traced-offset test, cases of the same sizes) compile once."""

  def loss(xs):
    out = DENSE[name](*xs, **kwargs)
    return jnp.sum(out * cotangent), out

  return jax.grad(loss, has_aux=True)(xs)


def dense_output_and_grads(name, cotangent, *args, **kwargs):
  """DENSE[name] in float64 (x64 scoped to this call): output and gradients as NumPy."""
  with jax.enable_x64(True):
    xs = tuple(None if x is None else jnp.asarray(x, jnp.float64) for x in args)
    kwargs = {k: None if v is None else jnp.asarray(v) for k, v in kwargs.items()}
    grads, output = _dense_grads(name, jnp.asarray(cotangent, jnp.float64), xs, kwargs)
    return np.asarray(output), [None if g is None else np.asarray(g) for g in grads]


def _check_grads(got, want, names, tol=GRAD_TOL):
  present = [n for n, w in enumerate(want) if w is not None]
  assert all(got[n] is None for n in range(len(want)) if n not in present)
  assert_grads_close(
    [got[n] for n in present],
    [want[n] for n in present],
    tol=tol,
    names=[names[n] for n in present],
  )


def _kernel_keep(rng_key, batch, heads, q_len, kv_len, rate):
  """The keep mask [batch, heads, q_len, kv_len] the kernels hash from `rng_key` (NumPy);
  jitted, as op by op it takes a second."""
  keep = jax.jit(
    lambda key: dropout_keep_hashed(dropout_seed(key), batch, heads, q_len, kv_len, rate)
  )
  return np.asarray(keep(rng_key))


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


def _numpy(args):
  return [None if a is None else np.asarray(a, np.float64) for a in args]


# --------------------------------------------------------------------------------------------
# Shaw et al.

# (id, k, mask kind, query_offset, dropped table, block_sizes, causal): causal=True is the
# kernels' own causal bound over a keys-only mask, the reference's mask its causal mask and that.
SHAW_CASES = [
  ('k3_dead_rows', 3, 'dead_rows', None, None, BLOCKS, False),  # band-crossing and edge tiles
  ('k0_random', 0, 'random', 2, None, BLOCKS, False),
  ('k_ge_n_padding', 20, 'padding', None, None, (8, 4), False),
  ('keys_only_causal', 2, 'causal', 2, 'rel_value', BLOCKS, False),
  # Tiles the causal mask masks whole are skipped, band-crossing ones among them (k = 3, keys
  # 4-7 of queries 0-3).
  ('causal_masked_band_tiles', 3, 'causal', 0, None, BLOCKS, False),
  ('values_only_before_keys', 2, 'none', -3, 'rel_key', (4, 8), False),
  ('after_keys_default_tiles', 1, 'none', 16, None, None, False),  # one tile each, all on the edge
  # The char LM's: a memory whose first slots are unfilled; the first queries see no key.
  ('causal_flag_memory_filling', 3, 'filling', None, None, BLOCKS, True),
  # Queries before most keys, some rows without a key, ragged key padding per batch row.
  ('causal_flag_k0_padding_before_keys', 0, 'padding', -2, None, BLOCKS, True),
  # The causal bound alone; every pair in the band.
  ('causal_flag_k_ge_n_no_mask', 20, 'none', None, None, BLOCKS, True),
]


@pytest.mark.parametrize(
  'kmax,mask_kind,offset,drop,blocks,causal',
  slow_where(
    [c[1:] for c in SHAW_CASES],
    {
      'after_keys_default_tiles',
      'keys_only_causal',
      'causal_flag_k0_padding_before_keys',
      'causal_flag_k_ge_n_no_mask',
    },
    [c[0] for c in SHAW_CASES],
    unpack=True,
  ),
)
def test_shaw_pallas_vs_reference(kmax, mask_kind, offset, drop, blocks, causal):
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(1000 + kmax + 7 * (offset or 0) + 300 * causal)
  args = _shaw_args(rng, S, kmax, drop)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=offset)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  output, grads = output_and_grads(
    'shaw', cot, *args, mask=mask, query_offset=offset, block_sizes=blocks, causal=causal
  )
  assert output.shape == (batch, q_len, heads, dim) and output.dtype == jnp.float32
  full = mask
  if causal:
    assert mask is None or mask.ndim == 1 or mask.shape[-2] == 1  # keys only
    full = causal_np(q_len, kv_len, offset) & (True if mask is None else mask)
  want = reference.shaw(*_numpy(args), mask=full, query_offset=offset)
  assert_close(output, want, tol=FWD_TOL)
  dead = dead_rows(full, batch, heads, q_len, kv_len)
  if causal:
    assert dead.any() == (mask_kind != 'none')
  assert np.all(np.asarray(output)[dead] == 0.0), 'fully masked rows must be exactly zero'
  _, want_grads = dense_output_and_grads('shaw', cot, *args, mask=full, query_offset=offset)
  _check_grads(grads, want_grads, SHAW_NAMES)


# (causal, offsets): the causal mask as an array, or (slow tier) causal=True and no mask; -6 and
# -7 put every key after every query, so every row is fully masked.
TRACED_OFFSETS = [(False, (-6, 3, 11)), pytest.param(True, (-7, 3), marks=pytest.mark.slow)]


@pytest.mark.parametrize('causal,offsets', TRACED_OFFSETS, ids=['mask', 'causal_flag'])
def test_shaw_pallas_traced_query_offset(causal, offsets):
  """query_offset traced under jit: one compilation for offsets before, inside and after."""
  batch, q_len, kv_len, heads, dim, kmax = 1, 5, 11, 2, 4, 2
  rng = np.random.default_rng(1100)
  args = _shaw_args(rng, (batch, q_len, kv_len, heads, dim), kmax)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  traces = []

  @functools.partial(jax.jit, static_argnums=0)
  def step(causal, offset, *xs):
    traces.append(causal)
    # The causal mask as an array, or (causal=True) the kernels' own bound and no mask.
    mask = None if causal else jnp.arange(kv_len)[None, :] <= offset + jnp.arange(q_len)[:, None]

    def fn(*ys):
      return attention.shaw_attention(
        *ys,
        mask=mask,
        causal=causal,
        query_offset=offset,
        implementation='pallas',
        block_sizes=(4, 4),
      )

    output, vjp = jax.vjp(fn, *xs)
    return output, vjp(cot)

  for offset in offsets:
    output, grads = step(causal, jnp.int32(offset), *args)
    mask = causal_np(q_len, kv_len, offset)
    want = reference.shaw(*_numpy(args), mask=mask, query_offset=offset)
    assert_close(output, want, FWD_TOL)
    _, want = dense_output_and_grads('shaw', cot, *args, mask=mask, query_offset=offset)
    _check_grads(grads, want, SHAW_NAMES)
  assert traces == [causal]


# --------------------------------------------------------------------------------------------
# Transformer-XL

# (id, shape, mask kind, block_sizes)
XL_CASES = [
  ('memory_none', S, 'none', BLOCKS),
  ('memory_dead_rows', (2, 5, 6, 4, 6), 'dead_rows', (2, 3)),
  ('no_memory_padding', (2, 9, 9, 2, 8), 'padding', (4, 4)),
  ('one_query_default_tiles', (1, 1, 11, 3, 4), 'random', None),
  # A [kv_len] mask (one row in the kernels): its first 8 keys, beyond the memory's 6, unfilled,
  # so the first two queries see no key.
  ('keys_only_dead_rows', (2, 5, 11, 3, 4), 'filling', (4, 4)),
  # Keys two windows long (16 rows: 4 + 8 - 1 padded), ragged (28 of 32): R's windows and the
  # dR kernel's key runs are clamped into the axis at the causal diagonal and at its end.
  ('clamped_windows', (1, 13, 28, 1, 4), 'random', (4, 8)),
]


@pytest.mark.parametrize(
  'shape,mask_kind,blocks',
  slow_where(
    [c[1:] for c in XL_CASES],
    {'memory_none', 'one_query_default_tiles'},
    [c[0] for c in XL_CASES],
    unpack=True,
  ),
)
def test_xl_pallas_vs_reference(shape, mask_kind, blocks):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(1200 + q_len + kv_len)
  args = _xl_args(rng, shape)
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  output, grads = output_and_grads('xl', cot, *args, mask=mask, block_sizes=blocks)
  assert output.shape == (batch, q_len, heads, dim) and output.dtype == jnp.float32
  assert_close(output, reference.xl(*_numpy(args), mask=mask), tol=FWD_TOL)
  causal = causal_np(q_len, kv_len)
  dead = dead_rows(causal if mask is None else mask & causal, batch, heads, q_len, kv_len)
  assert np.all(np.asarray(output)[dead] == 0.0)
  _, want_grads = dense_output_and_grads('xl', cot, *args, mask=mask)
  _check_grads(grads, want_grads, XL_NAMES)


def test_xl_windows_are_clamped_into_the_key_axis():
  """Every window of R (and run of keys) the XL kernels read lies inside the unpadded axis,
  the last row included, and its shift maps the wanted rows onto it: what the interpreter
  cannot show, since it pads a read past the end where Triton would read out of bounds."""
  from relpos.attention.pallas_common import Tiling
  from relpos.attention.pallas_xl import _clamped_rows, _XLSpec

  for q_len, kv_len, blocks in [(21, 44, (4, 8)), (512, 1024, (32, 32)), (5, 6, (2, 3))]:
    spec = _XLSpec(Tiling.make(q_len, kv_len, blocks, 32), 0.0, 1.0)
    assert spec.extended == max(spec.tiling.kv_padded, spec.window)
    lowest = -(spec.tiling.block_q + spec.tiling.block_k)
    for first in range(lowest, spec.extended + spec.window):
      rows, shift = _clamped_rows(spec, jnp.int32(first))
      start = int(rows.start)
      assert 0 <= start and start + spec.window <= spec.extended
      assert start + int(shift) == first
      # the rows a real pair needs, [first, first + span) within the axis, are all read
      wanted = range(max(first, 0), min(first + spec.span, spec.extended))
      assert all(start <= row < start + spec.window for row in wanted)


# --------------------------------------------------------------------------------------------
# Both kernels: the dense transcriptions, dropout, bf16, 'auto', errors.


def test_dense_transcriptions_match_reference():
  rng = np.random.default_rng(1300)
  batch, q_len, kv_len, heads, dim = S
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  args = _numpy(_shaw_args(rng, S, 3))
  cot = randn(rng, batch, q_len, heads, dim)
  got, _ = dense_output_and_grads('shaw', cot, *args, mask=mask, query_offset=4)
  assert_close(got, reference.shaw(*args, mask=mask, query_offset=4), tol=1e-12)
  args = _numpy(_xl_args(rng, S))
  got, _ = dense_output_and_grads('xl', cot, *args, mask=mask)
  assert_close(got, reference.xl(*args, mask=mask), tol=1e-12)


def test_dropout_keep_hashed():
  """The hashed keep mask: the right rate, and a different mask per seed, batch, head, row."""
  rate = 0.3
  # jitted (op by op it takes a second), the seed traced
  hashed = jax.jit(
    lambda seed, rate: dropout_keep_hashed(seed, 4, 3, 50, 60, rate), static_argnums=1
  )
  keep = np.asarray(hashed(jnp.uint32(7), rate))
  assert keep.shape == (4, 3, 50, 60) and keep.dtype == bool
  assert abs(keep.mean() - (1 - rate)) < 0.01
  assert not np.array_equal(keep[0, 0], keep[1, 0]) and not np.array_equal(keep[0, 0], keep[0, 1])
  assert not np.array_equal(keep[0, 0, 0], keep[0, 0, 1])
  other = np.asarray(hashed(jnp.uint32(8), rate))
  assert abs((keep == other).mean() - (rate**2 + (1 - rate) ** 2)) < 0.01  # independent draws
  assert np.asarray(hashed(jnp.uint32(7), 0.0)).all()


@pytest.mark.parametrize('name', slow_where(['shaw', 'xl'], {'xl'}))
def test_pallas_dropout_vs_reference_with_hashed_mask(name):
  """Dropout weights the values (and Shaw's a^V) by p·keep/(1 - rate), keep from the hash."""
  batch, q_len, kv_len, heads, dim = S
  rate, rng_key = 0.4, jax.random.key(3)
  rng = np.random.default_rng(1400)
  args = _shaw_args(rng, S, 2) if name == 'shaw' else _xl_args(rng, S)
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len)
  cot = f32(randn(rng, batch, q_len, heads, dim))
  output, grads = output_and_grads(
    name, cot, *args, mask=mask, dropout_rate=rate, dropout_rng=rng_key
  )
  keep = _kernel_keep(rng_key, batch, heads, q_len, kv_len, rate)
  want, want_grads = dense_output_and_grads(name, cot, *args, mask=mask, keep=keep, rate=rate)
  assert_close(output, want, tol=FWD_TOL)
  _check_grads(grads, want_grads, SHAW_NAMES if name == 'shaw' else XL_NAMES)
  without, _ = dense_output_and_grads(name, cot, *args, mask=mask)
  assert not np.allclose(np.asarray(output), without, atol=1e-3), 'dropout had no effect'


@pytest.mark.parametrize('name', slow_where(['shaw', 'xl'], {'xl'}))
def test_pallas_bf16(name):
  """bf16 inputs accumulate in float32: output bf16, close to the float64 result."""
  batch, q_len, kv_len, heads, dim = S
  rng = np.random.default_rng(1500)
  args = _shaw_args(rng, S, 3) if name == 'shaw' else _xl_args(rng, S)
  args = [None if a is None else a.astype(jnp.bfloat16) for a in args]
  mask = make_mask('padding', rng, batch, heads, q_len, kv_len)
  cot = f32(randn(rng, batch, q_len, heads, dim)).astype(jnp.bfloat16)
  output, grads = output_and_grads(name, cot, *args, mask=mask)
  assert output.dtype == jnp.bfloat16
  assert all(g is None or g.dtype == jnp.bfloat16 for g in grads)
  want, want_grads = dense_output_and_grads(name, cot, *_numpy(args), mask=mask)
  assert_close(output, want, tol=BF16_TOL)
  _check_grads(grads, want_grads, SHAW_NAMES if name == 'shaw' else XL_NAMES, tol=BF16_TOL)


def test_auto_is_xla_off_a_gpu():
  """'auto' runs the XLA kernels on this CPU (Pallas would only interpret here)."""
  if jax.default_backend() == 'gpu':
    pytest.skip("on a GPU 'auto' may be 'pallas' (tests/test_autotune.py)")
  rng = np.random.default_rng(1600)
  batch, q_len, kv_len, heads, dim = S
  mask = make_mask('random', rng, batch, heads, q_len, kv_len)
  for name, args in (('shaw', _shaw_args(rng, S, 2)), ('xl', _xl_args(rng, S))):

    @jax.jit
    def both(*xs, name=name):
      auto = KERNELS[name](*xs, mask=mask)
      return auto, KERNELS[name](*xs, mask=mask, implementation='xla')

    auto, xla = both(*args)
    np.testing.assert_array_equal(np.asarray(auto), np.asarray(xla))


def test_resolve_implementation_keeps_names_and_asks_the_tuner_for_auto():
  """'xla', 'pallas' and 'cudnn' are kept with the caller's tiles whatever the tuner says;
  'auto' is the tuner's answer (relpos.attention.autotune) with its tiles ('pallas@QxK'), the
  caller's for plain 'pallas', and 'xla' without a tuner; other names, and 'cudnn' for Shaw
  (whose a^V term is no additive bias), raise ValueError."""
  for kernel in ('shaw', 'xl'):
    resolve = functools.partial(resolve_implementation, kernel=kernel)
    assert resolve('xla', None, lambda: 'pallas') == ('xla', None)
    assert resolve('pallas', (16, 32), lambda: 'xla') == ('pallas', (16, 32))
    assert resolve('auto', None, lambda: 'pallas') == ('pallas', None)
    assert resolve('auto', None, lambda: 'pallas@128x64') == ('pallas', (128, 64))
    assert resolve('auto', (16, 32), lambda: 'pallas@16x32') == ('pallas', (16, 32))
    assert resolve('auto') == ('xla', None)
    with pytest.raises(ValueError, match="one of 'auto', 'xla', 'pallas', 'cudnn'"):
      resolve('triton')
    with pytest.raises(ValueError, match='pallas@QxK'):
      resolve('auto', None, lambda: 'flash')
  assert resolve_implementation('cudnn', None, lambda: 'xla', kernel='xl') == ('cudnn', None)
  assert resolve_implementation('auto', None, lambda: 'cudnn', kernel='xl') == ('cudnn', None)
  with pytest.raises(ValueError, match="'cudnn' is not one of shaw attention's"):
    resolve_implementation('cudnn', kernel='shaw')


# --------------------------------------------------------------------------------------------
# Native lowering: `jax.export` for platform 'cuda' runs the Pallas Triton lowering on this
# CPU-only machine. It lowers (Triton IR inside a StableHLO custom call) but compiles nothing:
# Triton's own passes and ptxas run only when XLA compiles for a GPU. So this shows the kernels
# lower, not that they compile or run on a GPU.

TRITON_CALL = '__gpu$xla.gpu.triton'
# pallas_calls in the lowered forward pass and gradient: Shaw's backward is dq and dk/dv, XL's
# also d rel_key.
KERNEL_CALLS = {'shaw': (1, 3), 'shaw_causal': (1, 3), 'xl': (1, 4)}
# (id, length, memory, head_dim, k): realistic power-of-two sizes, and ragged ones (padded
# tiles, head_dim padded to 64, a few buckets).
EXPORT_CASES = [('len256_mem64_d64_k16', 256, 64, 64, 16), ('len200_mem37_d40_k3', 200, 37, 40, 3)]


def _export_for_cuda(fn, *avals):
  exported = jax.export.export(
    jax.jit(fn),
    platforms=['cuda'],
    disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)],
  )(*avals)
  return exported.mlir_module()


@functools.cache
def _why_no_cuda_export():
  """None if this jaxlib lowers a trivial Triton pallas_call for 'cuda' here, else why not."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pallas_triton

  def double(x_ref, out_ref):
    out_ref[...] = 2.0 * x_ref[...]

  def call(x):
    return pl.pallas_call(
      double,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      compiler_params=pallas_triton.CompilerParams(),
    )(x)

  try:
    _export_for_cuda(call, jax.ShapeDtypeStruct((16, 16), jnp.float32))
  except Exception as error:  # any failure means: cannot test here
    return f'this jaxlib cannot export a Triton pallas_call for cuda: {error!r:.200}'
  return None


# Every (case, kernel, dtype); the default tier lowers each kernel, each dtype and each case at
# least once (EXPORT_DEFAULT), the slow tier the rest.
EXPORT_COMBOS = [
  (f'{case[0]}-{name}-{dtype}', (name, dtype, *case[1:]))
  for case in EXPORT_CASES
  for name in ('shaw', 'shaw_causal', 'xl')
  for dtype in ('float32', 'bfloat16')
]
EXPORT_DEFAULT = {
  'len256_mem64_d64_k16-shaw-float32',
  'len256_mem64_d64_k16-xl-bfloat16',
  'len200_mem37_d40_k3-shaw-bfloat16',
  'len200_mem37_d40_k3-xl-float32',
  'len200_mem37_d40_k3-shaw_causal-bfloat16',
}


@pytest.mark.parametrize(
  'name,dtype,length,memory,head_dim,kmax',
  slow_where(
    [combo for _, combo in EXPORT_COMBOS],
    {i for i, _ in EXPORT_COMBOS} - EXPORT_DEFAULT,
    [i for i, _ in EXPORT_COMBOS],
    unpack=True,
  ),
)
def test_pallas_lowers_for_cuda_with_triton(name, dtype, length, memory, head_dim, kmax):
  """Forward and gradient (of a sum) with mask, dropout and memory (Shaw: query offset) lower
  for 'cuda' with every pallas_call through Triton; nothing runs or compiles for a GPU.
  'shaw_causal': causal=True over a keys-only mask, as the models call it."""
  if (reason := _why_no_cuda_export()) is not None:
    pytest.skip(reason)
  batch, heads, kv_len = 2, 4, length + memory
  dtype = jnp.dtype(dtype)
  sds = jax.ShapeDtypeStruct
  qkv_avals = [sds((batch, length, heads, head_dim), dtype)]
  qkv_avals += [sds((batch, kv_len, heads, head_dim), dtype)] * 2
  if name.startswith('shaw'):
    extra = [sds((2 * kmax + 1, head_dim), dtype)] * 2
  else:
    extra = [sds((kv_len, heads, head_dim), dtype)] + [sds((heads, head_dim), dtype)] * 2
  avals = qkv_avals + extra
  causal = name == 'shaw_causal'
  mask = sds((batch, 1, 1 if causal else length, kv_len), jnp.bool_)
  dropout_rng = jax.eval_shape(lambda: jax.random.key(0))
  kwargs = {'query_offset': memory} if name.startswith('shaw') else {}
  if causal:
    kwargs['causal'] = True

  def forward(*xs_mask_rng):
    *xs, mask, rng = xs_mask_rng
    return KERNELS[name.removesuffix('_causal')](
      *xs, mask=mask, dropout_rate=0.1, dropout_rng=rng, implementation='pallas', **kwargs
    )

  def gradient(*xs_mask_rng):
    def total(*xs):
      return jnp.sum(forward(*xs, *xs_mask_rng[-2:]).astype(jnp.float32))

    return jax.grad(total, argnums=tuple(range(len(avals))))(*xs_mask_rng[:-2])

  for fn, calls in zip((forward, gradient), KERNEL_CALLS[name], strict=True):
    module = _export_for_cuda(fn, *avals, mask, dropout_rng)
    assert module.count(f'@{TRITON_CALL}(') == calls, fn.__name__


# --------------------------------------------------------------------------------------------
# Native (GPU): the kernels compiled by Triton and run, against the same float64 references, at
# sizes Triton compiles (default tiles: powers of two >= 16, several per axis, padded tails).
# Skipped off a GPU, where the interpreted tests above stand in; on one,
# `python -m pytest tests/test_pallas.py -k pallas_native -s` runs them and prints each case's
# errors.

# float32 natively: the in-kernel dots are IEEE float32 (the fixture's 'highest' precision), but
# exp and the order of the sums differ from the CPU; 1e-4 still fails any wrong term by orders
# of magnitude. bf16: BF16_TOL, as interpreted.
NATIVE_TOL = {'float32': 1e-4, 'bfloat16': BF16_TOL}
# (id, kernel, (batch, q_len, kv_len, heads, head_dim), k, mask kind, query_offset, dropout
# rate, dtype)
NATIVE_CASES = [
  ('shaw_k16_memory_causal', 'shaw', (2, 100, 137, 3, 40), 16, 'causal', 37, 0.0, 'float32'),
  ('shaw_k0_padding', 'shaw', (2, 100, 100, 3, 64), 0, 'padding', None, 0.0, 'float32'),
  ('shaw_k_ge_n_dead_rows', 'shaw', (2, 40, 40, 2, 32), 45, 'dead_rows', None, 0.0, 'float32'),
  ('shaw_k3_dropout', 'shaw', (2, 100, 100, 3, 64), 3, 'random', None, 0.1, 'float32'),
  ('shaw_k16_bf16', 'shaw', (2, 100, 137, 3, 64), 16, 'padding', 37, 0.0, 'bfloat16'),
  # causal=True over a keys-only mask (the char LM's call: unfilled memory slots).
  (
    'shaw_k16_causal_flag',
    'shaw_causal',
    (2, 100, 164, 3, 64),
    16,
    'filling',
    None,
    0.0,
    'bfloat16',
  ),
  ('xl_memory_dead_rows', 'xl', (2, 100, 137, 3, 40), None, 'dead_rows', None, 0.0, 'float32'),
  ('xl_dropout', 'xl', (2, 100, 100, 3, 64), None, 'none', None, 0.1, 'float32'),
  ('xl_bf16', 'xl', (2, 100, 137, 3, 64), None, 'padding', None, 0.0, 'bfloat16'),
]


@pytest.mark.skipif(
  jax.default_backend() != 'gpu', reason='native Pallas (Triton) needs a GPU; interpreted above'
)
@pytest.mark.parametrize(
  'name,shape,kmax,mask_kind,offset,rate,dtype',
  [c[1:] for c in NATIVE_CASES],
  ids=[c[0] for c in NATIVE_CASES],
)
def test_pallas_native_vs_reference(name, shape, kmax, mask_kind, offset, rate, dtype):
  batch, q_len, kv_len, heads, dim = shape
  rng = np.random.default_rng(1800 + q_len + kv_len + (kmax or 0))
  causal = name == 'shaw_causal'
  name = name.removesuffix('_causal')
  args = _shaw_args(rng, shape, kmax) if name == 'shaw' else _xl_args(rng, shape)
  args = [a.astype(dtype) for a in args]
  mask = make_mask(mask_kind, rng, batch, heads, q_len, kv_len, query_offset=offset)
  cot = f32(randn(rng, batch, q_len, heads, dim)).astype(dtype)
  rng_key = jax.random.key(5) if rate else None
  output, grads = output_and_grads(
    name,
    cot,
    *args,
    mask=mask,
    query_offset=offset,
    dropout_rate=rate,
    dropout_rng=rng_key,
    block_sizes=None,
    causal=causal,
  )
  if causal:  # the reference takes the causal mask as an array
    mask = causal_np(q_len, kv_len, offset) & mask
  keep = _kernel_keep(rng_key, batch, heads, q_len, kv_len, rate) if rate else None
  kwargs = {'query_offset': offset} if name == 'shaw' else {}
  want, want_grads = dense_output_and_grads(
    name, cot, *_numpy(args), mask=mask, keep=keep, rate=rate, **kwargs
  )
  got_grads = [np.asarray(g, np.float64) for g in grads if g is not None]
  # Each gradient's error on the scale `assert_grads_close` uses: max(1, max |gradient|).
  grad_errors = [
    np.max(np.abs(g - w)) / max(1.0, np.max(np.abs(w)))
    for g, w in zip(got_grads, [w for w in want_grads if w is not None], strict=True)
  ]
  print(
    f'{name} {shape} k={kmax} {mask_kind} {dtype}: output max |error| '
    f'{np.max(np.abs(np.asarray(output, np.float64) - want)):.1e}, gradients max |error| / '
    f'max(1, max |gradient|) {max(grad_errors):.1e}'
  )
  assert output.dtype == jnp.dtype(dtype)
  assert_close(output, want, tol=NATIVE_TOL[dtype])
  _check_grads(grads, want_grads, SHAW_NAMES if name == 'shaw' else XL_NAMES, NATIVE_TOL[dtype])


def test_unknown_implementation():
  rng = np.random.default_rng(1700)
  for name, args in (('shaw', _shaw_args(rng, S, 2)), ('xl', _xl_args(rng, S))):
    with pytest.raises(ValueError, match="implementation must be one of 'auto', 'xla', 'pallas'"):
      KERNELS[name](*args, implementation='triton')


def test_take_columns_gathers_each_row():
  """`pallas_gather.take_columns` (XL's skew) outside a kernel: out[i, j] = x[i, index[i, j]],
  and shapes it cannot take are a TypeError naming them."""
  from relpos.attention.pallas_gather import take_columns

  rng = np.random.default_rng(1701)
  x = rng.standard_normal((5, 7)).astype(np.float32)
  index = rng.integers(0, 7, size=(5, 3))
  got = np.asarray(jax.jit(take_columns)(x, index))
  np.testing.assert_array_equal(got, x[np.arange(5)[:, None], index])
  with pytest.raises(TypeError, match=r'x \[Q, C\] and an index \[Q, K\]'):
    take_columns(x, index[:4])
