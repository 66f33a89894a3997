"""apply_rope vs the float64 reference (Su et al. 2021), its relative property, and gradients."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import assert_close, assert_grads_close, f32, f32_np, randn
from jax.test_util import check_grads

from relpos import attention

pytestmark = pytest.mark.usefixtures('attention_test_config')

# The float32 angle position·θ_i is rounded, an error that grows with |position| (about
# |position|·2^-24 rad). Measured on CPU for |positions| < 100: float32 vs the float64 reference
# to within 2e-6 (assert_close's rtol = atol, outputs O(1)); 2x headroom.
ROPE_TOL = 4e-6


@functools.partial(jax.jit, static_argnames=('base',))
def rope(x, positions, base=10000.0):
  return attention.apply_rope(x, positions, base=base)


def _rope_complex(x, positions, base):
  """Second transcription: pair (i, i + half) as the complex number x_i + i·x_{i+half}, times
  exp(i·position·θ_i)."""
  half = x.shape[-1] // 2
  theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
  positions = np.broadcast_to(positions, x.shape[:2])
  z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * positions[..., None, None] * theta)
  return np.concatenate([z.real, z.imag], axis=-1)


def test_reference_matches_complex_rotation():
  rng = np.random.default_rng(0)
  x = randn(rng, 2, 3, 2, 6)
  positions = np.array([[0, 5, -3], [7, 100, 2]])
  np.testing.assert_allclose(
    reference.rope(x, positions, 500.0), _rope_complex(x, positions, 500.0), atol=1e-12
  )
  # head_dim 2: one pair, rotated by the position itself (θ_0 = 1)
  out = reference.rope(np.array([1.0, 0.0]).reshape(1, 1, 1, 2), [2])
  np.testing.assert_allclose(out.ravel(), [math.cos(2), math.sin(2)], atol=1e-15)


# (batch, len, heads, head_dim, positions, base): odd sizes, head_dim/2 odd, per-batch
# positions, negative positions and offsets.
CASES = [
  ('shared', (2, 7, 3, 6), np.arange(7), 10000.0),
  ('offset', (1, 5, 2, 10), 11 + np.arange(5), 10000.0),
  ('negative', (2, 4, 1, 4), np.array([-3, -1, 0, 2]), 10000.0),
  ('per_batch', (3, 5, 2, 8), np.arange(15).reshape(3, 5) * 3 - 7, 10000.0),
  ('base', (1, 9, 2, 6), np.arange(9) + 80, 500.0),
  ('head_dim2', (2, 3, 2, 2), np.array([0, 1, 17]), 10000.0),
]


@pytest.mark.parametrize('shape,positions,base', [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rope_vs_reference(shape, positions, base):
  rng = np.random.default_rng(10 + shape[-1] + shape[1])
  x = randn(rng, *shape)
  out = rope(f32(x), jnp.asarray(positions, jnp.int32), base=base)
  assert out.shape == shape and out.dtype == np.float32
  assert_close(out, reference.rope(f32_np(x), positions, base), tol=ROPE_TOL)


def test_rope_traced_positions_under_jit():
  """A decoding step's positions: arange(len) + a traced offset, one compilation."""
  rng = np.random.default_rng(20)
  x = randn(rng, 2, 3, 2, 6)
  traces = []

  @jax.jit
  def step(x, offset):
    traces.append(1)
    return attention.apply_rope(x, jnp.arange(3) + offset)

  for offset in [0, 4, 60]:
    want = reference.rope(f32_np(x), offset + np.arange(3), 10000.0)
    assert_close(step(f32(x), jnp.int32(offset)), want, tol=ROPE_TOL)
  assert len(traces) == 1


def test_rope_vmap_matches_per_batch_positions():
  rng = np.random.default_rng(21)
  x = f32(randn(rng, 3, 4, 2, 6))
  positions = jnp.array([[0, 1, 2, 3], [5, 6, 7, 8], [-2, 9, 4, 1]], jnp.int32)
  per_example = jax.vmap(lambda x, p: attention.apply_rope(x[None], p)[0])(x, positions)
  np.testing.assert_allclose(
    np.asarray(per_example), np.asarray(rope(x, positions)), rtol=1e-6, atol=1e-6
  )


def test_rope_position_zero_is_identity():
  x = f32(randn(np.random.default_rng(22), 1, 1, 3, 8))
  np.testing.assert_array_equal(np.asarray(rope(x, jnp.zeros(1, jnp.int32))), np.asarray(x))


def test_rope_is_roformer_up_to_a_permutation():
  """Interleaving the halves (i, i + half) -> (2i, 2i + 1) gives RoFormer's adjacent pairs."""
  rng = np.random.default_rng(23)
  x = randn(rng, 1, 4, 2, 6)
  positions = np.array([1, 4, 9, 30])
  half = 3
  interleave = np.stack([np.arange(half), np.arange(half) + half], axis=-1).ravel()  # 0,3,1,4,..
  theta = 10000.0 ** (-2.0 * np.arange(half) / 6)
  angle = positions[:, None, None] * theta  # [len, 1, half]
  y = f32_np(x)[..., interleave]
  roformer = np.empty_like(y)  # RoFormer eq. 34: (y_2i, y_2i+1) rotated by angle_i
  roformer[..., 0::2] = y[..., 0::2] * np.cos(angle) - y[..., 1::2] * np.sin(angle)
  roformer[..., 1::2] = y[..., 1::2] * np.cos(angle) + y[..., 0::2] * np.sin(angle)
  out = np.asarray(rope(f32(x), jnp.asarray(positions, jnp.int32)))
  assert_close(out[..., interleave], roformer, tol=ROPE_TOL)


