"""relpos.attention.mosaic_xl: the Mosaic GPU (Hopper) causal Transformer-XL kernel, run in Mosaic
GPU's interpreter on the CPU against float64 NumPy (`reference.xl`, and the logsumexp of the same
logits) and against `xl_attention(implementation='xla')`, and lowered for CUDA through
jax.export (no GPU needed: the Mosaic GPU custom call is built, not compiled to PTX).
On a Hopper GPU the same reference and gradient cases also run compiled (the `mosaic_interpret`
fixture's 'native' variant; `pytest -k native -m 'slow or not slow'`).

Each interpret case runs the whole grid in Python callbacks (about 3 s per case at these
shapes), so the default cases are few: a memory of one tile (bf16), no memory over several query
tiles (f16), the race detector (2 s), and gradients through the four kernels with a memory of
one tile (6 s); batch and heads > 1 with a two-tile memory, forward and gradients, and f16
gradients without memory are slow (45 s together).

Tolerances: every 16-bit input is exactly representable in float64, so the errors are the
kernel's own roundings, bf16's 8 significant bits (f16's 11) on q + u, q + v (as 'xla' rounds
them too), p before the P·V matmul and z, plus exp2 with approx_math: about 0.5% of the largest
|z| for bf16 measured. The bound, 2e-2 of the largest |z| (f16: 5e-3), leaves that margin; a
broken kernel fails them (checked by breaking it on purpose): the skew read one distance early
reads the NaN padding (NaN), one late gives errors of 2 (largest |z| 1.4), R shifted by one
distance 2, the window one tile late an out-of-bounds read (raises), no causal mask 0.8, and the
logsumexp off by 0.05 fails its 2e-2 bound. The gradient bound, 3e-2: the inverse skew written
one column late gives 1.5, the d rel windows summed one block off 1.0, dk without its 1/sqrt(d)
7, the backward without its causal mask 0.4.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from relpos.attention import mosaic_xl
from relpos.attention.mosaic_common import SMEM_BYTES
from relpos.attention.mosaic_xl import xl_attention_mosaic
from relpos.attention.xl import xl_attention

SLOW = pytest.mark.slow


def _inputs(batch, q_len, kv_len, heads, head_dim, dtype, seed=0):
  """query, key, value, rel_key, u, v: standard normal, rounded to `dtype`."""
  rng = np.random.default_rng(seed)
  shapes = [
    (batch, q_len, heads, head_dim),
    (batch, kv_len, heads, head_dim),
    (batch, kv_len, heads, head_dim),
    (kv_len, heads, head_dim),
    (heads, head_dim),
    (heads, head_dim),
  ]
  return [jnp.asarray(rng.standard_normal(shape), dtype) for shape in shapes]


def _f64(x):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _logsumexp64(query, key, rel_key, u, v):
  """Float64 logsumexp over j <= pos_i of ((q_i + u)·k_j + (q_i + v)·R[pos_i - j]) / sqrt(d),
  [batch, heads, q_len]."""
  q, k, r, u, v = (_f64(x) for x in (query, key, rel_key, u, v))
  q_len, kv_len, head_dim = q.shape[1], k.shape[1], q.shape[3]
  distance = (kv_len - q_len + np.arange(q_len))[:, None] - np.arange(kv_len)[None, :]
  content = np.einsum('bihd,bjhd->bhij', q + u, k)
  by_distance = np.einsum('bihd,thd->bhit', q + v, r)  # [b, h, i, t]
  position = np.take_along_axis(by_distance, np.maximum(distance, 0)[None, None], axis=-1)
  logits = np.where(distance >= 0, (content + position) / math.sqrt(head_dim), -np.inf)
  top = logits.max(-1, keepdims=True)
  return (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]


CASES = [
  # (batch, q_len, kv_len, heads, dtype)
  pytest.param(1, 64, 128, 1, jnp.bfloat16, id='memory-one-tile-bf16'),
  pytest.param(1, 192, 192, 1, jnp.float16, id='no-memory-f16'),
  pytest.param(2, 128, 256, 2, jnp.bfloat16, id='batch-heads-memory', marks=SLOW),
]


@pytest.mark.parametrize('batch, q_len, kv_len, heads, dtype', CASES)
def test_matches_reference(mosaic_interpret, batch, q_len, kv_len, heads, dtype):
  """z against float64 `reference.xl` and against 'xla' on the same inputs, the logsumexp against
  float64 (absolute: it is of order log kv_len)."""
  args = _inputs(batch, q_len, kv_len, heads, 64, dtype)
  z, lse = xl_attention_mosaic(*args, interpret=mosaic_interpret, return_lse=True)
  assert z.dtype == dtype and z.shape == args[0].shape and lse.shape == (batch, heads, q_len)
  bound = 2e-2 if dtype == jnp.bfloat16 else 5e-3
  want = reference.xl(*(_f64(x) for x in args))
  scale = np.abs(want).max()
  assert np.abs(_f64(z) - want).max() < bound * scale
  xla = jax.jit(xl_attention, static_argnames='implementation')(*args, implementation='xla')
  assert np.abs(_f64(z) - _f64(xla)).max() < bound * scale
  query, key, _, rel_key, u, v = args
  assert np.abs(np.asarray(lse, np.float64) - _logsumexp64(query, key, rel_key, u, v)).max() < 2e-2


@pytest.mark.parametrize('backward', [False, True])
def test_interpreter_finds_no_races(fresh_interpreter, backward):
  """The interpreter's race detector, on the forward and on the three backward kernels (one
  warpgroup: little to see, and its copies are synchronous, so it cannot see TMA races; a
  memory of two tiles, so that the backward kernels' double-buffered slots both serve)."""
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  args = _inputs(1, 64, 192 if backward else 128, 1, 64, jnp.bfloat16)
  params = InterpretGPUParams(detect_races=True)

  def loss(*args):
    return xl_attention_mosaic(*args, interpret=params).astype(jnp.float32).sum()

  jax.block_until_ready(jax.grad(loss, argnums=range(6))(*args) if backward else loss(*args))
  assert not gpu_callbacks.get_races().races_found


