"""`implementation='mosaic'` of `shaw_attention` and `xl_attention`: the causal Mosaic GPU
kernels where they serve and the mask allows (`relpos.attention.mosaic_dispatch`), the 'xla'
form elsewhere, and 'mosaic' as an 'auto' candidate on a GPU.

Which branch runs is decided at run time from the traced mask, so the dispatch tests replace
the kernel by a stand-in whose output cannot be mistaken (the queries, 1 + q): what comes out
says which branch ran, inside jit and grad, at no interpreter cost. One forward per kernel runs
the real kernel in Mosaic GPU's interpreter at a ragged length (padding to whole tiles) against
'xla'; their gradients are in the slow tier (the kernels' own float64 tests are
tests/test_mosaic_shaw.py and tests/test_mosaic_xl.py).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos.attention import autotune, mosaic_dispatch, mosaic_shaw, mosaic_xl
from relpos.attention import shaw as shaw_module
from relpos.attention import xl as xl_module
from relpos.attention.masking import causal_mask
from relpos.attention.shaw import shaw_attention
from relpos.attention.xl import xl_attention
from relpos.config.char_lm_defaults import char_lm_config
from relpos.training import char_lm_task
from relpos.training.mesh import data_mesh

Q, MEMORY, HEADS, HEAD_DIM, K = 40, 64, 2, 64, 3  # 40 queries (padded to 64) over 104 keys


def _normal(rng, dtype):
  return lambda *shape: jnp.asarray(rng.standard_normal(shape) * 0.5, dtype)


def _shaw_inputs(dtype=jnp.bfloat16, memory=MEMORY, tables='kv', seed=0):
  normal = _normal(np.random.default_rng(seed), dtype)
  kv_len = Q + memory
  q, k, v = (
    normal(2, Q, HEADS, HEAD_DIM),
    normal(2, kv_len, HEADS, HEAD_DIM),
    normal(2, kv_len, HEADS, HEAD_DIM),
  )
  rel_key, rel_value = (normal(2 * K + 1, HEAD_DIM) if t in tables else None for t in 'kv')
  return q, k, v, rel_key, rel_value


def _xl_inputs(dtype=jnp.bfloat16, memory=MEMORY, head_dim=HEAD_DIM, seed=0):
  normal = _normal(np.random.default_rng(seed), dtype)
  kv_len = Q + memory
  q = normal(2, Q, HEADS, head_dim)
  k, v = normal(2, kv_len, HEADS, head_dim), normal(2, kv_len, HEADS, head_dim)
  rel_key = normal(kv_len, HEADS, head_dim)
  return q, k, v, rel_key, normal(HEADS, head_dim), normal(HEADS, head_dim)


ATTENTION = {'shaw': shaw_attention, 'xl': xl_attention}
INPUTS = {'shaw': _shaw_inputs, 'xl': _xl_inputs}
MODULES = {'shaw': (mosaic_shaw, 'shaw_attention_mosaic'), 'xl': (mosaic_xl, 'xl_attention_mosaic')}


def _stand_in(monkeypatch, kernel):
  """Replaces `kernel`'s Mosaic kernel by `1 + q` (padded rows included); records each call."""
  calls = []

  def fake(query, key, value, *tables, **kwargs):
    calls.append((query.shape, key.shape, [t.shape for t in tables], kwargs))
    return 1 + query

  monkeypatch.setattr(*MODULES[kernel], fake)
  return calls


def _mosaic(kernel, args, mask, **kwargs):
  def call(*a):
    return ATTENTION[kernel](*a, mask=mask, implementation='mosaic', **kwargs)

  return jax.jit(call)(*args)


CAUSAL = causal_mask(Q, Q + MEMORY)


KEYS = jnp.ones((2, 1, 1, Q + MEMORY), bool)  # keys only: a full memory, no PAD


@pytest.mark.parametrize(
  ('kernel', 'mask', 'causal'),
  [
    ('shaw', CAUSAL, False),
    ('shaw', None, True),
    ('shaw', KEYS, True),
    pytest.param('shaw', CAUSAL, True, marks=pytest.mark.slow),
    ('xl', None, False),
    ('xl', CAUSAL, False),
    ('xl', CAUSAL[None, None], False),
    pytest.param('xl', KEYS, False, marks=pytest.mark.slow),
  ],
)
def test_a_causal_call_runs_the_kernel_padded_to_whole_tiles(monkeypatch, kernel, mask, causal):
  calls = _stand_in(monkeypatch, kernel)
  args = INPUTS[kernel]()
  kwargs = {'causal': True} if causal else {}
  np.testing.assert_array_equal(_mosaic(kernel, args, mask, **kwargs), 1 + args[0])
  (q_shape, k_shape, tables, kwargs), *_ = calls
  assert (q_shape, k_shape) == ((2, 64, HEADS, HEAD_DIM), (2, 128, HEADS, HEAD_DIM))
  if kernel == 'xl':  # R padded as the keys are
    assert tables == [(128, HEADS, HEAD_DIM), (HEADS, HEAD_DIM), (HEADS, HEAD_DIM)]
  assert kwargs['interpret'] is True  # on this CPU


