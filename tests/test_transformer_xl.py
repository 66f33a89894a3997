"""Transformer-XL LM (relpos.models.transformer_xl): recurrence, masks, dtypes, parameters."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import reference as ref
from flax import nnx
from helpers import built_once, slow_where

from relpos import attention
from relpos.models import layers
from relpos.models import transformer_xl as txl

pytestmark = pytest.mark.usefixtures('attention_test_config')

# 'absolute' and 'none' share the dot-product path: tests of that path use one of them.
KERNEL_MODES = ('xl', 'shaw', 'none')
BATCH = 2


# Run settings: config.train / config.eval in a real run, call arguments of the model.
RUN_FIELDS = ('mem_len', 'clamp_len', 'same_length')


def make_config(**overrides):
  """The tiny model's config.model fields plus vocab_size and the RUN_FIELDS."""
  config = ml_collections.ConfigDict(
    dict(
      vocab_size=11,
      num_layers=2,
      d_model=16,
      num_heads=2,
      head_dim=8,
      d_ff=32,
      dropout=0.1,
      attention_dropout=0.0,
      mem_len=12,
      clamp_len=0,
      same_length=False,
      untie_r=True,
      pre_layer_norm=False,
      position='xl',
      max_relative_position=2,
      relative_keys=True,
      relative_values=True,
      relative_table_init='kernel',
      relative_table_init_scale=1.0,
      t5_num_buckets=6,
      t5_max_distance=9,
      rope_base=10000.0,
      remat='none',
      scan_layers=False,
      attention_implementation='auto',
      dtype='float32',
    )
  )
  config.update(overrides)
  return config


def model_config(config) -> txl.TransformerXLConfig:
  fields = {k: v for k, v in config.items() if k not in RUN_FIELDS}
  return txl.TransformerXLConfig(**fields)


class Tiny:
  """A tiny model with its run settings: memories default to its mem_len, calls use its
  clamp_len and same_length. Attributes are the model's."""

  def __init__(self, model, config):
    self.model = model
    self.run = {name: config[name] for name in RUN_FIELDS}

  def __getattr__(self, name):
    return getattr(self.model, name)

  def init_memory(self, batch_size, mem_len=None):
    return self.model.init_memory(batch_size, self.run['mem_len'] if mem_len is None else mem_len)

  def settings(self):
    return {'clamp_len': self.run['clamp_len'], 'same_length': self.run['same_length']}


def make_model(seed=0, **overrides):
  """A tiny model whose parameters get N(0, 0.3²) noise on top of the init: at the 0.02 init
  the position terms barely move the logits (clamping changes them by ~1e-7), which would
  make position bugs invisible at the tests' tolerances. A fresh model each call (its own
  variables), built once per seed and model config (the run settings aside: `built_once`)."""
  config = make_config(**overrides)

  def build():
    model = txl.TransformerXL(model_config(config), rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p: p + 0.3 * rng.standard_normal(p.shape, 'f4'), params))
    return model

  return Tiny(built_once((seed, model_config(config)), build), config)


@functools.partial(nnx.jit, static_argnames=('clamp_len', 'same_length', 'deterministic'))
def _apply(model, tokens_BT, memory, *, clamp_len, same_length, deterministic):
  return model(
    tokens_BT, memory, deterministic=deterministic, clamp_len=clamp_len, same_length=same_length
  )


def forward(tiny, tokens_BT, memory):
  """Deterministic logits and new memory, compiled (much faster than eager on CPU)."""
  return _apply(tiny.model, tokens_BT, memory, deterministic=True, **tiny.settings())


def random_tokens(length, seed=0, vocab=11):
  return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (BATCH, length)), jnp.int32)


def run_segments(model, tokens_BT, lengths, mem_len=None):
  """Logits of `tokens_BT` fed segment by segment (lengths), carrying the memory."""
  memory = model.init_memory(BATCH, mem_len)
  logits, start = [], 0
  for length in lengths:
    segment_logits, memory = forward(model, tokens_BT[:, start : start + length], memory)
    logits.append(segment_logits)
    start += length
  return jnp.concatenate(logits, axis=1), memory


def assert_allclose(actual, expected, atol=1e-5):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=0, atol=atol)


