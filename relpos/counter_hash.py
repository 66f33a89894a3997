"""Random bits from a counter-based hash: murmur3's 32-bit finaliser over a seed and an element's
indices, and the keep masks of dropout drawn from them.

JAX's default PRNG, threefry2x32 in its partitionable form, spends about 130 integer operations
on each random word (20 rounds of add, rotate and xor, both output words folded into one). A
dropout mask needs far less: bits that look independent from element to element and from call
to call. Here an element's bits are `fmix32` (murmur3's finaliser: two multiplies and three
xor-shifts, a bijection of uint32 with full avalanche) chained over the seed and the element's
indices, each index entering as (index + 1)·GOLDEN (a Weyl step: odd, so a bijection), so
neighbouring elements differ in every input bit of the next round. It is stateless and a pure
function of the global indices, so a mask is the same however its array is sharded, and XLA
fuses it into the op that applies it.

Two users, one implementation:
- the Pallas kernels' attention dropout (`relpos.attention.pallas_common`), whose hash chains the
  four indices (batch, head, query, key) after a 32-bit seed, in-kernel, on each tile;
- the models' dropout with `config.model.dropout_bits='hash'` (`relpos.models.layers.Dropout`):
  `hashed_keep` over an activation's flat index, after two seed words. About 20 integer
  operations an element, against threefry's 130 (docs/gpu.md, "Dropout's random bits in the
  floor").

What it is not: a general-purpose PRNG. murmur3's finaliser over a Weyl sequence is SplitMix32's
construction, which fails the largest statistical batteries eventually; the tests check what
dropout needs (the keep rate, no correlation between neighbours, rows or calls).
"""

import math

import jax
import jax.numpy as jnp

GOLDEN = 0x9E3779B9  # odd: x -> x·GOLDEN is a bijection of uint32
FLAT_INDEX_LIMIT = 2**32  # masks this large chain each axis' index: a flat uint32 index would wrap


def fmix32(h):
  """murmur3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def chain(bits, index):
  """One round: `index` (int, broadcast against `bits`) hashed into `bits` (uint32)."""
  index = jnp.asarray(index).astype(jnp.uint32)
  return fmix32(bits + (index + jnp.uint32(1)) * jnp.uint32(GOLDEN))


def keep_threshold(rate: float):
  """uint32 t with P(bits >= t) = 1 - rate for uniform bits (to 2^-32)."""
  return jnp.uint32(min(int(round(rate * 2.0**32)), 2**32 - 1))


def hashed_keep(key, shape, rate: float) -> jax.Array:
  """bool `shape`: True with probability 1 - rate, each element's from its flat index.

  The call's seed is the key's own first two words (`jax.random.key_data`: a key from a stream
  or a split is already the output of a hash, and reading it launches nothing, where drawing
  bits from it would be a threefry call per site); the first round chains the second word into
  the first (a scalar, once per call), the second the element's flat index, so two calls' masks
  are not shifts of one another. Shapes of `FLAT_INDEX_LIMIT` (2^32) elements or more chain
  every axis' index instead of the flat one, which would wrap.
  """
  seed = jax.random.key_data(key).reshape(-1)[:2]
  bits = chain(seed[0], seed[1])
  size = math.prod(shape)
  if size < FLAT_INDEX_LIMIT:
    return chain(bits, jax.lax.iota(jnp.uint32, size).reshape(shape)) >= keep_threshold(rate)
  for axis in range(len(shape)):
    bits = chain(bits, jax.lax.broadcasted_iota(jnp.uint32, shape, axis))
  return bits >= keep_threshold(rate)