@pytest.mark.parametrize('tables', ['k', 'v'])
def test_a_missing_shaw_table_reaches_the_kernel_as_zeros(monkeypatch, tables):
  def fake(query, key, value, rel_key, rel_value, **kwargs):
    missing = rel_value if tables == 'k' else rel_key
    return 1 + query + jnp.sum(jnp.abs(missing))  # 1 + q only if the missing table is zeros

  monkeypatch.setattr(mosaic_shaw, 'shaw_attention_mosaic', fake)
  args = _shaw_inputs(tables=tables)
  np.testing.assert_array_equal(_mosaic('shaw', args, CAUSAL), 1 + args[0])


UNFILLED = CAUSAL & (jnp.arange(Q + MEMORY) >= 5)  # the LM's first segment: memory slots empty
PADDED = CAUSAL[None, None] & (jnp.arange(2)[:, None, None, None] == 0)  # batch row 1 all PAD


FULL = jnp.ones((Q, Q + MEMORY), bool)  # bidirectional: more than causal (Shaw's only mask)


UNFILLED_KEYS = jnp.arange(Q + MEMORY) >= 5  # the same, keys only (the LM with causal=True)


@pytest.mark.parametrize(
  ('kernel', 'mask', 'causal'),
  [
    ('shaw', UNFILLED, False),
    ('shaw', PADDED, False),
    ('shaw', FULL, False),
    ('shaw', UNFILLED_KEYS, True),
    pytest.param('shaw', PADDED, True, marks=pytest.mark.slow),
    ('xl', PADDED, False),
    pytest.param('xl', UNFILLED_KEYS, False, marks=pytest.mark.slow),
  ],
)
def test_any_other_mask_runs_xla(monkeypatch, kernel, mask, causal):
  """Not a mask the kernel computes, so the 'xla' form runs, equal to implementation='xla' to
  the bit, although the kernel branch is traced too (Shaw's mask without `causal` must equal
  the causal one; with it, and XL's, must allow every causal pair)."""
  _stand_in(monkeypatch, kernel)
  args = INPUTS[kernel]()
  kwargs = {'causal': True} if causal else {}
  want = ATTENTION[kernel](*args, mask=mask, implementation='xla', **kwargs)
  np.testing.assert_array_equal(_mosaic(kernel, args, mask, **kwargs), want)


@pytest.mark.parametrize('kernel', ['shaw', 'xl'])
def test_the_xla_branch_has_the_xla_gradients(monkeypatch, kernel):
  """Rematerialised inside the cond, up to bf16 rounding (a different fusion may round the
  last bit differently)."""
  _stand_in(monkeypatch, kernel)
  args = INPUTS[kernel]()

  def loss(implementation, *a):
    out = ATTENTION[kernel](*a, mask=UNFILLED, implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  grads, want_grads = (
    jax.jit(jax.grad(lambda *a, i=i: loss(i, *a), argnums=range(len(args))))(*args)
    for i in ('mosaic', 'xla')
  )
  for got, wanted in zip(grads, want_grads, strict=True):
    got, wanted = np.float32(got), np.float32(wanted)
    assert np.max(np.abs(got - wanted)) <= 2**-8 * np.max(np.abs(wanted))


SHAW_REFUSALS = [
  ({'mask': None}, 'no mask: full attention, not causal'),
  ({'mask': jnp.ones((2, 1, 1, Q + MEMORY), bool)}, 'key padding only: not causal'),
  ({'query_offset': 3}, 'queries not the last keys'),
  ({'dropout_rate': 0.1, 'dropout_rng': jax.random.key(0)}, 'dropout'),
  ({'dtype': jnp.float32}, 'float32'),
  ({'memory': 32}, 'a memory of part of a tile'),
]
XL_REFUSALS = [
  ({'dropout_rate': 0.1, 'dropout_rng': jax.random.key(0)}, 'dropout'),
  ({'dtype': jnp.float32}, 'float32'),
  ({'memory': 32}, 'a memory of part of a tile'),
  ({'head_dim': 128}, "over the backward's shared memory"),
]


@pytest.mark.parametrize(
  ('kernel', 'change', 'why'),
  [('shaw', *case) for case in SHAW_REFUSALS] + [('xl', *case) for case in XL_REFUSALS],
)
def test_where_the_kernel_cannot_serve_mosaic_is_xla(monkeypatch, kernel, change, why):
  calls = _stand_in(monkeypatch, kernel)
  change = dict(change)
  shapes = {name: change.pop(name) for name in ('dtype', 'memory', 'head_dim') if name in change}
  args = INPUTS[kernel](**shapes)
  kwargs = {'mask': causal_mask(Q, args[1].shape[1]), **change}
  want = ATTENTION[kernel](*args, implementation='xla', **kwargs)
  np.testing.assert_array_equal(ATTENTION[kernel](*args, implementation='mosaic', **kwargs), want)
  assert not calls, why


def _signature(kernel):
  # enwik8_base's call in bf16: 512 queries over 1,024 keys, 8 heads of 64 (Shaw: k = 16)
  query = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  key = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16)
  mask = jax.ShapeDtypeStruct((512, 1024), bool)
  if kernel == 'xl':
    return autotune.xl_signature(query, key, mask, 0.0)
  table = jax.ShapeDtypeStruct((33, 64), jnp.bfloat16)
  return autotune.shaw_signature(query, key, table, table, mask, 0.0, xla_form='banded')


