"""Data parallelism: a step on 4 devices equals the 1-device step; 2-process runs stay in sync.

Forced host devices need XLA_FLAGS before jax starts, so the multi-device parts run in
subprocesses of this file (`python tests/test_data_parallel.py step_differences` and `... train`).
"""

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_CHAR_LM_FLAGS, refusal, write_pairs, write_word_corpus

from relpos.training import distributed
from relpos.training import mesh as mesh_lib

REPO = Path(__file__).resolve().parent.parent
STEP_TOLERANCE = 1e-5  # max |param difference| after one step, 1 against 4 devices
ADAM_EPS = 1e-3  # for that comparison (see _one_step)


def _forced_devices_env(count: int) -> dict:
  return {
    **os.environ,
    'XLA_FLAGS': f'--xla_force_host_platform_device_count={count}',
  }


def _float_leaves(state: dict) -> dict:
  """{path: float64 NumPy array} of the floating leaves of a training state's model and
  optimizer (replicated: this process's replica); PRNG keys and integer counts are left out,
  and so is the carried memory, split by rows across processes."""
  import jax
  import jax.numpy as jnp

  both = {name: state[name] for name in ('model', 'optimizer')}
  leaves = jax.tree_util.tree_leaves_with_path(mesh_lib.local_copy(both))
  return {
    jax.tree_util.keystr(path): np.asarray(leaf, np.float64)
    for path, leaf in leaves
    if jnp.issubdtype(leaf.dtype, jnp.floating)
  }


def _one_step(task: str, mesh, **train) -> dict:
  """The float leaves of (model, optimizer), and the char LM's new memory, after one train
  step on a fixed global batch; `train` overrides config.train (with grad_accum_steps, dropout
  is turned off: micro-batches draw other masks; and so is the clip of the gradient's norm,
  which would hide a gradient summed or averaged at another scale: clipped, any scale above
  clip_norm gives the same step)."""
  from helpers import tiny_translate_config as translate_config
  from test_char_lm_training import _config as char_config

  from relpos.training import char_lm_task as char_lm
  from relpos.training import translation_task as translate

  # Adam's first update is lr * g / (|g| + eps). With the configs' eps (1e-8, 1e-9) it turns
  # rounding noise in gradients that are 0 in exact arithmetic (e.g. the decoder's rel_key rows
  # of future distances, about 1e-10 with either reduction order) into +-lr; eps = 1e-3 keeps
  # the update proportional to the gradient, so the comparison tests the step, not the noise.
  rng = np.random.default_rng(0)
  if task == 'char_lm':
    config = char_config('unused', steps=1)
    config.optim.eps = ADAM_EPS
    config.train.update(train)
    if 'grad_accum_steps' in train:
      config.model.dropout = 0.0
      config.optim.clip_norm = 0.0
    _, graphdef, state = char_lm.build(config, 50, mesh)
    tokens = rng.integers(0, 50, (4, 17)).astype(np.int32)
    batch = mesh_lib.global_batch((tokens[:, :-1], tokens[:, 1:]), mesh)
    state, _ = char_lm.train_step_fn(config, graphdef, mesh)(state, batch)
    return _float_leaves(state) | {'memory': np.asarray(state['memory']['hidden'], np.float64)}
  else:
    config = translate_config(Path('unused'), steps=1)
    config.optim.eps = ADAM_EPS
    config.train.update(train)
    if 'grad_accum_steps' in train:
      config.model.dropout = 0.0
      config.optim.clip_norm = 0.0
    graphdef, state = translate.build(config, 40, mesh)
    shape = (8, 12)
    ids = {name: rng.integers(4, 40, shape).astype(np.int32) for name in ('src', 'tgt_in')}
    ids['tgt_out'] = np.where(np.arange(12) < rng.integers(1, 13, (8, 1)), ids['tgt_in'], 0)
    step = translate.train_step_fn(config, graphdef, mesh)
    state, _ = step(state, mesh_lib.global_batch(ids, mesh))
  return _float_leaves(state)


