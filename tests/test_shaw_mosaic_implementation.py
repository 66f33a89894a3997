"""`shaw_attention(..., implementation='mosaic')`: the causal Mosaic GPU kernel where the mask is
causal, the 'xla' form elsewhere (`relpos.attention.shaw._shaw_mosaic`), and 'mosaic' as an
'auto' candidate on a GPU.

Which branch runs is decided at run time from the traced mask, so the dispatch tests replace
the kernel by a stand-in whose output cannot be mistaken (the queries, 1 + q): what comes out
says which branch ran, inside jit and grad, at no interpreter cost. One forward and one
gradient run the real kernel in Mosaic GPU's interpreter at a ragged length (padding to whole
tiles) against 'xla' (the kernel's own float64 tests are tests/test_mosaic_shaw.py).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos.attention import autotune, mosaic_shaw
from relpos.attention.masking import causal_mask
from relpos.attention.shaw import shaw_attention

Q, MEMORY, HEADS, HEAD_DIM, K = 40, 64, 2, 64, 3  # 40 queries (padded to 64) over 104 keys


def _inputs(dtype=jnp.bfloat16, q_len=Q, memory=MEMORY, tables='kv', seed=0):
  rng = np.random.default_rng(seed)

  def normal(*shape):
    return jnp.asarray(rng.standard_normal(shape) * 0.5, dtype)

  kv_len = q_len + memory
  q, k, v = (
    normal(2, q_len, HEADS, HEAD_DIM),
    normal(2, kv_len, HEADS, HEAD_DIM),
    normal(2, kv_len, HEADS, HEAD_DIM),
  )
  rel_key, rel_value = (normal(2 * K + 1, HEAD_DIM) if t in tables else None for t in 'kv')
  return q, k, v, rel_key, rel_value


def _stand_in(monkeypatch):
  """Replaces the kernel by `1 + q` (padded rows included) and records each call's shapes."""
  calls = []

  def fake(query, key, value, rel_key, rel_value, **kwargs):
    calls.append((query.shape, key.shape, rel_key.shape, rel_value.shape, kwargs))
    return 1 + query

  monkeypatch.setattr(mosaic_shaw, 'shaw_attention_mosaic', fake)
  return calls


def _mosaic(args, mask, **kwargs):
  return jax.jit(lambda *a: shaw_attention(*a, mask=mask, implementation='mosaic', **kwargs))(*args)


def test_a_causal_mask_runs_the_kernel_padded_to_whole_tiles(monkeypatch):
  calls = _stand_in(monkeypatch)
  args = _inputs()
  out = _mosaic(args, causal_mask(Q, Q + MEMORY))
  np.testing.assert_array_equal(out, 1 + args[0])
  (q_shape, k_shape, rel_k, rel_v, kwargs), *_ = calls
  assert (q_shape, k_shape) == ((2, 64, HEADS, HEAD_DIM), (2, 128, HEADS, HEAD_DIM))
  assert rel_k == rel_v == (2 * K + 1, HEAD_DIM)
  assert kwargs['interpret'] is True  # on this CPU


@pytest.mark.parametrize('tables', ['k', 'v'])
def test_a_missing_table_reaches_the_kernel_as_zeros(monkeypatch, tables):
  def fake(query, key, value, rel_key, rel_value, **kwargs):
    missing = rel_value if tables == 'k' else rel_key
    return 1 + query + jnp.sum(jnp.abs(missing))  # 1 + q only if the missing table is zeros

  monkeypatch.setattr(mosaic_shaw, 'shaw_attention_mosaic', fake)
  args = _inputs(tables=tables)
  np.testing.assert_array_equal(_mosaic(args, causal_mask(Q, Q + MEMORY)), 1 + args[0])


def test_any_other_mask_runs_xla_exactly(monkeypatch):
  """The character LM's mask with memory slots not yet filled, and a decoder's PAD keys: not
  causal, so the 'xla' form runs, equal to implementation='xla' (values to the bit,
  gradients up to bf16 rounding), although the kernel branch is traced too."""
  _stand_in(monkeypatch)
  args = _inputs()
  unfilled = causal_mask(Q, Q + MEMORY) & (jnp.arange(Q + MEMORY) >= 5)
  padded = causal_mask(Q, Q + MEMORY)[None, None] & (jnp.arange(2)[:, None, None, None] == 0)
  for mask in (unfilled, padded):
    want = shaw_attention(*args, mask=mask, implementation='xla')
    np.testing.assert_array_equal(_mosaic(args, mask), want)
  for mask in (unfilled,):

    def loss(implementation, *a, mask=mask):
      out = shaw_attention(*a, mask=mask, implementation=implementation)
      return jnp.sum(out.astype(jnp.float32) ** 2)

    grads, want_grads = (
      jax.jit(jax.grad(lambda *a, i=i: loss(i, *a), argnums=range(5)))(*args)
      for i in ('mosaic', 'xla')
    )
    for got, wanted in zip(grads, want_grads, strict=True):
      # The same program but rematerialised: bf16 roundings may differ in the last bit.
      got, wanted = np.float32(got), np.float32(wanted)
      assert np.max(np.abs(got - wanted)) <= 2**-8 * np.max(np.abs(wanted))


