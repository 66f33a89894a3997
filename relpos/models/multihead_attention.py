"""Multi-head attention with the position scheme's relative terms: the one attention layer of
both models, and the one place that dispatches between the kernels of `relpos.attention`.

A model's `config.model.position` maps to what its self-attention layers do
(`relpos.constants.self_attention_kind`) and, for the bias schemes, to one `RelativeBias` per
stack of layers.

The layer projects queries, keys and values (no biases) to num_heads * head_dim (which need not
be d_model), splits heads, calls the kernel its `relative` kind names, and projects the heads
back. Keys and values are those of the queries' own inputs, or `kv` from `keys_values` of
another context: a decoding cache, a memory followed by the queries, the encoder output.

- 'none': `dot_product_attention` (absolute or no positions; encoder-decoder attention), with
  an optional additive logit `bias` [heads, q_len, kv_len] from the stack's `RelativeBias`
  (T5 buckets, ALiBi).
- 'shaw': `shaw_attention`, with this layer's [2k+1, head_dim] tables w^K / w^V shared by its
  heads (either may be left out: the keys-only and values-only ablations). `query_offset`
  places the queries among the keys, so cached decoding and a memory are exact.
- 'xl': `xl_attention`, with this layer's W_kR (`r_net`) projecting the sinusoids R of the
  distances; the biases u and v come from the caller, since Transformer-XL may share them
  across layers.
- 'rope': `dot_product_attention` on queries and keys rotated by `apply_rope` at their
  positions: keys at 0..kv_len-1 of their context (or the `positions` given to `keys_values`,
  so a decoding cache holds rotated keys), queries from `query_offset`. Only m - n reaches the
  logits, so cached decoding and a memory are exact here too.

Attention-probability dropout runs inside the kernels (`dropout_rate`, `dropout_rng`), in
training only, with a fresh key per call from this layer's own 'dropout' rng stream.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from relpos import attention
from relpos.attention.masking import default_query_offset, table_max_distance
from relpos.config.model_fields import ModelConfig
from relpos.constants import BIAS_POSITIONS
from relpos.models import layers

RELATIVE_SCHEMES = ('none', 'shaw', 'xl', 'rope')


class MultiHeadAttention(nnx.Module):
  """Attention of queries from x over keys and values, with the scheme's relative terms."""

  def __init__(self, config: ModelConfig, *, relative: str, kernel_init, rngs: nnx.Rngs):
    """Builds the projections [d_model, num_heads * head_dim] and the scheme's parameters.

    Args:
      config: the model's typed config; the layer reads its d_model, num_heads, head_dim and
        dtype, attention_dropout, and what its scheme reads: Shaw's k, tables and their start
        and the keys up to which its 'xla' kernels take their dense form ('shaw'), rope_base
        ('rope') and attention_implementation ('shaw', 'xl').
      relative: one of RELATIVE_SCHEMES (encoder-decoder attention is 'none' whatever the
        config's position).
      kernel_init: initializer of the projections, and of Shaw's tables.
      rngs: 'params' (or default) stream for initialisation, 'dropout' (or default) for
        attention dropout.
    """
    if relative not in RELATIVE_SCHEMES:
      raise ValueError(f'relative must be one of {RELATIVE_SCHEMES}, got {relative!r}')
    self.relative, self.num_heads, self.head_dim = relative, config.num_heads, config.head_dim
    self.dtype, self.attention_dropout = config.compute_dtype, config.attention_dropout
    self.rope_base, self.implementation = config.rope_base, config.attention_implementation
    self.shaw_dense_max_kv_len = config.shaw_dense_max_kv_len
    width = config.num_heads * config.head_dim

    def linear(fan_in, fan_out):
      return layers.linear(
        fan_in, fan_out, self.dtype, rngs, kernel_init=kernel_init, use_bias=False
      )

    self.query, self.key, self.value = (linear(config.d_model, width) for _ in range(3))
    self.output = linear(width, config.d_model)
    self.r_net = linear(config.d_model, width) if relative == 'xl' else None

    def table(wanted):
      if relative != 'shaw' or not wanted:
        return None
      zeros = config.relative_table_init == 'zeros'
      init = nnx.initializers.zeros_init() if zeros else kernel_init
      # A key is drawn either way, so the init leaves every other parameter's draw unchanged.
      start = init(rngs.params(), (2 * config.max_relative_position + 1, config.head_dim))
      return nnx.Param(start * config.relative_table_init_scale)

    self.rel_key = table(config.relative_keys)
    self.rel_value = table(config.relative_values)
    # Forked whatever the rate, so the rate never changes the initialisation.
    self.dropout_rngs = rngs['dropout'].fork()

  def _heads(self, x_BTF):
    """[..., num_heads * head_dim] -> [..., num_heads, head_dim]."""
    return x_BTF.reshape(*x_BTF.shape[:-1], self.num_heads, self.head_dim)

  def _rotate(self, x_BTHD, positions_T):
    return attention.apply_rope(x_BTHD, positions_T, base=self.rope_base)

  def keys_values(self, x_BKD, positions_K=None):
    """Keys and values [batch, kv_len, heads, head_dim] of the context [batch, kv_len, d_model].

    'rope' rotates the keys at `positions_K` (int [kv_len], may be traced; None: 0..kv_len-1).
    """
    k_BKHD = self._heads(self.key(x_BKD))
    if self.relative == 'rope':
      if positions_K is None:
        positions_K = jnp.arange(x_BKD.shape[1])
      k_BKHD = self._rotate(k_BKHD, positions_K)
    return k_BKHD, self._heads(self.value(x_BKD))

  def __call__(
    self,
    x_BQD,
    mask,
    *,
    deterministic: bool,
    causal: bool = False,
    kv=None,
    query_offset=None,
    xl_terms=None,
    bias=None,
  ) -> jax.Array:
    """Attention of the queries from x over keys and values.

    Args:
      x_BQD: [batch, q_len, d_model], the query inputs.
      mask: None or bool broadcastable to [batch, heads, q_len, kv_len], True = may attend.
      deterministic: disables attention dropout.
      causal: also mask every key after its query (at `query_offset`). 'xl' is causal whatever
        this says and 'shaw' hands it to its kernel, so for both a keys-only `mask`
        ([.., 1, kv_len]) keeps the call O(length); the others get the causal mask as an array.
      kv: (keys, values) [batch, kv_len, heads, head_dim] from `keys_values` of another
        context (a decoding cache, a memory before x, the encoder output); None: self-attention,
        those of x.
      query_offset: 'shaw', 'rope': the position of query 0 among the keys (int or traced
        scalar); None means the queries are the last q_len keys.
      xl_terms: 'xl' only: (r_KD [kv_len, d_model], the sinusoids R of distances 0..kv_len-1;
        u_HD, v_HD [heads, head_dim], the content and position biases).
      bias: 'none' and 'rope' only: float [heads, q_len, kv_len] (or broadcastable to
        [batch, heads, q_len, kv_len]) added to the logits, a `RelativeBias`'s; or None.
    Returns:
      [batch, q_len, d_model].
    """
    q_BQHD = self._heads(self.query(x_BQD))
    k_BKHD, v_BKHD = self.keys_values(x_BQD) if kv is None else kv
    if self.relative == 'rope':
      q_len, kv_len = q_BQHD.shape[1], k_BKHD.shape[1]
      if query_offset is None:
        query_offset = default_query_offset(q_len, kv_len)
      q_BQHD = self._rotate(q_BQHD, jnp.arange(q_len) + query_offset)
    if causal and self.relative not in ('xl', 'shaw'):
      mask = attention.with_causal(
        mask, q_BQHD.shape[1], k_BKHD.shape[1], query_offset=query_offset
      )
    kwargs = {'mask': mask}
    if self.attention_dropout > 0 and not deterministic:
      kwargs.update(dropout_rate=self.attention_dropout, dropout_rng=self.dropout_rngs())
    if self.relative in ('xl', 'shaw'):
      kwargs['implementation'] = self.implementation
    if self.relative == 'xl':
      r_KD, u_HD, v_HD = xl_terms
      rel_key_KHD = self._heads(self.r_net(r_KD))
      u_HD, v_HD = u_HD.astype(self.dtype), v_HD.astype(self.dtype)
      heads_BQHD = attention.xl_attention(q_BQHD, k_BKHD, v_BKHD, rel_key_KHD, u_HD, v_HD, **kwargs)
    elif self.relative == 'shaw':
      rel_key, rel_value = (
        None if t is None else t[...].astype(self.dtype) for t in (self.rel_key, self.rel_value)
      )
      heads_BQHD = attention.shaw_attention(
        q_BQHD,
        k_BKHD,
        v_BKHD,
        rel_key,
        rel_value,
        causal=causal,
        query_offset=query_offset,
        dense_max_kv_len=self.shaw_dense_max_kv_len,
        **kwargs,
      )
    else:
      heads_BQHD = attention.dot_product_attention(q_BQHD, k_BKHD, v_BKHD, bias=bias, **kwargs)
    return self.output(heads_BQHD.reshape(*heads_BQHD.shape[:2], -1))


