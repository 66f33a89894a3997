"""Encoder-decoder Transformer (relpos.models.transformer): cached decoding, masks, positions,
Shaw tables, config errors, gradients, dtypes, dropout sites and a float64 reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from flax import nnx
from helpers import built_once, slow_where

from relpos.config.translation_defaults import translate_config
from relpos.constants import BOS_ID, EOS_ID, PAD_ID, TRANSLATE_POSITIONS
from relpos.models import layers
from relpos.models import transformer as tr
from relpos.models.multihead_attention import clip_shaw_tables

pytestmark = pytest.mark.usefixtures('attention_test_config')

VOCAB = 13
BOS, EOS, PAD = BOS_ID, EOS_ID, PAD_ID
# Each variant of the position scheme, including the paper's Table 4 ablations.
VARIANTS = {
  'absolute': dict(position='absolute'),
  'learned': dict(position='learned'),
  'shaw': dict(position='shaw'),
  'shaw_absolute': dict(position='shaw_absolute'),
  'none': dict(position='none'),
  't5': dict(position='t5'),
  'alibi': dict(position='alibi'),
  'rope': dict(position='rope'),
  'shaw-keys_only': dict(position='shaw', relative_values=False),
  'shaw-values_only': dict(position='shaw', relative_keys=False),
}


def make_config(**overrides):
  """A tiny model: d_model 16, 2 heads, 1 + 2 layers, k = 2, max_len 16, 8 T5 buckets that
  reach the log-spaced ones within the tests' lengths."""
  config = translate_config().model
  config.update(
    dict(
      encoder_layers=1,
      decoder_layers=2,
      d_model=16,
      num_heads=2,
      d_ff=32,
      max_relative_position=2,
      max_len=16,
      t5_num_buckets=8,
      t5_max_distance=12,
    )
  )
  config.update(overrides)
  return tr.TransformerConfig.from_section(config, vocab_size=VOCAB)


def make_model(seed=0, **overrides):
  """A fresh model (its own variables), built once per seed and config (`built_once`)."""
  config = make_config(**overrides)
  return built_once((seed, config), lambda: tr.Transformer(config, rngs=nnx.Rngs(seed)))


def sentences(lengths, total, seed, start=()):
  """int32 [len(lengths), total]: `start`, random non-special tokens, EOS, then PAD."""
  rng = np.random.default_rng(seed)
  rows = np.full((len(lengths), total), PAD, np.int32)
  for row, length in enumerate(lengths):
    body = rng.integers(3, VOCAB, length - 1 - len(start))
    rows[row, :length] = [*start, *body, EOS]
  return jnp.asarray(rows)


# Source rows of 7, 4 and 2 tokens; decoder inputs (BOS first) of 9, 5 and 3.
SRC = sentences([7, 4, 2], 7, seed=0)
TGT_IN = sentences([9, 5, 3], 9, seed=1, start=(BOS,))


@nnx.jit
def forward(model, src_BS, tgt_in_BT):
  return model(src_BS, tgt_in_BT, deterministic=True)


@nnx.jit
def encode(model, src_BS):
  return model.encode(src_BS, deterministic=True)


@nnx.jit
def decode_step(model, enc_BSD, src_BS, token_B, cache, step):
  return model.decode_step(model.decode_context(enc_BSD), src_BS, token_B, cache, step)


@nnx.jit
def cached_logits(model, src_BS, tgt_in_BT, cache):
  """Logits of every target position by `decode_step` in a fori_loop (the step is traced)."""
  context = model.decode_context(model.encode(src_BS, deterministic=True))

  def body(step, carry):
    cache, logits_BTV = carry
    logits_BV, cache = model.decode_step(context, src_BS, tgt_in_BT[:, step], cache, step)
    return cache, logits_BTV.at[:, step].set(logits_BV)

  logits_BTV = jnp.zeros((*tgt_in_BT.shape, VOCAB), jnp.float32)
  return jax.lax.fori_loop(0, tgt_in_BT.shape[1], body, (cache, logits_BTV))


