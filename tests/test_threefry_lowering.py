"""relpos.threefry_lowering: threefry2x32 on the CPU without a loop, and with the same bits.

The suite itself runs with the rolled lowering (conftest: it compiles faster with XLA's
optimisations off), so the tests here set the straight-line one themselves, and check in a
fresh process that a program importing relpos.models gets it by default."""

import os
import subprocess
import sys

import jax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np
import pytest

import relpos.models  # noqa: F401  (applies the run's lowering, as every model user gets it)
from relpos import threefry_lowering


@pytest.fixture(autouse=True)
def straight_line_lowering():
  """relpos's default lowering in each test, and the run's (conftest's RELPOS_THREEFRY) after:
  set either way, since `unroll_on_cpu` under RELPOS_THREEFRY=rolled leaves a lowering as it is."""
  run_unrolled = os.environ.get(threefry_lowering.OFF_SWITCH) != 'rolled'
  assert threefry_lowering.set_cpu_lowering(unrolled=True)
  yield
  threefry_lowering.set_cpu_lowering(unrolled=run_unrolled)


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32_np(key, x0, x1):
  """Threefry-2x32 with 20 rounds (Salmon et al. 2011, Random123), in NumPy uint32."""
  x0, x1 = x0.astype(np.uint32), x1.astype(np.uint32)
  ks = [np.uint32(key[0]), np.uint32(key[1]), np.uint32(key[0] ^ key[1] ^ 0x1BD11BDA)]
  with np.errstate(over='ignore'):
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for block in range(5):
      for r in _ROTATIONS[block % 2]:
        x0 = x0 + x1
        x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
        x1 = x0 ^ x1
      x0 = x0 + ks[(block + 1) % 3]
      x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
  return x0, x1


_hash = jax.jit(jex_random.threefry_2x32)


def test_known_answer_vectors_of_random123():
  for key, count, expected in [
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
  ]:
    bits = _hash(jnp.array(key, jnp.uint32), jnp.array(count, jnp.uint32))
    np.testing.assert_array_equal(np.asarray(bits), np.array(expected, np.uint32))


def test_hash_equals_a_numpy_transcription_on_random_counts():
  rng = np.random.default_rng(0)
  key = rng.integers(0, 2**32, 2, dtype=np.uint32)
  count = rng.integers(0, 2**32, 2 * 1001, dtype=np.uint32)  # JAX hashes (first half, second half)
  bits = np.asarray(_hash(jnp.asarray(key), jnp.asarray(count)))
  expected0, expected1 = threefry2x32_np(key, count[:1001], count[1001:])
  np.testing.assert_array_equal(bits, np.concatenate([expected0, expected1]))


def _has_loop() -> bool:
  """Whether a fresh dropout draw lowers to a while loop now."""
  draw = jax.jit(lambda key: jax.random.bernoulli(key, 0.9, (5, 9)))
  return 'while' in draw.lower(jax.random.key(0)).as_text()


def test_dropout_draws_lower_without_a_loop_on_the_cpu():
  assert not _has_loop()


def test_a_program_importing_the_models_gets_the_straight_line_lowering():
  """What `relpos.models` does on import where RELPOS_THREEFRY is unset, as in users' programs:
  in a fresh process, since this one has the run's lowering (`unroll_on_cpu` under
  RELPOS_THREEFRY=rolled: the next test)."""
  program = (
    'import jax, relpos.models\n'
    'draw = jax.jit(lambda key: jax.random.bernoulli(key, 0.9, (5, 9)))\n'
    "print('while' in draw.lower(jax.random.key(0)).as_text())\n"
  )
  env = {k: v for k, v in os.environ.items() if k != threefry_lowering.OFF_SWITCH}
  done = subprocess.run(
    [sys.executable, '-c', program], env=env, capture_output=True, text=True, timeout=120
  )
  assert done.stdout.split() == ['False'], done.stderr[-2000:]


def test_the_rolled_lowering_can_be_had_again(monkeypatch):
  try:
    assert threefry_lowering.set_cpu_lowering(unrolled=False)
    assert _has_loop()
    rolled_bits = jax.jit(lambda key: jax.random.bits(key, (3, 7)))(jax.random.key(5))
  finally:
    threefry_lowering.set_cpu_lowering(unrolled=True)
  assert not _has_loop()
  unrolled_bits = jax.jit(lambda key: jax.random.bits(key, (3, 7)))(jax.random.key(5))
  np.testing.assert_array_equal(np.asarray(rolled_bits), np.asarray(unrolled_bits))
  monkeypatch.setenv(threefry_lowering.OFF_SWITCH, 'rolled')
  assert not threefry_lowering.unroll_on_cpu()