def step_differences() -> dict:
  """{task: max |param difference|} between one step on 1 device and on all devices."""
  import jax

  differences = {}
  for task in ('char_lm', 'translate'):
    single = _one_step(task, mesh_lib.data_mesh(jax.devices()[:1]))
    parallel = _one_step(task, mesh_lib.data_mesh())
    differences[task] = max(float(np.max(np.abs(single[k] - parallel[k]))) for k in single)
  return {'devices': jax.device_count(), 'differences': differences}


@pytest.mark.slow
def test_one_step_on_4_devices_equals_the_1_device_step():
  done = subprocess.run(
    [sys.executable, __file__, 'step_differences'],
    env=_forced_devices_env(4),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result['devices'] == 4
  for task, difference in result['differences'].items():
    assert difference < STEP_TOLERANCE, (task, difference)


def test_a_batch_that_does_not_split_names_the_config_field():
  with pytest.raises(ValueError, match=r'config.train.batch_size=6 .* multiple of 4'):
    mesh_lib.check_rows(6, types.SimpleNamespace(size=4), 'config.train.batch_size')
  with pytest.raises(ValueError, match=r'2 devices x 3 micro-batches .* multiple of 6$'):
    mesh_lib.check_rows(8, types.SimpleNamespace(size=2), 'config.train.batch_size', 3)


@functools.cache
def _one_big_batch_step(task: str) -> dict:
  """`_one_step` of `task` without accumulation (grad_accum_steps=1), computed once: the cases
  of one task compare their micro-batches with the same step (callers must not change it)."""
  return _one_step(task, mesh_lib.data_mesh(), grad_accum_steps=1)


# Most XLA optimisations off (conftest.py), as the attention tests have them: compiling dominates
# these in-process steps, and both sides of each comparison are compiled alike.
@pytest.mark.usefixtures('attention_test_config')
@pytest.mark.parametrize(
  ('task', 'micro_batches'),
  [
    ('char_lm', 2),
    pytest.param('char_lm', 4, marks=pytest.mark.slow),
    pytest.param('translate', 2, marks=pytest.mark.slow),  # the same loop, another task
  ],
)
def test_gradient_accumulation_equals_one_big_batch(task, micro_batches):
  """grad_accum_steps splits the rows into micro-batches, computed one after another: the
  parameters, Adam's moments and the char LM's memory (its rows split the same way) after the
  step equal those of one step on the whole batch."""
  whole = _one_big_batch_step(task)
  accumulated = _one_step(task, mesh_lib.data_mesh(), grad_accum_steps=micro_batches)
  assert whole.keys() == accumulated.keys()
  difference = max(float(np.max(np.abs(whole[k] - accumulated[k]))) for k in whole)
  assert difference < STEP_TOLERANCE, difference
  moved = max(float(np.max(np.abs(whole[k]))) for k in whole if 'mu' in k)
  assert moved > 1e-4  # the step did update Adam's first moment


# --------------------------------------------------------------------------------------------
# Two processes of train.py (jax.distributed on 127.0.0.1, gloo CPU collectives), each with two
# forced host devices: a 4-device mesh over 2 processes.


def train_and_dump(dump: str, train_args: list[str]):
  """Runs train.py with `train_args`, then writes this process's replica of the final state's
  float leaves to `dump` (.npz): the train step is wrapped to keep its last output."""
  from relpos.training import char_lm_task as char_lm
  from relpos.training import tasks
  from relpos.training import translation_task as translate

  last = {}
  for module in (char_lm, translate):
    make_step, evaluate = module.train_step_fn, module.TASK.evaluate

    def keeping_last(*args, make_step=make_step):
      step = make_step(*args)

      def kept(state, batch):
        outputs = step(state, batch)
        last['state'] = outputs[0]
        return outputs

      return kept

    def dump_then_evaluate(*args, evaluate=evaluate, **kwargs):
      np.savez(dump, **_float_leaves(last['state']))
      return evaluate(*args, **kwargs)

    module.train_step_fn, module.TASK.evaluate = keeping_last, dump_then_evaluate
  sys.argv = ['train.py', *train_args]
  tasks.launch('train_and_evaluate')


def _two_process_environment() -> dict:
  """Two forced host devices, and JAX's persistent compilation cache that train.py turns on
  (relpos.runtime): the run's shared cache (conftest.py), so that a launch that resumes loads
  the steps the first launch compiled, as a rerun of train.py does."""
  import jax

  environment = _forced_devices_env(2)
  directory = jax.config.jax_compilation_cache_dir
  if directory:
    environment.update(
      JAX_COMPILATION_CACHE_DIR=directory, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0.3'
    )
  return environment


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _run_two_processes(tmp_path, train_args: list[str], timeout: int = 240, *, terminate=None):
  """Starts process 0 and 1 of `train.py train_args`; returns their (output, exit code).

  terminate: None, or (process id, text): SIGTERM that process (only) once its output shows
    `text`. Both processes are killed as soon as either fails, or when `timeout` seconds run
    out.
  """
  port, environment = _free_port(), _two_process_environment()
  processes, logs = [], []
  try:
    for process_id in (0, 1):
      log = open(tmp_path / f'process{process_id}.log', 'w+')  # noqa: SIM115 (closed below)
      logs.append(log)
      command = [
        sys.executable,
        __file__,
        'train',
        str(tmp_path / f'params{process_id}.npz'),
        *train_args,
        f'--workdir={tmp_path / "run"}',
        '--distributed=explicit',
        f'--coordinator_address=127.0.0.1:{port}',
        '--num_processes=2',
        f'--process_id={process_id}',
      ]
      processes.append(
        subprocess.Popen(command, cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT)
      )
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes):
      if any(p.poll() not in (None, 0, 143) for p in processes) or time.monotonic() > deadline:
        break  # a failed process: stop the other now
      if terminate and terminate[1] in (tmp_path / f'process{terminate[0]}.log').read_text():
        processes[terminate[0]].send_signal(signal.SIGTERM)
        terminate = None
      time.sleep(0.1)
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()
    outputs = []
    for log in logs:
      log.seek(0)
      outputs.append(log.read())
      log.close()
  return outputs, [process.returncode for process in processes]


