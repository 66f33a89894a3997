"""Training-step time of the translation model for each position mode, measured in one run.

    python benchmarks/translate_step.py --config=configs/translate_tiny.py
    python benchmarks/translate_step.py --config=configs/translate_tiny.py --batches=24 --rounds=5

Reads the config's data (translate_tiny's is Tatoeba: `python -m relpos.data.prepare tatoeba
--out=data/` once; or the bundled toy-ende slice, with the `--config.data.*` overrides of
translate_tiny's docstring; the vocabulary is trained in a temporary directory), takes the
first `--batches` training batches (real sentences, every bucket shape),
builds the config's model once per position mode, and times a pass of the jitted train step
(forward, backward, Adam update) over those batches, the modes interleaved round by round.
Prints ms per batch, target tokens/s and the ratio to 'absolute' (Shaw et al.: 7% slower),
and how close each step comes to the machine: the model FLOPs per batch
(`relpos.flops.translation_flops` of each batch's padded shape, a training step counted as 3 x
the forward pass), XLA's count beside it ("n/a" where XLA has none), the model FLOP rate and
MFU against the devices' peak (`timing.peak_rate`: a GPU's or TPU's data-sheet peak in
config.model.dtype; on a CPU the float32 matmul rate, timed in the same run on the model's own
feed-forward and output shapes: at 1.00 every model FLOP would run as fast as a plain matmul;
the peer harness's translation target needs more than that, docs/performance-cpu.md), with every
attention
pair counted and with only the causally visible ones.
`--threefry=unrolled,rolled` also times each mode with jax 0.10.2's own rolled-loop PRNG
lowering (relpos.threefry_lowering), for relpos's default on and off in one run.
`--shaw_dense_max_kv_len=0,64` times the Shaw modes once per value of
config.model.shaw_dense_max_kv_len (0: the banded kernel at every length), which is how
that threshold was chosen. `--attention_implementations=auto,xla,pallas` times the Shaw modes
once per `config.model.attention_implementation` (on a GPU 'auto' times both kernels at each
batch shape's calls on first use and keeps the faster, relpos.attention.autotune; this shows it
against each kernel named). `--dropout_bits=threefry2x32,hash` times each mode once per
`config.model.dropout_bits`.
"""

import functools
import itertools
import operator
import tempfile
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import step_profile
from absl import flags
from ml_collections import config_flags
from timing import (
  CONVENTION_LINE,
  STEP_COLUMNS,
  check_task_config,
  interleaved_median_seconds,
  peak_memory_line,
  peak_rate,
  repeated_row_line,
  step_cells,
  step_flops,
  with_repeated_rows,
)

from relpos import flag_types, runtime, threefry_lowering
from relpos import flops as flops_lib
from relpos.attention import autotune
from relpos.attention.implementations import IMPLEMENTATIONS
from relpos.cli import run_main
from relpos.config.model_fields import DROPOUT_BITS
from relpos.constants import PAD_ID
from relpos.data.translation import load_translation_data
from relpos.training import translation_task as translate
from relpos.training.mesh import data_mesh

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A translation config.')
_BATCHES = flags.DEFINE_integer('batches', 12, 'Training batches per timed pass.', lower_bound=1)
_ROUNDS = flags.DEFINE_integer(
  'rounds', 5, 'Interleaved timing rounds (median reported).', lower_bound=1
)
_POSITIONS = flags.DEFINE_list(
  'positions',
  'absolute,shaw,shaw_absolute,learned,none',
  'Position modes to time (config.model.position values, checked as train.py checks them).',
)
flags.register_validator(
  'positions', bool, message='--positions takes one or more position modes, e.g. absolute,shaw'
)
_LOWERINGS = ('unrolled', 'rolled')
_THREEFRY = flags.DEFINE_list(
  'threefry',
  'unrolled',
  'CPU lowerings of the PRNG to time each mode with: unrolled (relpos.threefry_lowering, the '
  "default) and/or rolled (jax 0.10.2's own loop).",
)
flags.register_validator(
  'threefry',
  lambda values: bool(values) and set(values) <= set(_LOWERINGS),
  message=f'--threefry takes one or more of {", ".join(_LOWERINGS)}',
)
_DENSE_MAX = flag_types.define_int_list(
  'shaw_dense_max_kv_len',
  '',
  'Values of config.model.shaw_dense_max_kv_len to time the Shaw modes with (default: the '
  "config's own).",
  minimum=0,
  allow_empty=True,
)
_IMPLEMENTATIONS = flags.DEFINE_list(
  'attention_implementations',
  [],
  'Values of config.model.attention_implementation to time the Shaw modes with (default: '
  "the config's own).",
)
flags.register_validator(
  'attention_implementations',
  lambda values: set(values) <= set(IMPLEMENTATIONS),
  message=f'--attention_implementations takes {", ".join(IMPLEMENTATIONS)}',
)
_DROPOUT_BITS = flags.DEFINE_list(
  'dropout_bits',
  [],
  "Values of config.model.dropout_bits to time each mode with (default: the config's own).",
)
flags.register_validator(
  'dropout_bits',
  lambda values: set(values) <= set(DROPOUT_BITS),
  message=f'--dropout_bits takes {", ".join(DROPOUT_BITS)}',
)
flags.mark_flags_as_required(['config'])