# --------------------------------------------------------------------------------------------
# 1. Segment-level recurrence: with mem_len >= the whole length, segment-wise evaluation with
# memory equals one pass over the whole sequence (the whole pass uses no memory at all, except
# with same_length, whose window needs mem_len > 0).


@pytest.mark.parametrize(
  'overrides',
  # Slow tier: values-only Shaw (a table dropped: the kernels' own tests cover it).
  slow_where(
    [
      dict(position='xl'),
      dict(position='xl', untie_r=False, pre_layer_norm=True),
      dict(position='xl', same_length=True),
      dict(position='shaw'),
      dict(position='shaw', same_length=True, pre_layer_norm=True),
      dict(position='shaw', relative_keys=False),
      dict(position='none'),
      dict(position='t5'),
      dict(position='alibi', same_length=True),
      dict(position='rope', pre_layer_norm=True),
    ],
    {'shaw-values_only'},
    [
      'xl',
      'xl-shared_r-pre_ln',
      'xl-same_length',
      'shaw',
      'shaw-same_length-pre',
      'shaw-values_only',
      'none',
      't5',
      'alibi-same_length',
      'rope-pre_ln',
    ],
  ),
)
def test_segments_with_memory_equal_whole_sequence(overrides):
  model = make_model(**overrides)
  tokens = random_tokens(12)
  whole_mem_len = 12 if overrides.get('same_length') else 0
  whole, _ = forward(model, tokens, model.init_memory(BATCH, whole_mem_len))
  segmented, memory = run_segments(model, tokens, [4, 4, 4])
  assert segmented.shape == (BATCH, 12, 11) and segmented.dtype == jnp.float32
  assert_allclose(segmented, whole)
  assert int(memory.length) == 12
  # The memory matters: without it, later segments change.
  alone, _ = forward(model, tokens[:, 8:], model.init_memory(BATCH))
  assert np.abs(np.asarray(alone - whole[:, 8:])).max() > 1e-3


def test_absolute_positions_restart_every_segment():
  """'absolute' adds sinusoids of the position within the segment (0..T-1), so segment-wise
  and whole-sequence evaluation agree on the first segment only: later segments see their
  memory with the memory's own (restarted) positions, by design."""
  model = make_model(position='absolute')
  tokens = random_tokens(12)
  whole, _ = forward(model, tokens, model.init_memory(BATCH, 0))
  segmented, _ = run_segments(model, tokens, [4, 4, 4])
  assert np.all(np.isfinite(np.asarray(segmented)))
  assert_allclose(segmented[:, :4], whole[:, :4])
  assert np.abs(np.asarray(segmented[:, 4:] - whole[:, 4:])).max() > 1e-3
  # Layer-0 inputs (memory.hidden[0]) are scaled embeddings + sinusoids of 0..T-1, per segment.
  memory = model.init_memory(BATCH)
  embedding = model.embed.embedding[...]
  positions_TD = attention.sinusoidal_embedding(jnp.arange(4), 16)
  for start in (0, 4):
    _, memory = forward(model, tokens[:, start : start + 4], memory)
    expected = embedding[tokens[:, start : start + 4]] * 4.0 + positions_TD
    assert_allclose(memory.hidden[0, :, -4:], expected)


# --------------------------------------------------------------------------------------------
# A one-layer model against float64 NumPy written from the papers' formulas, with a partly
# filled memory: catches what segment-vs-whole equivalence cannot, e.g. a relative position
# that is consistently off by one.


def sinusoid(positions, dim):
  inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
  angles = np.asarray(positions, np.float64)[..., None] * inv_freq
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def value(variable):
  return np.asarray(variable[...], np.float64)


def layer_norm(x, norm):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-5) * value(norm.scale) + value(norm.bias)


