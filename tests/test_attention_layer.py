"""The attention layer both models share (relpos.models.multihead_attention.MultiHeadAttention):
every
attention of both models is one, and its queries may sit anywhere among longer keys."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos import attention
from relpos.config.char_lm_defaults import char_lm_config
from relpos.config.translation_defaults import translate_config
from relpos.models.multihead_attention import MultiHeadAttention
from relpos.models.transformer import Transformer, TransformerConfig
from relpos.models.transformer_xl import TransformerXL, TransformerXLConfig

pytestmark = pytest.mark.usefixtures('attention_test_config')

D_MODEL, HEADS, HEAD_DIM, KV_LEN = 12, 2, 8, 7  # projections 12 -> 16 -> 12


def make_layer(relative, **fields):
  """The layer of a typed model config (the declared defaults, these sizes and `fields`)."""
  config = TransformerXLConfig(
    vocab_size=1, d_model=D_MODEL, num_heads=HEADS, head_dim=HEAD_DIM, max_relative_position=2
  )
  return MultiHeadAttention(
    dataclasses.replace(config, **fields),
    relative=relative,
    kernel_init=nnx.initializers.normal(0.5),  # large enough for positions to matter
    rngs=nnx.Rngs(0),
  )


def inputs(relative):
  """x [2, KV_LEN, D_MODEL] and the layer's xl_terms ('xl') or None."""
  rng = np.random.default_rng(0)
  x_BKD = jnp.asarray(rng.standard_normal((2, KV_LEN, D_MODEL)), jnp.float32)
  if relative != 'xl':
    return x_BKD, None
  r_KD = attention.xl_relative_encoding(KV_LEN, D_MODEL)
  u_HD, v_HD = jnp.asarray(rng.standard_normal((2, HEADS, HEAD_DIM)), jnp.float32)
  return x_BKD, (r_KD, u_HD, v_HD)


def causal(q_len, kv_len, query_offset=None):
  return attention.causal_mask(q_len, kv_len, query_offset=query_offset)


@pytest.mark.parametrize('relative', ('none', 'shaw', 'xl'))
def test_queries_may_be_the_last_of_longer_keys(relative):
  """Queries of the last 3 positions over keys of all 7 (a memory before them): the last 3 rows
  of causal self-attention over all 7."""
  layer = make_layer(relative)
  x_BKD, xl_terms = inputs(relative)
  whole = layer(x_BKD, causal(KV_LEN, KV_LEN), deterministic=True, xl_terms=xl_terms)
  assert whole.shape == (2, KV_LEN, D_MODEL)
  kv = layer.keys_values(x_BKD)
  assert kv[0].shape == (2, KV_LEN, HEADS, HEAD_DIM)
  last = layer(x_BKD[:, -3:], causal(3, KV_LEN), deterministic=True, kv=kv, xl_terms=xl_terms)
  np.testing.assert_allclose(np.asarray(last), np.asarray(whole[:, -3:]), rtol=0, atol=1e-5)


@pytest.mark.parametrize('relative', ('none', 'shaw'))
def test_query_offset_places_queries_among_the_keys(relative):
  """Queries at positions 2 and 3 of 7 keys (a decoding cache with unwritten slots past them):
  rows 2 and 3 of causal self-attention, relative positions included."""
  layer = make_layer(relative)
  x_BKD, _ = inputs(relative)
  whole = layer(x_BKD, causal(KV_LEN, KV_LEN), deterministic=True)
  kv = layer.keys_values(x_BKD)
  mask = causal(2, KV_LEN, query_offset=2)
  middle = layer(x_BKD[:, 2:4], mask, deterministic=True, kv=kv, query_offset=2)
  np.testing.assert_allclose(np.asarray(middle), np.asarray(whole[:, 2:4]), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
  'relative_keys,relative_values', [(True, True), (True, False), (False, True)]
)
def test_shaw_tables_follow_the_ablation(relative_keys, relative_values):
  layer = make_layer('shaw', relative_keys=relative_keys, relative_values=relative_values)
  tables = {name: getattr(layer, name) for name in ('rel_key', 'rel_value')}
  assert {name: table is not None for name, table in tables.items()} == {
    'rel_key': relative_keys,
    'rel_value': relative_values,
  }
  assert all(table.shape == (5, HEAD_DIM) for table in tables.values() if table is not None)
  assert make_layer('xl').r_net.kernel.shape == (D_MODEL, HEADS * HEAD_DIM)
  assert make_layer('none').rel_key is None and make_layer('none').r_net is None


def attention_layers(model):
  """{path: relative scheme} of every MultiHeadAttention in the model."""
  return {
    '/'.join(map(str, path)): module.relative
    for path, module in nnx.iter_modules(model)
    if isinstance(module, MultiHeadAttention)
  }


def test_both_models_attend_through_the_shared_layer():
  """Translation: Shaw in self-attention, none in encoder-decoder attention; char LM: its
  position scheme in every layer, Shaw's keys-only / values-only ablation included."""
  section = translate_config().model
  section.update(encoder_layers=1, decoder_layers=1, d_model=16, num_heads=2, d_ff=16)
  translate = Transformer(TransformerConfig.from_section(section, vocab_size=8), rngs=nnx.Rngs(0))
  assert attention_layers(translate) == {
    'encoder_layers/0/self_attention': 'shaw',
    'decoder_layers/0/self_attention': 'shaw',
    'decoder_layers/0/cross_attention': 'none',
  }
  section = char_lm_config().model
  section.update(num_layers=2, d_model=16, num_heads=2, head_dim=4, d_ff=16)
  section.update(position='shaw', relative_keys=False)
  char_lm = TransformerXL(TransformerXLConfig.from_section(section, vocab_size=8), rngs=nnx.Rngs(0))
  assert attention_layers(char_lm) == {'layers/0/attention': 'shaw', 'layers/1/attention': 'shaw'}
  assert char_lm.layers[0].attention.rel_key is None
  assert char_lm.layers[0].attention.query.kernel.shape == (16, 8)  # 2 heads of 4
  tokens_BT = jnp.asarray(np.random.default_rng(1).integers(0, 8, (2, 5)), jnp.int32)
  apply = nnx.jit(lambda model, tokens, memory: model(tokens, memory, deterministic=True))
  logits_BTV, _ = apply(char_lm, tokens_BT, char_lm.init_memory(2, 3))  # op by op: seconds
  assert logits_BTV.shape == (2, 5, 8) and bool(jnp.all(jnp.isfinite(logits_BTV)))


def test_attention_dropout_needs_training_and_a_rate():
  """deterministic=True or rate 0: the layer of the same seed without dropout; training with a
  rate: a fresh mask per call."""
  x_BKD, _ = inputs('shaw')
  mask = causal(KV_LEN, KV_LEN)
  clean = make_layer('shaw')(x_BKD, mask, deterministic=False)
  layer = make_layer('shaw', attention_dropout=0.5)
  np.testing.assert_array_equal(layer(x_BKD, mask, deterministic=True), clean)
  first, second = (layer(x_BKD, mask, deterministic=False) for _ in range(2))
  assert float(jnp.abs(first - clean).max()) > 1e-3
  assert float(jnp.abs(second - first).max()) > 1e-3
  assert jax.tree.structure(nnx.state(layer, nnx.Param)) == jax.tree.structure(
    nnx.state(make_layer('shaw'), nnx.Param)
  )
