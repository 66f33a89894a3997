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

Builds the config's model once per `config.model.position` mode (xl, shaw, absolute, none; the xl
row also without memory, without dropout (what its random bits and masks cost) and with dropout's
bits from relpos.counter_hash; xl and shaw also
with each kernel named instead of 'auto', in bf16 xl also with cuDNN's, and both with the Mosaic GPU
kernels), times the jitted train step (forward, backward, Adam update) on a fixed random batch with
the modes interleaved round by round, and prints ms/step, tokens/s and the ratio to the first
variant named, then each step's model FLOPs (`relpos.flops.char_lm_flops`, a training step counted
as 3 x the forward pass), XLA's count beside it ("n/a" where XLA has no cost analysis, e.g. on a GPU
without a compiled one), the model FLOP rate and MFU against the devices' peak (`timing.peak_rate`:
a GPU's or TPU's data-sheet peak in config.model.dtype; on a CPU the float32 matmul rate timed in
the same run on the model's own shapes), with every attention pair counted and with only the
causally visible ones. `--profile_steps=3` then traces three steps of each variant and prints where
the time goes (benchmarks/step_profile.py).
"""

import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import step_profile
from absl import flags
from ml_collections import config_flags
from timing import (
  CONVENTION_LINE,
  STEP_COLUMNS,
  build_within,
  check_task_config,
  interleaved_median_seconds,
  peak_memory_line,
  peak_rate,
  repeated_row_line,
  step_cells,
  step_flops,
  with_repeated_rows,
)

from relpos import flops as flops_lib
from relpos import runtime
from relpos.attention import autotune
from relpos.cli import run_main
from relpos.training.char_lm_task import build, train_step_fn
from relpos.training.mesh import data_mesh

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A character-LM config.')
_ROUNDS = flags.DEFINE_integer(
  'rounds', 10, 'Interleaved timing rounds (median reported).', lower_bound=1
)
flags.mark_flags_as_required(['config'])
_VOCAB_SIZE = 256  # bytes

# --variants name -> (table name, config overrides).
_VARIANTS = {
  'xl': ('xl', {'model': {'position': 'xl'}}),
  'xl_mem0': ('xl, mem_len=0', {'model': {'position': 'xl'}, 'train': {'mem_len': 0}}),
  'shaw': ('shaw', {'model': {'position': 'shaw'}}),
  'absolute': ('absolute', {'model': {'position': 'absolute'}}),
  'none': ('none', {'model': {'position': 'none'}}),
  # XL's position term as the bias of cuDNN's flash attention (bf16 configs only).
  'xl_cudnn': (
    'xl, cudnn kernels',
    {'model': {'position': 'xl', 'attention_implementation': 'cudnn'}},
  ),
  # The causal Mosaic GPU kernels (bf16 configs only; Hopper GPUs).
  **{
    f'{position}_mosaic': (
      f'{position}, mosaic kernels',
      {'model': {'position': position, 'attention_implementation': 'mosaic'}},
    )
    for position in ('xl', 'shaw')
  },
  # What dropout (its random bits and masks) costs in the step, and its bits from a hash.
  'xl_nodropout': (
    'xl, no dropout',
    {'model': {'position': 'xl', 'dropout': 0.0, 'attention_dropout': 0.0}},
  ),
  'xl_hash_dropout': (
    'xl, hashed dropout bits',
    {'model': {'position': 'xl', 'dropout_bits': 'hash'}},
  ),
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
  f"Variants to time, the first the ratios' base: {', '.join(_VARIANTS)}.",
)
_SECONDS = flags.DEFINE_float(
  'seconds',
  0.0,
  'Time budget (0: none), for a run under a time limit: the variants are built (compiled and '
  'run once) in the order given while they fit 60% of it with --profile_steps, else 85% '
  '(timing.build_within: the timing itself takes seconds); the rest are left out with a line '
  'naming them, and the profiles are skipped once 80% of it is spent, so that the table '
  'prints.',
  lower_bound=0,
)
flags.register_validator(
  'variants',
  lambda names: bool(names) and set(names) <= set(_VARIANTS),
  message=f'--variants: one or more of {", ".join(_VARIANTS)}',
)


def variant_config(config, overrides):
  """A copy of `config` with a variant's overrides (`_VARIANTS`)."""
  variant = ml_collections.ConfigDict(config.to_dict())
  variant.model.update(overrides.get('model', {}))
  variant.train.update(overrides.get('train', {}))
  return variant


def step_call(config, overrides, inputs, targets, mesh):
  """A zero-argument call running one training step of the variant (state carried along), the
  model's forward FLOPs (`relpos.flops.Flops`), XLA's FLOP count of that step (or None) and a
  function giving its compiled module's text (`step_profile.compiled_text`)."""
  variant = variant_config(config, overrides)
  _, graphdef, state = build(variant, _VOCAB_SIZE, mesh)
  train_step = train_step_fn(variant, graphdef, mesh)
  carried = {'state': state}
  xla_count = step_flops(train_step, state, (inputs, targets), devices=mesh.size)
  text = step_profile.compiled_text(train_step, state, (inputs, targets))
  batch, length = inputs.shape
  model_flops = flops_lib.char_lm_flops(
    variant.model,
    batch=batch,
    tgt_len=length,
    mem_len=variant.train.mem_len,
    vocab_size=_VOCAB_SIZE,
  )

  def call():
    carried['state'], sums = train_step(carried['state'], (inputs, targets))
    return sums['loss']

  jax.block_until_ready(call())  # compiled here (and 'auto' tuned), within the build's time
  return call, model_flops, xla_count, text