def garbage_cache(model, batch, max_decode_len):
  """A cache whose unwritten slots hold noise and claim to be valid: all must be masked."""
  cache = model.init_cache(batch, max_decode_len)
  rng = np.random.default_rng(2)
  noise = tuple(jnp.asarray(rng.standard_normal(layer.shape), layer.dtype) for layer in cache.keys)
  return cache._replace(
    keys=noise, values=tuple(-layer for layer in noise), valid=jnp.ones_like(cache.valid)
  )


def max_diff(a, b):
  return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


# --------------------------------------------------------------------------------------------
# 1. Cached decoding (relative positions from the traced step) equals teacher forcing.


@pytest.mark.parametrize(
  'variant',
  # Slow tier: learned (absolute's path with a table instead of sinusoids), absolute and none
  # (the plain path t5 takes too), alibi (a bias like t5's), shaw_absolute (shaw's path, plus
  # absolute's sinusoids at the traced step), keys-only and values-only Shaw (a table dropped:
  # the kernels' own tests cover both).
  slow_where(
    list(VARIANTS),
    {'learned', 'absolute', 'none', 'alibi', 'shaw_absolute', 'shaw-keys_only', 'shaw-values_only'},
  ),
)
def test_cached_decoding_matches_teacher_forcing(variant):
  model = make_model(**VARIANTS[variant])
  tgt_in_BT = TGT_IN.at[0, 3].set(PAD)  # a PAD key inside a row must stay masked too
  expected = forward(model, SRC, tgt_in_BT)
  assert expected.shape == (3, 9, VOCAB) and expected.dtype == jnp.float32
  cache = garbage_cache(model, 3, 11)  # two slots past the last step
  assert all(leaf.shape[0] == 3 for leaf in jax.tree.leaves(cache))
  assert [layer.shape for layer in cache.keys] == [(3, 2, 11, 8)] * 2  # [batch, heads, T, D]
  cache, logits = cached_logits(model, SRC, tgt_in_BT, cache)
  assert max_diff(logits, expected) <= 1e-5
  np.testing.assert_array_equal(np.asarray(cache.valid[:, :9]), np.asarray(tgt_in_BT != PAD))


def test_cache_rows_follow_a_batch_reordering():
  """A beam search reorders every cache leaf along axis 0: each row must be self-contained."""
  model = make_model(**VARIANTS['shaw'])
  cache, _ = cached_logits(model, SRC, TGT_IN, garbage_cache(model, 3, 11))
  enc_BSD, token_B, step = encode(model, SRC), jnp.array([5, 6, 7], jnp.int32), 9
  logits_BV, new_cache = decode_step(model, enc_BSD, SRC, token_B, cache, step)
  order = jnp.array([2, 0, 0])
  reorder = lambda tree: jax.tree.map(lambda leaf: leaf[order], tree)  # noqa: E731
  reordered_BV, reordered_cache = decode_step(
    model, enc_BSD[order], SRC[order], token_B[order], reorder(cache), step
  )
  assert max_diff(reordered_BV, logits_BV[order]) == 0.0
  expected_cache = reorder(new_cache)
  for leaf, expected in zip(
    jax.tree.leaves(reordered_cache), jax.tree.leaves(expected_cache), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected))


# --------------------------------------------------------------------------------------------
# 2. Padding: PAD keys are masked, and real tokens keep their positions.


@pytest.mark.parametrize(
  'position',
  # Slow tier: the paths absolute, shaw and t5 (a bias) already take, and alibi (a bias too).
  slow_where(list(TRANSLATE_POSITIONS), {'none', 'learned', 'shaw_absolute', 'alibi'}),
)
def test_source_padding(position):
  """PAD appended to the source changes nothing. PAD prepended shifts every source position by 3:
  relative and position-free models cannot see that (PAD keys are masked); models with absolute
  positions must."""
  model = make_model(position=position)
  base = forward(model, SRC, TGT_IN)
  appended = jnp.pad(SRC, ((0, 0), (0, 3)), constant_values=PAD)
  assert max_diff(forward(model, appended, TGT_IN), base) <= 1e-5
  prepended = jnp.pad(SRC, ((0, 0), (3, 0)), constant_values=PAD)
  moved = max_diff(forward(model, prepended, TGT_IN), base)
  assert (moved > 1e-3) if position in ('absolute', 'learned', 'shaw_absolute') else moved <= 1e-5


