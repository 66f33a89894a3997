"""Transformer-XL relative attention (Dai et al. 2019, §3.3).

    score_ij = ((q_i + u)·k_j + (q_i + v)·W_kR R_{pos_i - j}) / sqrt(d)

Queries are the last q_len of kv_len positions (the memory comes first). The position term is
computed per distance, `[q_len, kv_len]` over t = 0..kv_len-1, and moved to key coordinates
with the pad-and-reshape relative shift; no [q, kv, heads, d] tensor is gathered.

Three implementations of the same scores: 'xla' (below: logits, softmax and the weighted sum
as XLA ops), 'pallas' (`relpos.attention.pallas_xl`: fused, tiled, no [q_len, kv_len] array)
and 'cudnn' (`xl_attention_cudnn`): the position term, causal mask included, computed as for
'xla' and handed to cuDNN's flash attention as an additive bias, which fuses the content
logits, the softmax, the weighted sum and their gradients (the bias's gradient included). Its
memory is O(q_len·kv_len) like 'xla''s, in the input dtype instead of float32; cuDNN takes
bf16/fp16 inputs and no attention dropout here, and runs on NVIDIA GPUs only.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from relpos.attention import autotune, mosaic_dispatch, mosaic_xl
from relpos.attention.dot_product import attend, check_qkv, content_logits
from relpos.attention.implementations import HALF_DTYPES, resolve_implementation
from relpos.attention.masking import (
  accumulation_dtype,
  attention_dropout,
  causal_mask,
  check_dropout,
  masked_softmax,
)
from relpos.attention.pallas_xl import xl_attention_pallas
from relpos.attention.skew import relative_to_absolute


def relative_shift(x_BHQT):
  """`out[..., i, j] = x[..., i, pos_i - j]` for j <= pos_i, pos_i = kv_len - q_len + i.

  Args:
    x_BHQT: [..., q_len, kv_len] indexed by distance t = 0..kv_len-1.
  Returns:
    [..., q_len, kv_len] indexed by key; entries with j > pos_i are unspecified (masked).
  """
  q_len, kv_len = x_BHQT.shape[-2:]
  # With distances reversed, column c = kv_len-1-t, and c = j - i + (q_len - 1).
  return relative_to_absolute(jnp.flip(x_BHQT, axis=-1), q_len - 1, kv_len)


def _position_logits(query_BQHD, rel_key_THD, dtype=None):
  """`q_i·rel_key_t / sqrt(d)` for every distance t: [batch, heads, q_len, kv_len], in `dtype`
  (default: the accumulation dtype, at least float32), by one matmul laid out for the platform
  it is lowered for (`lax.platform_dependent`): `_position_logits_heads_major` on a CPU,
  `_position_logits_batched` elsewhere. They differ in layout only (float rounding aside)."""
  return lax.platform_dependent(
    query_BQHD,
    rel_key_THD,
    cpu=functools.partial(_position_logits_heads_major, dtype=dtype),
    default=functools.partial(_position_logits_batched, dtype=dtype),
  )


def _position_logits_heads_major(query_BQHD, rel_key_THD, dtype=None):
  """`_position_logits` as [heads, batch·q_len, t], then transposed, so that the relative
  shift, which walks t for each query, reads rows of it; in XLA:CPU's own choice of layout,
  [heads, t, batch·q_len], it strides across memory (docs/kernels.md has the measurements).
  On a CPU the attention's fwd+bwd at char_tiny's shapes takes 19.0 ms this way against 22.0
  for `_position_logits_batched` (2026-11-27)."""
  position_HBQT = jnp.einsum(
    'bqhd,thd->hbqt',
    query_BQHD,
    rel_key_THD.astype(query_BQHD.dtype),
    preferred_element_type=dtype or accumulation_dtype(query_BQHD.dtype),
  )
  return jnp.transpose(position_HBQT, (1, 0, 2, 3)) * query_BQHD.shape[-1] ** -0.5


def _position_logits_batched(query_BQHD, rel_key_THD, dtype=None):
  """`_position_logits` as a matmul batched over batch and heads, R broadcast over the batch
  (a [batch, kv_len, heads, d] operand, small beside the logits): its output is [batch, heads,
  q_len, t] as the relative shift and cuDNN's bias want it, and its gradient comes back in that
  layout too. With heads the only batch axis (`_position_logits_heads_major`), XLA:GPU
  transposed each layer's [batch, heads, q_len, kv_len] logits gradient to [heads, ...] for
  the two backward matmuls. Compiled for an H100 (benchmarks/gpu_compile.py step,
  enwik8_base, bf16), the step's layout copies fell from 8.9 to 0.6 GB and its floor from
  16.2 / 12.0 ms (H100 / H200) to 15.2 / 11.3 through cuDNN, 35.0 / 25.1 to 33.0 / 23.7 with
  'xla' (docs/gpu.md)."""
  rel_key_BTHD = jnp.broadcast_to(
    rel_key_THD.astype(query_BQHD.dtype), (query_BQHD.shape[0], *rel_key_THD.shape)
  )
  position_BHQT = jnp.einsum(
    'bqhd,bthd->bhqt',
    query_BQHD,
    rel_key_BTHD,
    preferred_element_type=dtype or accumulation_dtype(query_BQHD.dtype),
  )
  return position_BHQT * query_BQHD.shape[-1] ** -0.5


def _position_term(query_BQHD, rel_key_THD, position_bias_HD, dtype=None):
  """`(q_i + v)·W_kR R_{pos_i - j} / sqrt(d)` in key coordinates, [batch, heads, q_len,
  kv_len] in `dtype` (default: at least float32), entries with j > pos_i unspecified: the term
  'xla' adds to the content logits and 'cudnn' hands to cuDNN as its bias."""
  biased = query_BQHD + position_bias_HD.astype(query_BQHD.dtype)
  return relative_shift(_position_logits(biased, rel_key_THD, dtype))


def _allowed(q_len: int, kv_len: int, mask):
  """XL's causal mask (query i at key position kv_len - q_len + i) and the caller's `mask`."""
  allowed = causal_mask(q_len, kv_len)
  return allowed if mask is None else allowed & mask


# What `xl_attention_cudnn` asks of jax.nn.dot_product_attention: cuDNN on a GPU. Tests on a
# CPU set 'xla', JAX's own implementation of the same call, to check what relpos builds.
CUDNN_IMPLEMENTATION = 'cudnn'


def xl_attention_cudnn(query, key, value, rel_key, content_bias, position_bias, *, mask=None):
  """XL attention through cuDNN's flash attention: `softmax((q + u)·kᵀ/sqrt(d) + bias) v` with
  bias = the relative-shifted position term (as 'xla' computes it, in the input dtype)
  where a key may be attended, and a large negative number elsewhere. Rows with no key allowed
  are zeros, as in 'xla'. Arguments as `xl_attention`'s; bf16/fp16 inputs, no dropout."""
  if jnp.dtype(query.dtype).name not in HALF_DTYPES:
    raise ValueError(
      f"implementation='cudnn' takes bfloat16 or float16 inputs (cuDNN's flash attention); "
      f"these are {jnp.dtype(query.dtype).name}: use 'xla' or 'pallas'"
    )
  allowed = _allowed(query.shape[1], key.shape[1], mask)
  # In the input dtype from the matmul on (the tensor cores still accumulate in float32): the
  # bias is rounded to it anyway, and the [batch, heads, q_len, kv_len] logits, their relative
  # shift and their gradient's then cross memory at half float32's bytes. The 1/sqrt(d) scale
  # after the rounding is exact where d is a power of 4 (64: 1/8), else rounds once more.
  position = _position_term(query, rel_key, position_bias, dtype=query.dtype)
  # Finite and moderate, as JAX's own cuDNN masks (cuDNN subtracts such numbers from each other).
  lowest = -(2.0**41) if query.dtype == jnp.bfloat16 else -(2.0**15)
  bias = jnp.where(allowed, position, lowest).astype(query.dtype)
  out = jax.nn.dot_product_attention(
    query + content_bias.astype(query.dtype),
    key,
    value,
    bias=bias,
    scale=query.shape[-1] ** -0.5,
    implementation=CUDNN_IMPLEMENTATION,
  )
  # A row with no allowed key: cuDNN averages every value (all biases equal); 'xla' gives 0.
  any_allowed = jnp.any(jnp.broadcast_to(allowed, bias.shape), axis=-1)  # [B, H, Q]
  return jnp.where(jnp.transpose(any_allowed, (0, 2, 1))[..., None], out, 0).astype(value.dtype)


