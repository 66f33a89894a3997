"""Both models' training steps and XL's evaluation lower for a TPU (no TPU needed: `jax.export`
for platform 'tpu' runs JAX's lowering to StableHLO here; XLA:TPU's compilation is not run).

No TPU has run relpos (README, "GPUs, TPUs and many hosts"). What these tests guard is the part
of a TPU run that a CPU can check: that the default `attention_implementation='auto'`, resolved
as on a TPU (`jax.default_backend()` says 'tpu'), picks kernels that lower there, so the module
holds no custom call at all (no Triton, Mosaic GPU or cuDNN kernel, which have no TPU form), and
that nothing else in the step (dropout's bits, the relative shift, Shaw's banded kernel,
`lax.platform_dependent`'s CPU branches) is CPU- or GPU-only. The implementations that do not
run on a TPU ('pallas', 'cudnn', 'mosaic') are refused before a run
(`implementations.check_runs_on`, tests/test_checks.py).
"""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from relpos.config.char_lm_defaults import char_lm_config
from relpos.config.translation_defaults import translate_config
from relpos.training import char_lm_task, translation_task
from relpos.training.mesh import data_mesh

_SHAPES = {'batch': 2, 'length': 32}


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _char_lm_config(position, dtype):
  config = char_lm_config()
  config.model.update(
    position=position, num_layers=1, d_model=64, num_heads=2, head_dim=32, d_ff=64, dtype=dtype
  )  # one layer: a layer's every operation is in the module, which lowers in half the time
  config.train.update(batch_size=_SHAPES['batch'], tgt_len=_SHAPES['length'], mem_len=32)
  return config


def _char_lm_step(position, dtype):
  config = _char_lm_config(position, dtype)
  mesh = data_mesh()
  _, graphdef, state = char_lm_task.build(config, 256, mesh)
  tokens = jax.ShapeDtypeStruct((_SHAPES['batch'], _SHAPES['length']), jnp.int32)
  return char_lm_task.train_step_fn(config, graphdef, mesh), (_abstract(state), (tokens, tokens))


def _translation_step(position, dtype):
  config = translate_config()
  config.model.update(
    position=position, encoder_layers=1, decoder_layers=1, d_model=64, num_heads=2, d_ff=64
  )
  config.model.dtype = dtype
  mesh = data_mesh()
  graphdef, state = translation_task.build(config, 300, mesh)
  tokens = jax.ShapeDtypeStruct((_SHAPES['batch'], _SHAPES['length']), jnp.int32)
  batch = {'src': tokens, 'tgt_in': tokens, 'tgt_out': tokens}
  return translation_task.train_step_fn(config, graphdef, mesh), (_abstract(state), batch)


@pytest.mark.parametrize(
  ('build', 'position', 'dtype'),
  [
    (_char_lm_step, 'xl', 'bfloat16'),
    (_char_lm_step, 'shaw', 'float32'),
    (_translation_step, 'shaw', 'bfloat16'),
  ],
  ids=['char_lm-xl-bf16', 'char_lm-shaw-f32', 'translate-shaw-bf16'],
)
def test_the_training_step_lowers_for_a_tpu_with_no_custom_call(
  monkeypatch, build, position, dtype
):
  step, shapes = build(position, dtype)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')  # 'auto' resolves as on a TPU
  module = jax.export.export(step, platforms=['tpu'])(*shapes).mlir_module()
  assert re.findall(r'custom_call @(\w+)', module) == []
  # The step is the whole step: the optimizer's update is in it, not only the loss.
  assert module.count('stablehlo.dot_general') > 10


def test_the_char_lm_evaluation_with_a_longer_memory_lowers_for_a_tpu(monkeypatch):
  """XL's evaluation as the paper runs it: a memory longer than the training one, `clamp_len`
  and `same_length` (`char_lm_task.score_segment`, forward only)."""
  model, _, _ = char_lm_task.build(_char_lm_config('xl', 'bfloat16'), 256, data_mesh())
  graphdef, state = nnx.split(model)
  memory = model.init_memory(_SHAPES['batch'], 2 * _SHAPES['length'])
  tokens = jax.ShapeDtypeStruct((_SHAPES['batch'], _SHAPES['length']), jnp.int32)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
  exported = jax.export.export(char_lm_task.score_segment, platforms=['tpu'])(
    graphdef, _abstract(state), _abstract(memory), tokens, tokens, _SHAPES['length'], True
  )
  assert re.findall(r'custom_call @(\w+)', exported.mlir_module()) == []
