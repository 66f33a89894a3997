"""Compile time and memory of one training step of the paper-sized configs, on any backend.

    python benchmarks/compile_report.py
    python benchmarks/compile_report.py --configs=enwik8_base --variants=loop,scan+full
    python benchmarks/compile_report.py --configs=char_tiny:shaw   # a preset of a config

For every config (configs/<name>.py, or <name>:<preset>) and variant (`config.model
.scan_layers`, `config.model.remat`), lowers and compiles the jitted train step (forward,
backward, Adam update) of the config's own global batch on one device, from abstract arrays:
nothing is allocated or run. Every entry is loaded and checked (the task's `check_config`)
before the table starts.
Reports the compile time and XLA's `memory_analysis()`: argument bytes (parameters, Adam's
moments, the batch, the char LM's memory), temporary bytes (activations kept for the backward
pass and scratch) and output bytes. Translation batches are those of the longest length
bucket (`max_tokens` // (`max_length` + 1) rows of `max_length` + 1 positions), the largest
activations a step can meet.

With data parallelism over D devices each device holds the arguments whole and about 1/D of
the temporaries, so the table ends with the fewest devices of `--device_gib` GiB whose share
fits: ceil(temp / (device - args)). This is an estimate from the CPU compiler's buffer
assignment; accelerator compilers fuse and schedule differently.
"""

import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags

from relpos import runtime
from relpos.cli import run_main
from relpos.config import TASKS, load_config_file
from relpos.training import char_lm_task as char_lm
from relpos.training import mesh as mesh_lib
from relpos.training import tasks
from relpos.training import translation_task as translate

CONFIGS_DIR = Path(__file__).resolve().parent.parent / 'configs'


def define_flags():
  """The command-line flags (defined only when run as a program, so tests can import this)."""
  flags.DEFINE_list(
    'configs', 'enwik8_base,enwik8_large,wmt_base,wmt_big', 'Config files under configs/.'
  )
  flags.DEFINE_list(
    'variants', 'loop,loop+full,scan,scan+full', 'loop|scan, optionally +<remat policy>.'
  )
  flags.DEFINE_float('device_gib', 80.0, 'Accelerator memory for the estimate.')
  for name in ('configs', 'variants'):
    flags.register_validator(name, bool, message='must name at least one')
  flags.register_validator('device_gib', lambda gib: gib > 0, message='must be > 0')


TABLE_HEADER = (
  '| config | variant | batch | compile s | arguments GiB | temporaries GiB | output GiB '
  '| devices of {gib:g} GiB |'
)


def variant_config(config, variant: str) -> ml_collections.ConfigDict:
  """`config` with scan_layers and remat set from 'loop' / 'scan' [+ '<policy>']."""
  layout, _, remat = variant.partition('+')
  if layout not in ('loop', 'scan'):
    raise ValueError(f'--variants: {variant!r} must start with loop or scan')
  copy = ml_collections.ConfigDict(config.to_dict())
  copy.model.update(scan_layers=layout == 'scan', remat=remat or 'none')
  return copy


def load(name: str) -> ml_collections.ConfigDict:
  """The config --configs names: configs/<name>.py, or <name>:<preset> for a preset of it;
  ValueError naming the entry for a file that is not there or not a training config."""
  file, _, preset = name.partition(':')
  path = CONFIGS_DIR / f'{file}.py'
  if not path.is_file():
    raise ValueError(f'--configs={name}: no config file {path}')
  try:
    config = load_config_file(path, preset or None)
  except ValueError as error:
    raise ValueError(f'--configs={name}: {error}') from None
  if config.get('task') not in TASKS:
    raise ValueError(
      f'--configs={name}: not a training config (config.task {config.get("task")!r}); '
      f'this report compiles the train step of {" and ".join(TASKS)} configs'
    )
  return config


def planned_rows(names, variants) -> list[tuple[str, str, ml_collections.ConfigDict]]:
  """(name, variant, config) of every row, each config loaded and checked as train.py checks
  it (the task's `check_config`, on one device) before any row is compiled or printed, so a
  bad entry is one line, not a table cut short."""
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  rows = []
  for name in names:
    base = load(name)
    for variant in variants:
      config = variant_config(base, variant)
      try:
        tasks.get(config).check_config(config, mesh)
      except ValueError as error:
        raise ValueError(f'--configs={name} --variants={variant}: {error}') from None
      rows.append((name, variant, config))
  return rows


def _abstract(tree):
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def abstract_step(config):
  """(jitted train step, abstract state, abstract batch, batch description) of `config`."""
  mesh = mesh_lib.data_mesh(jax.devices()[:1])
  task = char_lm if config.task == 'char_lm' else translate
  if config.task == 'char_lm':
    # 'original' holds the bytes of the data, which is not read here: its most (all but newline)
    vocab = 256 if config.data.vocab == 'bytes' else 255
    graphdef, state = _graphdef_and_abstract_state(lambda: char_lm.build(config, vocab, mesh)[1:])
    shape = (config.train.batch_size, config.train.tgt_len)
    batch = tuple(jax.ShapeDtypeStruct(shape, jnp.int32) for _ in range(2))
    description = f'{shape[0]} x {shape[1]} chars, mem {config.train.mem_len}'
  else:
    vocab = config.data.vocab_size
    graphdef, state = _graphdef_and_abstract_state(lambda: translate.build(config, vocab, mesh))
    length = config.data.max_length + 1
    shape = (config.data.max_tokens // length, length)
    batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32) for name in ('src', 'tgt_in', 'tgt_out')}
    description = f'{shape[0]} x {shape[1]} pieces'
  return task.train_step_fn(config, graphdef, mesh), state, batch, description


def _graphdef_and_abstract_state(build):
  """The graphdef and the abstract state of `build() -> (graphdef, state)`, built under
  `jax.eval_shape`: no parameter is allocated."""
  holder = {}

  def arrays():
    graphdef, state = build()
    holder['graphdef'] = graphdef
    return state

  state = jax.eval_shape(arrays)
  return holder['graphdef'], _abstract(state)


def measure(config) -> dict:
  step, state, batch, description = abstract_step(config)
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  return {
    'batch': description,
    'compile_s': seconds,
    'arguments': memory.argument_size_in_bytes,
    'temporaries': memory.temp_size_in_bytes,
    'output': memory.output_size_in_bytes,
  }


def devices_needed(arguments: int, temporaries: int, device_bytes: float) -> str:
  """The fewest data-parallel devices whose 1/D share of the temporaries fits beside the
  whole arguments ('-' if the arguments alone do not fit)."""
  free = device_bytes - arguments
  return '-' if free <= 0 else str(max(1, math.ceil(temporaries / free)))


def main(argv):
  del argv
  args, gib = flags.FLAGS, 2.0**30
  rows = planned_rows(args.configs, args.variants)
  print(TABLE_HEADER.format(gib=args.device_gib))
  print('|---|---|---|---|---|---|---|---|')
  for name, variant, config in rows:
    row = measure(config)
    needed = devices_needed(row['arguments'], row['temporaries'], args.device_gib * gib)
    sizes = (row['arguments'], row['temporaries'], row['output'])
    print(
      f'| {name} | {variant} | {row["batch"]} | {row["compile_s"]:.1f} | '
      + ' | '.join(f'{np.float64(size) / gib:.2f}' for size in sizes)
      + f' | {needed} |',
      flush=True,
    )


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  define_flags()
  run_main(main)