def reference_logits(model, config, tokens_BT, hidden_LBMD, length):
  """Logits of a one-layer model in float64."""
  (batch, q_len), mem_len = tokens_BT.shape, hidden_LBMD.shape[2]
  heads, head_dim, kv_len = config.num_heads, config.head_dim, mem_len + q_len
  embedding = value(model.embed.embedding)
  x = embedding[np.asarray(tokens_BT)] * np.sqrt(config.d_model)
  if config.position == 'absolute':
    x = x + sinusoid(np.arange(q_len), config.d_model)
  layer = model.layers[0]
  block, ff = layer.attention, layer.ff
  block_norm, ff_norm = layer.attention_residual.norm, ff.residual.norm
  context = np.concatenate([np.asarray(hidden_LBMD[0], np.float64), x], axis=1)
  if config.pre_layer_norm:  # as the original: the memory is normalised too
    context = layer_norm(context, block_norm)
  q = (context[:, mem_len:] @ value(block.query.kernel)).reshape(batch, q_len, heads, head_dim)
  k = (context @ value(block.key.kernel)).reshape(batch, kv_len, heads, head_dim)
  v = (context @ value(block.value.kernel)).reshape(batch, kv_len, heads, head_dim)
  if config.position == 'rope':  # keys at 0..kv_len-1, queries after the memory
    q = ref.rope(q, mem_len + np.arange(q_len), config.rope_base)
    k = ref.rope(k, np.arange(kv_len), config.rope_base)
  distance = (mem_len + np.arange(q_len))[:, None] - np.arange(kv_len)[None, :]  # pos_i - j
  allowed = (distance >= 0) & (np.arange(kv_len) >= mem_len - length)
  if config.same_length:
    allowed &= distance < mem_len
  scores = np.einsum('bihd,bjhd->bhij', q, k)
  if config.position == 'xl':
    clamped = np.clip(distance, 0, config.clamp_len if config.clamp_len > 0 else None)
    rel_key = (sinusoid(clamped, config.d_model) @ value(block.r_net.kernel)).reshape(
      q_len, kv_len, heads, head_dim
    )
    u, v_bias = value(model.content_bias), value(model.position_bias)
    if config.untie_r:
      u, v_bias = u[0], v_bias[0]
    scores = np.einsum('bihd,bjhd->bhij', q + u, k)
    scores += np.einsum('bihd,ijhd->bhij', q + v_bias, rel_key)
  if config.position == 'shaw':
    kmax = config.max_relative_position
    bucket = np.clip(-distance, -kmax, kmax) + kmax
    scores += np.einsum('bihd,ijd->bhij', q, value(block.rel_key)[bucket])
  scores = scores / np.sqrt(head_dim)
  if config.position == 't5':
    buckets = np.vectorize(ref.t5_bucket)(
      -distance, False, config.t5_num_buckets, config.t5_max_distance
    )
    scores += np.moveaxis(value(model.relative_bias.table)[buckets], -1, 0)  # [heads, i, j]
  if config.position == 'alibi':
    slopes = np.asarray(ref.alibi_slopes(heads))
    scores -= slopes[:, None, None] * np.abs(distance)
  scores = np.where(allowed, scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum('bhij,bjhd->bihd', probs, v)
  if config.position == 'shaw':
    out += np.einsum('bhij,ijd->bihd', probs, value(block.rel_value)[bucket])
  h = x + out.reshape(batch, q_len, -1) @ value(block.output.kernel)
  h = h if config.pre_layer_norm else layer_norm(h, block_norm)
  inner = layer_norm(h, ff_norm) if config.pre_layer_norm else h
  inner = np.maximum(inner @ value(ff.inner.kernel) + value(ff.inner.bias), 0.0)
  h = h + inner @ value(ff.outer.kernel) + value(ff.outer.bias)
  h = h if config.pre_layer_norm else layer_norm(h, ff_norm)  # pre-LN: no final LayerNorm
  return h @ embedding.T + value(model.output_bias)


@pytest.mark.parametrize(
  'overrides',
  [
    dict(position='xl'),
    dict(position='xl', clamp_len=2, same_length=True),
    dict(position='xl', pre_layer_norm=True, untie_r=False),
    dict(position='shaw'),
    dict(position='absolute'),
    dict(position='none'),
    dict(position='t5'),
    dict(position='alibi'),
    dict(position='rope'),
  ],
  ids=[
    'xl',
    'xl-clamp-same_length',
    'xl-pre_ln-shared_r',
    'shaw',
    'absolute',
    'none',
    't5',
    'alibi',
    'rope',
  ],
)
def test_one_layer_matches_numpy_reference(overrides):
  config = make_config(num_layers=1, mem_len=5, **overrides)
  model = make_model(**config)
  tokens = random_tokens(4, seed=13)
  hidden = jnp.asarray(np.random.default_rng(14).standard_normal((1, BATCH, 5, 16)), jnp.float32)
  logits, _ = forward(model, tokens, txl.Memory(hidden, jnp.int32(3)))
  expected = reference_logits(model, config, tokens, hidden, 3)
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------------------------
# 2. No gradient reaches the memory.


@nnx.jit
def memory_gradients(model, tokens_BT, memory):
  """Gradients w.r.t. (params, memory.hidden) of the loss and of the new memory's sum."""

  def loss(model, hidden):
    logits, _ = model(tokens_BT, txl.Memory(hidden, memory.length), deterministic=True)
    return jnp.mean(txl.nats_per_token(logits, tokens_BT))

  def new_memory_sum(model, hidden):
    _, new_memory = model(tokens_BT, txl.Memory(hidden, memory.length), deterministic=True)
    return jnp.sum(new_memory.hidden)

  return tuple(nnx.grad(f, argnums=(0, 1))(model, memory.hidden) for f in (loss, new_memory_sum))


@nnx.jit
def parameter_gradients(model, tokens_BT, memory):
  """memory_gradients' gradients of the loss w.r.t. the parameters alone: half the program,
  for the tests that compare them between two forms of a model."""

  def loss(model):
    logits, _ = model(tokens_BT, memory, deterministic=True)
    return jnp.mean(txl.nats_per_token(logits, tokens_BT))

  return nnx.grad(loss)(model)


@pytest.mark.parametrize('mode', slow_where(KERNEL_MODES, {'shaw'}))
def test_no_gradient_through_memory(mode):
  model = make_model(position=mode)
  tokens = random_tokens(8, seed=1)
  _, memory = forward(model, tokens[:, :4], model.init_memory(BATCH))
  loss_grads, new_memory_grads = memory_gradients(model.model, tokens[:, 4:], memory)
  param_grads, hidden_grad = loss_grads
  assert np.all(np.asarray(hidden_grad) == 0.0)
  assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(param_grads))
  # The new memory is a stop_gradient: nothing flows back from it.
  assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(new_memory_grads))


