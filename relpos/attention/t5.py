"""T5's bucketed relative position bias (Raffel et al. 2020, sec. 2.1).

    logits_hij += w[bucket(j - pos_i), h]        (w: [num_buckets, heads], learned)

`bucket` is mesh-tensorflow's / HF transformers' `_relative_position_bucket` of the relative
position j - pos_i. With n = pos_i - j (how far the key lies in the past):

- bidirectional: half of the buckets per side; keys after the query (n < 0) use the upper half,
  and n becomes |n|. Causal: all buckets describe the past, n becomes max(n, 0).
- Of a side's buckets, the first max_exact = buckets // 2 are the distances 0 .. max_exact-1
  themselves; larger n get `max_exact + int(log(n / max_exact) / log(max_distance / max_exact)
  · (buckets - max_exact))`, log-spaced up to max_distance and capped at the side's last
  bucket.

T5 evaluates this in float32, and the rounding decides the bucket where the exact value is an
integer (n = 16, 32, 64 for T5's default 32 bidirectional buckets, max_distance 128). Compiled
by XLA, the same expression need not round the same way: XLA:CPU folds the division by
log(max_distance / max_exact) and the multiplication into one constant factor, which moves such
a boundary by one distance for some configurations (64 causal buckets, max_distance 50:
n = 40), and backends' float32 logs may differ in the last bit. So the log-spaced buckets are
not computed per (query, key) pair: the first n of each bucket is found once at trace time by
evaluating T5's float32 formula in NumPy for every n in [max_exact, max_distance] (a correctly
rounded float32 log, then T5's float32 division and multiplication), and the kernel counts the
bucket starts at or below each n. The buckets are thus the same on every backend, need no
transcendental per pair and take no log(0). The distances are int32, so query_offset may be
traced.

The table is read by a one-hot einsum with a [q_len, kv_len, num_buckets] operand in float32
(float64 for a float64 table): its gradient w.r.t. the table is a matmul, where a gather's
would be a scatter (slow on XLA:CPU). The bias is added to the attention logits by the caller
(`dot_product_attention`'s `bias`).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from relpos.attention.masking import accumulation_dtype, default_query_offset, query_key_distance


def _check_buckets(num_buckets: int, max_distance: int, bidirectional: bool):
  """Raises ValueError unless each side has an exact bucket and max_distance > max_exact."""
  side = num_buckets // 2 if bidirectional else num_buckets
  max_exact = side // 2
  if max_exact < 1 or max_distance <= max_exact:
    raise ValueError(
      f'T5 buckets need num_buckets >= {4 if bidirectional else 2} and max_distance > '
      f'max_exact (= {max_exact} for num_buckets={num_buckets}, '
      f'bidirectional={bidirectional}); got max_distance={max_distance}'
    )


@functools.lru_cache(maxsize=64)
def _log_bucket_starts(side_buckets: int, max_distance: int) -> tuple[int, ...]:
  """The smallest n of each log-spaced bucket max_exact+1 .. side_buckets-1 of one side.

  T5's float32 `max_exact + int(log(n / max_exact) / log(max_distance / max_exact) ·
  (side_buckets - max_exact))`, capped at side_buckets - 1, is non-decreasing in n and reaches
  the last bucket by n = max_distance (where the value is side_buckets - max_exact up to
  rounding); a bucket it skips starts where the next one does.
  """
  max_exact = side_buckets // 2
  log_range = np.float32(math.log(max_distance / max_exact))
  width = np.float32(side_buckets - max_exact)

  def bucket(n):  # T5's float32 arithmetic, elementwise over int64 n
    ratio = n.astype(np.float32) / np.float32(max_exact)
    log = np.log(ratio.astype(np.float64)).astype(np.float32)  # correctly rounded float32 log
    scaled = log / log_range * width
    return np.minimum(max_exact + scaled.astype(np.int32), side_buckets - 1)

  # The smallest n in [max_exact, max_distance] whose bucket reaches each b, by bisection, all
  # buckets at once: O(buckets · log(max_distance)), not an array of every distance (a
  # max_distance of 1e9 took 8 GB).
  targets = np.arange(max_exact + 1, side_buckets)
  low = np.full(
    targets.shape, max_exact, np.int64
  )  # bucket(low) < b (bucket(max_exact) = max_exact)
  high = np.full(targets.shape, max_distance, np.int64)  # bucket(high) >= b
  while np.any(high - low > 1):
    middle = (low + high) // 2
    reaches = bucket(middle) >= targets
    high = np.where(reaches, middle, high)
    low = np.where(reaches, low, middle)
  return tuple(int(start) for start in high)


def t5_relative_buckets(
  q_len: int,
  kv_len: int,
  num_buckets: int,
  max_distance: int,
  *,
  bidirectional: bool,
  query_offset=None,
) -> jax.Array:
  """T5's bucket of every (query, key) pair: int32 [q_len, kv_len] in [0, num_buckets).

  Query i sits at absolute position pos_i = `query_offset + i` (default `kv_len - q_len`, an
  int or a traced int32 scalar), key j at j; the bucket is T5's `_relative_position_bucket`
  of j - pos_i (see the module docstring). Bidirectional: buckets [0, num_buckets // 2) for
  keys at or before the query, [num_buckets // 2, 2·(num_buckets // 2)) for keys after it.
  Causal: every key after the query gets bucket 0, like distance 0.
  """
  _check_buckets(num_buckets, max_distance, bidirectional)
  if query_offset is None:
    query_offset = default_query_offset(q_len, kv_len)
  n_QK = -query_key_distance(q_len, kv_len, query_offset)  # pos_i - j
  if bidirectional:
    num_buckets //= 2
    side_QK = jnp.where(n_QK < 0, num_buckets, 0)
    n_QK = jnp.abs(n_QK)
  else:
    side_QK = 0
    n_QK = jnp.maximum(n_QK, 0)
  max_exact = num_buckets // 2
  starts_S = jnp.asarray(_log_bucket_starts(num_buckets, max_distance), jnp.int32)
  large_QK = max_exact + jnp.sum(n_QK[..., None] >= starts_S, axis=-1, dtype=jnp.int32)
  return side_QK + jnp.where(n_QK < max_exact, n_QK, large_QK)


def t5_relative_bias(
  table_NH,
  q_len: int,
  kv_len: int,
  *,
  max_distance: int,
  bidirectional: bool,
  query_offset=None,
) -> jax.Array:
  """T5's per-head logit bias `table[bucket(j - pos_i), h]`: [heads, q_len, kv_len].

  Args:
    table_NH: the learned table [num_buckets, heads].
    q_len, kv_len: query and key counts.
    max_distance, bidirectional: see `t5_relative_buckets`.
    query_offset: absolute position of query 0 (int or traced int scalar); keys sit at
      0..kv_len-1. Default kv_len - q_len: queries are the last positions.
  Returns:
    [heads, q_len, kv_len] in the table's dtype, to add to the logits q·k/sqrt(d).
  """
  if table_NH.ndim != 2:
    raise ValueError(f'T5 bias table must be [num_buckets, heads], got {table_NH.shape}')
  num_buckets = table_NH.shape[0]
  buckets_QK = t5_relative_buckets(
    q_len,
    kv_len,
    num_buckets,
    max_distance,
    bidirectional=bidirectional,
    query_offset=query_offset,
  )
  # In (at least) float32, so that the gradient's sums over pairs are too; at the highest
  # precision, so that GPUs' TF32 matmuls do not round the table entries the lookup returns.
  dtype = accumulation_dtype(table_NH.dtype)
  one_hot_QKN = jax.nn.one_hot(buckets_QK, num_buckets, dtype=dtype)
  bias_HQK = jnp.einsum(
    'qkn,nh->hqk', one_hot_QKN, table_NH.astype(dtype), precision=jax.lax.Precision.HIGHEST
  )
  return bias_HQK.astype(table_NH.dtype)