# --------------------------------------------------------------------------------------------
# 3. Causality.


@pytest.mark.parametrize('position', slow_where(['shaw', 'absolute'], {'absolute'}))
def test_decoder_is_causal(position):
  model = make_model(position=position)
  base = forward(model, SRC, TGT_IN)
  changed = forward(model, SRC, TGT_IN.at[:, 4].set(jnp.where(TGT_IN[:, 4] == 5, 6, 5)))
  assert max_diff(changed[:, :4], base[:, :4]) == 0.0
  assert max_diff(changed[:, 4:], base[:, 4:]) > 1e-3


# --------------------------------------------------------------------------------------------
# 4. Shaw tables: one [2k+1, head_dim] pair per self-attention layer, used, ablatable.


def rel_tables(model):
  """{path: shape} of every relative table parameter."""
  params = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return {
    '/'.join(map(str, path)): tuple(v.shape)
    for path, v in params
    if path[-1] in ('rel_key', 'rel_value')
  }


def test_shaw_tables_sit_in_self_attention_only():
  tables = rel_tables(make_model(position='shaw', max_relative_position=3))
  expected = {
    f'{stack}/{i}/self_attention/{table}': (7, 8)  # [2k+1, head_dim]
    for stack, layers in (('encoder_layers', 1), ('decoder_layers', 2))
    for i in range(layers)
    for table in ('rel_key', 'rel_value')
  }
  assert tables == expected
  values_only = make_model(position='shaw', max_relative_position=3, relative_keys=False)
  assert rel_tables(values_only) == {
    path: shape for path, shape in expected.items() if path.endswith('rel_value')
  }
  assert rel_tables(make_model(position='absolute')) == {}


@pytest.mark.parametrize(
  'layer,table',
  [('encoder_layers', 'rel_key'), ('encoder_layers', 'rel_value'), ('decoder_layers', 'rel_key')],
)
def test_shaw_tables_are_used(layer, table):
  """A constant added to a table row shifts a query's logits equally and changes nothing, so the
  table gets noise."""
  model = make_model(position='shaw')
  base = forward(model, SRC, TGT_IN)
  variable = getattr(getattr(model, layer)[0].self_attention, table)
  variable[...] += 0.5 * jax.random.normal(jax.random.key(0), variable.shape)
  assert max_diff(forward(model, SRC, TGT_IN), base) > 1e-3


@pytest.mark.parametrize('scan_layers', (pytest.param(False, marks=pytest.mark.slow), True))
def test_clipped_tables_see_distances_beyond_k_as_k(scan_layers):
  """clip_shaw_tables(model, k') keeps each table's rows -k'..k': nothing changes at the
  trained k, nor at k' = 2 for inputs of 3 positions (no distance beyond 2), which a slice off
  the centre would change; longer inputs change; k' beyond k is an error."""
  model = make_model(position='shaw', max_relative_position=4, scan_layers=scan_layers)
  short_src, short_tgt = sentences([3, 2], 3, seed=3), sentences([3, 3], 3, seed=4, start=(BOS,))
  before = forward(model, SRC, TGT_IN), forward(model, short_src, short_tgt)
  clip_shaw_tables(model, 4)
  assert max_diff(forward(model, SRC, TGT_IN), before[0]) == 0
  clip_shaw_tables(model, 2)
  assert set(rel_tables(model).values()) == {(5, 8)}
  assert max_diff(forward(model, short_src, short_tgt), before[1]) <= 1e-6
  assert max_diff(forward(model, SRC, TGT_IN), before[0]) > 1e-3
  with pytest.raises(ValueError, match='cannot clip Shaw tables of k = 2 at 3'):
    clip_shaw_tables(model, 3)