def clip_shaw_tables(model: nnx.Module, max_relative_position: int) -> None:
  """Clips the Shaw distances of every attention layer in `model` at `max_relative_position`
  (k'), in place: each [.., 2k+1, head_dim] table keeps its rows for -k'..k'.

  The kernels clip a distance to the table's own k and read the row k + d, so the kept rows
  make a model that treats every distance beyond k' as the trained model treats k': what a
  trained model loses when its tables are clipped shorter says how much it uses the rows it
  no longer sees. Stacked tables (scanned layers) keep the same rows of every layer.

  Raises:
    ValueError: k' < 0, or a table with fewer than 2k' + 1 rows.
  """
  for _, module in nnx.iter_modules(model):
    if not isinstance(module, MultiHeadAttention):
      continue
    for table in (module.rel_key, module.rel_value):
      if table is None:
        continue
      trained = table_max_distance(table)
      if not 0 <= max_relative_position <= trained:
        raise ValueError(
          f'cannot clip Shaw tables of k = {trained} at {max_relative_position}: '
          f'k must be between 0 and {trained}'
        )
      table.set_value(
        table[..., trained - max_relative_position : trained + max_relative_position + 1, :]
      )


class RelativeBias(nnx.Module):
  """The logit bias of a distance, shared by the layers of one stack: T5's or ALiBi's.

  - 't5': a learned table [num_buckets, heads] read at `t5_relative_buckets` (exact distances
    up to num_buckets/2 per side, log-spaced buckets up to max_distance, one side when causal).
    T5 shares it across the layers of a stack and so does relpos: the encoder, the decoder and
    the character LM each own one.
  - 'alibi': -slope_h * |j - pos_i| with the paper's fixed head slopes; no parameters.

  Calling it gives float32 [heads, q_len, kv_len] for queries at query_offset.. (None: the last
  q_len keys), which the stack's layers pass to `MultiHeadAttention` as `bias`.
  """

  def __init__(self, config: ModelConfig, *, bidirectional: bool, kernel_init, rngs: nnx.Rngs):
    """The bias of config.position (one of BIAS_POSITIONS) with config.num_heads heads and,
    for 't5', config.t5_num_buckets and t5_max_distance; `bidirectional`: both directions
    (encoder self-attention) or the past only."""
    if config.position not in BIAS_POSITIONS:
      raise ValueError(
        f'RelativeBias position must be one of {BIAS_POSITIONS}, got {config.position!r}'
      )
    self.position, self.num_heads = config.position, config.num_heads
    self.bidirectional, self.max_distance = bidirectional, config.t5_max_distance
    shape = (config.t5_num_buckets, config.num_heads)
    self.table = nnx.Param(kernel_init(rngs.params(), shape)) if config.position == 't5' else None

  @classmethod
  def from_config(
    cls, config: ModelConfig, *, bidirectional: bool, kernel_init, rngs: nnx.Rngs
  ) -> 'RelativeBias | None':
    """The bias of a stack under config.position, or None for positions without one."""
    if config.position not in BIAS_POSITIONS:
      return None
    return cls(config, bidirectional=bidirectional, kernel_init=kernel_init, rngs=rngs)

  def __call__(self, q_len: int, kv_len: int, query_offset=None) -> jax.Array:
    if self.position == 't5':
      return attention.t5_relative_bias(
        self.table[...],
        q_len,
        kv_len,
        max_distance=self.max_distance,
        bidirectional=self.bidirectional,
        query_offset=query_offset,
      ).astype(jnp.float32)
    slopes_H = attention.alibi_slopes(self.num_heads)
    return attention.alibi_bias(slopes_H, q_len, kv_len, query_offset=query_offset)
