"""xl_attention(implementation='cudnn'): XL's position term as the bias of cuDNN's flash
attention. On a CPU, jax.nn.dot_product_attention's own XLA implementation stands in for cuDNN
(`xl.CUDNN_IMPLEMENTATION`), which checks everything relpos builds around the call (the bias,
the mask, the scale, dead rows, the gradients); on a GPU the `cudnn_native` test runs cuDNN
itself (benchmarks/gpu_run.sh's native part selects it)."""

import dataclasses
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import REPO, make_mask, qkv, randn, slow_where

from relpos.attention import autotune, xl
from relpos.attention.xl import xl_attention

SHAPES = [(2, 7, 13, 3, 64), (1, 16, 16, 2, 64), (2, 1, 9, 2, 64)]  # (B, Q, K, H, D)


def _inputs(seed, batch, q_len, kv_len, heads, dim, dtype=jnp.bfloat16):
  rng = np.random.default_rng(seed)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  rest = randn(rng, kv_len, heads, dim), randn(rng, heads, dim), randn(rng, heads, dim)
  return [jnp.asarray(x, dtype) for x in (q, k, v, *rest)]


@pytest.fixture
def stand_in(monkeypatch):
  """cuDNN's place taken by JAX's XLA implementation of the same call (off a GPU)."""
  if jax.default_backend() != 'gpu':
    monkeypatch.setattr(xl, 'CUDNN_IMPLEMENTATION', 'xla')


# Memory and odd sizes with a random mask, no memory without one, one query with dead rows.
CASES = list(zip(SHAPES, ['random', 'none', 'dead_rows'], strict=True))


CASE_IDS = ['x'.join(map(str, s)) + '-' + m for s, m in CASES]


@pytest.mark.parametrize(
  'shape, mask_kind', slow_where(CASES, {'1x16x16x2x64-none'}, CASE_IDS, unpack=True)
)
def test_cudnn_equals_the_reference_and_xla(stand_in, shape, mask_kind):
  args = _inputs(3, *shape)
  batch, q_len, kv_len, heads, _ = shape
  mask = make_mask(mask_kind, np.random.default_rng(4), batch, heads, q_len, kv_len)
  # Both implementations in one jit (op by op they take seconds).
  both = jax.jit(
    lambda *xs: [xl_attention(*xs, mask=mask, implementation=i) for i in ('cudnn', 'xla')]
  )
  out, xla = both(*args)
  assert out.shape == args[0].shape and out.dtype == jnp.bfloat16
  want = reference.xl(*(np.asarray(a, np.float64) for a in args), mask=mask)
  scale = np.abs(want).max()
  assert np.abs(np.asarray(out, np.float64) - want).max() < 2e-2 * scale
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(xla, np.float32), atol=0.03)
  if mask_kind == 'dead_rows':  # rows with no key allowed are zeros, as 'xla' gives them
    allowed = np.broadcast_to(mask, (batch, heads, q_len, kv_len)) & (
      np.arange(kv_len)[None] <= np.arange(q_len)[:, None] + kv_len - q_len
    )
    dead = ~allowed.any(-1).transpose(0, 2, 1)  # [B, Q, H]
    assert dead.any() and np.all(np.asarray(out, np.float32)[dead] == 0)


def test_cudnn_gradients_equal_xla(stand_in):
  args = _inputs(5, 2, 7, 13, 3, 64)
  cotangent = jnp.asarray(np.random.default_rng(6).normal(size=args[0].shape), jnp.float32)

  def grads(implementation):
    def loss(*xs):
      out = xl_attention(*xs, implementation=implementation).astype(jnp.float32)
      return jnp.sum(out * cotangent)

    return jax.jit(jax.grad(loss, argnums=tuple(range(6))))(*args)

  for name, got, want in zip(
    ['q', 'k', 'v', 'r', 'u', 'v_bias'], grads('cudnn'), grads('xla'), strict=True
  ):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.abs(got - want).max() < 3e-2 * np.abs(want).max(), name


def test_cudnn_refuses_float32_and_dropout():
  args = _inputs(7, 1, 4, 4, 1, 64, dtype=jnp.float32)
  with pytest.raises(ValueError, match="'cudnn' takes bfloat16 or float16 inputs"):
    xl_attention(*args, implementation='cudnn')
  args = _inputs(7, 1, 4, 4, 1, 64)
  with pytest.raises(ValueError, match="'cudnn' has no attention dropout"):
    xl_attention(*args, implementation='cudnn', dropout_rate=0.1, dropout_rng=jax.random.key(0))


def test_cudnn_is_a_candidate_for_xl_in_bf16_without_dropout_on_a_gpu(monkeypatch):
  # enwik8_base's XL call in bf16: 512 queries over 1,024 keys, 8 heads of 64
  query = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  key = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16)
  base = autotune.xl_signature(query, key, None, 0.0)

  def signature(**changes):
    return dataclasses.replace(base, **changes)

  assert 'cudnn' not in autotune.candidate_names(signature())  # not on this CPU
  monkeypatch.setattr(autotune.jax, 'default_backend', lambda: 'gpu')
  assert 'cudnn' in autotune.candidate_names(signature())
  given_tiles = autotune.candidate_names(signature(tiles=(32, 32)))
  assert given_tiles[:3] == ('xla', 'pallas@32x32', 'cudnn')
  for changes in ({'dtype': 'float32'}, {'dropout': 0.1}):
    assert 'cudnn' not in autotune.candidate_names(signature(**changes))
  shaw = signature(kernel='shaw', max_distance=16, tables='kv')
  assert 'cudnn' not in autotune.candidate_names(shaw)