@pytest.mark.parametrize(
  'overrides,table_factor',
  [(dict(relative_table_init='zeros'), 0.0), (dict(relative_table_init_scale=1.5), 1.5)],
)
def test_table_inits_change_the_tables_start_and_every_other_parameter_as_before(
  overrides, table_factor
):
  """relative_table_init='zeros' and relative_table_init_scale change the tables' start (to 0,
  or the 'kernel' start times the scale) and nothing else: a comparison of two inits varies
  only the tables."""
  kernel = nnx.to_flat_state(nnx.state(make_model(position='shaw'), nnx.Param))
  other = nnx.to_flat_state(nnx.state(make_model(position='shaw', **overrides), nnx.Param))
  assert [path for path, _ in kernel] == [path for path, _ in other]
  for (path, before), (_, after) in zip(kernel, other, strict=True):
    before, after = np.asarray(before[...]), np.asarray(after[...])
    if path[-1] in ('rel_key', 'rel_value'):
      assert np.abs(before).max() > 0, path
      np.testing.assert_allclose(after, table_factor * before, rtol=1e-6, err_msg=str(path))
    else:
      np.testing.assert_array_equal(after, before, err_msg=str(path))


def test_t5_bias_tables_one_per_stack_shared_by_its_layers():
  """T5 shares one [num_buckets, heads] table across the layers of a stack: the encoder's
  (both directions) and the decoder's (the past); both are used, and ALiBi has none."""
  model = make_model(position='t5')
  params = nnx.to_flat_state(nnx.state(model, nnx.Param))
  tables = {'/'.join(map(str, path)): tuple(v.shape) for path, v in params if 'bias' in path[0]}
  assert tables == {'encoder_bias/table': (8, 2), 'decoder_bias/table': (8, 2)}
  base = forward(model, SRC, TGT_IN)
  for stack in (model.encoder_bias, model.decoder_bias):
    stack.table[...] += 0.5 * jax.random.normal(jax.random.key(1), stack.table.shape)
    changed = forward(model, SRC, TGT_IN)
    assert max_diff(changed, base) > 1e-3
    base = changed
  alibi = nnx.to_flat_state(nnx.state(make_model(position='alibi'), nnx.Param))
  assert not [path for path, _ in alibi if 'bias' in path[0]]


# --------------------------------------------------------------------------------------------
# 5. Lengths (bad configs: test_model_config.py).


def test_learned_positions_longer_than_max_len_are_an_error():
  model = make_model(position='learned', max_len=8)
  with pytest.raises(ValueError, match='source length 9 exceeds max_len=8, the rows of the'):
    model(jnp.ones((1, 9), jnp.int32), TGT_IN[:, :8], deterministic=True)
  with pytest.raises(ValueError, match='target length 9 exceeds max_len=8'):
    model.decode(jnp.zeros((3, 7, 16)), SRC, TGT_IN, deterministic=True)
  with pytest.raises(ValueError, match='max_decode_len length 9 exceeds max_len=8'):
    model.init_cache(1, 9)


@pytest.mark.parametrize('position', sorted(set(TRANSLATE_POSITIONS) - {'learned'}))
def test_other_positions_have_no_length_bound(position):
  """Sinusoids extend past max_len (Vaswani et al.'s extrapolation); relative schemes have
  no absolute position at all."""
  model = make_model(position=position, max_len=8)
  enc_BSD = encode(model, jnp.ones((1, 9), jnp.int32))
  assert enc_BSD.shape == (1, 9, 16) and np.all(np.isfinite(np.asarray(enc_BSD)))
  assert [layer.shape for layer in model.init_cache(1, 9).keys] == [(1, 2, 9, 8)] * 2


# --------------------------------------------------------------------------------------------
# 6. Training mode, gradients and dtypes.


# The training-mode and bfloat16 tests' models: one decoder layer (an encoder and a decoder
# layer between them have every kind of parameter, dropout and dtype), as they compile slowly.
TRAIN_LAYERS = dict(decoder_layers=1)


@nnx.jit
def train_grads(model, src_BS, tgt_in_BT):
  """Gradients of a teacher-forced cross-entropy with dropout on."""

  def loss(model):
    logits_BTV = model(src_BS, tgt_in_BT, deterministic=False)
    targets_BT = jnp.roll(tgt_in_BT, -1, axis=1)
    log_probs = jax.nn.log_softmax(logits_BTV)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets_BT[..., None], axis=-1))

  return nnx.grad(loss)(model)


