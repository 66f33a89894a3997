"""Data-parallel train-step throughput at 1, 2 and 4 devices (forced CPU host devices).

    python benchmarks/data_parallel.py --config=configs/char_tiny.py
    python benchmarks/data_parallel.py --config=configs/translate_tiny.py --device_counts=1,2,4

For each device count this script runs itself in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=N (it must be set before jax starts), which
times the jitted data-parallel train step on the same global batches: the char LM on a fixed
random [batch_size, tgt_len] batch, translation on the first `--batches` real training batches
(rows a multiple of the largest device count, so every count sees the same batches). It prints
ms per step, tokens per second and the loss after the timed steps, which should agree across
device counts. Forced host devices share the machine's cores: on a small CPU machine this shows
that the step runs and stays correct, not that it scales.

The config is checked as train.py checks it (`timing.check_task_config`) before any worker
starts, and again in each worker against its devices (a char-LM batch that does not split
across one of the counts); a worker's `error:` line is the parent's. A worker that runs past
`--worker_timeout` is killed and named: a benchmark never waits without end.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import flags
from ml_collections import config_flags
from timing import check_task_config

from relpos import flag_types, runtime
from relpos.cli import run_main
from relpos.config import TASKS
from relpos.constants import PAD_ID
from relpos.data.translation import load_translation_data
from relpos.training import char_lm_task as char_lm
from relpos.training import mesh as mesh_lib
from relpos.training import translation_task as translate

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A char_lm or translate config.')
_COUNTS = flag_types.define_int_list(
  'device_counts', '1,2,4', 'Numbers of forced host devices.', minimum=1, maximum=1024
)
_STEPS = flags.DEFINE_integer(
  'steps', 10, 'Timed steps (char LM) or passes (translation).', lower_bound=1
)
_BATCHES = flags.DEFINE_integer(
  'batches', 4, 'Translation: real training batches per pass.', lower_bound=1
)
_TIMEOUT = flags.DEFINE_float(
  'worker_timeout', 1800.0, 'Seconds each device count may take before it is killed.', lower_bound=1
)
# None in the parent: the workers get a count >= 1 (a count of 0 used to mean "not a worker",
# so --device_counts=0 started the whole benchmark again in every worker, without end).
_WORKER = flags.DEFINE_integer(
  'worker_devices', None, 'Internal: time on this many devices.', lower_bound=1
)
flags.mark_flags_as_required(['config'])
_TASKS = tuple(TASKS)


def _median_seconds(call, steps: int) -> tuple[float, float]:
  """(median seconds of `call`, its last float result) after two untimed calls."""
  for _ in range(2):
    float(call())
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    result = float(call())
    times.append(time.perf_counter() - start)
  return float(np.median(times)), result


def _time_char_lm(config, mesh) -> dict:
  _, graphdef, state = char_lm.build(config, 256, mesh)
  train_step = char_lm.train_step_fn(config, graphdef, mesh)
  rows, length = config.train.batch_size, config.train.tgt_len
  tokens = np.random.default_rng(0).integers(0, 256, (rows, length + 1)).astype(np.int32)
  batch = mesh_lib.global_batch((tokens[:, :-1], tokens[:, 1:]), mesh)
  carried = {'state': state}

  def call():
    carried['state'], sums = train_step(carried['state'], batch)
    return sums['loss'] / sums['tokens']

  seconds, loss = _median_seconds(call, _STEPS.value)
  return {'seconds': seconds, 'tokens': rows * length, 'rows': rows, 'loss': loss}


def _time_translate(config, mesh, row_multiple: int) -> dict:
  with tempfile.TemporaryDirectory() as workdir:
    data = load_translation_data(config.data, workdir, seed=config.seed, row_multiple=row_multiple)
  batches = [data.train.batch(step)[1] for step in range(_BATCHES.value)]
  tokens = sum(int(np.sum(batch['tgt_out'] != PAD_ID)) for batch in batches)
  names = ('src', 'tgt_in', 'tgt_out')
  batches = [mesh_lib.global_batch({n: b[n] for n in names}, mesh) for b in batches]
  graphdef, state = translate.build(config, data.tokenizer.vocab_size, mesh)
  train_step = translate.train_step_fn(config, graphdef, mesh)
  carried = {'state': state}

  def call():  # one pass over the batches
    for batch in batches:
      carried['state'], sums = train_step(carried['state'], batch)
    return sums['loss'] / sums['tokens']

  seconds, loss = _median_seconds(call, _STEPS.value)
  rows = '/'.join(str(len(b['src'])) for b in batches)
  return {
    'seconds': seconds / len(batches),
    'tokens': tokens / len(batches),
    'rows': rows,
    'loss': loss,
  }


def _worker(config) -> dict:
  mesh = mesh_lib.data_mesh()
  check_task_config(config, _TASKS, mesh)
  if config.task == 'char_lm':
    return _time_char_lm(config, mesh)
  return _time_translate(config, mesh, max(_COUNTS.value))


def _run_worker(command: list[str], env: dict, count: int) -> dict:
  """The result line of the worker `command` timing `count` devices. Its `error:` line (a
  config it refused) is raised as this process's own; another failure ends the run with the
  end of its stderr; one that runs past --worker_timeout is killed."""
  try:
    done = subprocess.run(
      command, env=env, capture_output=True, text=True, check=False, timeout=_TIMEOUT.value
    )
  except subprocess.TimeoutExpired as expired:
    raise SystemExit(
      f'error: the worker timing {count} devices ran past --worker_timeout={_TIMEOUT.value:g} '
      's and was killed: give a smaller config, fewer --steps, or a longer --worker_timeout'
    ) from expired
  if done.returncode:
    errors = [line for line in done.stderr.splitlines() if line.startswith('error: ')]
    if errors:
      raise SystemExit(errors[-1])
    raise SystemExit(
      f'error: the worker timing {count} devices failed (exit {done.returncode}); its '
      f'stderr ends:\n{done.stderr[-3000:]}'
    )
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  config = _CONFIG.value
  if _WORKER.value is not None:
    print(json.dumps({'devices': _WORKER.value, **_worker(config)}))
    return
  check_task_config(config, _TASKS)
  if config.task == 'translate' and not Path(config.data.train_src).exists():
    raise SystemExit(f'skipped: {config.data.train_src} is absent (set --config.data.train_src)')
  results = []
  for count in _COUNTS.value:
    env = {**os.environ, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={count}'}
    command = [sys.executable, __file__, *sys.argv[1:], f'--worker_devices={count}']
    results.append(_run_worker(command, env, count))
  unit, tokens = ('step', 'tokens') if config.task == 'char_lm' else ('batch', 'target tokens')
  print(f'{config.task}, {os.cpu_count()} CPU cores, median of {_STEPS.value} timed passes')
  print(
    f'| devices | global rows | ms / {unit} | {tokens}/s | speed / first row | loss after timing |'
  )
  print('|---|---|---|---|---|---|')
  base = results[0]['seconds']
  for r in results:
    print(
      f'| {r["devices"]} | {r["rows"]} | {r["seconds"] * 1e3:.1f} | '
      f'{r["tokens"] / r["seconds"]:.0f} | {base / r["seconds"]:.2f}x | {r["loss"]:.6f} |'
    )


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  run_main(main)