def _scores(q, k, m, n):
  """RoPE(q, m)·RoPE(k, n) per head: q, k [heads, head_dim] -> [heads]."""
  rq = attention.apply_rope(q[None, None], jnp.array([m], jnp.int32))[0, 0]
  rk = attention.apply_rope(k[None, None], jnp.array([n], jnp.int32))[0, 0]
  return jnp.sum(rq * rk, axis=-1)


@pytest.mark.parametrize('difference', [-5, 0, 7])
def test_rope_scores_depend_on_position_difference(difference):
  """RoPE(q, m)·RoPE(k, n) = q·R((n - m)θ) k for every m: the same for pairs with the same
  m - n, and different for another difference. float64 (to 1e-12) and float32."""
  rng = np.random.default_rng(30 + difference)
  q, k = randn(rng, 3, 8), randn(rng, 3, 8)
  starts = [0, 3, 40, 1000]
  with jax.enable_x64(True):
    scores = jax.jit(_scores)
    exact = [np.asarray(scores(jnp.asarray(q), jnp.asarray(k), m, m - difference)) for m in starts]
    other = np.asarray(scores(jnp.asarray(q), jnp.asarray(k), 0, 1 - difference))
  for got in exact[1:]:
    np.testing.assert_allclose(got, exact[0], rtol=1e-12, atol=1e-12)
  assert np.all(np.abs(other - exact[0]) > 1e-6)
  # float32: the angles' rounding grows with the position (see ROPE_TOL), so positions < 100
  scores = jax.jit(_scores)
  for m in starts[:3]:
    got = np.asarray(scores(f32(q), f32(k), m, m - difference))
    np.testing.assert_allclose(got, exact[0], rtol=1e-5, atol=1e-5 * np.abs(q * k).sum())


def test_rope_bf16_close_to_float32():
  """bf16 x is rotated in float32 and rounded once: exactly float32's result on the same
  (bf16) values, rounded to bf16; and within bf16 rounding of the unrounded input's."""
  rng = np.random.default_rng(40)
  x = randn(rng, 2, 5, 3, 8)
  positions = jnp.arange(5, dtype=jnp.int32) + 9
  x_bf16 = jnp.asarray(x, jnp.bfloat16)
  out = rope(x_bf16, positions)
  assert out.dtype == jnp.bfloat16
  same_values = rope(x_bf16.astype(jnp.float32), positions).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(same_values, np.float32))
  full = np.asarray(rope(f32(x), positions))
  np.testing.assert_allclose(np.asarray(out, np.float32), full, rtol=0, atol=2e-2 * np.abs(x).max())


def test_rope_float64_stays_float64():
  rng = np.random.default_rng(41)
  x = randn(rng, 1, 3, 2, 4)
  with jax.enable_x64(True):
    out = attention.apply_rope(jnp.asarray(x), jnp.array([2, -1, 300]))
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, reference.rope(x, [2, -1, 300]), rtol=1e-13, atol=1e-13)


def test_rope_grad_wrt_x():
  """The rotation's transpose is the rotation by the negative angle: the gradient of
  sum(RoPE(x, p)·c) is RoPE(c, -p). float32 vs the reference, and finite differences."""
  rng = np.random.default_rng(42)
  x, cot = randn(rng, 2, 5, 3, 6), randn(rng, 2, 5, 3, 6)
  positions = np.array([[0, 3, 7, 12, 40], [-4, 1, 2, 9, 99]])

  @jax.jit
  def grad(x, positions, cot):
    return jax.grad(lambda x: jnp.sum(attention.apply_rope(x, positions) * cot))(x)

  got = grad(f32(x), jnp.asarray(positions, jnp.int32), f32(cot))
  want = reference.rope(f32_np(cot), -positions, 10000.0)
  assert_grads_close([got], [want], tol=ROPE_TOL, names=['x'])
  with jax.enable_x64(True):
    check_grads(
      jax.jit(lambda x: attention.apply_rope(x, positions[0])),
      (jnp.asarray(x),),
      order=1,
      modes=('rev',),
      atol=1e-6,
      rtol=1e-6,
      eps=1e-5,
    )


def test_rope_errors():
  with pytest.raises(ValueError, match='head_dim'):
    attention.apply_rope(jnp.ones((1, 3, 2, 5)), jnp.arange(3))
  with pytest.raises(ValueError, match='positions'):
    attention.apply_rope(jnp.ones((1, 3, 2, 4)), jnp.arange(4))
  with pytest.raises(ValueError, match='batch, len, heads, head_dim'):
    attention.apply_rope(jnp.ones((3, 2, 4)), jnp.arange(3))