def variant_config(config, position, implementation=None, dropout_bits=None, threshold=None):
  """A copy of `config` with `position`, the attention `implementation`, `dropout_bits` and
  Shaw's dense-form `threshold` (config.model.shaw_dense_max_kv_len; None: the config's)."""
  variant = ml_collections.ConfigDict(config.to_dict())
  variant.model.position = position
  if threshold is not None:
    variant.model.shaw_dense_max_kv_len = threshold
  if implementation is not None:
    variant.model.attention_implementation = implementation
  if dropout_bits is not None:
    variant.model.dropout_bits = dropout_bits
  return variant


def variants():
  """(lowering, position, Shaw threshold, implementation, dropout bits) of every variant the
  flags ask for, in the order they are timed (None: the config's or relpos's own)."""
  for lowering, position in itertools.product(_THREEFRY.value, _POSITIONS.value):
    thresholds = _DENSE_MAX.value if 'shaw' in position else []
    implementations = _IMPLEMENTATIONS.value if 'shaw' in position else []
    for threshold, implementation, bits in itertools.product(
      thresholds or [None], implementations or [None], _DROPOUT_BITS.value or [None]
    ):
      yield lowering, position, threshold, implementation, bits


def pass_call(
  config,
  position,
  vocab_size,
  batches,
  mesh,
  implementation=None,
  dropout_bits=None,
  threshold=None,
):
  """A zero-argument call running the train step of `position` (with the attention
  `implementation`, `dropout_bits` and Shaw's dense-form `threshold`, None: the config's) over
  `batches` (state kept), the
  model's forward FLOPs of that pass (`relpos.flops.Flops`), XLA's FLOP count of it (None where
  XLA has none) and, per batch, a function giving its compiled module's text
  (`step_profile.compiled_text`; one function per shape)."""
  variant = variant_config(config, position, implementation, dropout_bits, threshold)
  graphdef, state = translate.build(variant, vocab_size, mesh)
  train_step = translate.train_step_fn(variant, graphdef, mesh)
  carried = {'state': state}
  texts = {
    tuple(x.shape for x in batch.values()): step_profile.compiled_text(train_step, state, batch)
    for batch in batches
  }
  xla_counts = [step_flops(train_step, state, batch, devices=mesh.size) for batch in batches]
  xla_count = None if None in xla_counts else sum(xla_counts)
  model_flops = functools.reduce(
    operator.add,
    (
      flops_lib.translation_flops(
        variant.model,
        rows=batch['src'].shape[0],
        src_len=batch['src'].shape[1],
        tgt_len=batch['tgt_in'].shape[1],
        vocab_size=vocab_size,
      )
      for batch in batches
    ),
  )

  def call():
    for batch in batches:
      carried['state'], sums = train_step(carried['state'], batch)
    return sums['loss']

  # One text function per batch, in the order the pass runs them (a shape's function once per
  # batch of that shape): the floor of a pass counts each batch (step_profile.floor_line).
  per_batch = [texts[tuple(x.shape for x in batch.values())] for batch in batches]
  return call, model_flops, xla_count, per_batch


