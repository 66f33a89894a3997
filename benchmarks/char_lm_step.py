"""Training-step time of the character LM for each attention mode, measured in one run.

    python benchmarks/char_lm_step.py --config=configs/char_tiny.py
    python benchmarks/char_lm_step.py --config=configs/char_tiny.py --rounds=20
    python benchmarks/char_lm_step.py --config=configs/enwik8_base.py --variants=xl,absolute
    python benchmarks/char_lm_step.py --config=configs/enwik8_base.py \
      --variants=xl,xl_xla,xl_pallas,shaw,shaw_xla,shaw_pallas

(on a GPU, where config.model.attention_implementation='auto' times XLA's and the Pallas
kernels at the model's own shapes on first use and keeps the faster, relpos.attention.autotune:
the xl and shaw rows are 'auto', the _xla and _pallas rows name each kernel, so 'auto' can be
checked against the faster of the two).

Builds the config's model once per `config.model.position` mode (xl, shaw, absolute, none;
the xl row also without memory; xl and shaw also with each kernel named instead of 'auto'),
times the jitted train step (forward, backward, Adam update)
on a fixed random batch with the modes interleaved round by round, and prints ms/step,
tokens/s and the ratio to 'xl', and each step's FLOP rate against this machine's float32
matmul rate (`timing.MatmulRate`, timed in the same run on the model's own shapes).
"""

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags
from timing import MatmulRate, interleaved_median_seconds, peak_memory_line, step_flops

from relpos import runtime
from relpos.attention import autotune
from relpos.training.char_lm_task import build, train_step_fn
from relpos.training.mesh import data_mesh

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A character-LM config.')
_ROUNDS = flags.DEFINE_integer('rounds', 10, 'Interleaved timing rounds (median reported).')
flags.mark_flags_as_required(['config'])

# --variants name -> (table name, config overrides).
_VARIANTS = {
  'xl': ('xl', {'model': {'position': 'xl'}}),
  'xl_mem0': ('xl, mem_len=0', {'model': {'position': 'xl'}, 'train': {'mem_len': 0}}),
  'shaw': ('shaw', {'model': {'position': 'shaw'}}),
  'absolute': ('absolute', {'model': {'position': 'absolute'}}),
  'none': ('none', {'model': {'position': 'none'}}),
  # Each kernel named, against 'auto' (on a GPU the faster of the two: relpos.attention.autotune).
  **{
    f'{position}_{kernels}': (
      f'{position}, {kernels} kernels',
      {'model': {'position': position, 'attention_implementation': kernels}},
    )
    for position in ('xl', 'shaw')
    for kernels in ('xla', 'pallas')
  },
}
_NAMES = flags.DEFINE_list(
  'variants',
  ['xl', 'xl_mem0', 'shaw', 'absolute', 'none'],
  f'Variants to time, xl among them: {", ".join(_VARIANTS)}.',
)
flags.register_validator(
  'variants',
  lambda names: 'xl' in names and set(names) <= set(_VARIANTS),
  message=f'--variants must include xl and choose from: {", ".join(_VARIANTS)}',
)


def step_call(config, overrides, inputs, targets, mesh):
  """A zero-argument call running one training step of the variant (state carried along), and
  XLA's FLOP count of that step."""
  variant = ml_collections.ConfigDict(config.to_dict())
  variant.model.update(overrides.get('model', {}))
  variant.train.update(overrides.get('train', {}))
  _, graphdef, state = build(variant, 256, mesh)
  train_step = train_step_fn(variant, graphdef, mesh)
  carried = {'state': state}
  flops = step_flops(train_step, state, (inputs, targets))

  def call():
    carried['state'], sums = train_step(carried['state'], (inputs, targets))
    return sums['loss']

  return call, flops


def main(argv):
  del argv
  config = _CONFIG.value
  batch, length = config.train.batch_size, config.train.tgt_len
  tokens = np.random.default_rng(0).integers(0, 256, (batch, length + 1))
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  mesh = data_mesh()
  calls, flops = {}, {}
  for name in _NAMES.value:
    table_name, overrides = _VARIANTS[name]
    calls[table_name], flops[table_name] = step_call(config, overrides, inputs, targets, mesh)
  seconds = interleaved_median_seconds(calls, rounds=_ROUNDS.value, warmup=2)
  m = config.model
  rows = batch * length
  matmul_rate = MatmulRate(
    mesh, [(rows, m.d_model, m.d_ff), (rows, m.d_ff, m.d_model), (rows, m.d_model, 256)]
  )
  print(
    f'num_layers={m.num_layers} d_model={m.d_model} num_heads={m.num_heads} batch={batch} '
    f'tgt_len={length} mem_len={config.train.mem_len}  '
    f'median of {_ROUNDS.value} interleaved rounds'
  )
  print(matmul_rate.line())
  print(f'| position | ms / step | tokens/s | step time / xl |{MatmulRate.COLUMNS}')
  print('|---|---|---|---|---|---|---|')
  for name, s in seconds.items():
    print(
      f'| {name} | {s * 1e3:.1f} | {batch * length / s:.0f} | {s / seconds["xl"]:.2f} |'
      + matmul_rate.cells(flops[name], s)
    )
  for position in ('xl', 'shaw'):  # 'auto' against each kernel named, where all three ran
    kernels = {k: seconds.get(f'{position}, {k} kernels') for k in ('xla', 'pallas')}
    if position in seconds and None not in kernels.values():
      print(autotune.auto_line(position, seconds[position], kernels))
  if memory := peak_memory_line():
    print(memory)


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  app.run(main)