def main(argv):
  del argv
  config = _CONFIG.value
  mesh = data_mesh()
  names = list(dict.fromkeys(_NAMES.value))  # the first is the ratios' base
  # Every variant's config passes train.py's checks before the first is built.
  check_task_config(config, ('char_lm',), mesh)
  for name in names:
    check_task_config(
      variant_config(config, _VARIANTS[name][1]), ('char_lm',), mesh, variant=f'--variants={name}'
    )
  batch, length = config.train.batch_size, config.train.tgt_len
  tokens = np.random.default_rng(0).integers(0, _VOCAB_SIZE, (batch, length + 1))
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  start = time.perf_counter()
  chosen = {}  # 'xl'/'shaw' -> the kernels its 'auto' variant's calls resolved to

  def build(name):
    overrides = _VARIANTS[name][1]
    named = overrides['model'].get('attention_implementation')
    position = overrides['model']['position']
    if named is not None and chosen.get(position) == {named}:
      # 'auto' chose these kernels at every call, and `resolve_implementation` gives a chosen
      # name the implementation and tiles naming it gives: the same program (compared in
      # tests/test_autotune.py), not built twice (45 to 60 s at enwik8_base's size on
      # an H200, of a step part's few minutes). A str: the table name whose time it shares.
      return _VARIANTS[position][0]
    with autotune.recorded_choices() as choices:
      built = step_call(config, overrides, inputs, targets, mesh)
    if name in ('xl', 'shaw') and config.model.attention_implementation == 'auto':
      chosen[name] = set(choices)
    return built

  built, left_out = build_within(
    names, build, _SECONDS.value, share=0.6 if step_profile.PROFILE_STEPS.value else 0.85
  )
  calls, model_flops, xla_counts, texts, repeats = {}, {}, {}, {}, {}
  for name, variant in built.items():
    table_name = _VARIANTS[name][0]
    if isinstance(variant, str):  # the 'auto' variant's program: timed once, as that variant
      repeats[table_name] = variant
      continue
    call, flops, xla_count, text = variant
    calls[table_name], model_flops[table_name], xla_counts[table_name] = call, flops, xla_count
    texts[table_name] = text
  seconds = with_repeated_rows(
    interleaved_median_seconds(calls, rounds=_ROUNDS.value, warmup=1),
    repeats,
    [_VARIANTS[name][0] for name in built],
    model_flops,
    xla_counts,
  )
  m = config.model
  rows = batch * length
  peak, peak_line = peak_rate(
    mesh,
    m.dtype,
    [(rows, m.d_model, m.d_ff), (rows, m.d_ff, m.d_model), (rows, m.d_model, _VOCAB_SIZE)],
  )
  print(
    f'num_layers={m.num_layers} d_model={m.d_model} num_heads={m.num_heads} batch={batch} '
    f'tgt_len={length} mem_len={config.train.mem_len}  '
    f'median of {_ROUNDS.value} interleaved rounds'
  )
  print(peak_line)
  print(CONVENTION_LINE)
  base = next(iter(seconds))
  print(f'| position | ms / step | tokens/s | step time / {base} |{STEP_COLUMNS}')
  print('|---|---|---|---|---|---|---|---|---|')
  for name, s in seconds.items():
    print(
      f'| {name} | {s * 1e3:.1f} | {batch * length / s:.0f} | {s / seconds[base]:.2f} |'
      + step_cells(model_flops[name], xla_counts[name], s, peak)
    )
  for table_name, auto_name in repeats.items():
    print(repeated_row_line(table_name, auto_name))
  for position in ('xl', 'shaw'):  # 'auto' against each kernel named, where xla and another ran
    named_kernels = ('xla', 'pallas', 'cudnn', 'mosaic')
    kernels = {k: seconds.get(f'{position}, {k} kernels') for k in named_kernels}
    named = {k: s for k, s in kernels.items() if s is not None}
    if position in seconds and 'xla' in named and len(named) > 1:
      print(autotune.auto_line(position, seconds[position], named))
  if memory := peak_memory_line():
    print(memory)
  if left_out:
    print(left_out)
  spent = time.perf_counter() - start
  if step_profile.PROFILE_STEPS.value and _SECONDS.value and spent > 0.8 * _SECONDS.value:
    print(f'time budget: profiles skipped ({spent:.0f} s of --seconds={_SECONDS.value:g} spent)')
  elif step_profile.PROFILE_STEPS.value:
    step_profile.print_profiles(
      calls, texts, steps=step_profile.PROFILE_STEPS.value, trace_dir=step_profile.PROFILE_DIR.value
    )


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  run_main(main)