def _xl_mosaic(query, key, value, rel_key, content_bias, position_bias, mask):
  """'mosaic': `mosaic_xl.xl_attention_mosaic` where `mask` (on top of XL's causal one) allows
  every causal pair when the step runs, else `mosaic_dispatch.fallback`'s implementation
  (`relpos.attention.mosaic_dispatch`; checked by its `serves_call` first). rel_key is padded with
  zero rows as the keys are: the extra distances reach padded queries only."""
  q_len, kv_len = query.shape[1], key.shape[1]

  def kernel(query, key, value, rel_key, content_bias, position_bias, mask):
    del mask
    (rel_key_1THD,) = mosaic_dispatch.pad_to_tiles(q_len, rel_key[None])
    out = mosaic_xl.xl_attention_mosaic(
      *mosaic_dispatch.pad_to_tiles(q_len, query, key, value),
      rel_key_1THD[0],
      content_bias,
      position_bias,
      block=mosaic_dispatch.BLOCK,
      interpret=mosaic_dispatch.interpret(),
    )
    return out[:, :q_len].astype(value.dtype)

  def other(*operands):
    implementation = mosaic_dispatch.fallback(kv_len)
    return xl_attention(*operands[:-1], mask=operands[-1], implementation=implementation)

  use_kernel = mosaic_dispatch.allows_causal(mask, q_len, kv_len)
  operands = (query, key, value, rel_key, content_bias, position_bias, mask)
  return mosaic_dispatch.run(use_kernel, kernel, other, *operands)


