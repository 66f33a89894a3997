"""relpos.counter_hash and the models' Dropout with dropout_bits='hash': the hash against a NumPy
transcription of its definition, what dropout needs of its masks (the keep rate, no correlation
between neighbours, rows or calls, uniform bits), the same mask however the array is sharded,
and Dropout('threefry2x32') equal to nnx.Dropout bit for bit."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos import counter_hash
from relpos.attention.pallas_common import dropout_bits
from relpos.models.layers import Dropout

_M = 2**32


def _fmix32_np(h):
  h = np.asarray(h, np.uint64) % _M
  h ^= h >> 16
  h = (h * 0x85EBCA6B) % _M
  h ^= h >> 13
  h = (h * 0xC2B2AE35) % _M
  return h ^ (h >> 16)


def _chain_np(bits, index):
  return _fmix32_np(
    (np.asarray(bits, np.uint64) + (np.asarray(index, np.uint64) + 1) * 0x9E3779B9) % _M
  )


def _keep_np(key, shape, rate):
  seed = np.asarray(jax.random.key_data(key), np.uint64)
  bits = _chain_np(_chain_np(seed[0], seed[1]), np.arange(np.prod(shape)).reshape(shape))
  return bits >= round(rate * 2.0**32)


def test_the_hash_is_its_definition():
  values = np.array([0, 1, 2, 12345, 2**31, 2**32 - 1], np.uint64)
  got = np.asarray(counter_hash.fmix32(jnp.asarray(values, jnp.uint32)))
  np.testing.assert_array_equal(got, _fmix32_np(values))
  assert len(set(got.tolist())) == len(values)  # a bijection: no two equal here
  # The Pallas kernels' attention-dropout bits: the four indices chained after the seed.
  b, h, i, j = np.ix_(np.arange(2), np.arange(3), np.arange(5), np.arange(7))
  want = _chain_np(_chain_np(_chain_np(_chain_np(7, b), h), i), j)
  bits = jax.jit(dropout_bits)(jnp.uint32(7), b, h, i, j)  # jitted: op by op it takes seconds
  np.testing.assert_array_equal(np.asarray(bits), want)
  # The models' masks: the seed's second word into its first, then each element's flat index.
  key = jax.random.key(3)
  for shape in [(4, 5, 6), (1,), (0, 3)]:
    np.testing.assert_array_equal(_masks(3, shape, 0.1), _keep_np(key, shape, 0.1))


def _masks(seed, shape=(64, 128, 256), rate=0.1):
  return np.asarray(
    jax.jit(counter_hash.hashed_keep, static_argnums=(1, 2))(jax.random.key(seed), shape, rate)
  )


def test_the_masks_keep_at_the_rate_with_no_correlation_between_neighbours_rows_or_calls():
  keep = _masks(0)  # 2.1 M elements: the keep fraction's sd is 2e-4
  assert keep.mean() == pytest.approx(0.9, abs=1e-3)
  x = keep.astype(np.float64)

  def correlation(a, b):
    return np.corrcoef(a.ravel(), b.ravel())[0, 1]

  # Neighbours along each axis (flat indices 1, 256 and 32,768 apart): |r| of independent
  # masks is about 1 / sqrt(2 M) = 7e-4.
  assert abs(correlation(x[:, :, 1:], x[:, :, :-1])) < 0.005
  assert abs(correlation(x[:, 1:], x[:, :-1])) < 0.005
  assert abs(correlation(x[1:], x[:-1])) < 0.005
  # Another call (another key): independent, not a shifted copy.
  other = _masks(1).astype(np.float64)
  assert abs(correlation(x, other)) < 0.005
  assert abs(correlation(x[:, :, 1:], other[:, :, :-1])) < 0.005
  assert abs(correlation(x.ravel()[1000:], other.ravel()[:-1000])) < 0.005
  # The same key: the same mask.
  np.testing.assert_array_equal(keep, _masks(0))
  # Other rates, exactly as far as a 2^-32 threshold goes.
  assert _masks(2, (512, 512), 0.5).mean() == pytest.approx(0.5, abs=3e-3)
  assert _masks(3, (4, 4), 0.0).all()


def test_masks_past_the_flat_index_limit_chain_every_axis(monkeypatch):
  # A mask of 2^32 elements or more cannot be built here, so the limit is lowered: the branch
  # for such masks then serves (64, 128, 256), and is checked as the flat one is above.
  monkeypatch.setattr(counter_hash, 'FLAT_INDEX_LIMIT', 1000)
  key, shape = jax.random.key(5), (64, 128, 256)
  seed = np.asarray(jax.random.key_data(key), np.uint64)
  want = _chain_np(seed[0], seed[1])
  for axis, size in enumerate(shape):
    index = np.arange(size).reshape([size if a == axis else 1 for a in range(len(shape))])
    want = _chain_np(want, index)
  keep = np.asarray(counter_hash.hashed_keep(key, shape, 0.1))
  np.testing.assert_array_equal(keep, want >= round(0.1 * 2.0**32))
  assert keep.mean() == pytest.approx(0.9, abs=1e-3)
  x = keep.astype(np.float64)
  for a, b in [(x[:, :, 1:], x[:, :, :-1]), (x[:, 1:], x[:, :-1]), (x[1:], x[:-1])]:
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.005
  assert (keep != _keep_np(key, shape, 0.1)).any()  # not the flat index's bits


def test_the_bits_are_uniform():
  seed = jax.random.key_data(jax.random.key(5))
  bits = counter_hash.chain(
    counter_hash.chain(seed[0], seed[1]), jnp.arange(2**20, dtype=jnp.uint32)
  )
  bits = np.asarray(bits)
  for shift in (24, 16, 8, 0):  # each byte of the word, 256 bins of 4,096 expected
    counts = np.bincount((bits >> shift) & 255, minlength=256)
    chi2 = ((counts - 4096.0) ** 2 / 4096.0).sum()
    assert chi2 < 255 + 6 * np.sqrt(2 * 255), (shift, chi2)  # df 255: mean 255, sd 22.6


_SHARDED = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from relpos import counter_hash
assert len(jax.devices()) == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ('data',))
x = jnp.ones((8, 16, 32))
sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec('data')))
apply = jax.jit(lambda key, x: jnp.where(counter_hash.hashed_keep(key, x.shape, 0.25), x, 0.0))
key = jax.random.key(11)
split = apply(key, sharded)
assert split.sharding.spec == PartitionSpec('data'), split.sharding
np.testing.assert_array_equal(np.asarray(split), np.asarray(apply(key, x)))
print('same')
"""


