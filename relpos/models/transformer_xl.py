"""Transformer-XL character language model (Dai et al. 2019), in Flax NNX.

Follows the original kimiyoung/transformer-xl PyTorch code (enwik8 setting, `div_val=1`,
tied input/output embeddings): embedding scaled by sqrt(d_model), post-LN decoder layers (or
pre-LN, without a final LayerNorm, as the original), segment-level recurrence with a memory of
each layer's input states, `same_length` and `clamp_len`.

The position scheme is a config choice, the rest of the model being identical:

- 'xl': relative attention `relpos.attention.xl_attention` with R = sinusoids of distances,
  `W_kR` (`r_net`) per layer and biases u, v (per layer if `untie_r`, else shared).
- 'shaw': `relpos.attention.shaw_attention` with per-layer [2k+1, d_head] tables, shared by the
  heads, for keys and values.
- 'absolute': sinusoids of the position within the current segment (0..T-1) added to the
  embeddings. Positions restart every segment, so memory states carry the positions of their
  own segment: segment-wise evaluation is NOT the same as one pass over the whole sequence.
- 'none': no position information at all.

Attention-probability dropout (`dropatt`, as in the original) applies in training only
(`deterministic=False`), inside the kernels (their `dropout_rate` / `dropout_rng`). Its keys
come from the rng stream of the attention block's residual dropout, so it adds no state and
leaves the initialisation unchanged.

Memory has a fixed shape for `jit`: `mem_len` slots per layer of which the trailing
`Memory.length` are valid; invalid slots are masked out of the attention.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from relpos import attention
from relpos.models import layers

ATTENTION_MODES = ('xl', 'shaw', 'absolute', 'none')
_INIT = nnx.initializers.normal(0.02)  # the original's `init_std` for weights and embeddings
_LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default


class Memory(NamedTuple):
  """Segment-level recurrence state (a pytree).

  Attributes:
    hidden: [n_layer, batch, mem_len, d_model]; hidden[l] holds the inputs of layer l at the
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


def attention_mask(q_len: int, mem_len: int, length, *, same_length: bool) -> jax.Array:
  """Keys a query may attend over [memory; segment]: bool [q_len, mem_len + q_len].

  Causal, only the trailing `length` (int or traced int32 scalar) of the mem_len memory slots,
  and with `same_length` the original's same-length window.
  """
  kv_len = mem_len + q_len
  valid_K = jnp.arange(kv_len) >= mem_len - length
  mask_QK = attention.causal_mask(q_len, kv_len) & valid_K[None, :]
  if same_length:
    if mem_len == 0:
      raise ValueError('same_length needs mem_len > 0: with no memory no key is visible')
    mask_QK &= same_length_mask(q_len, mem_len)
  return mask_QK


_linear = functools.partial(layers.linear, kernel_init=_INIT)
_layer_norm = functools.partial(layers.layer_norm, epsilon=_LAYER_NORM_EPSILON)


def check_config(config):
  """Raises ValueError for a config the model cannot honour."""
  if config.attention not in ATTENTION_MODES:
    raise ValueError(
      f'config.model.attention must be one of {ATTENTION_MODES}, got {config.attention!r}'
    )
  layers.check_dtype(config)
  if not 0 <= config.dropatt < 1:
    raise ValueError(f'config.model.dropatt must be in [0, 1), got {config.dropatt}')
  if config.attention in ('xl', 'absolute') and config.d_model % 2:
    raise ValueError(
      f'sinusoidal positions need an even d_model (config.model.d_model), got {config.d_model}'
    )
  if config.attention == 'shaw' and config.max_relative_position < 0:
    raise ValueError(
      f'config.model.max_relative_position must be >= 0, got {config.max_relative_position}'
    )
  if config.mem_len < 0:
    raise ValueError(f'config.model.mem_len must be >= 0, got {config.mem_len}')


