"""relpos.attention.mosaic_shaw: the Mosaic GPU (Hopper) causal Shaw kernels, run in Mosaic GPU's
interpreter on the CPU (the forward against the float64 reference, gradients through the forward
and backward kernels against the XLA implementation's in float32), and lowered for CUDA through
jax.export (no GPU needed: the Mosaic GPU custom call is built, not compiled to PTX).
On a Hopper GPU the same reference and gradient cases also run compiled (the `mosaic_interpret`
fixture's 'native' variant; `pytest -k native -m 'slow or not slow'`).

Each interpret case runs the whole grid in Python callbacks (a few seconds at these shapes), so
the cases are few and small; between them they cover far tiles (plain flash attention), band
tiles, tiles before the sequence start (all masked), k = 0, k below and above a tile, k >= the
length, block_q = 2·block_kv, several batches and heads, bf16 and f16, for the one-warpgroup
kernel, and the warp-specialised one (3 interpreted threads, slower). The gradient cases
(forward plus two backward kernels, jitted: 5 to 7 s each) cover k below a tile with the lse in
the loss, k above a tile with far tiles, k = 0, k >= the length, f16 with block_q =
2·block_kv, several batches and heads, and the warp-specialised forward. The default run (README
command (2), under 10 minutes on 2 cores) keeps one case of each kind that no other default
case covers: forward far-and-band, k >= the length, f16 with block_q = 128, the
warp-specialised form at k = 0; gradients far-and-band with the lse; one forward export per
form and one gradient export. Queries over a memory (kv_len > q_len, Transformer-XL): forward
at k below a tile, gradients at k below a tile with the lse, and the forward and gradient
exports at enwik8_base's 512 queries over 1,024 keys. The rest are marked slow
(`pytest -m slow`).
"""

import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import REPO

from relpos import attention
from relpos.attention import mosaic_shaw
from relpos.attention.mosaic_shaw import shaw_attention_mosaic


def _inputs(batch, length, heads, head_dim, max_distance, dtype, seed=0, memory=0):
  """query [batch, length, ...], key and value [batch, memory + length, ...], the tables."""
  rng = np.random.default_rng(seed)
  shapes = [(batch, length + extra, heads, head_dim) for extra in (0, memory, memory)]
  q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in shapes)
  rows = (2 * max_distance + 1, head_dim)
  rel_k, rel_v = (jnp.asarray(rng.standard_normal(rows), dtype) for _ in range(2))
  return q, k, v, rel_k, rel_v


def _f64(x):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _offsets(q_len, kv_len):
  """j - pos_i [q_len, kv_len], pos_i = kv_len - q_len + i."""
  return np.arange(kv_len)[None, :] - (kv_len - q_len + np.arange(q_len)[:, None])


def _logsumexp(q, k, rel_k, xp=np):
  """logsumexp over j <= pos_i of (q_i·k_j + q_i·w^K[r_ij]) / sqrt(d), [batch, heads, q_len]:
  in float64 NumPy (`xp=np`, the reference) or in float32 JAX (`xp=jnp`, differentiable, for a
  loss that uses the lse)."""
  if xp is np:
    q, k, rel_k = _f64(q), _f64(k), _f64(rel_k)
  length, head_dim = q.shape[1], q.shape[3]
  max_distance = (rel_k.shape[0] - 1) // 2
  offsets = _offsets(length, k.shape[1])  # j - pos_i
  buckets = np.clip(offsets, -max_distance, max_distance) + max_distance
  # a^K logits q_i·w^K[r_ij]: the [i, r] products read at r = buckets[i, j].
  table = xp.einsum('bihd,rd->bhir', q, rel_k)[:, :, np.arange(length)[:, None], buckets]
  logits = xp.einsum('bihd,bjhd->bhij', q, k) + table
  logits = xp.where(offsets <= 0, logits / math.sqrt(head_dim), -np.inf)
  if xp is not np:
    return jax.nn.logsumexp(logits, axis=-1)
  top = logits.max(-1, keepdims=True)
  return (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]