def test_a_mask_is_the_same_however_its_array_is_sharded():
  """Over 2 forced CPU devices (a subprocess: XLA_FLAGS before jax starts), the mask of a
  batch-sharded array, each device hashing its own rows' indices, is the unsharded one."""
  # Appended to XLA_FLAGS: the suite's fast-compile flag (tests/conftest.py) stays.
  flags = f'{os.environ.get("XLA_FLAGS", "")} --xla_force_host_platform_device_count=2'
  environ = {**os.environ, 'XLA_FLAGS': flags.strip()}
  result = subprocess.run(
    [sys.executable, '-c', _SHARDED], env=environ, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0 and result.stdout.strip() == 'same', result.stderr[-2000:]


def test_dropout_threefry_is_nnx_dropout_and_hash_keeps_its_state():
  x = jax.random.normal(jax.random.key(0), (4, 8, 16))
  ours, theirs = Dropout(0.3, rngs=nnx.Rngs(5)), nnx.Dropout(0.3, rngs=nnx.Rngs(5))
  for _ in range(2):  # the stream advances alike
    np.testing.assert_array_equal(
      np.asarray(ours(x, deterministic=False)), np.asarray(theirs(x, deterministic=False))
    )
  hashed = Dropout(0.3, bits='hash', rngs=nnx.Rngs(5))
  # The same state (the rng stream), so checkpoints restore under either.
  assert jax.tree.structure(nnx.state(hashed)) == jax.tree.structure(nnx.state(theirs))
  first = np.asarray(hashed(x, deterministic=False))
  second = np.asarray(hashed(x, deterministic=False))
  kept = first != 0
  np.testing.assert_allclose(first[kept], np.asarray(x)[kept] / 0.7, rtol=1e-6)
  assert 0.6 < kept.mean() < 0.8
  assert ((second != 0) != kept).any()  # a fresh mask per call
  np.testing.assert_array_equal(np.asarray(hashed(x, deterministic=True)), np.asarray(x))
  assert not np.asarray(Dropout(1.0, bits='hash', rngs=nnx.Rngs(0))(x, deterministic=False)).any()


def test_both_models_take_hashed_dropout_bits_with_the_same_parameters():
  """dropout_bits changes only the training masks: the same initial parameters (the rng stream
  is forked alike), the same deterministic outputs, other training outputs."""
  import test_transformer as translation
  import test_transformer_xl as char_lm

  def params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))

  # The translation Transformer, one decoder layer and Transformer-XL one layer (the tests'
  # models have two): a threefry training pass compiles slowly, and a layer shows the forking.
  plain = translation.make_model(decoder_layers=1)
  hashed = translation.make_model(decoder_layers=1, dropout_bits='hash')
  for a, b in zip(params(plain), params(hashed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  src, tgt = translation.SRC, translation.TGT_IN
  np.testing.assert_array_equal(
    np.asarray(translation.forward(plain, src, tgt)),
    np.asarray(translation.forward(hashed, src, tgt)),
  )
  train = nnx.jit(lambda model: model(src, tgt, deterministic=False))
  trained, evaluated = np.asarray(train(hashed)), np.asarray(translation.forward(hashed, src, tgt))
  assert np.isfinite(trained).all() and not np.allclose(trained, evaluated)
  assert not np.allclose(trained, np.asarray(train(plain)))
  # Transformer-XL.
  plain = char_lm.make_model(num_layers=1)
  hashed = char_lm.make_model(num_layers=1, dropout_bits='hash')
  for a, b in zip(params(plain.model), params(hashed.model), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (2, 6)), jnp.int32)
  memory = hashed.init_memory(2)
  logits, _ = char_lm.forward(hashed, tokens, memory)
  np.testing.assert_array_equal(np.asarray(char_lm.forward(plain, tokens, memory)[0]), logits)
  trained, _ = char_lm._apply(
    hashed.model, tokens, memory, deterministic=False, **hashed.settings()
  )
  assert np.isfinite(np.asarray(trained)).all() and not np.allclose(trained, logits)
