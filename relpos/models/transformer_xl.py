"""Transformer-XL character language model (Dai et al. 2019), in Flax NNX.

Follows the original kimiyoung/transformer-xl PyTorch code (enwik8 setting, `div_val=1`,
tied input/output embeddings): embedding scaled by sqrt(d_model), post-LN decoder layers (or
pre-LN, without a final LayerNorm, as the original), segment-level recurrence with a memory of
each layer's input states, `same_length` and `clamp_len`.

The position scheme is `config.model.position`, the rest of the model being identical; each
layer's attention is the shared `relpos.models.multihead_attention.MultiHeadAttention`:

- 'xl': relative attention `relpos.attention.xl_attention` with R = sinusoids of distances,
  `W_kR` (`r_net`) per layer and biases u, v (per layer if `untie_r`, else shared).
- 'shaw': `relpos.attention.shaw_attention` with per-layer [2k+1, head_dim] tables, shared by
  the heads, for keys and values (`relative_keys` / `relative_values`).
- 'absolute': sinusoids of the position within the current segment (0..T-1) added to the
  embeddings. Positions restart every segment, so memory states carry the positions of their
  own segment: segment-wise evaluation is NOT the same as one pass over the whole sequence.
- 'none': no position information at all.
- 't5': T5's bucketed relative bias, causal (past distances only): one learned
  [num_buckets, heads] table shared by every layer, as T5 shares it across a stack.
- 'alibi': ALiBi's -slope_h * distance on the logits.
- 'rope': RoPE, queries and keys of [memory; segment] rotated by their positions.

Every scheme but 'absolute' depends on distances only, so segment-wise evaluation with memory
equals one pass over the whole sequence.

The segment and memory lengths, clamp_len and same_length are not part of the model: training
and evaluation pass their own (config.train / config.eval) to `init_memory` and `__call__`.
Attention-probability dropout (`attention_dropout`, the original's dropatt) applies in
training only (`deterministic=False`), inside the kernels.

Memory has a fixed shape for `jit`: `mem_len` slots per layer of which the trailing
`Memory.length` are valid; invalid slots are masked out of the attention.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import attention
from relpos.config.model_fields import TransformerXLConfig
from relpos.constants import self_attention_kind
from relpos.models import layers
from relpos.models.multihead_attention import MultiHeadAttention, RelativeBias

_INIT = nnx.initializers.normal(0.02)  # the original's `init_std` for weights and embeddings
_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default


class Memory(NamedTuple):
  """Segment-level recurrence state (a pytree).

  Attributes:
    hidden: [num_layers, batch, mem_len, d_model]; hidden[l] holds the inputs of layer l at the
      last mem_len positions seen.
    length: int32 scalar, how many trailing slots of `hidden` are valid (0..mem_len).
  """

  hidden: jax.Array
  length: jax.Array


def nats_per_token(logits_BTV, targets_BT) -> jax.Array:
  """Cross-entropy -log p(target) in nats, computed in float32: [batch, time]."""
  log_probs_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(log_probs_BTV, targets_BT[..., None], axis=-1)[..., 0]


def same_length_mask(q_len: int, mem_len: int) -> jax.Array:
  """The original `dec_attn_mask` for `same_length`, negated: bool [q_len, mem_len + q_len].

  True = may attend. The original builds `triu(ones, 1 + mlen) + tril(ones, -mask_shift_len)`
  with `mask_len = klen - mem_len` and `mask_shift_len = qlen - mask_len`. Here the memory
  always has mem_len slots (mlen = mem_len; unfilled slots are masked separately), so
  mask_len = q_len and mask_shift_len = 0: query i sees keys i+1 .. mem_len+i, i.e. itself
  and the mem_len - 1 positions before it.
  """
  ones = jnp.ones((q_len, mem_len + q_len), bool)
  mask_shift_len = 0
  return ~(jnp.triu(ones, 1 + mem_len) | jnp.tril(ones, -mask_shift_len))


def attention_mask(
  q_len: int, mem_len: int, length, *, same_length: bool, keys_only: bool = False
) -> jax.Array:
  """Keys a query may attend over [memory; segment]: bool [q_len, mem_len + q_len].

  Causal, only the trailing `length` (int or traced int32 scalar) of the mem_len memory slots,
  and with `same_length` the original's same-length window.

  keys_only: for attention asked to be causal (`MultiHeadAttention(..., causal=True)`, which
  the model's layers are), the unfilled memory slots alone, one row [1, mem_len + q_len] (with
  `same_length` the window still needs its [q_len, mem_len + q_len]). At long context this
  keeps the step's memory O(length) under XL's and Shaw's kernels, which add the causal mask
  themselves: the full mask is a byte per query and key, 32 GiB at a 131,072-token segment
  over as long a memory, and the fused kernels read one row of it for every query tile.
  """
  kv_len = mem_len + q_len
  valid_K = jnp.arange(kv_len) >= mem_len - length
  if keys_only and not same_length:
    return valid_K[None, :]
  mask_QK = attention.causal_mask(q_len, kv_len) & valid_K[None, :]
  if same_length:
    if mem_len == 0:
      raise ValueError('same_length needs mem_len > 0: with no memory no key is visible')
    mask_QK &= same_length_mask(q_len, mem_len)
  return mask_QK


class DecoderLayer(nnx.Module):
  """Attention over [memory; segment], then the position-wise feed-forward block; each with
  its residual and LayerNorm (post-LN, or pre-LN where the memory is normalised too)."""

  def __init__(self, config: TransformerXLConfig, *, rngs: nnx.Rngs):
    self.attention = MultiHeadAttention(
      config, relative=self_attention_kind(config.position), kernel_init=_INIT, rngs=rngs
    )
    self.attention_residual = layers.Residual(config, epsilon=_LAYER_NORM_EPSILON, rngs=rngs)
    self.ff = layers.FeedForward(
      config,
      inner_dropout=config.dropout,
      epsilon=_LAYER_NORM_EPSILON,
      kernel_init=_INIT,
      rngs=rngs,
    )

  def __call__(self, x_BQD, memory_BMD, mask_QK, xl_terms, bias_HQK, *, deterministic: bool):
    """One layer.

    Args:
      x_BQD: [batch, q_len, d_model], the layer input for the current segment.
      memory_BMD: [batch, mem_len, d_model], the layer input at the memory positions.
      mask_QK: bool [1, mem_len + q_len], the memory's filled slots (`attention_mask`, keys
        only: the attention is causal itself), or [q_len, ..] with same_length; True = may
        attend.
      xl_terms: 'xl' only (else None): (R [mem_len + q_len, d_model] of distances, u, v).
      bias_HQK: 't5', 'alibi' only (else None): the model's relative bias
        [heads, q_len, mem_len + q_len].
      deterministic: disables dropout, of the attention probabilities included.
    Returns:
      [batch, q_len, d_model].
    """

    def attend(h_BQD):  # keys and values of [memory; segment], normalised alike (pre-LN)
      context_BKD = jnp.concatenate([self.attention_residual.inputs(memory_BMD), h_BQD], axis=1)
      kv = self.attention.keys_values(context_BKD)
      return self.attention(
        h_BQD,
        mask_QK,
        deterministic=deterministic,
        causal=True,
        kv=kv,
        xl_terms=xl_terms,
        bias=bias_HQK,
      )

    x_BQD = self.attention_residual(x_BQD, attend, deterministic=deterministic)
    return self.ff(x_BQD, deterministic=deterministic)


class TransformerXL(nnx.Module):
  """Transformer-XL language model with segment-level recurrence.

  Usage:
    model = TransformerXL(TransformerXLConfig.from_section(config.model, vocab_size=256),
                          rngs=nnx.Rngs(0))
    memory = model.init_memory(batch_size, mem_len)
    logits_BTV, memory = model(tokens_BT, memory, deterministic=False)
  """

  def __init__(self, config: TransformerXLConfig, *, rngs: nnx.Rngs):
    """Builds the model; `rngs`: 'params' (or default) stream for initialisation, 'dropout'
    (or default) for dropout and attention dropout."""
    self.position = config.position
    self.num_layers, self.d_model = config.num_layers, config.d_model
    self.untie_r = config.untie_r
    self.dtype = config.compute_dtype
    self.scan_layers, self.remat = config.scan_layers, config.remat  # how stacks run
    self.embed = nnx.Embed(
      config.vocab_size, config.d_model, dtype=self.dtype, embedding_init=_INIT, rngs=rngs
    )
    self.output_bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32))
    self.dropout = layers.Dropout(config.dropout, bits=config.dropout_bits, rngs=rngs)
    self.layers = nnx.List([DecoderLayer(config, rngs=rngs) for _ in range(config.num_layers)])
    if self.position == 'xl':
      per_layer = (config.num_layers,) if config.untie_r else ()
      shape = (*per_layer, config.num_heads, config.head_dim)
      self.content_bias = nnx.Param(_INIT(rngs.params(), shape))  # u (r_w_bias)
      self.position_bias = nnx.Param(_INIT(rngs.params(), shape))  # v (r_r_bias)
    self.relative_bias = RelativeBias.from_config(
      config, bidirectional=False, kernel_init=_INIT, rngs=rngs
    )

  def init_memory(self, batch_size: int, mem_len: int, *, device=None) -> Memory:
    """Empty memory: zeros [num_layers, batch_size, mem_len, d_model], length 0; placed on
    `device` (a device or a sharding, as `jnp.zeros` takes it; None: JAX's default, not
    committed)."""
    shape = (self.num_layers, batch_size, mem_len, self.d_model)
    return Memory(
      jnp.zeros(shape, self.dtype, device=device), jnp.zeros((), jnp.int32, device=device)
    )

  def _embed(self, tokens_BT, *, deterministic):
    x_BTD = self.embed(tokens_BT) * self.d_model**0.5
    if self.position == 'absolute':
      positions_TD = attention.sinusoidal_embedding(jnp.arange(tokens_BT.shape[1]), self.d_model)
      x_BTD += positions_TD.astype(self.dtype)
    return self.dropout(x_BTD, deterministic=deterministic)

  def _xl_terms(self, kv_len, clamp_len, *, deterministic):
    """'xl': (R_t for t = 0..kv_len-1 after dropout [kv_len, d_model], u and v per layer
    [num_layers, heads, head_dim], shared ones repeated); otherwise (None, None, None)."""
    if self.position != 'xl':
      return None, None, None
    clamp_len = clamp_len if clamp_len and clamp_len > 0 else None
    r_KD = attention.xl_relative_encoding(kv_len, self.d_model, clamp_len=clamp_len)
    r_KD = self.dropout(r_KD, deterministic=deterministic)
    u, v = self.content_bias[...], self.position_bias[...]
    if not self.untie_r:
      u, v = (jnp.broadcast_to(bias, (self.num_layers, *bias.shape)) for bias in (u, v))
    return r_KD, u, v

  def _logits(self, h_BTD):
    """Tied output softmax: h Eᵀ + b, accumulated in float32: [batch, time, vocab]."""
    embedding_VD = self.embed.embedding[...].astype(h_BTD.dtype)
    logits_BTV = jnp.einsum('btd,vd->btv', h_BTD, embedding_VD, preferred_element_type=jnp.float32)
    return logits_BTV + self.output_bias[...]

  def __call__(
    self,
    tokens_BT,
    memory: Memory,
    *,
    deterministic: bool,
    clamp_len: int | None = None,
    same_length: bool = False,
  ):
    """Runs one segment.

    Args:
      tokens_BT: int [batch, q_len], any q_len.
      memory: from `init_memory` or the previous call; its mem_len is its own.
      deterministic: disables dropout.
      clamp_len: 'xl': distances past it use R_clamp_len (None or <= 0: no clamping).
      same_length: every query sees the same number of keys (needs a memory).
    Returns:
      logits [batch, q_len, vocab] float32, and the new memory: the last mem_len of
      [memory; this segment's layer inputs], under stop_gradient. The incoming memory is put
      under stop_gradient too, so no gradient ever crosses a segment boundary.
    """
    batch, q_len = tokens_BT.shape
    if memory.hidden.shape[:2] != (self.num_layers, batch):
      raise ValueError(
        f'memory.hidden {memory.hidden.shape} does not match num_layers={self.num_layers}, '
        f'batch={batch}'
      )
    memory_LBMD = jax.lax.stop_gradient(memory.hidden).astype(self.dtype)
    mem_len = memory_LBMD.shape[2]
    r_KD, u_LHD, v_LHD = self._xl_terms(mem_len + q_len, clamp_len, deterministic=deterministic)
    # The layers' attention is causal itself: its mask is the memory's unfilled slots only.
    mask_QK = attention_mask(q_len, mem_len, memory.length, same_length=same_length, keys_only=True)
    bias_HQK = None if self.relative_bias is None else self.relative_bias(q_len, mem_len + q_len)
    x_BQD = self._embed(tokens_BT, deterministic=deterministic)

    def call(layer, x_BQD, per_layer):
      memory_BMD, u_HD, v_HD = per_layer
      terms = None if r_KD is None else (r_KD, u_HD, v_HD)
      return layer(x_BQD, memory_BMD, mask_QK, terms, bias_HQK, deterministic=deterministic)

    x_BQD, inputs_LBQD = layers.run_stack(
      self.layers,
      call,
      x_BQD,
      (memory_LBMD, u_LHD, v_LHD),
      collect_inputs=True,
      scan=self.scan_layers,
      remat=self.remat,
    )
    logits_BQV = self._logits(self.dropout(x_BQD, deterministic=deterministic))
    return logits_BQV, _update_memory(memory_LBMD, memory.length, inputs_LBQD)


def _update_memory(memory_LBMD, length, inputs_LBQD) -> Memory:
  """The last mem_len of [memory; inputs] along time, length = min(length + q_len, mem_len)."""
  mem_len, q_len = memory_LBMD.shape[2], inputs_LBQD.shape[2]
  both_LBKD = jnp.concatenate([memory_LBMD, inputs_LBQD], axis=2)
  hidden = jax.lax.stop_gradient(both_LBKD[:, :, q_len:])
  return Memory(hidden, jnp.minimum(length + q_len, mem_len).astype(jnp.int32))