@pytest.mark.parametrize('remat', [pytest.param('full', marks=pytest.mark.slow), 'dots'])
def test_remat_keeps_the_gradients(remat):
  """Rematerialised layers give the plain model's parameter gradients (no dropout)."""
  tokens = random_tokens(8, seed=1)
  gradients = []
  for setting in ('none', remat):
    model = make_model(position='rope', dropout=0.0, remat=setting)
    if setting == 'none':  # the same parameters, so the same memory: one forward compiled
      _, memory = forward(model, tokens[:, :4], model.init_memory(BATCH))
    gradients.append(jax.tree.leaves(parameter_gradients(model.model, tokens[:, 4:], memory)))
  for expected, actual in zip(*gradients, strict=True):
    assert_allclose(actual, expected, atol=1e-6)


@pytest.mark.parametrize(
  'overrides',
  [dict(position='xl', untie_r=False), pytest.param(dict(position='t5'), marks=pytest.mark.slow)],
)
def test_scanned_layers_equal_the_loop(overrides):
  """scan_layers: the same parameters, logits, memory and gradients as the Python loop."""
  tokens = random_tokens(8, seed=3)
  results = []
  for scan_layers in (False, True):
    model = make_model(scan_layers=scan_layers, **overrides)
    logits, memory = run_segments(model, tokens, [4, 4])
    grads = parameter_gradients(model.model, tokens[:, 4:], memory)
    results.append((logits, memory.hidden, jax.tree.leaves(grads)))
  (logits, hidden, grads), (scan_logits, scan_hidden, scan_grads) = results
  assert_allclose(scan_logits, logits)
  assert_allclose(scan_hidden, hidden)
  for expected, actual in zip(grads, scan_grads, strict=True):
    assert_allclose(actual, expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('position', ['xl', 'shaw'])
def test_pallas_attention_equals_xla(position, monkeypatch):
  """attention_implementation='pallas' (interpreted on CPU, Triton on a GPU) reaches the
  kernel and gives the 'xla' model's logits, memory and gradients over two segments, the
  second reading a memory."""
  kernel_name = f'{position}_attention'
  kernel, asked = getattr(attention, kernel_name), []

  def spy(*args, **kwargs):
    asked.append(kwargs.get('implementation'))
    return kernel(*args, **kwargs)

  monkeypatch.setattr(attention, kernel_name, spy)
  tokens = random_tokens(10, seed=4)
  results = []
  for implementation in ('xla', 'pallas'):
    model = make_model(position=position, attention_implementation=implementation)
    with jax.default_matmul_precision('highest'):  # float32 on a GPU too (no TF32)
      logits, memory = run_segments(model, tokens, [5, 5])
      grads = memory_gradients(model.model, tokens[:, 5:], memory)[0]
    results.append((logits, memory.hidden, jax.tree.leaves(grads)))
  assert 'pallas' in asked and set(asked) <= {'xla', 'pallas'}
  (logits, hidden, grads), (pallas_logits, pallas_hidden, pallas_grads) = results
  assert_allclose(pallas_logits, logits, atol=1e-4)
  assert_allclose(pallas_hidden, hidden, atol=1e-4)
  for expected, actual in zip(grads, pallas_grads, strict=True):
    assert_allclose(actual, expected, atol=1e-4)


# --------------------------------------------------------------------------------------------
# 3. same_length and clamp_len as in the original code.


def original_dec_attn_mask(qlen, mlen, mem_len, same_length):
  """kimiyoung/transformer-xl MemTransformerLM._forward, torch -> numpy: True = masked."""
  klen = mlen + qlen
  all_ones = np.ones((qlen, klen))
  if same_length:
    mask_len = klen - mem_len
    if mask_len > 0:
      mask_shift_len = qlen - mask_len
    else:
      mask_shift_len = qlen
    return (np.triu(all_ones, 1 + mlen) + np.tril(all_ones, -mask_shift_len)).astype(bool)
  return np.triu(all_ones, 1 + mlen).astype(bool)


@pytest.mark.parametrize('same_length', [False, True])
@pytest.mark.parametrize(
  'qlen,mlen,mem_len',
  [(4, 0, 6), (4, 3, 6), (4, 6, 6), (6, 2, 3), (6, 3, 3), (1, 5, 5), (5, 0, 2), (3, 1, 8)],
)
def test_mask_matches_original(qlen, mlen, mem_len, same_length):
  """The original's memory holds its mlen <= mem_len valid states; ours has mem_len slots, the
  trailing length = mlen of them valid: the valid columns must match, the rest be masked."""
  ours = np.asarray(txl.attention_mask(qlen, mem_len, mlen, same_length=same_length))
  assert ours.shape == (qlen, mem_len + qlen)
  assert not ours[:, : mem_len - mlen].any()
  np.testing.assert_array_equal(
    ours[:, mem_len - mlen :], ~original_dec_attn_mask(qlen, mlen, mem_len, same_length)
  )
  # XL's kernels add the causal mask themselves: keys only, one row without same_length, and
  # the same pairs once combined with the causal mask.
  keys = np.asarray(
    txl.attention_mask(qlen, mem_len, mlen, same_length=same_length, keys_only=True)
  )
  assert keys.shape == (qlen if same_length else 1, mem_len + qlen)
  causal = np.asarray(attention.causal_mask(qlen, mem_len + qlen))
  np.testing.assert_array_equal(keys & causal, ours)


def test_same_length_hides_keys_beyond_the_window():
  """With a full memory of mem_len slots, query i sees keys i+1 .. mem_len+i: slot 0 is never
  visible with same_length (and is visible without it)."""
  tokens = random_tokens(8, seed=2)
  garbage = jnp.asarray(np.random.default_rng(3).standard_normal((2, BATCH, 1, 16)), jnp.float32)
  for same_length in (True, False):
    model = make_model(same_length=same_length, mem_len=4)
    _, memory = forward(model, tokens[:, :4], model.init_memory(BATCH))
    base, _ = forward(model, tokens[:, 4:], memory)
    hidden = memory.hidden.at[:, :, :1].add(garbage)
    changed, _ = forward(model, tokens[:, 4:], txl.Memory(hidden, memory.length))
    moved = np.abs(np.asarray(changed - base)).max()
    assert (moved == 0.0) if same_length else (moved > 1e-3)


def test_same_length_without_memory_is_an_error():
  model = make_model().model
  with pytest.raises(ValueError, match='same_length'):
    model(random_tokens(4), model.init_memory(BATCH, 0), deterministic=True, same_length=True)


def test_clamp_len():
  """Query i (no memory) sees distances 0..i: clamping at c changes positions i > c only, and
  clamp_len >= kv_len is no clamping."""
  tokens = random_tokens(12, seed=4)
  empty = make_model().init_memory(BATCH, 0)
  plain, _ = forward(make_model(clamp_len=0), tokens, empty)
  clamped, _ = forward(make_model(clamp_len=3), tokens, empty)
  assert_allclose(clamped[:, :4], plain[:, :4])
  differences = np.abs(np.asarray(clamped - plain))[:, 4:].max(axis=(0, 2))
  assert np.all(differences > 1e-4), differences
  same, _ = forward(make_model(clamp_len=12), tokens, empty)  # kv_len = 12
  np.testing.assert_array_equal(np.asarray(same), np.asarray(plain))


# --------------------------------------------------------------------------------------------
# 4. Eval segment length and memory length may differ from training (tgt_len=4, mem_len=12).


@pytest.mark.parametrize('mode', slow_where(['xl', 'shaw'], {'shaw'}))
def test_other_segment_lengths_and_mem_len(mode):
  model = make_model(position=mode)
  tokens = random_tokens(26, seed=5)
  whole, _ = forward(model, tokens, model.init_memory(BATCH, 0))
  memory, logits, start = model.init_memory(BATCH, mem_len=26), [], 0
  # Two lengths, each twice (one compile each), neither the training 4: the memory part filled,
  # then full and shifting.
  for length in (8, 5, 8, 5):
    segment_logits, memory = forward(model, tokens[:, start : start + length], memory)
    logits.append(segment_logits)
    start += length
  assert memory.hidden.shape == (2, BATCH, 26, 16)
  assert_allclose(jnp.concatenate(logits, axis=1), whole)


# --------------------------------------------------------------------------------------------
# 5. Memory bookkeeping.


def test_memory_length_grows_and_saturates():
  model = make_model(position='none')
  tokens = random_tokens(4, seed=6)
  memory = model.init_memory(BATCH)
  assert memory.hidden.shape == (2, BATCH, 12, 16) and int(memory.length) == 0
  lengths, previous = [], memory
  for _ in range(4):
    _, memory = forward(model, tokens, previous)
    lengths.append(int(memory.length))
    # Slots shift left by T; the new T slots are this segment's layer inputs.
    np.testing.assert_array_equal(memory.hidden[:, :, :8], previous.hidden[:, :, 4:])
    previous = memory
  assert lengths == [4, 8, 12, 12]
  assert_allclose(memory.hidden[0, :, -4:], model.embed.embedding[...][tokens] * 4.0)


@pytest.mark.parametrize('mode', KERNEL_MODES)
def test_invalid_memory_slots_are_masked(mode):
  model = make_model(position=mode)
  tokens = random_tokens(8, seed=7)
  _, memory = forward(model, tokens[:, :4], model.init_memory(BATCH))
  assert int(memory.length) == 4
  base, base_memory = forward(model, tokens[:, 4:], memory)
  garbage = 1e3 * np.random.default_rng(8).standard_normal(memory.hidden.shape)
  hidden = jnp.where(jnp.arange(12)[:, None] < 8, garbage, memory.hidden)
  logits, new_memory = forward(model, tokens[:, 4:], txl.Memory(hidden, memory.length))
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(base))
  np.testing.assert_array_equal(new_memory.hidden[:, :, -8:], base_memory.hidden[:, :, -8:])
  assert int(new_memory.length) == 8


