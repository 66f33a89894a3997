"""Where `implementation='mosaic'` runs a causal Mosaic GPU kernel, and how it falls back.

Shaw's and XL's Mosaic GPU kernels (`mosaic_shaw`, `mosaic_xl`) know one mask: causal, with
the queries the last q_len keys. A model's mask is traced (the character LM's also drops the
memory slots not yet filled; a decoder's, the PAD keys of its batch), so whether a call's mask
is one the kernel computes is known only when the step runs. `implementation='mosaic'`
therefore means: the kernel where it can serve, another form elsewhere ('xla'; at long context
on a GPU the Pallas kernel), decided in two steps.

- While tracing, from shapes (`serves`): bf16/fp16, no attention dropout, a memory of whole
  kernel tiles before the queries, a head_dim the kernel's backward fits in shared memory
  (Shaw 64 or 128, XL 64); for Shaw the default query offset, and a call asked to be causal
  (`causal=True`) or a mask with a query axis (then the mask is Shaw's only causal mask: a
  key-padding mask or None is not causal). Where these fail, 'mosaic' is 'xla' at no cost.
- When the step runs (`run`): a `lax.cond` on the caller's predicate. Where the kernel adds
  the causal mask itself (XL always, Shaw with `causal=True`) the mask must allow every causal
  pair (`allows_causal`: of a keys-only mask, every key); Shaw's mask without `causal` must
  equal the causal mask (a [q_len, kv_len] comparison). The other branch is
  rematerialised (`jax.checkpoint`): under differentiation a cond keeps the residuals of both
  branches (the untaken one's as zeros), and 'xla''s would be [batch, heads, q_len, kv_len]
  probabilities, so it keeps its inputs only and recomputes its forward in the backward, when
  it ran. XL without a mask needs no cond.
- Which form the other branch is (`fallback`): XLA allocates every branch's buffers whether or
  not it runs (their peak, not their sum), so an 'xla' branch would put its [q_len, kv_len]
  logits and probabilities back into the step's peak memory, the very thing the kernels avoid
  at long context. From `LONG_KV_LEN` keys on a GPU the other branch is therefore the fused
  Pallas kernel (exact with any mask, O(length) memory); below, and off GPUs (where Pallas
  interprets), it is 'xla'.

Ragged lengths (`pad_to_tiles`): queries and keys are padded at the end by the same number of
rows, so the memory before the queries is unchanged; a padded query comes after every real key
and a padded key after every real query, so under the causal mask the real rows are unchanged
and the padding gets no gradient. On a CPU the kernels run in Mosaic GPU's interpreter (tests).
"""

import jax
import jax.numpy as jnp
from jax import lax

from relpos.attention import implementations
from relpos.attention.masking import causal_mask, static_query_offset

BLOCK = 64  # the tiles the kernels are called with, both axes (their defaults)
HEAD_DIMS = {'shaw': (64, 128), 'xl': (64,)}  # what each kernel's backward fits (shared memory)
# From this many keys the other branch is the Pallas kernel on a GPU (`fallback`): enwik8_base's
# 1,024 keys keep 'xla' (whose [q, kv] buffers are a few hundred MB there), long context does not.
LONG_KV_LEN = 4096


def serves(
  kernel: str,
  q_len: int,
  kv_len: int,
  dtype,
  head_dim: int,
  mask_shape,
  dropout_rate: float,
  query_offset=None,
  *,
  causal: bool = False,
) -> bool:
  """Whether `kernel`'s ('shaw' or 'xl') Mosaic GPU kernel can serve a call of these shapes
  (module docstring); `query_offset` and `causal` are Shaw's (XL's kernel is always causal),
  the offset None or a static int (a traced one: no)."""
  memory = kv_len - q_len
  if kernel == 'shaw':
    has_query_axis = mask_shape is not None and len(mask_shape) >= 2 and mask_shape[-2] == q_len
    if not (causal or has_query_axis) or (query_offset is not None and query_offset != memory):
      return False
  return (
    implementations.serves('mosaic', kernel, jnp.dtype(dtype).name, dropout_rate)
    and head_dim in HEAD_DIMS[kernel]
    and memory >= 0
    and memory % BLOCK == 0
  )


def serves_call(
  kernel: str, query, key, value, mask, dropout_rate: float, query_offset=None, *, causal=False
):
  """`serves` for a call's arrays: query, key and value of one dtype, and (Shaw) a query offset
  known while tracing (a traced one, a decoding step's, is never served)."""
  if len({jnp.dtype(x.dtype) for x in (query, key, value)}) != 1:
    return False
  offset = None if query_offset is None else static_query_offset(query_offset)
  if query_offset is not None and offset is None:
    return False
  mask_shape = None if mask is None else mask.shape
  shapes = (query.shape[1], key.shape[1], query.dtype, query.shape[-1])
  return serves(kernel, *shapes, mask_shape, dropout_rate, offset, causal=causal)


def allows_causal(mask, q_len: int, kv_len: int):
  """Whether `mask` (None, or bool broadcastable to [.., q_len, kv_len]) allows every pair
  the causal mask allows (queries the last q_len keys): True for None, else a traced bool,
  reduced where it is computed (no [q_len, kv_len] array is kept)."""
  if mask is None:
    return True
  return jnp.all(mask | ~causal_mask(q_len, kv_len))


def _platform() -> str:
  """The platform the kernels are compiled for: the default device's where one is set
  (`jax.default_device(d)`; benchmarks/gpu_compile.py sets its compile-only H100 so on a CPU
  host), else JAX's default backend."""
  return getattr(jax.config.jax_default_device, 'platform', None) or jax.default_backend()


def fallback(kv_len: int) -> str:
  """The implementation of the branch that runs where the kernel does not (module docstring)."""
  return 'pallas' if _platform() == 'gpu' and kv_len >= LONG_KV_LEN else 'xla'


def interpret() -> bool:
  """The kernels compile on a GPU and run in Mosaic GPU's interpreter elsewhere."""
  return _platform() != 'gpu'


def pad_to_tiles(q_len: int, *arrays):
  """`arrays` [batch, length, ...] padded with zeros at the end of axis 1 to make q_len whole
  tiles (module docstring): the same number of rows for queries and keys."""
  pad = -q_len % BLOCK
  return tuple(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) for x in arrays)


def run(use_kernel, kernel, other, *operands):
  """`kernel(*operands)` where `use_kernel` (a bool, or a traced scalar decided when the step
  runs), else `other(*operands)` (the `fallback` form), rematerialised (module docstring).
  Both return the same shape and dtype."""
  if use_kernel is True:
    return kernel(*operands)
  return lax.cond(use_kernel, kernel, jax.checkpoint(other), *operands)