def _tuned(query, key, mask, dropout_rate, block_sizes) -> str:
  """'auto' for this call: the autotuner's choice at its shapes and the caller's tiles
  ('xla', 'pallas' or 'pallas@QxK'; `relpos.attention.autotune`)."""
  return autotune.choose(
    lambda: autotune.xl_signature(query, key, mask, dropout_rate, block_sizes),
    lambda signature: autotune.timed_candidates(xl_attention, signature),
  )


def xl_attention(
  query,
  key,
  value,
  rel_key,
  content_bias,
  position_bias,
  *,
  mask=None,
  dropout_rate: float = 0.0,
  dropout_rng=None,
  implementation: str = 'auto',
  block_sizes=None,
) -> jax.Array:
  """Transformer-XL attention over [memory; current segment].

  Args:
    query: [batch, q_len, heads, head_dim], the current segment.
    key, value: [batch, kv_len, heads, head_dim], memory first then the current segment.
    rel_key: [kv_len, heads, head_dim]; row t is W_kR·R_t for distance t = pos_i - j.
    content_bias: u, [heads, head_dim].
    position_bias: v, [heads, head_dim].
    mask: None or bool broadcastable to [batch, heads, q_len, kv_len], True = may attend,
      applied on top of the causal mask (e.g. same_length).
    dropout_rate, dropout_rng: attention-probability dropout, see
      `relpos.attention.masking.attention_dropout`; rate 0 (the default) needs no rng.
    implementation: 'xla' (this module's kernel), 'pallas' (the fused, tiled kernels of
      `relpos.attention.pallas_xl`; interpreted on CPU, Triton on GPU; no TPU lowering),
      'cudnn' (`xl_attention_cudnn`: NVIDIA GPUs, bf16/fp16, no dropout), 'mosaic' (the
      Mosaic GPU kernel, `relpos.attention.mosaic_xl`, where it serves and the mask, when the
      step runs, allows every causal pair; 'xla' elsewhere: `relpos.attention.mosaic_dispatch`)
      or 'auto' (the default): on a GPU the fastest of 'xla', 'pallas' at a few tilings and
      (bf16/fp16 without dropout) 'cudnn' and, where it serves, 'mosaic', timed forward and
      backward at this call's shapes on first use and cached
      (`relpos.attention.autotune`); 'xla' elsewhere. With dropout, 'pallas' draws its keep
      mask from a hash (`pallas_common.dropout_keep_hashed`): same distribution, different
      bits than 'xla'.
    block_sizes: (block_q, block_k) tiles of the 'pallas' implementation (None: its default,
      which Triton can lower, or under 'auto' the tuned tiles; given sizes must be powers of
      two >= 16 for GPU, and 'auto' then tunes only 'xla' against 'pallas' at them); unused
      by 'xla'.
  Returns:
    [batch, q_len, heads, head_dim] in value's dtype.
  """
  check_qkv(query, key, value)
  q_len, kv_len = query.shape[1], key.shape[1]
  if rel_key.shape != (kv_len,) + key.shape[2:]:
    raise ValueError(
      f'rel_key must be [kv_len={kv_len}, heads, head_dim] = '
      f'{(kv_len,) + key.shape[2:]}, got {rel_key.shape}'
    )
  for name, bias in (('content_bias', content_bias), ('position_bias', position_bias)):
    if bias.shape != key.shape[2:]:
      raise ValueError(f'{name} must be [heads, head_dim] = {key.shape[2:]}, got {bias.shape}')
  dropout_rate = check_dropout(dropout_rate, dropout_rng)
  implementation, block_sizes = resolve_implementation(
    implementation,
    block_sizes,
    lambda: _tuned(query, key, mask, dropout_rate, block_sizes),
    kernel='xl',
  )
  if implementation == 'cudnn':
    if dropout_rate:
      raise ValueError(
        f"implementation='cudnn' has no attention dropout (dropout_rate={dropout_rate}): "
        "use 'xla' or 'pallas'"
      )
    return xl_attention_cudnn(query, key, value, rel_key, content_bias, position_bias, mask=mask)
  if implementation == 'mosaic' and mosaic_dispatch.serves_call(
    'xl', query, key, value, mask, dropout_rate
  ):
    return _xl_mosaic(query, key, value, rel_key, content_bias, position_bias, mask)
  if implementation == 'pallas':
    return xl_attention_pallas(
      query,
      key,
      value,
      rel_key,
      content_bias,
      position_bias,
      mask=mask,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
      block_sizes=block_sizes,
    )
  content = content_logits(query + content_bias.astype(query.dtype), key)
  logits = content + _position_term(query, rel_key, position_bias)
  allowed = _allowed(q_len, kv_len, mask)
  probs = attention_dropout(masked_softmax(logits, allowed), dropout_rate, dropout_rng)
  return attend(probs, value).astype(value.dtype)