def main(argv):
  del argv
  config = _CONFIG.value
  mesh = data_mesh()
  # The config and each variant of it pass train.py's checks before the data is read.
  check_task_config(config, ('translate',), mesh)
  for _, position, _, implementation, bits in variants():
    given = [f'--positions={position}']
    given += [f'--attention_implementations={implementation}'] if implementation else []
    given += [f'--dropout_bits={bits}'] if bits else []
    check_task_config(
      variant_config(config, position, implementation, bits),
      ('translate',),
      mesh,
      variant=' '.join(given),
    )
  data_path = config.data.train_src
  if config.data.kind == 'text' and not Path(data_path).exists():
    raise SystemExit(f'skipped: {data_path} is absent (set --config.data.train_src etc.)')
  with tempfile.TemporaryDirectory() as workdir:
    # Rows a multiple of the device count, as train.py builds them (the batch splits evenly).
    data = load_translation_data(config.data, workdir, seed=config.seed, row_multiple=mesh.size)
  batches = []
  target_tokens = 0
  for step in range(_BATCHES.value):
    batch = data.train.batch(step)[1]
    batches.append({name: jnp.asarray(batch[name]) for name in ('src', 'tgt_in', 'tgt_out')})
    target_tokens += int((batch['tgt_out'] != PAD_ID).sum())
  vocab_size = data.tokenizer.vocab_size
  calls, model_flops, xla_counts, texts = {}, {}, {}, {}
  chosen, repeats = {}, {}  # 'auto' variant -> its calls' choices; variant -> 'auto' variant
  order = []  # every variant, built or repeated, in the order named
  lowered_with = None  # the PRNG lowering set last
  for lowering, position, threshold, implementation, bits in variants():
    if lowering != lowered_with:
      if not threefry_lowering.set_cpu_lowering(unrolled=lowering == 'unrolled'):
        raise SystemExit(f'error: --threefry={lowering}: this JAX lacks that lowering rule')
      lowered_with = lowering
    name = position if _THREEFRY.value == ['unrolled'] else f'{position}, {lowering}'
    variant = name if threshold is None else f'{name}, dense ≤ {threshold} keys'
    auto_variant = variant + ', auto kernels'
    if implementation is not None:
      variant += f', {implementation} kernels'
    if bits is not None:
      auto_variant += f', {bits} dropout bits'
      variant += f', {bits} dropout bits'
    order.append(variant)
    if chosen.get(auto_variant) == {implementation}:
      # Every call of the 'auto' pass chose these kernels: the same programs
      # (autotune.recorded_choices), timed once, as 'auto'.
      repeats[variant] = auto_variant
      continue
    with autotune.recorded_choices() as choices:
      calls[variant], model_flops[variant], xla_counts[variant], texts[variant] = pass_call(
        config, position, vocab_size, batches, mesh, implementation, bits, threshold
      )
      calls[variant]()  # compiles now, with this lowering and threshold
    if implementation == 'auto':
      chosen[variant] = set(choices)
  threefry_lowering.unroll_on_cpu()
  seconds = with_repeated_rows(
    interleaved_median_seconds(calls, rounds=_ROUNDS.value, warmup=1),
    repeats,
    order,
    model_flops,
    xla_counts,
  )
  m = config.model
  tokens = config.data.max_tokens
  peak, peak_line = peak_rate(
    mesh,
    m.dtype,
    [(tokens, m.d_model, m.d_ff), (tokens, m.d_ff, m.d_model), (tokens, m.d_model, vocab_size)],
  )
  print(
    f'{m.encoder_layers}+{m.decoder_layers} layers, d_model={m.d_model}, heads={m.num_heads}, '
    f'd_ff={m.d_ff}, k={m.max_relative_position}, max_tokens={config.data.max_tokens}; '
    f'{len(batches)} real batches ({target_tokens} target tokens) per pass, '
    f'median of {_ROUNDS.value} interleaved rounds'
  )
  print(peak_line)
  print(CONVENTION_LINE)
  base_name = next(iter(seconds))  # the first mode, with the first lowering
  base = seconds[base_name]
  print(f'| position | ms / batch | target tokens/s | step time / {base_name} |{STEP_COLUMNS}')
  print('|---|---|---|---|---|---|---|---|---|')
  for name, s in seconds.items():
    step = s / len(batches)
    xla_per_batch = None if xla_counts[name] is None else xla_counts[name] / len(batches)
    per_batch = model_flops[name].scaled(1 / len(batches))
    print(
      f'| {name} | {step * 1e3:.1f} | {target_tokens / s:.0f} | {s / base:.3f} |'
      + step_cells(per_batch, xla_per_batch, step, peak)
    )
  for variant, auto_variant in repeats.items():
    print(repeated_row_line(variant, auto_variant))
  for name in seconds:  # 'auto' against each kernel named, where all three ran
    if name.endswith(', auto kernels'):
      stem = name.removesuffix(', auto kernels')
      kernels = {k: seconds.get(f'{stem}, {k} kernels') for k in ('xla', 'pallas')}
      if None not in kernels.values():
        print(autotune.auto_line(stem, seconds[name], kernels))
  if memory := peak_memory_line():
    print(memory)
  if step_profile.PROFILE_STEPS.value:
    step_profile.print_profiles(
      calls, texts, steps=step_profile.PROFILE_STEPS.value, trace_dir=step_profile.PROFILE_DIR.value
    )


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  run_main(main)