class MemoryAttention(nnx.Module):
  """Multi-head attention of a segment over [memory; segment], then residual and LayerNorm."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.mode = config.attention
    self.n_head, self.d_head = config.n_head, config.d_head
    self.pre_lnorm = config.pre_lnorm
    self.dtype = layers.compute_dtype(config)
    width = config.n_head * config.d_head
    self.query = _linear(config.d_model, width, config, rngs, use_bias=False)
    self.key = _linear(config.d_model, width, config, rngs, use_bias=False)
    self.value = _linear(config.d_model, width, config, rngs, use_bias=False)
    self.output = _linear(width, config.d_model, config, rngs, use_bias=False)
    self.norm = _layer_norm(config, rngs)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    self.dropatt = config.dropatt
    if self.mode == 'xl':
      self.r_net = _linear(config.d_model, width, config, rngs, use_bias=False)
    if self.mode == 'shaw':
      rows = 2 * config.max_relative_position + 1
      self.rel_key = nnx.Param(_INIT(rngs.params(), (rows, config.d_head)))
      self.rel_value = nnx.Param(_INIT(rngs.params(), (rows, config.d_head)))

  def _heads(self, x_BTF):
    """[..., n_head * d_head] -> [..., n_head, d_head]."""
    return x_BTF.reshape(*x_BTF.shape[:-1], self.n_head, self.d_head)

  def _attend(self, q_BQHD, k_BKHD, v_BKHD, mask_QK, r_KD, biases, *, deterministic):
    kwargs = dict(mask=mask_QK)
    if self.dropatt > 0 and not deterministic:
      # A fresh key per call, drawn from the residual dropout's stream as nnx.Dropout draws it.
      kwargs.update(dropout_rate=self.dropatt, dropout_rng=self.dropout.rngs())
    if self.mode == 'xl':
      rel_key_KHD = self._heads(self.r_net(r_KD))
      u_HD, v_HD = (bias.astype(self.dtype) for bias in biases)
      return attention.xl_attention(q_BQHD, k_BKHD, v_BKHD, rel_key_KHD, u_HD, v_HD, **kwargs)
    if self.mode == 'shaw':
      rel_key, rel_value = (t[...].astype(self.dtype) for t in (self.rel_key, self.rel_value))
      return attention.shaw_attention(q_BQHD, k_BKHD, v_BKHD, rel_key, rel_value, **kwargs)
    return attention.dot_product_attention(q_BQHD, k_BKHD, v_BKHD, **kwargs)

  def __call__(self, x_BQD, memory_BMD, mask_QK, r_KD, biases, *, deterministic: bool):
    """Attention block of one layer.

    Args:
      x_BQD: [batch, q_len, d_model], the layer input for the current segment.
      memory_BMD: [batch, mem_len, d_model], the layer input at the memory positions.
      mask_QK: bool [q_len, mem_len + q_len], True = may attend.
      r_KD: 'xl' only (else None): [mem_len + q_len, d_model], R_t for distances t.
      biases: 'xl' only (else None): (u, v), each [n_head, d_head].
      deterministic: disables dropout, of the attention probabilities (dropatt) included.
    Returns:
      [batch, q_len, d_model].
    """
    context_BKD = jnp.concatenate([memory_BMD, x_BQD], axis=1)
    if self.pre_lnorm:
      context_BKD = self.norm(context_BKD)
    q_BQHD = self._heads(self.query(context_BKD[:, -x_BQD.shape[1] :]))
    k_BKHD, v_BKHD = self._heads(self.key(context_BKD)), self._heads(self.value(context_BKD))
    heads_BQHD = self._attend(
      q_BQHD, k_BKHD, v_BKHD, mask_QK, r_KD, biases, deterministic=deterministic
    )
    out_BQD = self.output(heads_BQHD.reshape(*heads_BQHD.shape[:2], -1))
    out_BQD = self.dropout(out_BQD, deterministic=deterministic)
    return x_BQD + out_BQD if self.pre_lnorm else self.norm(x_BQD + out_BQD)


class PositionwiseFF(nnx.Module):
  """Linear, ReLU, dropout, Linear, dropout; then residual and LayerNorm (pre- or post-)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.pre_lnorm = config.pre_lnorm
    self.inner = _linear(config.d_model, config.d_inner, config, rngs)
    self.outer = _linear(config.d_inner, config.d_model, config, rngs)
    self.norm = _layer_norm(config, rngs)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

  def __call__(self, x_BTD, *, deterministic: bool):
    h_BTD = self.norm(x_BTD) if self.pre_lnorm else x_BTD
    h_BTF = self.dropout(jax.nn.relu(self.inner(h_BTD)), deterministic=deterministic)
    h_BTD = self.dropout(self.outer(h_BTF), deterministic=deterministic)
    return x_BTD + h_BTD if self.pre_lnorm else self.norm(x_BTD + h_BTD)