def test_no_memory():
  assert make_model(mem_len=0).init_memory(BATCH).hidden.shape == (2, BATCH, 0, 16)
  model = make_model()
  logits, memory = forward(model, random_tokens(12), model.init_memory(BATCH, 0))
  assert logits.shape == (BATCH, 12, 11) and memory.hidden.shape == (2, BATCH, 0, 16)
  assert int(memory.length) == 0


# --------------------------------------------------------------------------------------------
# 6. bfloat16 compute.


@pytest.mark.parametrize(
  'mode', slow_where(['xl', 'shaw', 'absolute', 't5', 'alibi', 'rope'], {'t5', 'alibi'})
)
def test_bfloat16_close_to_float32(mode):
  tokens = random_tokens(8, seed=9)
  reference, _ = run_segments(make_model(position=mode), tokens, [4, 4])
  model = make_model(position=mode, dtype='bfloat16')
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model.model, nnx.Param)))
  logits, memory = run_segments(model, tokens, [4, 4])
  assert logits.dtype == jnp.float32 and memory.hidden.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(logits)))
  # bf16 keeps 8 bits of mantissa; measured max error 0.8-1.3% of the largest logit.
  scale = np.abs(np.asarray(reference)).max()
  assert_allclose(logits, reference, atol=0.04 * scale)


