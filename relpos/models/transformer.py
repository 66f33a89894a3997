"""Encoder-decoder Transformer for translation (Vaswani et al. 2017), in Flax NNX, with the
position scheme as a config choice, to reproduce Shaw et al. 2018 ("Self-Attention with
Relative Position Representations").

`config.model.position` (relpos.constants.TRANSLATE_POSITIONS) is one of:

- 'absolute': sinusoids of the position added to the embeddings (Vaswani et al.).
- 'learned': a learned [max_len, d_model] table added to the embeddings.
- 'shaw': no absolute positions; every self-attention layer (encoder and decoder self-attention,
  not encoder-decoder attention) owns one pair of [2k+1, head_dim] tables w^K, w^V, shared by
  its heads, used by `relpos.attention.shaw_attention`. `relative_keys` / `relative_values`
  select the tables (paper Table 3); turning both off is rejected: that model is 'none'.
- 'shaw_absolute': 'shaw' plus the sinusoids of 'absolute' (paper section 4.3).
- 'none': no position information at all.
- 't5': T5's bucketed relative bias (Raffel et al. 2020): one learned [num_buckets, heads]
  table per stack (encoder self-attention: both directions; decoder self-attention: the past),
  shared by the stack's layers, as T5 does.
- 'alibi': ALiBi (Press et al. 2022): -slope_h * distance added to the self-attention logits.
- 'rope': RoPE (Su et al. 2021): self-attention queries and keys rotated by their positions.

Relative schemes never read encoder-decoder attention, which sees no positions. Sinusoids
extend to any length; only 'learned' is bounded: a sequence longer than its `max_len` rows
raises a ValueError (never wrapped or clipped silently).

The rest follows tensor2tensor's transformer_base, which Shaw et al. used:

- One shared embedding table for source, target and softmax: logits = x Eᵀ (no output bias).
  It is initialised N(0, d_model^-0.5) and scaled by sqrt(d_model) on input, so embedded
  tokens have unit scale.
- Dense kernels use Glorot-uniform (T2T's `uniform_unit_scaling`, fan_avg). Biases start at 0.
  The attention projections have no bias, and the feed-forward layers do. The relative tables
  also use Glorot-uniform, as T2T's default initialiser does. LayerNorm epsilon is 1e-6.
- Dropout applies to the embeddings (with positions) and to every sublayer output before the
  residual sum, as in Vaswani et al. `attention_dropout` adds dropout on the attention
  probabilities, inside the kernels (0 by default: Vaswani et al. describe residual dropout
  only).
- Every attention layer is the shared `relpos.models.multihead_attention.MultiHeadAttention`, the
same
  layer the Transformer-XL LM uses.
- `pre_layer_norm=False`: post-LN, x = LN(x + dropout(f(x))), as in Vaswani et al. and Shaw
  et al. `True`: pre-LN, x = x + dropout(f(LN(x))), with a final LayerNorm on the encoder and
  decoder outputs, as in tensor2tensor v2.

Masks: source PAD keys are masked out of encoder self-attention and encoder-decoder attention.
Decoder self-attention is causal and also masks target PAD keys: its mask is the PAD keys
alone, [batch, 1, 1, tgt_len], and the attention is asked to be causal (Shaw's kernels bound
their loops by it; the others build the causal mask). The decoding cache records which
positions held PAD, so cached decoding masks exactly the same keys.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import attention
from relpos.config.model_fields import TransformerConfig
from relpos.constants import PAD_ID, self_attention_kind
from relpos.models import layers
from relpos.models.multihead_attention import MultiHeadAttention, RelativeBias

_DENSE_INIT = nnx.initializers.xavier_uniform()
_LAYER_NORM_EPSILON = 1e-6  # tensor2tensor's


class DecodeCache(NamedTuple):
  """Decoder self-attention state for cached decoding (a pytree, batch leading in every leaf).

  Attributes:
    keys: per decoder layer, [batch, heads, max_decode_len, head_dim], the self-attention keys
      of positions 0..max_decode_len-1 (those past the current step are unused). One array
      per layer, heads before positions, as the attention matmuls read them: a step reads the
      cache in place (one [batch, layers, max_decode_len, heads, ..] array cost XLA:CPU a
      sliced, transposed copy of it per layer and step).
    values: the same for the values.
    valid: bool [batch, max_decode_len], whether the token at that position was not PAD.
  """

  keys: tuple
  values: tuple
  valid: jax.Array


def _key_mask(tokens_BK):
  """bool [batch, 1, 1, kv_len]: True where the key is not PAD."""
  return (tokens_BK != PAD_ID)[:, None, None, :]


def _attention(config: TransformerConfig, rngs, *, relative: bool) -> MultiHeadAttention:
  """The shared attention layer: self-attention (`relative`) gets the scheme's kind,
  encoder-decoder attention none."""
  kind = self_attention_kind(config.position) if relative else 'none'
  return MultiHeadAttention(config, relative=kind, kernel_init=_DENSE_INIT, rngs=rngs)


def _residual(config: TransformerConfig, rngs) -> layers.Residual:
  return layers.Residual(config, epsilon=_LAYER_NORM_EPSILON, rngs=rngs)


def _final_norm(config: TransformerConfig, rngs) -> nnx.LayerNorm:
  """The LayerNorm of the encoder's and the decoder's output (pre-LN)."""
  return nnx.LayerNorm(
    config.d_model, epsilon=_LAYER_NORM_EPSILON, dtype=config.compute_dtype, rngs=rngs
  )


def _sublayer(layer, name: str, x_BTD, deterministic: bool, **kwargs):
  """x [batch, len, d_model] through the layer's attention sublayer `name` ('self' or
  'cross': its `<name>_attention` with its `<name>_residual`); `kwargs` go to the attention."""
  attention = getattr(layer, f'{name}_attention')
  attend = functools.partial(attention, deterministic=deterministic, **kwargs)
  return getattr(layer, f'{name}_residual')(x_BTD, attend, deterministic=deterministic)


def _feed_forward(config: TransformerConfig, rngs) -> layers.FeedForward:
  """Linear, ReLU, Linear (no inner dropout, as tensor2tensor's transformer_base)."""
  return layers.FeedForward(
    config, inner_dropout=0.0, epsilon=_LAYER_NORM_EPSILON, kernel_init=_DENSE_INIT, rngs=rngs
  )


class EncoderLayer(nnx.Module):
  """Self-attention (with the relative scheme), then feed-forward."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.self_attention = _attention(config, rngs, relative=True)
    self.self_residual = _residual(config, rngs)
    self.ff = _feed_forward(config, rngs)

  def __call__(self, x_BSD, mask_B11S, bias_HSS, *, deterministic: bool):
    """x [batch, src_len, d_model], mask of the non-PAD source keys, the stack's relative bias
    (or None) -> [batch, src_len, d_model]."""
    x_BSD = _sublayer(self, 'self', x_BSD, deterministic, mask=mask_B11S, bias=bias_HSS)
    return self.ff(x_BSD, deterministic=deterministic)


class DecoderLayer(nnx.Module):
  """Causal self-attention (with the relative scheme), encoder-decoder attention (no
  positions), then feed-forward."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.self_attention = _attention(config, rngs, relative=True)
    self.self_residual = _residual(config, rngs)
    self.cross_attention = _attention(config, rngs, relative=False)
    self.cross_residual = _residual(config, rngs)
    self.ff = _feed_forward(config, rngs)

  def cross_keys_values(self, enc_BSD):
    """Encoder-decoder keys and values [batch, src_len, heads, head_dim] of this layer."""
    return self.cross_attention.keys_values(enc_BSD)

  def _cross_and_ff(self, x_BTD, cross_kv, cross_mask_B11S, *, deterministic):
    x_BTD = _sublayer(self, 'cross', x_BTD, deterministic, mask=cross_mask_B11S, kv=cross_kv)
    return self.ff(x_BTD, deterministic=deterministic)

  def __call__(
    self, x_BTD, enc_BSD, self_mask_B11T, cross_mask_B11S, bias_HTT, *, deterministic: bool
  ):
    """Teacher forcing.

    Args:
      x_BTD: [batch, tgt_len, d_model], the layer input.
      enc_BSD: [batch, src_len, d_model], the encoder output.
      self_mask_B11T: bool [batch, 1, 1, tgt_len], the non-PAD target keys (the
        self-attention is causal itself: `MultiHeadAttention(..., causal=True)`).
      cross_mask_B11S: bool [batch, 1, 1, src_len], non-PAD source keys.
      bias_HTT: the decoder stack's relative bias [heads, tgt_len, tgt_len], or None.
      deterministic: disables dropout.
    Returns:
      [batch, tgt_len, d_model].
    """
    x_BTD = _sublayer(
      self, 'self', x_BTD, deterministic, mask=self_mask_B11T, causal=True, bias=bias_HTT
    )
    cross_kv = self.cross_keys_values(enc_BSD)
    return self._cross_and_ff(x_BTD, cross_kv, cross_mask_B11S, deterministic=deterministic)

  def step(
    self, x_B1D, cross_kv, self_mask_B11T, cross_mask_B11S, bias_H1T, cache, layer: int, step
  ):
    """One cached decoding position (no dropout).

    Writes this position's self-attention key (rotated at `step` under 'rope') and value into
    layer `layer` of the cache at `step`, then attends over the whole cache with
    `self_mask_B11T` [batch, 1, 1, max_decode_len] (keys <= step that are not PAD), relative
    positions measured from `step` and the stack's bias row `bias_H1T` (or None); `cross_kv`
    is this layer's `cross_keys_values`, computed once per source.

    Returns:
      [batch, 1, d_model] and the updated cache.
    """
    h_B1D = self.self_residual.inputs(x_B1D)
    k_B1HD, v_B1HD = self.self_attention.keys_values(h_B1D, step[None])
    keys = _write(cache.keys, k_B1HD, layer, step)
    values = _write(cache.values, v_B1HD, layer, step)
    kv = tuple(jnp.swapaxes(cache_BHTD[layer], 1, 2) for cache_BHTD in (keys, values))
    h_B1D = self.self_attention(
      h_B1D, self_mask_B11T, deterministic=True, kv=kv, query_offset=step, bias=bias_H1T
    )
    x_B1D = self.self_residual.outputs(x_B1D, h_B1D, deterministic=True)
    x_B1D = self._cross_and_ff(x_B1D, cross_kv, cross_mask_B11S, deterministic=True)
    return x_B1D, cache._replace(keys=keys, values=values)


def _write(layers_BHTD: tuple, new_B1HD, layer: int, step) -> tuple:
  """Per-layer caches [batch, heads, max_decode_len, head_dim] with layer `layer`'s position
  `step` set to new [batch, 1, heads, head_dim]."""
  cache_BHTD = layers_BHTD[layer]
  new_BH1D = jnp.swapaxes(new_B1HD, 1, 2).astype(cache_BHTD.dtype)
  written = jax.lax.dynamic_update_slice(cache_BHTD, new_BH1D, (0, 0, step, 0))
  return (*layers_BHTD[:layer], written, *layers_BHTD[layer + 1 :])


class Transformer(nnx.Module):
  """Encoder-decoder Transformer with a shared source/target/softmax embedding.

  Usage:
    model = Transformer(config, rngs=nnx.Rngs(0))
    logits_BTV = model(src_BS, tgt_in_BT, deterministic=False)  # teacher forcing
    enc_BSD = model.encode(src_BS, deterministic=True)          # cached decoding
    context = model.decode_context(enc_BSD)
    cache = model.init_cache(batch, max_decode_len)
    logits_BV, cache = model.decode_step(context, src_BS, token_B, cache, step)
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    """Builds the model; `rngs`: 'params' (or default) stream for initialisation, 'dropout'
    (or default) for dropout."""
    self.position = config.position
    self.d_model, self.max_len = config.d_model, config.max_len
    self.num_heads, self.head_dim = config.num_heads, config.head_dim
    self.dtype = config.compute_dtype
    self.scan_layers, self.remat = config.scan_layers, config.remat  # how stacks run
    embedding_init = nnx.initializers.normal(config.d_model**-0.5)
    self.embed = nnx.Embed(
      config.vocab_size, config.d_model, dtype=self.dtype, embedding_init=embedding_init, rngs=rngs
    )
    table_shape = (config.max_len, config.d_model)
    self.position_table = (
      nnx.Param(embedding_init(rngs.params(), table_shape)) if self.position == 'learned' else None
    )
    self.dropout = layers.Dropout(config.dropout, bits=config.dropout_bits, rngs=rngs)
    self.encoder_layers = nnx.List(
      [EncoderLayer(config, rngs=rngs) for _ in range(config.encoder_layers)]
    )
    self.decoder_layers = nnx.List(
      [DecoderLayer(config, rngs=rngs) for _ in range(config.decoder_layers)]
    )
    self.encoder_bias, self.decoder_bias = (
      RelativeBias.from_config(
        config, bidirectional=bidirectional, kernel_init=_DENSE_INIT, rngs=rngs
      )
      for bidirectional in (True, False)
    )
    self.encoder_norm = _final_norm(config, rngs) if config.pre_layer_norm else None
    self.decoder_norm = _final_norm(config, rngs) if config.pre_layer_norm else None

  def _check_length(self, length: int, what: str):
    if self.position == 'learned' and length > self.max_len:
      raise ValueError(
        f'{what} length {length} exceeds max_len={self.max_len}, the rows of the learned '
        "position table (position='learned')"
      )

  @staticmethod
  def _bias(bias: RelativeBias | None, q_len: int, kv_len: int, query_offset=None):
    return None if bias is None else bias(q_len, kv_len, query_offset)

  def _embed(self, tokens_BT, positions_T, *, deterministic):
    """Scaled token embeddings plus absolute positions, after dropout: [batch, len, d_model]."""
    x_BTD = self.embed(tokens_BT) * self.d_model**0.5
    if self.position in TransformerConfig.SINUSOID_POSITIONS:
      x_BTD += attention.sinusoidal_embedding(positions_T, self.d_model).astype(self.dtype)
    elif self.position == 'learned':
      x_BTD += self.position_table[...][positions_T].astype(self.dtype)
    return self.dropout(x_BTD, deterministic=deterministic)

  def _logits(self, x_BTD):
    """Final LayerNorm (pre-LN) and tied softmax x Eᵀ in float32: [batch, len, vocab]."""
    if self.decoder_norm is not None:
      x_BTD = self.decoder_norm(x_BTD)
    embedding_VD = self.embed.embedding[...].astype(x_BTD.dtype)
    return jnp.einsum('btd,vd->btv', x_BTD, embedding_VD, preferred_element_type=jnp.float32)

  def encode(self, src_BS, *, deterministic: bool) -> jax.Array:
    """Encoder output [batch, src_len, d_model] (compute dtype) of int tokens [batch, src_len]."""
    self._check_length(src_BS.shape[1], 'source')
    mask_B11S = _key_mask(src_BS)
    src_len = src_BS.shape[1]
    x_BSD = self._embed(src_BS, jnp.arange(src_len), deterministic=deterministic)
    bias_HSS = self._bias(self.encoder_bias, src_len, src_len)

    def call(layer, x_BSD, _):
      return layer(x_BSD, mask_B11S, bias_HSS, deterministic=deterministic)

    x_BSD = layers.run_stack(
      self.encoder_layers, call, x_BSD, scan=self.scan_layers, remat=self.remat
    )
    return x_BSD if self.encoder_norm is None else self.encoder_norm(x_BSD)

  def decode(self, enc_BSD, src_BS, tgt_in_BT, *, deterministic: bool) -> jax.Array:
    """Teacher-forced logits.

    Args:
      enc_BSD: [batch, src_len, d_model] from `encode`.
      src_BS: int [batch, src_len], the source (for its PAD mask).
      tgt_in_BT: int [batch, tgt_len], the decoder input (BOS then the target shifted right).
      deterministic: disables dropout.
    Returns:
      float32 [batch, tgt_len, vocab]; position t predicts the token after tgt_in[:, t].
    """
    tgt_len = tgt_in_BT.shape[1]
    self._check_length(tgt_len, 'target')
    self_mask_B11T = _key_mask(tgt_in_BT)
    cross_mask_B11S = _key_mask(src_BS)
    x_BTD = self._embed(tgt_in_BT, jnp.arange(tgt_len), deterministic=deterministic)
    bias_HTT = self._bias(self.decoder_bias, tgt_len, tgt_len)

    def call(layer, x_BTD, _):
      masks = (self_mask_B11T, cross_mask_B11S)
      return layer(x_BTD, enc_BSD, *masks, bias_HTT, deterministic=deterministic)

    x_BTD = layers.run_stack(
      self.decoder_layers, call, x_BTD, scan=self.scan_layers, remat=self.remat
    )
    return self._logits(x_BTD)

  def __call__(self, src_BS, tgt_in_BT, *, deterministic: bool) -> jax.Array:
    """Teacher-forced logits, float32 [batch, tgt_len, vocab]; see `decode`."""
    enc_BSD = self.encode(src_BS, deterministic=deterministic)
    return self.decode(enc_BSD, src_BS, tgt_in_BT, deterministic=deterministic)

  def init_cache(self, batch_size: int, max_decode_len: int) -> DecodeCache:
    """Empty cache for decoding positions 0..max_decode_len-1 (zeros, no valid position)."""
    self._check_length(max_decode_len, 'max_decode_len')
    shape = (batch_size, self.num_heads, max_decode_len, self.head_dim)
    zeros = tuple(jnp.zeros(shape, self.dtype) for _ in self.decoder_layers)
    return DecodeCache(zeros, zeros, jnp.zeros((batch_size, max_decode_len), bool))

  def decode_context(self, enc_BSD) -> list:
    """Per decoder layer, the encoder-decoder (keys, values) [batch, src_len, heads, head_dim]
    of the encoder output [batch, src_len, d_model]: computed once, used at every step."""
    return [layer.cross_keys_values(enc_BSD) for layer in self.decoder_layers]

  def decode_step(self, context, src_BS, token_B, cache: DecodeCache, step):
    """Feeds the token at target position `step`, predicts the next one (no dropout).

    Args:
      context: `decode_context` of the encoder output (every leaf batch-leading).
      src_BS: int [batch, src_len], the source (for its PAD mask).
      token_B: int [batch], the decoder input at position `step` (BOS at step 0).
      cache: from `init_cache` or the previous step; holds positions 0..step-1.
      step: int32 scalar (may be traced), 0 <= step < max_decode_len.
    Returns:
      float32 logits [batch, vocab] for position step + 1's token, and the cache with this
      position's keys and values written at `step`.
    """
    step = jnp.asarray(step, jnp.int32)
    valid_BT = jax.lax.dynamic_update_slice(cache.valid, (token_B != PAD_ID)[:, None], (0, step))
    cache = cache._replace(valid=valid_BT)
    seen_T = jnp.arange(valid_BT.shape[1]) <= step
    self_mask_B11T = (seen_T[None, :] & valid_BT)[:, None, None, :]
    cross_mask_B11S = _key_mask(src_BS)
    x_B1D = self._embed(token_B[:, None], step[None], deterministic=True)
    bias_H1T = self._bias(self.decoder_bias, 1, valid_BT.shape[1], step)
    for index, (layer, cross_kv) in enumerate(zip(self.decoder_layers, context, strict=True)):
      x_B1D, cache = layer.step(
        x_B1D, cross_kv, self_mask_B11T, cross_mask_B11S, bias_H1T, cache, index, step
      )
    return self._logits(x_B1D)[:, 0], cache