def test_auto_calls_cudnn_when_the_tuner_picks_it(monkeypatch):
  """'auto' resolved to 'cudnn' reaches xl_attention_cudnn (a spy), inside jit and grad."""
  calls = []
  real = xl.xl_attention_cudnn

  def spy(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(xl, 'xl_attention_cudnn', spy)
  monkeypatch.setattr(xl, 'CUDNN_IMPLEMENTATION', 'xla')
  monkeypatch.setattr(autotune.jax, 'default_backend', lambda: 'gpu')
  timer = lambda name, run: 1.0 if name == 'cudnn' else 2.0  # noqa: E731
  args = _inputs(8, 1, 4, 8, 2, 64)
  with autotune.tuning(timer=timer, cache_path=None):
    jax.jit(jax.grad(lambda q: jnp.sum(xl_attention(q, *args[1:]).astype(jnp.float32))))(args[0])
  assert calls, "'auto' did not reach xl_attention_cudnn"


@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='cuDNN needs an NVIDIA GPU')
def test_cudnn_native_equals_xla():
  """cuDNN itself (no stand-in) against the 'xla' implementation, forward and gradients."""
  args = _inputs(9, 2, 128, 256, 4, 64)
  out = xl_attention(*args, implementation='cudnn')
  xla = xl_attention(*args, implementation='xla')
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(xla, np.float32), atol=0.03)

  def loss(implementation):
    def total(*xs):
      return jnp.sum(xl_attention(*xs, implementation=implementation).astype(jnp.float32))

    return total

  got = jax.grad(loss('cudnn'), argnums=(0, 1, 2, 3))(*args)
  want = jax.grad(loss('xla'), argnums=(0, 1, 2, 3))(*args)
  for g, w in zip(got, want, strict=True):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert np.abs(g - w).max() < 3e-2 * np.abs(w).max()


def _equations(jaxpr):
  """Every equation of a jaxpr and of the jaxprs nested in its equations' parameters."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, 'jaxpr', sub)
        if isinstance(inner, jax.extend.core.Jaxpr):
          yield from _equations(inner)


def test_the_bias_leaves_its_matmul_in_the_input_dtype(stand_in):
  """The position logits, [heads, batch, q_len, kv_len] on a CPU and [batch, heads, q_len,
  kv_len] elsewhere, come out of their matmul in bf16 (the tensor cores still accumulate in
  float32): the bias is rounded to bf16 anyway, and at enwik8_base's shapes the float32 logits,
  their shift and their gradient were 19% of the bf16 step's floor on an H200 (docs/gpu.md).
  'xla' keeps them in float32."""
  batch, q_len, kv_len, heads, dim = 2, 7, 13, 3, 64
  args = _inputs(5, batch, q_len, kv_len, heads, dim)

  def logits_dtypes(implementation):
    def loss(*xs):
      return xl_attention(*xs, implementation=implementation).astype(jnp.float32).sum()

    # The position matmul sits in a `lax.platform_dependent` (a cond): one branch per layout,
    # [heads, batch, ...] on a CPU and [batch, heads, ...] elsewhere; both are checked.
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 3)))(*args).jaxpr
    layouts = {(heads, batch, q_len, kv_len), (batch, heads, q_len, kv_len)}
    found = {
      (out.aval.shape, str(out.aval.dtype))
      for cond in _equations(jaxpr)
      if cond.primitive.name == 'cond'
      for branch in cond.params['branches']
      for eqn in _equations(branch.jaxpr)
      if eqn.primitive.name == 'dot_general'
      for out in eqn.outvars
      if out.aval.shape in layouts
    }
    assert {shape for shape, _ in found} == layouts
    return {dtype for _, dtype in found}

  assert logits_dtypes('cudnn') == {'bfloat16'}
  assert logits_dtypes('xla') == {'float32'}


def test_the_gpu_scripts_cudnn_anatomy_times_four_forms_beside_xl_through_cudnn():
  """benchmarks/mosaic_xl.py's `cudnn_part_rows` (where XL through cuDNN spends its time, on a
  GPU), run with JAX's XLA implementation standing in for cuDNN: a forward and a backward row
  for each form, each with its share of the whole XL call's time of the same pass."""
  code = (
    'import sys; sys.path.insert(0, "benchmarks"); import mosaic_xl\n'
    'rows = mosaic_xl.cudnn_part_rows(16, 16, 1, 2, 16, implementation="xla", rounds=1, '
    'repeats=1)\n'
    'print("\\n".join(rows))\n'
  )
  result = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, cwd=REPO, timeout=300
  )
  assert result.returncode == 0, result.stderr[-2000:]
  rows = re.findall(r'^n=16 cudnn part (\S+): ([\d.]+) ms, ([\d.]+) of (\S+)$', result.stdout, re.M)
  forms = ['flash', 'flash_mask', 'flash_dbias', 'xl_cudnn']
  assert [name for name, *_ in rows] == [f + p for f in forms for p in ('', '+bwd')], result.stdout
  for name, _, share, whole in rows:
    assert whole == 'xl_cudnn' + ('+bwd' if name.endswith('+bwd') else '')
    if name.startswith('xl_cudnn'):
      assert float(share) == 1.0