@pytest.mark.parametrize(
  ('change', 'why'),
  [
    ({'mask': None}, 'no mask: full attention, not causal'),
    ({'mask': jnp.ones((2, 1, 1, Q + MEMORY), bool)}, 'key padding only: not causal'),
    ({'query_offset': 3}, 'queries not the last keys'),
    ({'dropout_rate': 0.1, 'dropout_rng': jax.random.key(0)}, 'dropout'),
    ({'dtype': jnp.float32}, 'float32'),
    ({'memory': 32}, 'a memory of part of a tile'),
  ],
)
def test_where_the_kernel_cannot_serve_mosaic_is_xla(monkeypatch, change, why):
  calls = _stand_in(monkeypatch)
  change = dict(change)
  args = _inputs(change.pop('dtype', jnp.bfloat16), memory=change.pop('memory', MEMORY))
  kv_len = args[1].shape[1]
  kwargs = {'mask': causal_mask(Q, kv_len), **change}
  want = shaw_attention(*args, implementation='xla', **kwargs)
  np.testing.assert_array_equal(shaw_attention(*args, implementation='mosaic', **kwargs), want)
  assert not calls, why


def test_mosaic_is_shaws_only():
  with pytest.raises(ValueError, match="'mosaic'"):
    from relpos.attention.xl import xl_attention

    q, k, v, _, _ = _inputs()
    xl_attention(q, k, v, k[0], q[0, 0], q[0, 0], implementation='mosaic')


def test_mosaic_is_an_auto_candidate_for_causal_shaw_on_a_gpu(monkeypatch):
  # enwik8_base's Shaw call in bf16: 512 queries over 1,024 keys, 8 heads of 64, k = 16
  query = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
  key = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16)
  table = jax.ShapeDtypeStruct((33, 64), jnp.bfloat16)
  mask = jax.ShapeDtypeStruct((512, 1024), bool)
  base = autotune.shaw_signature(query, key, table, table, mask, 0.0)

  def names(**changes):
    return autotune.candidate_names(dataclasses.replace(base, **changes))

  assert 'mosaic' not in names()  # not on this CPU
  monkeypatch.setattr(autotune.jax, 'default_backend', lambda: 'gpu')
  assert names()[-1] == 'mosaic'
  assert names(tiles=(64, 64)) == ('xla', 'pallas@64x64', 'mosaic')
  for changes in (
    {'dtype': 'float32'},
    {'dropout': 0.1},
    {'mask': None},
    {'mask': (2, 1, 1, 1024)},
    {'head_dim': 32},
    {'kv_len': 1000},
  ):
    assert 'mosaic' not in names(**changes), changes
  xl_signature = dataclasses.replace(base, kernel='xl', max_distance=None, tables='')
  assert 'mosaic' not in autotune.candidate_names(xl_signature)


def _loss(implementation, *args):
  kv_len = args[1].shape[1]
  out = shaw_attention(
    *args, mask=causal_mask(args[0].shape[1], kv_len), implementation=implementation
  )
  return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(out.size).reshape(out.shape)))


def test_interpreted_kernel_equals_xla_at_a_ragged_length():
  """The real kernel (interpreted): 40 queries padded to 64 over a memory of 64 keys, bf16."""
  args = _inputs(seed=1)
  mask = causal_mask(Q, Q + MEMORY)
  got = _mosaic(args, mask).astype(jnp.float32)
  want = shaw_attention(*args, mask=mask, implementation='xla').astype(jnp.float32)
  assert float(jnp.max(jnp.abs(got - want))) < 2e-2  # bf16 outputs of size ~1: a few ulps
  assert float(jnp.max(jnp.abs(got - want))) > 0  # a different program ran


@pytest.mark.slow
def test_interpreted_kernel_gradients_equal_xla_at_a_ragged_length():
  args = _inputs(seed=2)
  got = jax.jit(jax.grad(lambda *a: _loss('mosaic', *a), argnums=range(5)))(*args)
  want = jax.grad(lambda *a: _loss('xla', *a), argnums=range(5))(*args)
  for name, g, w in zip(['q', 'k', 'v', 'w^K', 'w^V'], got, want, strict=True):
    g, w = (np.asarray(x, np.float32) for x in (g, w))
    error = np.max(np.abs(g - w)) / np.max(np.abs(w))
    assert error < 3e-2, (name, error)
