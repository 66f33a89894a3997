"""t5_relative_buckets and t5_relative_bias vs the float64 reference (T5's own bucket function)."""

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
  dead_rows,
  f32,
  f32_np,
  make_mask,
  qkv,
  randn,
)

from relpos import attention
from relpos.attention import t5

pytestmark = pytest.mark.usefixtures('attention_test_config')


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def buckets_traced(q_len, kv_len, num_buckets, max_distance, bidirectional, query_offset):
  """t5_relative_buckets with query_offset traced inside jit: one compile per configuration."""
  return attention.t5_relative_buckets(
    q_len, kv_len, num_buckets, max_distance, bidirectional=bidirectional, query_offset=query_offset
  )


@functools.partial(jax.jit, static_argnames=('q_len', 'kv_len', 'bidirectional', 'query_offset'))
def bias_static(table, *, q_len, kv_len, bidirectional, query_offset=None):
  return attention.t5_relative_bias(
    table, q_len, kv_len, max_distance=20, bidirectional=bidirectional, query_offset=query_offset
  )


def reference_buckets(q_len, kv_len, num_buckets, max_distance, bidirectional, query_offset=None):
  """T5's bucket of j - pos_i for every (i, j), from reference.t5_bucket: [q_len, kv_len]."""
  if query_offset is None:
    query_offset = kv_len - q_len
  relative = np.arange(kv_len)[None, :] - (query_offset + np.arange(q_len))[:, None]
  return np.vectorize(reference.t5_bucket)(relative, bidirectional, num_buckets, max_distance)


def test_known_buckets_t5_defaults():
  """Hand-derived buckets of T5's defaults, 32 buckets and max_distance 128, for relative
  positions j - pos_i. Bidirectional: 16 per side, 8 exact; the log-spaced bucket of n =
  pos_i - j >= 8 is 8 + int(2·log2(n / 8)), so buckets 9..15 start at n = 12, 16, 23, 32, 46,
  64, 91, and keys after the query add 16. Causal: 32 buckets, 16 exact, then 16 + int(16·
  log(n / 16) / log(8)): n = 18 -> 16, 19 -> 17, 99 -> 30, 127 -> 31."""
  bidirectional = {
    0: 0, -1: 1, -7: 7, -8: 8, -11: 8, -12: 9, -15: 9, -16: 10, -22: 10, -23: 11, -31: 11,
    -32: 12, -45: 12, -46: 13, -63: 13, -64: 14, -90: 14, -91: 15, -128: 15, -600: 15,
    1: 17, 7: 23, 8: 24, 12: 25, 16: 26, 64: 30, 91: 31, 599: 31,
  }  # fmt: skip
  causal = {
    5: 0, 1: 0, 0: 0, -1: 1, -15: 15, -16: 16, -18: 16, -19: 17, -20: 17, -21: 18, -98: 29,
    -99: 30, -112: 30, -113: 31, -127: 31, -128: 31, -600: 31,
  }  # fmt: skip
  # One query at position 600 over keys 0..1199: relative positions -600..599.
  for is_bidirectional, known in [(True, bidirectional), (False, causal)]:
    row = np.asarray(buckets_traced(1, 1200, 32, 128, is_bidirectional, jnp.int32(600)))[0]
    for relative, bucket in known.items():
      assert row[600 + relative] == bucket, (is_bidirectional, relative)
    assert row.dtype == np.int32
    want = reference_buckets(1, 1200, 32, 128, is_bidirectional, 600)[0]
    np.testing.assert_array_equal(row, want)


# (num_buckets, max_distance): T5's defaults, small and odd counts, a max_distance just above
# max_exact, and 64 / 50, where XLA:CPU's compiled float32 formula moves n = 40 into bucket 47.
CONFIGS = [(32, 128), (8, 20), (7, 9), (13, 40), (64, 50), (10, 1000), (4, 3)]