@pytest.mark.parametrize('kernel', ['shaw', 'xl'])
def test_mosaic_is_an_auto_candidate_on_a_gpu_where_it_serves_when_opted_in(monkeypatch, kernel):
  base = _signature(kernel)

  def names(**changes):
    return autotune.candidate_names(dataclasses.replace(base, **changes))

  assert 'mosaic' not in names()  # not on this CPU
  monkeypatch.setattr(autotune.jax, 'default_backend', lambda: 'gpu')
  assert 'mosaic' not in names()  # not without the opt-in (its kernels never ran on a GPU)
  monkeypatch.setenv(autotune.MOSAIC_OPT_IN, '1')
  assert names()[-1] == 'mosaic'
  given_tiles = names(tiles=(64, 64))
  assert given_tiles[:2] == ('xla', 'pallas@64x64') and given_tiles[-1] == 'mosaic'
  refused = [{'dtype': 'float32'}, {'dropout': 0.1}, {'kv_len': 1000}, {'head_dim': 32}]
  if kernel == 'shaw':
    refused += [{'mask': None}, {'mask': (2, 1, 1, 1024)}]
    for mask in (None, (2, 1, 1, 1024)):  # the kernel's own causal bound: any mask
      assert names(mask=mask, causal=True)[-1] == 'mosaic'
  else:
    assert names(mask=None)[-1] == 'mosaic'  # XL adds the causal mask itself
  for changes in refused:
    assert 'mosaic' not in names(**changes), changes


def _causal_loss(kernel, implementation, *args):
  kv_len = args[1].shape[1]
  out = ATTENTION[kernel](*args, mask=causal_mask(Q, kv_len), implementation=implementation)
  return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(out.size).reshape(out.shape)))


@pytest.mark.parametrize('kernel', ['shaw', 'xl'])
def test_kernel_equals_xla_at_a_ragged_length(kernel):
  """The real kernel (interpreted off a GPU, compiled on one): 40 queries padded to 64 over a
  memory of 64 keys, bf16."""
  args = INPUTS[kernel](seed=1)
  got = _mosaic(kernel, args, CAUSAL).astype(jnp.float32)
  want = ATTENTION[kernel](*args, mask=CAUSAL, implementation='xla').astype(jnp.float32)
  assert float(jnp.max(jnp.abs(got - want))) < 2e-2  # bf16 outputs of size ~1: a few ulps
  assert float(jnp.max(jnp.abs(got - want))) > 0  # a different program ran


@pytest.mark.slow
@pytest.mark.parametrize('kernel', ['shaw', 'xl'])
def test_kernel_gradients_equal_xla_at_a_ragged_length(kernel):
  args = INPUTS[kernel](seed=2)
  argnums = range(len(args))
  got = jax.jit(jax.grad(lambda *a: _causal_loss(kernel, 'mosaic', *a), argnums=argnums))(*args)
  want = jax.grad(lambda *a: _causal_loss(kernel, 'xla', *a), argnums=argnums)(*args)
  for i, g, w in zip(argnums, got, want, strict=True):
    g, w = (np.asarray(x, np.float32) for x in (g, w))
    error = np.max(np.abs(g - w)) / np.max(np.abs(w))
    assert error < 3e-2, (i, error)