@pytest.mark.parametrize(
  'overrides',
  slow_where(
    [
      dict(position='shaw'),
      dict(position='shaw', relative_table_init='zeros'),
      dict(position='learned', pre_layer_norm=True),
    ],
    {'learned-pre_ln'},
    ['shaw-post_ln', 'shaw_zero_tables-post_ln', 'learned-pre_ln'],
  ),
)
def test_gradients_reach_every_parameter(overrides):
  model = make_model(**overrides, **TRAIN_LAYERS)
  grads = nnx.to_flat_state(train_grads(model, SRC, TGT_IN))
  assert len(grads) == len(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for path, grad in grads:
    grad = np.asarray(grad[...])
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, path


def test_dropout_only_in_training():
  """Two training steps draw different dropout masks; evaluation is deterministic."""
  model = make_model(position='shaw', **TRAIN_LAYERS)
  first, second = (jax.tree.leaves(train_grads(model, SRC, TGT_IN)) for _ in range(2))
  assert max(max_diff(a, b) for a, b in zip(first, second, strict=True)) > 1e-3
  np.testing.assert_array_equal(
    np.asarray(forward(model, SRC, TGT_IN)), np.asarray(forward(model, SRC, TGT_IN))
  )


@nnx.jit
def train_logits(model, src_BS, tgt_in_BT):
  return model(src_BS, tgt_in_BT, deterministic=False)


def test_attention_dropout_only_in_training():
  """Attention-probability dropout (other dropout off) changes training logits, with a fresh
  mask per call, and leaves evaluation and the initialisation as they were."""
  model = make_model(position='shaw', dropout=0.0, attention_dropout=0.3, **TRAIN_LAYERS)
  without = make_model(position='shaw', dropout=0.0, **TRAIN_LAYERS)
  clean = forward(model, SRC, TGT_IN)
  np.testing.assert_array_equal(np.asarray(clean), np.asarray(forward(without, SRC, TGT_IN)))
  np.testing.assert_allclose(train_logits(without, SRC, TGT_IN), clean, atol=1e-6)
  first, second = (train_logits(model, SRC, TGT_IN) for _ in range(2))
  assert max_diff(first, clean) > 1e-3 and max_diff(second, first) > 1e-3


def test_dropout_sites_are_t2ts(monkeypatch):
  """In training, dropout at config.dropout on the embeddings (positions added) of the source
  and the target and on every sublayer's output before its residual sum; the feed-forward
  block's inner dropout is off (0), as tensor2tensor's transformer_base."""
  model = make_model(position='learned', encoder_layers=1, decoder_layers=1)
  sites, real = [], layers.Dropout.__call__

  def spy(self, inputs, *, deterministic):
    sites.append((inputs.shape, self.rate))
    return real(self, inputs, deterministic=deterministic)

  monkeypatch.setattr(layers.Dropout, '__call__', spy)
  # Traced, not run: the sites are the trace's (op by op the pass took seconds).
  graphdef, state = nnx.split(model)
  jax.eval_shape(lambda state: nnx.merge(graphdef, state)(SRC, TGT_IN, deterministic=False), state)
  src, tgt = ((3, 7, 16), 0.1), ((3, 9, 16), 0.1)
  encoder = [src, src, ((3, 7, 32), 0.0), src]  # embeddings, self-attention, feed-forward
  decoder = [tgt, tgt, tgt, ((3, 9, 32), 0.0), tgt]  # and encoder-decoder attention
  assert sites == encoder + decoder


@pytest.mark.parametrize(
  'position', slow_where(['shaw_absolute', 't5', 'alibi', 'rope'], {'t5', 'alibi'})
)
def test_bfloat16_close_to_float32(position):
  # One decoder layer (TRAIN_LAYERS): three programs compiled, and a layer's dtypes show.
  reference = forward(make_model(position=position, **TRAIN_LAYERS), SRC, TGT_IN)
  model = make_model(position=position, dtype='bfloat16', **TRAIN_LAYERS)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  logits = forward(model, SRC, TGT_IN)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(logits)))
  assert max_diff(logits, reference) < 0.1 * float(np.abs(np.asarray(reference)).max())
  cache, stepped = cached_logits(model, SRC, TGT_IN, model.init_cache(3, 9))
  assert all(layer.dtype == jnp.bfloat16 for layer in (*cache.keys, *cache.values))
  assert max_diff(stepped, reference) < 0.1 * float(np.abs(np.asarray(reference)).max())


