"""relative_buckets and causal_mask (relpos.attention.masking) against their direct formulas."""

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import REPO

from relpos import attention
from relpos.attention.masking import table_max_distance

pytestmark = pytest.mark.usefixtures('attention_test_config')


def _buckets(q_len, kv_len, k, off):
  i = np.arange(q_len)[:, None]
  j = np.arange(kv_len)[None, :]
  return np.clip(j - (off + i), -k, k) + k


CASES = [  # (q_len, kv_len, max_distance, query_offset or None)
  (7, 13, 3, None),
  (9, 9, 0, None),
  (9, 9, 1, None),
  (5, 5, 20, None),
  (1, 11, 4, None),
  (6, 4, 2, None),  # default offset negative
  (4, 10, 3, 0),
  (4, 10, 3, -7),
  (4, 10, 3, 15),
  (3, 6, 100, 2),
]


@pytest.mark.parametrize('q_len,kv_len,k,off', CASES)
def test_relative_buckets(q_len, kv_len, k, off):
  kwargs = {} if off is None else {'query_offset': off}
  got = attention.relative_buckets(q_len, kv_len, k, **kwargs)
  want = _buckets(q_len, kv_len, k, kv_len - q_len if off is None else off)
  assert got.shape == (q_len, kv_len)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(got), want)
  assert np.asarray(got).min() >= 0 and np.asarray(got).max() <= 2 * k
  # also cross-check against the reference's per-entry index function
  o = kv_len - q_len if off is None else off
  got = np.asarray(got)
  for i in range(q_len):
    for j in range(kv_len):
      assert got[i, j] == reference.shaw_index(i, j, k, o)


@pytest.mark.parametrize('q_len,kv_len,k,off', CASES)
def test_causal_mask(q_len, kv_len, k, off):
  del k
  kwargs = {} if off is None else {'query_offset': off}
  got = attention.causal_mask(q_len, kv_len, **kwargs)
  o = kv_len - q_len if off is None else off
  want = np.arange(kv_len)[None, :] <= o + np.arange(q_len)[:, None]
  assert got.shape == (q_len, kv_len)
  assert got.dtype == jnp.bool_
  np.testing.assert_array_equal(np.asarray(got), want)


def test_with_causal_adds_the_causal_mask_to_a_keys_only_mask():
  causal = np.arange(6)[None, :] <= 2 + np.arange(4)[:, None]
  np.testing.assert_array_equal(attention.with_causal(None, 4, 6), causal)
  keys_B11K = np.arange(6)[None, None, None, :] >= np.array([0, 3])[:, None, None, None]
  got = attention.with_causal(jnp.asarray(keys_B11K), 4, 6, query_offset=2)
  assert got.shape == (2, 1, 4, 6)
  np.testing.assert_array_equal(got, causal & keys_B11K)
  assert not np.asarray(got)[1, 0, 0].any()  # query 0 of row 1 sees keys 0-2, all masked


def test_buckets_and_causal_mask_with_traced_offset():
  traces = []

  @jax.jit
  def f(off):
    traces.append(1)
    return (
      attention.relative_buckets(3, 8, 2, query_offset=off),
      attention.causal_mask(3, 8, query_offset=off),
    )

  for off in [-4, 0, 5, 12]:
    b, m = f(jnp.int32(off))
    np.testing.assert_array_equal(np.asarray(b), _buckets(3, 8, 2, off))
    np.testing.assert_array_equal(np.asarray(m), np.arange(8)[None] <= off + np.arange(3)[:, None])
  assert len(traces) == 1


def test_table_max_distance_is_k_of_the_first_table_given():
  """Shaw's k from a [..., 2k+1, head_dim] table, the one helper of the kernels, the tuner and
  the model's clipping (either table may be left out)."""
  table = jnp.zeros((9, 4))
  assert table_max_distance(table, None) == table_max_distance(None, table) == 4
  assert table_max_distance(jnp.zeros((3, 4)), table) == 1  # the first one given
  assert table_max_distance(jnp.zeros((6, 33, 8))) == 16  # a model's stacked layers


def test_masked_logit_is_written_once():
  """masking.MASKED_LOGIT is every kernel's finite minus infinity (XLA's, Pallas's, Mosaic
  GPU's running max): no other module of relpos writes its own 1e30."""
  writers = [
    path.name
    for path in (REPO / 'relpos').rglob('*.py')
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, ast.Constant) and node.value == 1e30
  ]
  assert writers == ['masking.py']