class DecoderLayer(nnx.Module):
  """Attention block then position-wise feed-forward block."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.attention = MemoryAttention(config, rngs=rngs)
    self.ff = PositionwiseFF(config, rngs=rngs)

  def __call__(self, x_BQD, memory_BMD, mask_QK, r_KD, biases, *, deterministic: bool):
    """See `MemoryAttention.__call__`; returns [batch, q_len, d_model]."""
    x_BQD = self.attention(x_BQD, memory_BMD, mask_QK, r_KD, biases, deterministic=deterministic)
    return self.ff(x_BQD, deterministic=deterministic)


class TransformerXL(nnx.Module):
  """Transformer-XL language model with segment-level recurrence.

  Usage:
    model = TransformerXL(config, rngs=nnx.Rngs(0))
    memory = model.init_memory(batch_size)
    logits_BTV, memory = model(tokens_BT, memory, deterministic=False)
  """

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    """Builds the model.

    Args:
      config: vocab_size, n_layer, d_model, n_head, d_head, d_inner, dropout, dropatt
        (attention-probability dropout, in [0, 1)), tgt_len (unused: any segment length
        works), mem_len (default memory size), clamp_len (<= 0: none), same_length, untie_r,
        pre_lnorm, attention (one of ATTENTION_MODES), max_relative_position ('shaw'), dtype
        ('float32' | 'bfloat16', compute dtype; parameters stay float32).
      rngs: 'params' (or default) stream for initialisation; 'dropout' (or default) for
        dropout and dropatt.
    """
    check_config(config)
    self.mode = config.attention
    self.n_layer, self.d_model = config.n_layer, config.d_model
    self.mem_len = config.mem_len
    self.clamp_len = config.clamp_len if config.clamp_len > 0 else None
    self.same_length = config.same_length
    self.untie_r = config.untie_r
    self.dtype = layers.compute_dtype(config)
    self.embed = nnx.Embed(
      config.vocab_size, config.d_model, dtype=self.dtype, embedding_init=_INIT, rngs=rngs
    )
    self.output_bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32))
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    self.layers = nnx.List([DecoderLayer(config, rngs=rngs) for _ in range(config.n_layer)])
    if self.mode == 'xl':
      per_layer = (config.n_layer,) if config.untie_r else ()
      shape = (*per_layer, config.n_head, config.d_head)
      self.content_bias = nnx.Param(_INIT(rngs.params(), shape))  # u (r_w_bias)
      self.position_bias = nnx.Param(_INIT(rngs.params(), shape))  # v (r_r_bias)

  def init_memory(self, batch_size: int, mem_len: int | None = None) -> Memory:
    """Empty memory: zeros [n_layer, batch_size, mem_len, d_model], length 0.

    `mem_len` defaults to config.mem_len; eval may use another one.
    """
    mem_len = self.mem_len if mem_len is None else mem_len
    hidden = jnp.zeros((self.n_layer, batch_size, mem_len, self.d_model), self.dtype)
    return Memory(hidden, jnp.zeros((), jnp.int32))

  def _embed(self, tokens_BT, *, deterministic):
    x_BTD = self.embed(tokens_BT) * self.d_model**0.5
    if self.mode == 'absolute':
      positions_TD = attention.sinusoidal_embedding(jnp.arange(tokens_BT.shape[1]), self.d_model)
      x_BTD += positions_TD.astype(self.dtype)
    return self.dropout(x_BTD, deterministic=deterministic)

  def _relative_encoding(self, kv_len, *, deterministic):
    """'xl': R_t for t = 0..kv_len-1 after dropout, [kv_len, d_model]; otherwise None."""
    if self.mode != 'xl':
      return None
    r_KD = attention.xl_relative_encoding(kv_len, self.d_model, clamp_len=self.clamp_len)
    return self.dropout(r_KD, deterministic=deterministic)

  def _biases(self, layer):
    """'xl': (u, v) of layer `layer`, each [n_head, d_head]; otherwise None."""
    if self.mode != 'xl':
      return None
    u, v = self.content_bias[...], self.position_bias[...]
    return (u[layer], v[layer]) if self.untie_r else (u, v)

  def _logits(self, h_BTD):
    """Tied output softmax: h Eᵀ + b, accumulated in float32: [batch, time, vocab]."""
    embedding_VD = self.embed.embedding[...].astype(h_BTD.dtype)
    logits_BTV = jnp.einsum('btd,vd->btv', h_BTD, embedding_VD, preferred_element_type=jnp.float32)
    return logits_BTV + self.output_bias[...]

  def __call__(self, tokens_BT, memory: Memory, *, deterministic: bool):
    """Runs one segment.

    Args:
      tokens_BT: int [batch, q_len], any q_len.
      memory: from `init_memory` or the previous call; its mem_len is its own.
      deterministic: disables dropout.
    Returns:
      logits [batch, q_len, vocab] float32, and the new memory: the last mem_len of
      [memory; this segment's layer inputs], under stop_gradient. The incoming memory is put
      under stop_gradient too, so no gradient ever crosses a segment boundary.
    """
    batch, q_len = tokens_BT.shape
    if memory.hidden.shape[:2] != (self.n_layer, batch):
      raise ValueError(
        f'memory.hidden {memory.hidden.shape} does not match n_layer={self.n_layer}, batch={batch}'
      )
    memory_LBMD = jax.lax.stop_gradient(memory.hidden).astype(self.dtype)
    mem_len = memory_LBMD.shape[2]
    mask_QK = attention_mask(q_len, mem_len, memory.length, same_length=self.same_length)
    r_KD = self._relative_encoding(mem_len + q_len, deterministic=deterministic)
    x_BQD = self._embed(tokens_BT, deterministic=deterministic)
    inputs = []
    for layer_index, layer in enumerate(self.layers):
      inputs.append(x_BQD)
      x_BQD = layer(
        x_BQD,
        memory_LBMD[layer_index],
        mask_QK,
        r_KD,
        self._biases(layer_index),
        deterministic=deterministic,
      )
    logits_BQV = self._logits(self.dropout(x_BQD, deterministic=deterministic))
    return logits_BQV, _update_memory(memory_LBMD, memory.length, jnp.stack(inputs))


def _update_memory(memory_LBMD, length, inputs_LBQD) -> Memory:
  """The last mem_len of [memory; inputs] along time, length = min(length + q_len, mem_len)."""
  mem_len, q_len = memory_LBMD.shape[2], inputs_LBQD.shape[2]
  both_LBKD = jnp.concatenate([memory_LBMD, inputs_LBQD], axis=2)
  hidden = jax.lax.stop_gradient(both_LBKD[:, :, q_len:])
  return Memory(hidden, jnp.minimum(length + q_len, mem_len).astype(jnp.int32))