GRAD_CASES = [
  # (batch, q_len, kv_len, heads, dtype)
  pytest.param(1, 64, 128, 1, jnp.bfloat16, id='memory-one-tile-bf16'),
  pytest.param(1, 128, 128, 1, jnp.float16, id='no-memory-f16', marks=SLOW),
  pytest.param(2, 128, 256, 2, jnp.bfloat16, id='batch-heads-memory', marks=SLOW),
]


@pytest.mark.parametrize('batch, q_len, kv_len, heads, dtype', GRAD_CASES)
def test_gradients_match_xla(mosaic_interpret, batch, q_len, kv_len, heads, dtype):
  """Gradients of a scalar loss (a random weighting of z plus one of the logsumexp) w.r.t. all
  six inputs, through the forward and the three backward kernels, against 'xla'
  (and a float32 JAX logsumexp) in float32 on the same 16-bit inputs. Error: max |mosaic - xla|
  over max(max |xla|, 1); measured at most 1.5e-2 (u and R, sums of many 16-bit terms: dS and
  dP' are rounded to 16 bits before their matmuls, as flash attention does)."""
  args = _inputs(batch, q_len, kv_len, heads, 64, dtype)
  rng = np.random.default_rng(1)
  weight = jnp.asarray(rng.standard_normal(args[0].shape), jnp.float32)
  weight_lse = jnp.asarray(rng.standard_normal((batch, heads, q_len)), jnp.float32)

  def loss_mosaic(*args):
    z, lse = xl_attention_mosaic(*args, interpret=mosaic_interpret, return_lse=True)
    return jnp.sum(z.astype(jnp.float32) * weight) + jnp.sum(lse * weight_lse)

  def loss_xla(*args):
    query, key, value, rel_key, u, v = (x.astype(jnp.float32) for x in args)
    z = xl_attention(query, key, value, rel_key, u, v, implementation='xla')
    distance = (kv_len - q_len + np.arange(q_len))[:, None] - np.arange(kv_len)[None, :]
    content = jnp.einsum('bihd,bjhd->bhij', query + u, key)
    by_distance = jnp.einsum('bihd,thd->bhit', query + v, rel_key)
    index = np.broadcast_to(np.maximum(distance, 0), (batch, heads) + distance.shape)
    position = jnp.take_along_axis(by_distance, index, axis=-1)
    logits = jnp.where(distance >= 0, (content + position) / 8.0, -jnp.inf)  # head_dim 64
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum(z * weight) + jnp.sum(lse * weight_lse)

  got = jax.jit(jax.grad(loss_mosaic, argnums=range(6)))(*args)
  want = jax.jit(jax.grad(loss_xla, argnums=range(6)))(*args)
  errors = {}
  names = ('query', 'key', 'value', 'rel_key', 'u', 'v')
  for name, g, w, x in zip(names, got, want, args, strict=True):
    assert g.dtype == x.dtype and g.shape == x.shape, name
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    errors[name] = float(np.abs(g - w).max() / max(np.abs(w).max(), 1.0))
  assert max(errors.values()) < 3e-2, errors


