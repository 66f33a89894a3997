"""Mixed precision is one switch, `config.model.dtype='bfloat16'`: bf16 compute with float32
parameters and optimizer state, in both tasks, and a bf16 training step close to the float32
one from the same start."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos.config.char_lm_defaults import char_lm_config
from relpos.config.translation_defaults import translate_config
from relpos.training import char_lm_task, translation_task
from relpos.training.mesh import data_mesh


def _char_config(dtype):
  config = char_lm_config()
  config.model.update(
    position='xl', num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=64, dtype=dtype
  )  # one layer: a training step compiles in half the time of two's, and has every parameter
  config.model.dropout = 0.0
  config.train.update(batch_size=2, tgt_len=16, mem_len=16)
  return config


def _floating_leaves(tree):
  """The floating-point leaves of `tree`, as float64 NumPy arrays (copies)."""
  return [
    np.asarray(leaf, np.float64)
    for leaf in jax.tree.leaves(tree)
    if hasattr(leaf, 'dtype') and jnp.issubdtype(leaf.dtype, jnp.floating)
  ]


def _floating(tree):
  return {
    jax.tree_util.keystr(path): leaf.dtype
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    if hasattr(leaf, 'dtype') and jnp.issubdtype(leaf.dtype, jnp.floating)
  }


@pytest.mark.parametrize('task', ['char_lm', 'translation'])
def test_bfloat16_keeps_parameters_and_optimizer_state_in_float32(task):
  mesh = data_mesh()
  if task == 'char_lm':
    _, _, state = char_lm_task.build(_char_config('bfloat16'), 256, mesh)
  else:
    config = translate_config()
    config.model.update(
      encoder_layers=1, decoder_layers=1, d_model=32, num_heads=2, d_ff=64, dtype='bfloat16'
    )
    _, state = translation_task.build(config, 64, mesh)
  parameters, optimizer = _floating(state['model']), _floating(state['optimizer'])
  assert parameters and optimizer
  assert set(parameters.values()) == {jnp.dtype('float32')}, parameters
  assert set(optimizer.values()) == {jnp.dtype('float32')}, optimizer


def test_a_bfloat16_step_is_close_to_the_float32_step():
  """One char LM training step from the same parameters: the loss within 1%, Adam's first
  update pointing the same way (cosine > 0.9; it is about sign(gradient) in either), and the
  memory carried in the compute dtype."""
  mesh = data_mesh()
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 17)))
  batch = (tokens[:, :-1], tokens[:, 1:])
  results = {}
  for dtype in ('float32', 'bfloat16'):
    config = _char_config(dtype)
    _, graphdef, state = char_lm_task.build(config, 256, mesh)
    before = _floating_leaves(state['model'])
    state, sums = char_lm_task.train_step_fn(config, graphdef, mesh)(state, batch)
    after = _floating_leaves(state['model'])
    flat = np.concatenate([(new - old).ravel() for new, old in zip(after, before, strict=True)])
    results[dtype] = (float(sums['loss']), flat, state['memory']['hidden'].dtype)
  (loss32, update32, memory32), (loss16, update16, memory16) = results.values()
  assert abs(loss16 - loss32) <= 0.01 * abs(loss32)
  cosine = update16 @ update32 / np.linalg.norm(update16) / np.linalg.norm(update32)
  assert cosine > 0.9, cosine
  assert (memory32, memory16) == (jnp.float32, jnp.bfloat16)