# --------------------------------------------------------------------------------------------
# 7. Parameters: count and tied embeddings.


def parameter_count(config):
  heads = config.num_heads * config.head_dim
  per_layer = 4 * config.d_model * heads + 2 * config.d_model  # q, k, v, o; LayerNorm
  per_layer += 2 * config.d_model * config.d_ff + config.d_ff + 3 * config.d_model  # FF
  shared = config.vocab_size * (config.d_model + 1)  # tied embedding, output bias
  if config.position == 'xl':
    per_layer += config.d_model * heads  # r_net
    biases = 2 * heads  # u, v
    per_layer, shared = (
      (per_layer + biases, shared) if config.untie_r else (per_layer, shared + biases)
    )
  if config.position == 'shaw':
    tables = config.relative_keys + config.relative_values
    per_layer += tables * (2 * config.max_relative_position + 1) * config.head_dim
  return config.num_layers * per_layer + shared


def count(model):
  return sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize(
  'overrides',
  [
    dict(position='xl'),
    dict(position='xl', untie_r=False),
    dict(position='shaw'),
    dict(position='shaw', relative_values=False),
  ],
  ids=['xl', 'xl-shared_r', 'shaw', 'shaw-keys_only'],
)
def test_parameter_count(overrides):
  config = make_config(**overrides)
  assert count(txl.TransformerXL(model_config(config), rngs=nnx.Rngs(0))) == parameter_count(config)