@pytest.mark.parametrize('kernel', ['shaw', 'xl'])
def test_the_other_branch_is_pallas_at_long_context_on_a_gpu(monkeypatch, kernel):
  """XLA keeps every branch's buffers: from LONG_KV_LEN keys on a GPU the branch that runs
  where the kernel does not is the Pallas kernel (O(length) memory), not 'xla'."""
  assert mosaic_dispatch.fallback(mosaic_dispatch.LONG_KV_LEN) == 'xla'  # not on this CPU
  monkeypatch.setattr(mosaic_dispatch.jax, 'default_backend', lambda: 'gpu')
  assert mosaic_dispatch.fallback(mosaic_dispatch.LONG_KV_LEN - 1) == 'xla'
  assert mosaic_dispatch.fallback(mosaic_dispatch.LONG_KV_LEN) == 'pallas'
  _stand_in(monkeypatch, kernel)
  monkeypatch.setattr(mosaic_dispatch, 'LONG_KV_LEN', Q + MEMORY)  # these inputs count as long
  monkeypatch.setattr(mosaic_dispatch, 'interpret', lambda: True)
  chosen = []
  real = ATTENTION[kernel]

  def spy(*args, implementation, **kwargs):
    chosen.append(implementation)
    return real(*args, implementation=implementation, **kwargs)

  module = shaw_module if kernel == 'shaw' else xl_module
  monkeypatch.setattr(module, f'{kernel}_attention', spy)
  jax.eval_shape(lambda *a: real(*a, mask=UNFILLED, implementation='mosaic'), *INPUTS[kernel]())
  assert chosen == ['pallas']


def _char_lm(position, *, scan: bool, tgt_len: int, implementation='mosaic'):
  config = char_lm_config()
  config.model.update(
    position=position,
    num_layers=2,
    d_model=128,
    num_heads=2,
    head_dim=64,
    d_ff=64,
    max_relative_position=3,
    dtype='bfloat16',
    attention_implementation=implementation,
    dropout=0.0,
    attention_dropout=0.0,
    scan_layers=scan,
    remat='full' if scan else 'none',
  )
  config.train.update(batch_size=1, tgt_len=tgt_len, mem_len=64)
  mesh = data_mesh()
  _, graphdef, state = char_lm_task.build(config, 256, mesh)
  return config, state, char_lm_task.train_step_fn(config, graphdef, mesh)


@pytest.mark.parametrize(('position', 'calls'), [('xl', 5), ('shaw', 4)])
def test_the_char_lm_step_with_mosaic_lowers_for_cuda(monkeypatch, position, calls):
  """The whole training step, layers scanned and rematerialised, with the kernels as a GPU
  compiles them (not interpreted): one forward custom call in the scan, its rematerialised
  forward and the backward kernels (XL 3, Shaw 2), and a cond per pass."""
  monkeypatch.setattr(mosaic_dispatch, 'interpret', lambda: False)
  _, state, step = _char_lm(position, scan=True, tgt_len=64)
  tokens = jax.ShapeDtypeStruct((1, 64), jnp.int32)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  module = jax.export.export(step, platforms=['cuda'])(shapes, (tokens, tokens)).mlir_module()
  assert module.count('stablehlo.custom_call @mosaic_gpu') == calls


@pytest.mark.slow
def test_the_char_lm_runs_mosaic_once_its_memory_is_full():
  """Three 40-token segments over a 64-slot memory, interpreted: the first two (memory empty,
  then 40 of 64 slots) take the 'xla' branch and give 'xla''s losses to the bit, the third
  (memory full) the kernel, within bf16 rounding. (Not with remat: the interpreter's callbacks
  are effects that `jax.checkpoint` does not take; the GPU lowering above does.)"""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 121)))
  losses = {}
  for implementation in ('xla', 'mosaic'):
    _, state, step = _char_lm('xl', scan=False, tgt_len=40, implementation=implementation)
    losses[implementation] = []
    for start in (0, 40, 80):
      state, sums = step(state, (tokens[:, start : start + 40], tokens[:, start + 1 : start + 41]))
      losses[implementation].append(float(sums['loss']))
  (xla, mosaic) = losses.values()
  assert mosaic[:2] == xla[:2]
  assert mosaic[2] != xla[2] and abs(mosaic[2] - xla[2]) < 1e-3 * abs(xla[2])