@pytest.mark.parametrize('remat', ['full', pytest.param('dots_no_batch', marks=pytest.mark.slow)])
def test_remat_keeps_the_gradients(remat):
  """Rematerialising each layer recomputes its activations in the backward pass: the
  gradients stay those of the plain model (dropout off, so both draw nothing)."""
  plain = train_grads(make_model(position='t5', dropout=0.0, **TRAIN_LAYERS), SRC, TGT_IN)
  remat_grads = train_grads(
    make_model(position='t5', dropout=0.0, remat=remat, **TRAIN_LAYERS), SRC, TGT_IN
  )
  for (path, expected), (_, actual) in zip(
    nnx.to_flat_state(plain), nnx.to_flat_state(remat_grads), strict=True
  ):
    assert max_diff(actual[...], expected[...]) <= 1e-6, path


@pytest.mark.slow
def test_scanned_layers_equal_the_loop_and_share_its_checkpoints():
  """scan_layers runs each stack as one lax.scan over the layers' stacked states: the same
  parameters (one set per layer, so checkpoints load either way), the same logits, and the
  same training gradients, dropout included (every layer keeps its own rng streams)."""
  looped, scanned = make_model(position='rope'), make_model(position='rope', scan_layers=True)
  looped_state, scanned_state = (nnx.to_flat_state(nnx.state(m)) for m in (looped, scanned))
  assert [path for path, _ in looped_state] == [path for path, _ in scanned_state]
  assert max_diff(forward(scanned, SRC, TGT_IN), forward(looped, SRC, TGT_IN)) <= 1e-5
  for model, scans in ((looped, 0), (scanned, 2)):  # the encoder's and the decoder's
    graphdef, state = nnx.split(model)
    program = jax.make_jaxpr(
      lambda state, graphdef=graphdef: nnx.merge(graphdef, state)(SRC, TGT_IN, deterministic=True)
    )(state)
    assert str(program).count('scan[') == scans
  for _ in range(2):  # the second call sees the rng counts the first one advanced
    expected, actual = (nnx.to_flat_state(train_grads(m, SRC, TGT_IN)) for m in (looped, scanned))
    for (path, want), (_, got) in zip(expected, actual, strict=True):
      assert max_diff(got[...], want[...]) <= 1e-5, path


def test_shaw_dense_form_threshold_reaches_the_kernel(monkeypatch):
  """config.model.shaw_dense_max_kv_len picks the form of Shaw's 'xla' kernels in the model:
  at these few keys the dense form by default, the banded kernel (its custom VJP) at 0 (both
  exact: test_shaw compares them)."""
  dense, banded = make_model(), make_model(shaw_dense_max_kv_len=0)

  def jaxpr(model):
    graphdef, state = nnx.split(model)
    call = lambda state: nnx.merge(graphdef, state)(SRC, TGT_IN, deterministic=True)  # noqa: E731
    return str(jax.make_jaxpr(call)(state))

  assert 'custom_vjp_call' not in jaxpr(dense)
  assert 'custom_vjp_call' in jaxpr(banded)


# --------------------------------------------------------------------------------------------
# 7. One encoder and one decoder layer against float64 NumPy written from the papers' formulas:
# what the equivalences above cannot see (an embedding scale, the sinusoids of
# 'shaw_absolute', the pre-LN stacks' final LayerNorms), each applied alike everywhere.


def np_value(variable):
  return np.asarray(variable[...], np.float64)


def np_layer_norm(x, norm):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * np_value(norm.scale) + np_value(norm.bias)