@pytest.mark.parametrize('bidirectional', [True, False], ids=['bidirectional', 'causal'])
@pytest.mark.parametrize('num_buckets,max_distance', CONFIGS, ids=[f'{n}-{d}' for n, d in CONFIGS])
def test_buckets_every_distance(num_buckets, max_distance, bidirectional):
  """Every relative position up to 2·max_distance + 5 on either side, against T5's function."""
  reach = 2 * max_distance + 5
  got = buckets_traced(1, 2 * reach + 1, num_buckets, max_distance, bidirectional, jnp.int32(reach))
  want = reference_buckets(1, 2 * reach + 1, num_buckets, max_distance, bidirectional, reach)
  np.testing.assert_array_equal(np.asarray(got), want)
  side = num_buckets // 2 if bidirectional else num_buckets
  assert np.asarray(got).max() == (2 * side if bidirectional else side) - 1


@pytest.mark.parametrize('bidirectional', [True, False], ids=['bidirectional', 'causal'])
def test_buckets_query_offsets(bidirectional):
  """q_len != kv_len, query_offset default, static and traced, before, inside and after the
  keys (one compile per static offset, one for all traced ones)."""
  q_len, kv_len = 5, 47
  for offset in [None, 0, -9, 30, 90]:
    got = attention.t5_relative_buckets(
      q_len, kv_len, 16, 20, bidirectional=bidirectional, query_offset=offset
    )
    want = reference_buckets(q_len, kv_len, 16, 20, bidirectional, offset)
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=f'offset {offset}')
    traced = buckets_traced(
      q_len, kv_len, 16, 20, bidirectional, jnp.int32(kv_len - q_len if offset is None else offset)
    )
    np.testing.assert_array_equal(np.asarray(traced), want, err_msg=f'traced offset {offset}')


def test_buckets_vmap_over_offsets():
  offsets = jnp.array([-4, 0, 3, 25], jnp.int32)
  got = jax.vmap(
    lambda off: attention.t5_relative_buckets(3, 11, 12, 16, bidirectional=True, query_offset=off)
  )(offsets)
  for n, off in enumerate([-4, 0, 3, 25]):
    np.testing.assert_array_equal(np.asarray(got[n]), reference_buckets(3, 11, 12, 16, True, off))


@pytest.mark.parametrize(
  'num_buckets,max_distance,bidirectional', [(3, 10, True), (1, 10, False), (8, 4, False)]
)
def test_invalid_bucket_configuration(num_buckets, max_distance, bidirectional):
  """Too few buckets for an exact one per side, or max_distance <= max_exact (log(1) = 0)."""
  with pytest.raises(ValueError, match='max_distance > max_exact'):
    attention.t5_relative_buckets(2, 3, num_buckets, max_distance, bidirectional=bidirectional)


# --------------------------------------------------------------------------------------------
# The bias: the table read at the buckets.


def reference_bias(table, q_len, kv_len, bidirectional, query_offset=None):
  buckets = reference_buckets(q_len, kv_len, table.shape[0], 20, bidirectional, query_offset)
  return np.moveaxis(np.asarray(table, np.float64)[buckets], -1, 0)  # [heads, q_len, kv_len]


@pytest.mark.parametrize('bidirectional', [True, False], ids=['bidirectional', 'causal'])
def test_bias_vs_reference(bidirectional):
  rng = np.random.default_rng(40)
  table = f32(randn(rng, 17, 3))  # odd bucket count: bidirectional leaves the last unused
  for q_len, kv_len, offset in [(7, 45, None), (6, 4, None), (9, 9, -30), (1, 60, 59)]:
    got = bias_static(
      table, q_len=q_len, kv_len=kv_len, bidirectional=bidirectional, query_offset=offset
    )
    assert got.shape == (3, q_len, kv_len) and got.dtype == np.float32
    want = reference_bias(table, q_len, kv_len, bidirectional, offset)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)  # a lookup: exact


def test_bias_traced_offset_and_bf16_table():
  rng = np.random.default_rng(41)
  table = jnp.asarray(randn(rng, 32, 4), jnp.bfloat16)

  @jax.jit
  def step(table, off):
    return attention.t5_relative_bias(
      table, 2, 50, max_distance=20, bidirectional=False, query_offset=off
    )

  for off in [-3, 0, 21, 48, 70]:
    got = step(table, jnp.int32(off))
    assert got.dtype == jnp.bfloat16
    want = reference_bias(np.asarray(table, np.float32), 2, 50, False, off)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want, err_msg=f'offset {off}')