def _params(tmp_path) -> list[dict]:
  """The final parameters each process of the last `_run_two_processes` dumped."""
  return [dict(np.load(tmp_path / f'params{i}.npz')) for i in (0, 1)]


def _assert_succeeded(outputs, codes):
  for output, code in zip(outputs, codes, strict=True):
    assert code == 0, output[-3000:]


def _assert_identical(params):
  first, second = params
  assert sorted(first) == sorted(second) and first
  for name in first:
    np.testing.assert_array_equal(first[name], second[name], err_msg=name)


@pytest.mark.slow
def test_two_processes_train_the_char_lm_in_sync_and_stop_together(tmp_path):
  text = write_word_corpus(tmp_path / 'corpus.txt')
  args = [
    '--config=configs/char_tiny.py',
    f'--config.data.path={text}',
    *TINY_CHAR_LM_FLAGS,
    '--config.train.steps=120',
    '--config.train.batch_size=4',
    '--config.train.log_every=1',
    '--config.train.eval_every=60',
    '--config.train.checkpoint_every=60',
    '--config.eval.batch_size=2',
    # The final evaluation's segments are those of the validation during training: it reuses
    # that compile.
    '--config.eval.tgt_len=8',
    '--config.eval.mem_len=8',
    '--config.eval.max_segments_during_training=2',
  ]
  # SIGTERM reaches process 1 only: both stop after the same step and save it together.
  outputs, codes = _run_two_processes(tmp_path, args, terminate=(1, 'step 3/120'))
  assert codes == [143, 143], outputs[1][-3000:]
  stopped = [re.search(r'at step (\d+): saved ', output).group(1) for output in outputs]
  assert stopped[0] == stopped[1] and 3 <= int(stopped[0]) < 120
  assert stopped[0] in [p.name for p in (tmp_path / 'run' / 'checkpoints').iterdir()]

  outputs, codes = _run_two_processes(tmp_path, args)  # the same command resumes
  _assert_succeeded(outputs, codes)
  # Each process says at its start what becomes of it should the other die (JAX's abort).
  assert all(output.count(distributed.PEER_DEATH_NOTE) == 1 for output in outputs)
  assert all(f'resumed from {tmp_path / "run" / "checkpoints" / stopped[0]}' in o for o in outputs)
  _assert_identical(_params(tmp_path))
  assert all(output.strip().splitlines()[-1].startswith('bpc=') for output in outputs)
  assert outputs[0].strip().splitlines()[-1] == outputs[1].strip().splitlines()[-1]
  assert '120' in [p.name for p in (tmp_path / 'run' / 'checkpoints').iterdir()]
  assert (tmp_path / 'run' / 'eval_results.json').exists()