def test_parameter_count_enwik8_base():
  """The paper's 12-layer enwik8 model (run_enwik8_base.sh: shared u, v) has 41M parameters."""
  config = make_config(
    vocab_size=204, num_layers=12, d_model=512, num_heads=8, head_dim=64, d_ff=2048, untie_r=False
  )
  model = nnx.eval_shape(lambda: txl.TransformerXL(model_config(config), rngs=nnx.Rngs(0)))
  assert count(model) == parameter_count(config)
  assert 40.5e6 < count(model) < 41.5e6


def test_output_uses_the_embedding_matrix():
  model = make_model()
  matrices = [p for p in jax.tree.leaves(nnx.state(model.model, nnx.Param)) if p.shape[0] == 11]
  assert [p.shape for p in matrices] == [(11, 16), (11,)]  # embedding and output bias only
  tokens = random_tokens(4, seed=10, vocab=10)  # token 10 never appears in the input
  base, _ = forward(model, tokens, model.init_memory(BATCH))
  model.embed.embedding[...] = model.embed.embedding[...].at[10].add(1.0)
  logits, _ = forward(model, tokens, model.init_memory(BATCH))
  changed = np.abs(np.asarray(logits - base)).max(axis=(0, 1)) > 0
  np.testing.assert_array_equal(changed, np.arange(11) == 10)


# --------------------------------------------------------------------------------------------
# Loss and dropout (config checks: test_model_config.py).


def test_nats_per_token():
  logits = jnp.asarray(np.random.default_rng(11).standard_normal((BATCH, 3, 11)), jnp.bfloat16)
  targets = random_tokens(3, seed=12)
  nats = txl.nats_per_token(logits, targets)
  assert nats.shape == (BATCH, 3) and nats.dtype == jnp.float32
  logits64 = np.asarray(logits, np.float64)
  log_z = np.log(np.exp(logits64).sum(-1))
  expected = log_z - np.take_along_axis(logits64, np.asarray(targets)[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(nats), expected, rtol=1e-6)


@nnx.jit
def train_forward(model, tokens_BT, memory):
  return model(tokens_BT, memory, deterministic=False)


def test_dropout_only_when_not_deterministic():
  model = make_model(dropout=0.3, num_layers=1)  # one layer: a training pass compiles slowly
  tokens, memory = random_tokens(4), model.init_memory(BATCH)
  clean, _ = forward(model, tokens, memory)
  first, _ = train_forward(model.model, tokens, memory)
  second, _ = train_forward(model.model, tokens, memory)
  assert np.abs(np.asarray(first - clean)).max() > 1e-3
  assert np.abs(np.asarray(second - first)).max() > 1e-3  # a fresh mask per call
  again, _ = forward(model, tokens, memory)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(clean))