def _shapes(batch, q_len, kv_len, heads, head_dim, dtype):
  S = jax.ShapeDtypeStruct
  kv = S((batch, kv_len, heads, head_dim), dtype)
  table = S((kv_len, heads, head_dim), jnp.float32)  # cast to dtype by the wrapper
  bias = S((heads, head_dim), jnp.float32)
  return [S((batch, q_len, heads, head_dim), dtype), kv, kv, table, bias, bias]


@pytest.mark.parametrize(
  'batch, q_len, kv_len, heads, head_dim, dtype',
  [
    pytest.param(2, 512, 1024, 8, 64, jnp.bfloat16, id='enwik8_base'),
    pytest.param(1, 256, 256, 2, 128, jnp.float16, id='no-memory-d128-f16'),
  ],
)
def test_lowers_for_cuda(batch, q_len, kv_len, heads, head_dim, dtype):
  """The kernel lowers to one Mosaic GPU custom call (enwik8_base: 512 queries over 1,024 keys,
  8 heads of 64)."""
  shapes = _shapes(batch, q_len, kv_len, heads, head_dim, dtype)

  def f(*args):
    return xl_attention_mosaic(*args, return_lse=True)

  exported = jax.export.export(jax.jit(f), platforms=['cuda'])(*shapes)
  assert [a.shape for a in exported.out_avals] == [shapes[0].shape, (batch, heads, q_len)]
  assert exported.mlir_module().count('stablehlo.custom_call @mosaic_gpu') == 1


def test_gradient_lowers_for_cuda():
  """jax.grad at enwik8_base's shape: the forward and the three backward kernels lower (four
  Mosaic GPU custom calls), the unskew's store into the odd-strided view included."""
  shapes = _shapes(2, 512, 1024, 8, 64, jnp.bfloat16)

  def loss(*args):
    z, lse = xl_attention_mosaic(*args, return_lse=True)
    return jnp.sum(z.astype(jnp.float32) ** 2) + jnp.sum(lse)

  grad = jax.jit(jax.grad(loss, argnums=range(6)))
  exported = jax.export.export(grad, platforms=['cuda'])(*shapes)
  assert [a.shape for a in exported.out_avals] == [s.shape for s in shapes]
  assert exported.mlir_module().count('stablehlo.custom_call @mosaic_gpu') == 4


def test_backward_refuses_too_much_shared_memory():
  """head_dim=128: the forward fits, the backward kernels (one slot, two skew buffers, R's
  window in two orientations) do not."""
  shapes = _shapes(1, 128, 128, 1, 128, jnp.bfloat16)

  def loss(*args):
    return xl_attention_mosaic(*args).astype(jnp.float32).sum()

  jax.eval_shape(loss, *shapes)
  with pytest.raises(ValueError, match='the backward kernels with block=64, head_dim=128 need'):
    jax.eval_shape(jax.grad(loss), *shapes)