@pytest.mark.parametrize('bidirectional', [True, False], ids=['bidirectional', 'causal'])
def test_bias_grad_wrt_table(bidirectional):
  """d sum(bias · c) / d table[n, h] = Σ_{(i, j) in bucket n} c[h, i, j]."""
  rng = np.random.default_rng(42 + bidirectional)
  q_len, kv_len, offset = 7, 45, 3
  table = f32(randn(rng, 16, 3))
  cot = randn(rng, 3, q_len, kv_len)

  @jax.jit
  def grad(table, cot):
    def loss(table):
      bias = attention.t5_relative_bias(
        table, q_len, kv_len, max_distance=20, bidirectional=bidirectional, query_offset=offset
      )
      return jnp.sum(bias * cot)

    return jax.grad(loss)(table)

  got = grad(table, f32(cot))
  buckets = reference_buckets(q_len, kv_len, 16, 20, bidirectional, offset)
  want = np.zeros((16, 3))
  for h in range(3):
    for i in range(q_len):
      for j in range(kv_len):
        want[buckets[i, j], h] += f32_np(cot)[h, i, j]
  assert_grads_close([got], [want], names=['table'])


def test_bias_in_attention_vs_reference():
  """dot_product_attention with the T5 bias, a causal mask and fully masked rows."""
  batch, q_len, kv_len, heads, dim = 2, 7, 13, 3, 5
  rng = np.random.default_rng(43)
  q, k, v = qkv(rng, batch, q_len, kv_len, heads, dim)
  table = f32(randn(rng, 32, heads))
  mask = make_mask('dead_rows', rng, batch, heads, q_len, kv_len) & make_mask(
    'causal', rng, batch, heads, q_len, kv_len
  )

  @jax.jit
  def forward(q, k, v, table):
    bias = attention.t5_relative_bias(table, q_len, kv_len, max_distance=20, bidirectional=False)
    return attention.dot_product_attention(q, k, v, mask=mask, bias=bias)

  out = forward(f32(q), f32(k), f32(v), table)
  want = reference.vanilla(
    f32_np(q), f32_np(k), f32_np(v), mask=mask, bias=reference_bias(table, q_len, kv_len, False)
  )
  assert_close(out, want)
  assert np.all(np.asarray(out)[dead_rows(mask, batch, heads, q_len, kv_len)] == 0.0)


def test_bias_rejects_non_matrix_table():
  with pytest.raises(ValueError, match='num_buckets, heads'):
    attention.t5_relative_bias(jnp.ones((32,)), 2, 3, max_distance=20, bidirectional=True)


def _dense_bucket_starts(side_buckets, max_distance):
  """The bucket starts read off T5's float32 bucket of every distance (what `_log_bucket_starts`
  computed until it bisected: an array of max_distance entries)."""
  max_exact = side_buckets // 2
  n = np.arange(max_exact, max_distance + 1)
  ratio = n.astype(np.float32) / np.float32(max_exact)
  log = np.log(ratio.astype(np.float64)).astype(np.float32)
  scaled = (
    log / np.float32(math.log(max_distance / max_exact)) * np.float32(side_buckets - max_exact)
  )
  large = np.minimum(max_exact + scaled.astype(np.int32), side_buckets - 1)
  return tuple(int(s) for s in n[np.searchsorted(large, np.arange(max_exact + 1, side_buckets))])


@pytest.mark.parametrize('side_buckets', [4, 16, 32, 128])
@pytest.mark.parametrize('max_distance', [65, 128, 1000, 4097, 3_000_001])
def test_bucket_starts_by_bisection_equal_the_dense_search(side_buckets, max_distance):
  assert t5._log_bucket_starts(side_buckets, max_distance) == _dense_bucket_starts(
    side_buckets, max_distance
  )


def test_a_huge_max_distance_costs_no_memory():
  """t5_max_distance=1e9 built a 1e9-entry array (the run was killed for memory)."""
  starts = t5._log_bucket_starts(32, 10**9)
  assert len(starts) == 15 and starts[-1] <= 10**9 and list(starts) == sorted(starts)