def test_dropout_sites_are_the_originals(monkeypatch):
  """In training, dropout at the original's sites, each at config.dropout: R (the sinusoids of
  the distances), the scaled embeddings, each attention output and, in the feed-forward block,
  after its ReLU and on its output, and the last layer's output before the softmax."""
  model = make_model(num_layers=1)
  sites, real = [], layers.Dropout.__call__

  def spy(self, inputs, *, deterministic):
    sites.append((inputs.shape, self.rate))
    return real(self, inputs, deterministic=deterministic)

  monkeypatch.setattr(layers.Dropout, '__call__', spy)
  tokens, memory = random_tokens(4), model.init_memory(BATCH)
  # Traced, not run: the sites are the trace's (op by op the pass took seconds).
  graphdef, state = nnx.split(model.model)
  jax.eval_shape(
    lambda state: nnx.merge(graphdef, state)(tokens, memory, deterministic=False), state
  )
  x, r = ((BATCH, 4, 16), 0.1), ((12 + 4, 16), 0.1)  # R: mem_len + q_len distances
  assert sites == [r, x, x, ((BATCH, 4, 32), 0.1), x, x]


def test_each_layer_reads_its_own_content_and_position_biases():
  """untie_r: u and v [num_layers, heads, head_dim], row l read by layer l alone. Layer 1's
  input (the new memory's hidden[1]) is layer 0's output: it moves with row 0 and not row 1;
  the logits move with both."""
  model = make_model()  # two layers
  tokens, memory = random_tokens(4), model.init_memory(BATCH)
  base_logits, base_memory = forward(model, tokens, memory)
  for bias in (model.content_bias, model.position_bias):
    for layer in (0, 1):
      saved = bias[...]
      bias[...] = saved.at[layer].add(1.0)
      logits, new_memory = forward(model, tokens, memory)
      bias[...] = saved
      moved = np.abs(np.asarray(new_memory.hidden[1] - base_memory.hidden[1])).max()
      assert (moved > 1e-4) == (layer == 0), (bias, layer, moved)
      assert np.abs(np.asarray(logits - base_logits)).max() > 1e-4, (bias, layer)


@nnx.jit
def train_logits_and_grads(model, tokens_BT, memory, targets_BT):
  """Training-mode logits and the gradients of the mean loss w.r.t. the parameters."""

  def loss_fn(model):
    logits, _ = model(tokens_BT, memory, deterministic=False)
    return jnp.mean(txl.nats_per_token(logits, targets_BT)), logits

  (_, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  return logits, grads


@pytest.mark.parametrize('mode', slow_where(KERNEL_MODES, {'shaw', 'none'}))
def test_attention_dropout_only_when_not_deterministic(mode):
  """attention_dropout (other dropout off): a fresh mask per training call, none in eval."""
  # One layer: the training pass with its gradients compiles slowly, and a layer shows it.
  model = make_model(position=mode, dropout=0.0, attention_dropout=0.3, num_layers=1)
  tokens, targets = random_tokens(4), random_tokens(4, seed=1)
  _, memory = forward(model, random_tokens(6, seed=2), model.init_memory(BATCH))  # 6 slots
  clean, _ = forward(model, tokens, memory)
  first, grads = train_logits_and_grads(model.model, tokens, memory, targets)
  second, _ = train_logits_and_grads(model.model, tokens, memory, targets)
  assert np.abs(np.asarray(first - clean)).max() > 1e-3
  assert np.abs(np.asarray(second - first)).max() > 1e-3  # a fresh mask per call
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))
  # Eval mode ignores it: the same logits as a model built without it (the rate leaves the
  # initialisation unchanged, so the parameters are the same).
  again, _ = forward(model, tokens, memory)
  without, _ = forward(make_model(position=mode, dropout=0.0, num_layers=1), tokens, memory)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(clean))
  np.testing.assert_array_equal(np.asarray(without), np.asarray(clean))