@pytest.mark.slow
def test_two_processes_train_the_translation_model_in_sync(tmp_path):

  write_pairs(tmp_path, 'train', 300, seed=0)
  write_pairs(tmp_path, 'eval', 8, seed=1)
  args = [
    '--config=configs/translate_tiny.py:shaw',
    f'--config.data.train_src={tmp_path / "train.en"}',
    f'--config.data.train_tgt={tmp_path / "train.de"}',
    f'--config.data.eval_src={tmp_path / "eval.en"}',
    f'--config.data.eval_tgt={tmp_path / "eval.de"}',
    '--config.data.moses_detokenize=False',
    '--config.data.max_eval_examples=0',
    '--config.data.vocab_size=40',
    '--config.data.max_length=16',
    '--config.data.max_tokens=256',
    '--config.data.length_buckets=2',
    '--config.model.encoder_layers=1',
    '--config.model.decoder_layers=1',
    '--config.model.d_model=32',
    '--config.model.num_heads=2',
    '--config.model.d_ff=64',
    '--config.model.max_relative_position=3',
    '--config.train.steps=4',
    '--config.train.log_every=2',
    '--config.train.eval_every=0',  # the char LM test covers validation during training
    '--config.train.checkpoint_every=2',
    '--config.eval.beam_size=1',
    '--config.eval.max_decode_extra=4',
  ]
  outputs, codes = _run_two_processes(tmp_path, args)
  _assert_succeeded(outputs, codes)
  _assert_identical(_params(tmp_path))
  assert all(output.strip().splitlines()[-1].startswith('bleu=') for output in outputs)
  assert (tmp_path / 'run' / 'spm.model').exists()
  assert len((tmp_path / 'run' / 'translations_step4.txt').read_text().splitlines()) == 8


_CHAR_FLAGS = ('--config=configs/char_tiny.py', *TINY_CHAR_LM_FLAGS, '--config.train.batch_size=4')


@pytest.mark.parametrize(
  ('flags', 'message'),
  [
    # 0 was passed on as --worker_devices=0, "not a worker": each worker started the whole
    # benchmark again, without end.
    (('--device_counts=0',), '--device_counts=0: each must be at least 1'),
    (('--device_counts=',), '--device_counts=: give one or more integers'),
    (('--device_counts=x',), '--device_counts=x: give integers, comma-separated'),
    (('--steps=0',), '--steps=0: 0 is not a positive integer'),
    (('--batches=0',), '--batches=0: 0 is not a positive integer'),
    (('--config.train.batchsize=4',), 'no field train.batchsize'),
    (('--config.train.batch_size=0',), 'config.train.batch_size must be >= 1'),
    # The worker's own check, against its 2 devices: its error line is the benchmark's.
    (('--device_counts=2', '--config.train.batch_size=3'), 'split across 2 devices'),
    # A worker is never waited on without end (this one is still importing JAX).
    (('--device_counts=1', '--worker_timeout=1'), 'ran past --worker_timeout=1 s and was killed'),
  ],
)
def test_data_parallel_benchmark_refuses_bad_flags_in_one_line(commands, flags, message):
  script = REPO / 'benchmarks' / 'data_parallel.py'
  assert message in refusal(commands, script, *_CHAR_FLAGS, *flags, timeout=120)


if __name__ == '__main__':
  if sys.argv[1] == 'step_differences':
    print(json.dumps(step_differences()))
  else:
    train_and_dump(sys.argv[2], sys.argv[3:])