WS = True  # warp_specialized: two compute warpgroups and a TMA one (3 interpreted threads)
SLOW = pytest.mark.slow
CASES = [
  # (batch, length, heads, head_dim, k, block_q, dtype, warp_specialized)
  # 3 tiles: the last query tile's far tile 0, band tile 1 and diagonal (the interpreter's time
  # grows with the tile pairs: 6 here, 10 at length 256).
  pytest.param(1, 192, 1, 64, 3, 64, jnp.bfloat16, False, id='far-and-band'),
  pytest.param(2, 128, 2, 64, 1, 64, jnp.bfloat16, False, id='k1-batch-heads', marks=SLOW),
  pytest.param(1, 128, 1, 64, 0, 64, jnp.bfloat16, False, id='k0', marks=SLOW),
  pytest.param(1, 192, 1, 64, 70, 64, jnp.bfloat16, False, id='k-above-tile', marks=SLOW),
  pytest.param(1, 128, 1, 64, 200, 64, jnp.bfloat16, False, id='k-above-length'),
  pytest.param(1, 256, 1, 64, 3, 128, jnp.float16, False, id='f16-block_q-128', marks=SLOW),
  pytest.param(1, 256, 1, 64, 3, 64, jnp.bfloat16, WS, id='ws-far-and-band', marks=SLOW),
  pytest.param(1, 128, 1, 64, 0, 64, jnp.bfloat16, WS, id='ws-k0'),
  pytest.param(
    1, 256, 1, 64, 70, 64, jnp.float16, WS, id='ws-k-above-tile', marks=pytest.mark.slow
  ),
  pytest.param(2, 256, 2, 64, 1, 64, jnp.bfloat16, WS, id='ws-batch-heads', marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
  'batch, length, heads, head_dim, max_distance, block_q, dtype, warp_specialized', CASES
)
def test_matches_reference(
  mosaic_interpret, batch, length, heads, head_dim, max_distance, block_q, dtype, warp_specialized
):
  args = _inputs(batch, length, heads, head_dim, max_distance, dtype)
  z, _ = _check_forward(args, block_q, warp_specialized, mosaic_interpret)
  assert z.dtype == dtype and z.shape == args[0].shape


def _check_forward(args, block_q, warp_specialized, interpret):
  """The kernel's z and lse on `args` (query over a memory where key is longer)
  against the float64 reference and logsumexp: max error under 2e-2 of the largest value.
  Returns (z, lse)."""
  q, k, v, rel_k, rel_v = args
  q_len, kv_len = q.shape[1], k.shape[1]
  z, lse = shaw_attention_mosaic(
    *args,
    block_q=block_q,
    warp_specialized=warp_specialized,
    interpret=interpret,
    return_lse=True,
  )
  causal = _offsets(q_len, kv_len) <= 0
  want = reference.shaw(*(_f64(x) for x in args), causal, kv_len - q_len)
  assert np.abs(_f64(z) - want).max() / np.abs(want).max() < 2e-2
  want_lse = _logsumexp(q, k, rel_k)
  assert np.abs(_f64(lse) - want_lse).max() < 2e-2 * np.abs(want_lse).max()
  return z, lse


GRAD_CASES = [
  # (batch, length, heads, k, block_q, dtype, warp_specialized, loss uses the lse)
  pytest.param(1, 192, 1, 3, 64, jnp.bfloat16, False, True, id='far-and-band-lse'),
  pytest.param(1, 256, 1, 70, 64, jnp.bfloat16, False, False, id='k-above-tile', marks=SLOW),
  pytest.param(1, 128, 1, 0, 64, jnp.bfloat16, False, False, id='k0', marks=SLOW),
  pytest.param(1, 128, 1, 200, 64, jnp.bfloat16, False, True, id='k-above-length', marks=SLOW),
  pytest.param(
    2, 128, 2, 1, 64, jnp.bfloat16, False, False, id='batch-heads', marks=pytest.mark.slow
  ),
  pytest.param(1, 256, 1, 3, 128, jnp.float16, False, False, id='f16-block_q-128', marks=SLOW),
  pytest.param(1, 256, 1, 3, 64, jnp.bfloat16, WS, True, id='ws-lse', marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
  'batch, length, heads, max_distance, block_q, dtype, warp_specialized, use_lse', GRAD_CASES
)
def test_gradients_match_xla(
  mosaic_interpret, batch, length, heads, max_distance, block_q, dtype, warp_specialized, use_lse
):
  """Gradients of a scalar loss (a random weighting of z, plus one of the lse) w.r.t. all five
  inputs against `shaw_attention(implementation='xla')` in float32 on the same 16-bit inputs.
  Error: max |mosaic - xla| over max(max |xla|, 1) (the floor: for k = 0 the rel_key gradient
  is 0 up to rounding, softmax being blind to a per-row constant)."""
  _check_gradients(
    mosaic_interpret, batch, length, heads, max_distance, block_q, dtype, warp_specialized, use_lse
  )


MEMORY_GRAD_CASES = [
  # (q_len, kv_len, k, block_q, warp_specialized, loss uses the lse)
  pytest.param(64, 192, 3, 64, False, True, id='64-over-192-k3-lse'),
  pytest.param(128, 256, 70, 64, False, False, id='128-over-256-k-above-tile', marks=SLOW),
  pytest.param(64, 192, 300, 64, False, True, id='64-over-192-k-above-kv_len', marks=SLOW),
  pytest.param(128, 384, 1, 128, False, True, id='128-over-384-block_q-128', marks=SLOW),
  pytest.param(128, 256, 3, 64, WS, False, id='ws-128-over-256-k3', marks=SLOW),
]


@pytest.mark.parametrize(
  'q_len, kv_len, max_distance, block_q, warp_specialized, use_lse', MEMORY_GRAD_CASES
)
def test_memory_gradients_match_xla(
  mosaic_interpret, q_len, kv_len, max_distance, block_q, warp_specialized, use_lse
):
  """As above, queries over a memory: against the XLA implementation with its default
  query_offset kv_len - q_len and a causal [q_len, kv_len] mask."""
  _check_gradients(
    mosaic_interpret,
    1,
    q_len,
    1,
    max_distance,
    block_q,
    jnp.bfloat16,
    warp_specialized,
    use_lse,
    kv_len - q_len,
  )


def _check_gradients(
  interpret, batch, length, heads, max_distance, block_q, dtype, warp_specialized, use_lse, memory=0
):
  args = _inputs(batch, length, heads, 64, max_distance, dtype, memory=memory)
  rng = np.random.default_rng(1)
  weight = jnp.asarray(rng.standard_normal(args[0].shape), jnp.float32)
  weight_lse = jnp.asarray(rng.standard_normal((batch, heads, length)), jnp.float32)

  def loss_mosaic(*args):
    z, lse = shaw_attention_mosaic(
      *args,
      block_q=block_q,
      warp_specialized=warp_specialized,
      interpret=interpret,
      return_lse=True,
    )
    loss = jnp.sum(z.astype(jnp.float32) * weight)
    return loss + jnp.sum(lse * weight_lse) if use_lse else loss

  causal = attention.causal_mask(length, length + memory)

  def loss_xla(*args):
    args = [x.astype(jnp.float32) for x in args]
    loss = jnp.sum(attention.shaw_attention(*args, mask=causal, implementation='xla') * weight)
    return (
      loss + jnp.sum(_logsumexp(args[0], args[1], args[3], xp=jnp) * weight_lse)
      if use_lse
      else loss
    )

  got = jax.jit(jax.grad(loss_mosaic, argnums=range(5)))(*args)
  want = jax.jit(jax.grad(loss_xla, argnums=range(5)))(*args)
  errors = {}
  for name, g, w in zip(('query', 'key', 'value', 'rel_key', 'rel_value'), got, want, strict=True):
    assert g.dtype == dtype and g.shape == w.shape == args[len(errors)].shape, name
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    errors[name] = float(np.abs(g - w).max() / max(np.abs(w).max(), 1.0))
  assert max(errors.values()) < 3e-2, errors


@pytest.mark.slow
@pytest.mark.parametrize('warp_specialized, backward', [(False, False), (True, False), (WS, True)])
def test_interpreter_finds_no_races(fresh_interpreter, warp_specialized, backward):
  """The interpreter's race detector (shared memory accesses by different threads unordered by
  barriers) on both forward kernels, and on the gradient (the backward kernels have one thread:
  little for it to see). Its copies are synchronous, so it cannot see TMA races."""
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  args = _inputs(1, 256, 1, 64, 3, jnp.bfloat16)
  params = InterpretGPUParams(detect_races=True)

  def forward(*args):
    return shaw_attention_mosaic(*args, warp_specialized=warp_specialized, interpret=params)

  def loss(*args):
    return forward(*args).astype(jnp.float32).sum()

  f = jax.jit(jax.grad(loss, argnums=range(5))) if backward else forward
  jax.block_until_ready(f(*args))
  assert not gpu_callbacks.get_races().races_found


MEMORY_CASES = [
  # (q_len, kv_len, k, block_q, warp_specialized): queries at positions kv_len - q_len + i
  pytest.param(128, 256, 3, 64, False, id='128-over-256-k3'),
  pytest.param(64, 192, 300, 64, False, id='64-over-192-k-above-kv_len', marks=SLOW),
  pytest.param(64, 192, 70, 64, False, id='64-over-192-k-above-tile', marks=SLOW),
  pytest.param(128, 256, 1, 128, False, id='128-over-256-block_q-128', marks=SLOW),
  pytest.param(128, 384, 70, 64, False, id='128-over-384-k-above-tile', marks=SLOW),
  pytest.param(128, 256, 3, 64, WS, id='ws-128-over-256-k3', marks=SLOW),
]


@pytest.mark.parametrize('q_len, kv_len, max_distance, block_q, warp_specialized', MEMORY_CASES)
def test_memory_matches_reference(
  mosaic_interpret, q_len, kv_len, max_distance, block_q, warp_specialized
):
  """Queries over a memory (Transformer-XL): key/value longer than the query, query i at
  position kv_len - q_len + i, key j visible iff j <= pos_i."""
  args = _inputs(1, q_len, 1, 64, max_distance, jnp.bfloat16, memory=kv_len - q_len)
  z, lse = _check_forward(args, block_q, warp_specialized, mosaic_interpret)
  assert z.shape == args[0].shape and lse.shape == (1, 1, q_len)


def test_band_tiles():
  """The band holds the tiles with some pair -k < j - i <= 0: the diagonal's alone for k <= 1,
  one more per started block_kv of k, every tile for k >= the length."""
  assert mosaic_shaw.band_tiles(1024, 0, 64, 64) == 1
  assert mosaic_shaw.band_tiles(1024, 1, 64, 64) == 1
  assert mosaic_shaw.band_tiles(1024, 2, 64, 64) == 2
  assert mosaic_shaw.band_tiles(1024, 65, 64, 64) == 2
  assert mosaic_shaw.band_tiles(1024, 66, 64, 64) == 3
  assert mosaic_shaw.band_tiles(1024, 1, 128, 64) == 2
  assert mosaic_shaw.band_tiles(1024, 3, 128, 64) == 3
  assert mosaic_shaw.band_tiles(256, 5000, 64, 64) == 4
  # Over a memory (offset = kv_len - q_len, a multiple of block_kv) the pattern is the same, but
  # for k >= the length every tile up to the last diagonal, memory included, is band.
  assert mosaic_shaw.band_tiles(512, 64, 64, 64, offset=512) == 2
  assert mosaic_shaw.band_tiles(512, 1, 128, 64, offset=512) == 2
  assert mosaic_shaw.band_tiles(64, 5000, 64, 64, offset=128) == 3


@pytest.mark.parametrize(
  'length, head_dim, max_distance, block_q, dtype, warp_specialized',
  [
    (1024, 64, 64, 64, jnp.bfloat16, False),
    pytest.param(512, 128, 1, 128, jnp.float16, False, marks=SLOW),
    (1024, 64, 64, 64, jnp.bfloat16, True),
    (512, 128, 300, 64, jnp.float16, True),
  ],
)
def test_lowers_for_cuda(length, head_dim, max_distance, block_q, dtype, warp_specialized):
  shapes = [jax.ShapeDtypeStruct((2, length, 3, head_dim), dtype)] * 3
  shapes += [jax.ShapeDtypeStruct((2 * max_distance + 1, head_dim), dtype)] * 2

  def f(*args):
    return shaw_attention_mosaic(*args, block_q=block_q, warp_specialized=warp_specialized)

  exported = jax.export.export(jax.jit(f), platforms=['cuda'])(*shapes)
  assert len(exported.out_avals) == 1
  module = exported.mlir_module()
  assert 'stablehlo.custom_call @mosaic_gpu' in module
  assert exported.out_avals[0].shape == shapes[0].shape


@pytest.mark.parametrize(
  'length, head_dim, max_distance, block_q, warp_specialized',
  [
    (1024, 64, 64, 64, False),
    pytest.param(512, 128, 3, 128, False, marks=SLOW),
    pytest.param(512, 64, 300, 64, True, marks=SLOW),
  ],
)
def test_gradient_lowers_for_cuda(length, head_dim, max_distance, block_q, warp_specialized):
  """jax.grad of a loss through the kernel: the forward, dq and dk/dv kernels all lower."""
  shapes = [jax.ShapeDtypeStruct((2, length, 3, head_dim), jnp.bfloat16)] * 3
  shapes += [jax.ShapeDtypeStruct((2 * max_distance + 1, head_dim), jnp.bfloat16)] * 2

  def loss(*args):
    z, lse = shaw_attention_mosaic(
      *args, block_q=block_q, warp_specialized=warp_specialized, return_lse=True
    )
    return jnp.sum(z.astype(jnp.float32) ** 2) + jnp.sum(lse)

  exported = jax.export.export(jax.jit(jax.grad(loss, argnums=range(5))), platforms=['cuda'])(
    *shapes
  )
  assert [a.shape for a in exported.out_avals] == [s.shape for s in shapes]
  assert exported.mlir_module().count('stablehlo.custom_call @mosaic_gpu') == 3


@pytest.mark.parametrize('warp_specialized', [False, pytest.param(True, marks=SLOW)])
def test_memory_lowers_for_cuda(warp_specialized):
  """enwik8_base's attention: 512 queries over 1,024 keys (a 512-position memory first), k = 64;
  the forward and jax.grad (three kernels) lower."""
  query = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  key = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16)
  rel = jax.ShapeDtypeStruct((129, 64), jnp.bfloat16)
  shapes = [query, key, key, rel, rel]

  def f(*args):
    return shaw_attention_mosaic(*args, warp_specialized=warp_specialized)

  def loss(*args):
    z, lse = shaw_attention_mosaic(*args, warp_specialized=warp_specialized, return_lse=True)
    return jnp.sum(z.astype(jnp.float32) ** 2) + jnp.sum(lse)

  exported = jax.export.export(jax.jit(f), platforms=['cuda'])(*shapes)
  assert exported.out_avals[0].shape == query.shape
  assert exported.mlir_module().count('stablehlo.custom_call @mosaic_gpu') == 1
  grad = jax.jit(jax.grad(loss, argnums=range(5)))
  exported = jax.export.export(grad, platforms=['cuda'])(*shapes)
  assert [a.shape for a in exported.out_avals] == [s.shape for s in shapes]
  assert exported.mlir_module().count('stablehlo.custom_call @mosaic_gpu') == 3


def test_backward_refuses_too_much_shared_memory():
  """head_dim=192: the forward fits, the backward kernels' two slots of three key tiles and two
  float32 bias tiles do not."""
  q = jax.ShapeDtypeStruct((1, 128, 1, 192), jnp.bfloat16)
  rel = jax.ShapeDtypeStruct((7, 192), jnp.bfloat16)

  def loss(*args):
    return shaw_attention_mosaic(*args).astype(jnp.float32).sum()

  jax.eval_shape(loss, q, q, q, rel, rel)
  with pytest.raises(ValueError, match='the backward kernels with block_kv=64, head_dim=192 need'):
    jax.eval_shape(jax.grad(loss), q, q, q, rel, rel)


@pytest.mark.parametrize(
  'shape, table, kwargs, message',
  [
    ((1, 128, 1, 32), 3, {}, 'head_dim must be a multiple of 64, got 32'),
    ((1, 100, 1, 64), 3, {}, 'length must be a multiple of block_q=64, got 100'),
    ((1, 128, 1, 64), 3, {'block_q': 96}, 'block_q and block_kv must be multiples of 64'),
    ((1, 128, 1, 64), 3, {'block_q': 64, 'block_kv': 128}, 'block_q a multiple of block_kv'),
    ((1, 256, 1, 256), 3, {'block_q': 128}, 'bytes of shared memory'),
    ((1, 256, 1, 256), 3, {'warp_specialized': True}, 'bytes of shared memory'),
    ((1, 192, 1, 64), 3, {'warp_specialized': True}, 'multiple of 2·block_q=128, got 192'),
    ((1, 128, 1, 64), 4, {}, 'rel_key, rel_value must share one [2k+1, head_dim] shape'),
    ((1, 128, 1, 64), 3, {'kv_len': 160}, 'multiple of block_kv=64, got 160 - 128'),
    ((1, 128, 1, 64), 3, {'kv_len': 64}, 'non-negative multiple of block_kv=64, got 64 - 128'),
    ((1, 128, 1, 64), 3, {'kv_heads': 2}, 'must agree, got (1, 128, 1, 64), (1, 256, 2, 64)'),
  ],
)
def test_refusals(shape, table, kwargs, message):
  q = jnp.zeros(shape, jnp.bfloat16)
  kv_shape = (shape[0], kwargs.pop('kv_len', shape[1]), kwargs.pop('kv_heads', shape[2]), shape[3])
  if kv_shape[2] != shape[2]:
    kv_shape = (shape[0], 256) + kv_shape[2:]
  kv = jnp.zeros(kv_shape, jnp.bfloat16)
  rel = jnp.zeros((table, shape[-1]), jnp.bfloat16)
  with pytest.raises(ValueError) as error:
    shaw_attention_mosaic(q, kv, kv, rel, rel, **kwargs)
  assert message in str(error.value) and '\n' not in str(error.value)


def test_refuses_float32():
  q = jnp.zeros((1, 128, 1, 64), jnp.float32)
  rel = jnp.zeros((3, 64), jnp.float32)
  with pytest.raises(ValueError, match='bfloat16 or all float16, got float32'):
    shaw_attention_mosaic(q, q, q, rel, rel)


@pytest.mark.slow
def test_gpu_check_script_runs_interpreted():
  """benchmarks/mosaic_shaw.py (the GPU session's check and timing) end to end, interpreted:
  forward and gradient errors for both Mosaic kernels."""
  command = [
    sys.executable,
    str(REPO / 'benchmarks' / 'mosaic_shaw.py'),
    '--interpret',
    '--lengths=128',
    '--distances=3',
    '--batch=1',
    '--heads=1',
  ]
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  errors = re.findall(r'(mosaic[\w+]*): error vs xla (\S+),', result.stdout)
  names = ['mosaic', 'mosaic+bwd', 'mosaic_ws', 'mosaic_ws+bwd']
  assert [name for name, _ in errors] == names, result.stdout
  assert all(float(error) < 2e-2 for _, error in errors), result.stdout