def test_lowering_refuses_wgmma_pairs_on_the_skewed_view():
  """Why the skew is read in a vector-length-1 layout: the WGMMA layout's float pairs on the
  odd-strided view are refused by Mosaic GPU (jax 0.10.2 and 0.11.2, in the kernels' Lane
  semantics). If this starts passing, a newer Mosaic GPU may accept the plain WGMMA read."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  from relpos.attention.mosaic_common import COMPILER_PARAMS, smem_load

  rows, width = 64, 128

  def kernel(out_ref, flat):
    flat[...] = jnp.zeros((rows * width,), jnp.float32)
    view = flat.at[pl.ds(rows - 1, rows * (width - 1))].reshape(rows, width - 1).at[:, :64]
    out_ref[...] = smem_load(view, plgpu.Layout.WGMMA, optimized=False)

  f = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((rows, 64), jnp.float32),
    scratch_types=[plgpu.SMEM((rows * width,), jnp.float32)],
    compiler_params=COMPILER_PARAMS,
  )
  # A ValueError in jax 0.10, Mosaic GPU's own UnsupportedTransferError in 0.11: matched by text.
  with pytest.raises(Exception, match='Tiled strides must be a multiple of the vector length'):
    jax.export.export(jax.jit(f), platforms=['cuda'])()


@pytest.mark.parametrize(
  'q_len, kv_len, head_dim, dtype, kwargs, message',
  [
    (128, 128, 32, jnp.bfloat16, {}, 'head_dim must be a multiple of 64, got 32'),
    (100, 100, 64, jnp.bfloat16, {}, 'q_len must be a multiple of block=64, got 100'),
    (128, 160, 64, jnp.bfloat16, {}, 'multiple of block=64, got 160 - 128'),
    (128, 64, 64, jnp.bfloat16, {}, 'non-negative multiple of block=64, got 64 - 128'),
    (128, 128, 64, jnp.bfloat16, {'block': 96}, 'must be a multiple of 64, got 96'),
    (128, 128, 64, jnp.bfloat16, {'block': 32}, 'must be a multiple of 64, got 32'),
    (128, 128, 64, jnp.bfloat16, {'block': 128}, 'bytes of shared memory'),
    (128, 128, 256, jnp.bfloat16, {}, 'bytes of shared memory'),
    (128, 128, 64, jnp.float32, {}, 'bfloat16 or all float16, got float32'),
    (128, 128, 64, jnp.bfloat16, {'table_rows': 127}, 'rel_key must be [kv_len, heads'),
    (128, 128, 64, jnp.bfloat16, {'bias_heads': 2}, 'u (content_bias) must be [heads'),
  ],
)
def test_refusals(q_len, kv_len, head_dim, dtype, kwargs, message):
  table_rows = kwargs.pop('table_rows', kv_len)
  bias_heads = kwargs.pop('bias_heads', 1)
  q = jnp.zeros((1, q_len, 1, head_dim), dtype)
  kv = jnp.zeros((1, kv_len, 1, head_dim), dtype)
  rel = jnp.zeros((table_rows, 1, head_dim), dtype)
  u, v = jnp.zeros((bias_heads, head_dim)), jnp.zeros((1, head_dim))
  with pytest.raises(ValueError) as error:
    xl_attention_mosaic(q, kv, kv, rel, u, v, **kwargs)
  assert message in str(error.value) and '\n' not in str(error.value)


def test_shared_memory_estimate():
  """Tiles of 64 fit for head_dim 64 and 128; tiles of 128 do not (the [128, 264] float32 skew
  buffer alone is 135 KB)."""
  assert mosaic_xl._smem_bytes(64, 64) < SMEM_BYTES
  assert mosaic_xl._smem_bytes(128, 64) < SMEM_BYTES
  assert mosaic_xl._smem_bytes(64, 128) > SMEM_BYTES
  assert mosaic_xl._bwd_smem_bytes(64, 64) < SMEM_BYTES