def np_attention(attention, x, context, allowed, *, relative):
  """Multi-head attention of queries from x [batch, q_len, d_model] over `context`, with
  `allowed` [batch, 1, q_len or 1, kv_len]; Shaw's tables where `relative`."""
  (batch, q_len, _), kv_len = x.shape, context.shape[1]
  heads, head_dim = attention.num_heads, attention.head_dim
  q = (x @ np_value(attention.query.kernel)).reshape(batch, q_len, heads, head_dim)
  k = (context @ np_value(attention.key.kernel)).reshape(batch, kv_len, heads, head_dim)
  v = (context @ np_value(attention.value.kernel)).reshape(batch, kv_len, heads, head_dim)
  if relative:
    tables = (np_value(attention.rel_key), np_value(attention.rel_value))
    heads_out = ref.shaw(q, k, v, *tables, mask=allowed, query_offset=0)
  else:
    heads_out = ref.vanilla(q, k, v, mask=allowed)
  return heads_out.reshape(batch, q_len, -1) @ np_value(attention.output.kernel)


def np_feed_forward(ff, x):
  hidden = np.maximum(x @ np_value(ff.inner.kernel) + np_value(ff.inner.bias), 0.0)
  return hidden @ np_value(ff.outer.kernel) + np_value(ff.outer.bias)


def reference_logits(model, config, src_BS, tgt_in_BT):
  """Teacher-forced logits of a model of one encoder and one decoder layer, in float64."""
  src, tgt = np.asarray(src_BS), np.asarray(tgt_in_BT)
  embedding = np_value(model.embed.embedding)
  relative = config.position in ('shaw', 'shaw_absolute')

  def embed(tokens):
    x = embedding[tokens] * np.sqrt(config.d_model)
    positions = np.arange(tokens.shape[1])
    if config.position in ('absolute', 'shaw_absolute'):
      x = x + ref.sinusoidal(positions, config.d_model)
    if config.position == 'learned':
      x = x + np_value(model.position_table)[positions]
    return x

  def sublayer(residual, x, f):  # post-LN LN(x + f(x)), pre-LN x + f(LN(x))
    if config.pre_layer_norm:
      return x + f(np_layer_norm(x, residual.norm))
    return np_layer_norm(x + f(x), residual.norm)

  src_keys = (src != PAD)[:, None, None, :]
  encoder = model.encoder_layers[0]
  x = embed(src)
  x = sublayer(
    encoder.self_residual,
    x,
    lambda h: np_attention(encoder.self_attention, h, h, src_keys, relative=relative),
  )
  x = sublayer(encoder.ff.residual, x, lambda h: np_feed_forward(encoder.ff, h))
  enc = np_layer_norm(x, model.encoder_norm) if config.pre_layer_norm else x

  tgt_len = tgt.shape[1]
  causal = np.tril(np.ones((tgt_len, tgt_len), bool))
  tgt_keys = (tgt != PAD)[:, None, None, :] & causal[None, None]
  decoder = model.decoder_layers[0]
  y = embed(tgt)
  y = sublayer(
    decoder.self_residual,
    y,
    lambda h: np_attention(decoder.self_attention, h, h, tgt_keys, relative=relative),
  )
  y = sublayer(
    decoder.cross_residual,
    y,
    lambda h: np_attention(decoder.cross_attention, h, enc, src_keys, relative=False),
  )
  y = sublayer(decoder.ff.residual, y, lambda h: np_feed_forward(decoder.ff, h))
  if config.pre_layer_norm:
    y = np_layer_norm(y, model.decoder_norm)
  return y @ embedding.T


@pytest.mark.parametrize(
  'overrides',
  [
    dict(position='shaw_absolute'),
    dict(position='learned', pre_layer_norm=True),
  ],
  ids=['shaw_absolute-post_ln', 'learned-pre_ln'],
)
def test_one_layer_each_matches_numpy_reference(overrides):
  """Every parameter gets N(0, 0.1²) noise, so LayerNorms' scales and biases are not the
  identity they start as."""
  config = make_config(encoder_layers=1, decoder_layers=1, **overrides)
  model = make_model(encoder_layers=1, decoder_layers=1, **overrides)
  rng = np.random.default_rng(5)
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda p: p + 0.1 * rng.standard_normal(p.shape, 'f4'), params))
  expected = reference_logits(model, config, SRC, TGT_IN)
  np.testing.assert_allclose(np.asarray(forward(model, SRC, TGT_IN)), expected, atol=1e-4)
