"""Surviving crashes: SIGKILL and resume, SIGTERM saves and exits, damaged checkpoints skipped."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import TINY_CHAR_LM_FLAGS, damage_checkpoint, tiny_char_config, write_word_corpus

from relpos.training import char_lm_task as char_lm

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def text_file(tmp_path_factory):
  return write_word_corpus(tmp_path_factory.mktemp('text') / 'corpus.txt')


def _overrides(text_file, *, steps, checkpoint_every):
  return [
    f'--config.data.path={text_file}',
    *TINY_CHAR_LM_FLAGS,
    f'--config.train.steps={steps}',
    '--config.train.batch_size=2',
    '--config.train.log_every=1',
    '--config.train.eval_every=0',
    f'--config.train.checkpoint_every={checkpoint_every}',
    '--config.eval.batch_size=2',
  ]


def _train_command(text_file, workdir, **kwargs):
  return [
    sys.executable,
    'train.py',
    '--config=configs/char_tiny.py',
    f'--workdir={workdir}',
    *_overrides(text_file, **kwargs),
  ]


def _losses_by_step(workdir) -> dict:
  """The last logged loss of every step (a resumed run logs some steps again)."""
  records = map(json.loads, (workdir / 'metrics.jsonl').read_text().splitlines())
  return {r['step']: r['train/loss'] for r in records if 'train/loss' in r}


def _logged_steps(workdir) -> list:
  path = workdir / 'metrics.jsonl'
  if not path.exists():
    return []
  return [
    json.loads(line)['step'] for line in path.read_text().splitlines() if 'train/loss' in line
  ]


def _wait_for_step(process, workdir, step, timeout=240):
  deadline = time.monotonic() + timeout
  while max(_logged_steps(workdir), default=0) < step:
    assert process.poll() is None, 'training ended before it could be interrupted'
    assert time.monotonic() < deadline, f'step {step} not reached in {timeout}s'
    time.sleep(0.05)


def _sigterm_after_step(process, workdir, step, signum=signal.SIGTERM) -> str:
  """SIGTERM (or `signum`) once `workdir`'s run has logged `step`; its stderr after it exits."""
  try:
    _wait_for_step(process, workdir, step)
    process.send_signal(signum)
    return process.communicate(timeout=120)[1]
  finally:
    if process.poll() is None:
      process.kill()


@pytest.mark.slow
def test_sigkill_then_rerun_continues_the_same_loss_trajectory(text_file, tmp_path):
  kwargs = dict(steps=60, checkpoint_every=3)
  straight, killed = tmp_path / 'straight', tmp_path / 'killed'
  # The straight run trains beside the killed one and its rerun, which keeps the test short.
  # The killed run starts once the straight one has logged its first step: by then the step is
  # compiled and in the compilation cache train.py keeps, which the killed run loads instead of
  # compiling the same step at the same time.
  straight_run = subprocess.Popen(_train_command(text_file, straight, **kwargs), cwd=REPO)
  try:
    deadline = time.monotonic() + 240
    while not _logged_steps(straight) and straight_run.poll() is None:
      assert time.monotonic() < deadline, 'the straight run logged no step in 240 s'
      time.sleep(0.05)
    process = subprocess.Popen(
      _train_command(text_file, killed, **kwargs), cwd=REPO, stdout=subprocess.DEVNULL
    )
    try:
      _wait_for_step(process, killed, 20)
    finally:
      process.send_signal(signal.SIGKILL)
      process.wait()
    logged_before_kill = len(_logged_steps(killed))
    subprocess.run(_train_command(text_file, killed, **kwargs), cwd=REPO, check=True, timeout=600)
    assert straight_run.wait(timeout=600) == 0, 'the straight run failed'
  finally:
    if straight_run.poll() is None:
      straight_run.kill()
      straight_run.wait()
  rerun = _logged_steps(killed)[logged_before_kill:]
  assert rerun[0] > 10 and rerun == list(range(rerun[0], 61))  # resumed from a checkpoint
  expected, resumed = _losses_by_step(straight), _losses_by_step(killed)
  assert sorted(resumed) == list(range(1, 61))
  assert all(resumed[step] == expected[step] for step in resumed), 'loss trajectory changed'


@pytest.mark.parametrize(
  ('signum', 'named'), [(signal.SIGTERM, 'SIGTERM'), (signal.SIGINT, 'Ctrl-C')]
)
def test_sigterm_or_ctrl_c_saves_a_checkpoint_and_exits_cleanly(text_file, tmp_path, signum, named):
  workdir = tmp_path / 'run'
  # Ctrl-C as at a terminal, where SIGINT is not ignored: it is in a shell's background job,
  # which the run would inherit from a test session started as one, and then leave ignored.
  at_a_terminal = 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); '
  at_a_terminal += 'os.execv(sys.argv[1], sys.argv[1:])'
  process = subprocess.Popen(
    [sys.executable, '-c', at_a_terminal]
    + _train_command(text_file, workdir, steps=100_000, checkpoint_every=0),
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  stderr = _sigterm_after_step(process, workdir, 5, signum)
  assert process.returncode == 128 + signum, stderr[-2000:]
  assert 'Traceback' not in stderr, stderr[-2000:]
  assert f'\n{named}' in stderr and 'rerun the same command to resume' in stderr
  saved = [int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()]
  assert saved and 5 <= saved[0] <= max(_logged_steps(workdir))


@pytest.mark.parametrize(
  ('moment', 'signum', 'named'),
  [
    ('starting', signal.SIGINT, 'Ctrl-C'),
    ('running', signal.SIGINT, 'Ctrl-C'),
    ('running', signal.SIGTERM, 'SIGTERM'),
  ],
)
def test_ctrl_c_or_sigterm_outside_training_is_one_line(moment, signum, named):
  """Every relpos program (its `runtime.apply_defaults()`): Ctrl-C while it imports JAX (its
  first seconds, where it is most often pressed) or while it runs anything but training ends
  it at once, in one line with exit 130: no traceback, and none swallowed in a callback.
  SIGTERM (`python -m relpos.tools.sample`, `relpos.tools.translate`) ended the program
  with no line at all; it is one line too, with exit 143."""
  program = 'import os, signal, time\nfrom relpos import runtime\nruntime.apply_defaults()\n'
  if moment == 'starting':
    program += f'os.kill(os.getpid(), {int(signum)})\nimport jax\ntime.sleep(30)\n'
  else:
    program += f'import jax.numpy as jnp\njnp.ones(3).sum()\nos.kill(os.getpid(), {int(signum)})\n'
    program += 'time.sleep(30)\n'
  # Ctrl-C as at a terminal: SIGINT not ignored, as it is in a shell's background job.
  at_a_terminal = 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); '
  at_a_terminal += 'os.execv(sys.argv[1], sys.argv[1:])'
  done = subprocess.run(
    [sys.executable, '-c', at_a_terminal, sys.executable, '-c', program],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=60,
  )
  lines = [line for line in done.stderr.splitlines() if line and not line.startswith('relpos: ')]
  assert (done.returncode, lines) == (128 + signum, [f'error: stopped by {named}']), done.stderr[
    -2000:
  ]


def _config(text_file, steps):
  """The in-process runs: the tiny char LM with checkpoints every 2 steps (for 6 steps, the
  config of test_faults.py's runs, whose compiled step the run's shared cache then holds)."""
  config = tiny_char_config(text_file, steps=steps)
  config.train.checkpoint_every = 2
  return config


@pytest.fixture(scope='module')
def six_steps(text_file, tmp_path_factory):
  """The workdir of an uninterrupted in-process run of 6 steps, checkpoints at 2, 4 and 6 (kept
  unchanged: tests copy it)."""
  workdir = tmp_path_factory.mktemp('six_steps') / 'run'
  char_lm.TASK.train_model(_config(text_file, 6), workdir)
  return workdir


def test_sigterm_after_eval_py_printed_its_result_fails_nothing(text_file, six_steps, tmp_path):
  """SIGTERM to eval.py right after it wrote eval_results.json and printed its result lines
  turned the finished evaluation into `error: stopped by SIGTERM`, exit 143 (late in its exit,
  with no line at all). Now a signal after the result is written changes nothing: the exit
  status is 0 (`signals.finish_quietly`)."""
  workdir = tmp_path / 'run'
  shutil.copytree(six_steps, workdir)
  process = subprocess.Popen(
    [
      sys.executable,
      'eval.py',
      '--config=configs/char_tiny.py',
      f'--workdir={workdir}',
      f'--config.data.path={text_file}',
      *TINY_CHAR_LM_FLAGS,
      '--config.eval.batch_size=4',
      '--config.eval.tgt_len=8',
      '--config.eval.mem_len=8',
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},  # each line as it is printed
  )
  for line in process.stdout:
    if line.startswith('bpc='):
      process.send_signal(signal.SIGTERM)
      break
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-2000:]
  assert 'error:' not in stderr and (workdir / 'eval_results.json').is_file()


def test_an_allowed_config_change_the_checkpoints_refuse_leaves_config_json_the_runs(
  text_file, six_steps, tmp_path
):
  """--allow_config_change with another model: refused up front, naming the first shape that
  differs (`loop.check_same_parameters`; before, the restore failed on it, checkpoint by
  checkpoint), and config.json still records the run its checkpoints hold, so the original
  config still continues the run."""
  workdir = tmp_path / 'run'
  shutil.copytree(six_steps, workdir)
  recorded = (workdir / 'config.json').read_text()
  wider = _config(text_file, 8)
  wider.model.d_model *= 2
  with pytest.raises(ValueError, match=r'^config.model.d_model: 16 -> 32: another model than'):
    char_lm.TASK.train_model(wider, workdir, allow_config_change=True)
  assert (workdir / 'config.json').read_text() == recorded
  assert not list(workdir.glob('config.*.json'))
  char_lm.TASK.train_model(_config(text_file, 6), workdir)  # no change: no flag needed


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
  text_file, six_steps, tmp_path, capsys
):
  workdir = tmp_path / 'run'
  shutil.copytree(six_steps, workdir)
  expected = _losses_by_step(workdir)
  damage_checkpoint(workdir / 'checkpoints' / '6')
  os.remove(workdir / 'metrics.jsonl')
  char_lm.TASK.train_and_evaluate(_config(text_file, 6), workdir)
  out = capsys.readouterr().err
  assert 'checkpoints/6 is unreadable' in out and 'moved unreadable checkpoint 6' in out
  assert len(list((workdir / 'unreadable_checkpoints').iterdir())) == 1
  assert _logged_steps(workdir) == [5, 6]  # resumed from step 4
  assert _losses_by_step(workdir) == {5: expected[5], 6: expected[6]}


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(text_file, six_steps, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(six_steps, workdir)
  checkpoints = [p for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()]
  assert sorted(int(p.name) for p in checkpoints) == [2, 4, 6]
  for checkpoint in checkpoints:
    damage_checkpoint(checkpoint)
  with pytest.raises(ValueError, match='no readable checkpoint') as caught:
    char_lm.TASK.train_and_evaluate(_config(text_file, 6), workdir)
  message = str(caught.value)  # each step's cause, tensorstore's first line; what to do
  assert '\n' not in message and 'TensorStore' not in message, message
  assert message.count('is not valid for value of size 50') == 3, message
  assert message.endswith(
    'their files are damaged: restore them from a copy, or give a new --workdir'
  )


def test_a_trained_run_whose_checkpoints_are_gone_is_not_trained_again(
  text_file, six_steps, tmp_path
):
  """fz14b-4: a finished, scored run whose checkpoints/ was deleted (to save disk) was trained
  again from step 0 in silence to score a new config.eval (by train.py, and a sweep through
  it), and eval.py said "train first". Both now end with one line naming the step, the folder
  and what to do. A start killed before its first checkpoint (no eval_results.json) starts
  again as before."""
  from relpos.training.restore import checkpoints_gone

  workdir = tmp_path / 'run'
  shutil.copytree(six_steps, workdir)
  assert checkpoints_gone(workdir) is None  # its checkpoints are there
  (workdir / 'eval_results.json').write_text(json.dumps({'bpc': 5.0, 'step': 6}))
  shutil.rmtree(workdir / 'checkpoints')
  metrics = (workdir / 'metrics.jsonl').read_bytes()
  expected = (
    f'the run in {workdir} was trained to step 6 ({workdir}/eval_results.json records it), but '
    f'its checkpoints are gone ({workdir}/checkpoints holds none): restore them from a copy to '
    f'use them, or remove {workdir} or give another --workdir to train it again'
  )
  config = _config(text_file, 6)
  config.eval.mem_len = 4  # a new setting to score
  scored = tmp_path / 'scored'  # eval.py scores another setting into an --output_dir
  for command in (
    char_lm.TASK.train_and_evaluate,
    lambda *args: char_lm.TASK.evaluate(*args, output_dir=scored),
  ):
    with pytest.raises(FileNotFoundError) as refused:
      command(config, workdir)
    assert str(refused.value) == expected
  assert not scored.exists()
  assert (workdir / 'metrics.jsonl').read_bytes() == metrics and not (
    workdir / 'checkpoints'
  ).exists()
  (workdir / 'eval_results.json').unlink()  # unscored: metrics.jsonl tells the run trained
  assert checkpoints_gone(workdir) == (
    f'the run in {workdir} trained to step 6 at least ({workdir}/metrics.jsonl logs it), but '
    f'its checkpoints are gone ({workdir}/checkpoints is missing): restore them from a copy to '
    f'use them, or remove {workdir} or give another --workdir to train it again'
  )
  with pytest.raises(FileNotFoundError, match='trained to step 6 at least'):
    char_lm.TASK.train_and_evaluate(config, workdir)
  assert (workdir / 'metrics.jsonl').read_bytes() == metrics
  (workdir / 'checkpoints').mkdir()  # a start killed before its first save leaves it, empty
  assert checkpoints_gone(workdir) is None


class _ExitError(BaseException):
  """What the test's os._exit raises, with the status the program would have exited with."""


def test_sigterm_during_setup_stops_at_once(text_file, tmp_path, monkeypatch, capfd):
  """SIGTERM while the char LM builds its model (its data read, nothing trained) ended the
  run only after its first step and that step's save; it ends it at once now, one line, exit
  143, before anything is trained or saved."""
  build = char_lm.build

  def build_then_sigterm(*args, **kwargs):
    built = build(*args, **kwargs)
    # Without a handler, SIGTERM would kill the test session itself: fail instead.
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), 'no SIGTERM handler'
    os.kill(os.getpid(), signal.SIGTERM)  # as if the notice came while compiling
    return built

  def exit_now(status):
    raise _ExitError(status, [p.name for p in (workdir / 'checkpoints').glob('*')])

  monkeypatch.setattr(char_lm, 'build', build_then_sigterm)
  monkeypatch.setattr(os, '_exit', exit_now)
  workdir = tmp_path / 'run'
  with pytest.raises(_ExitError) as stopped:
    char_lm.TASK.train_and_evaluate(_config(text_file, 6), workdir)
  assert stopped.value.args == (143, [])  # no checkpoint, not even one begun
  assert capfd.readouterr().err.splitlines()[-1] == (
    'error: stopped by SIGTERM during start-up, before any step (nothing to save); no '
    'checkpoint was written yet; rerun the same command to start again'
  )


def test_a_second_ctrl_c_in_a_garbage_collection_callback_still_stops_at_once():
  """Pressed twice at real data sizes, the second Ctrl-C raised KeyboardInterrupt inside
  JAX's garbage-collection callback, where Python prints "Exception ignored in: <function
  _xla_gc_callback>" and its traceback, and goes on: the run trained on to its next step.
  `PreemptionSignal` now ends the process itself (`signals.stop_now`), wherever the press
  lands: one line, exit 130."""
  program = textwrap.dedent(
    """\
    import gc, os, signal
    from relpos.signals import PreemptionSignal

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as at a terminal, not a background job
    with PreemptionSignal() as preemption:
      preemption.unsaved = lambda: ' at step 3, without a save; rerun'
      os.kill(os.getpid(), signal.SIGINT)  # the first: saves after this step
      gc.callbacks.append(lambda phase, info: os.kill(os.getpid(), signal.SIGINT))
      gc.collect()  # the second press, handled inside the callback
      gc.callbacks.clear()
      print('ran on')
    """
  )
  done = subprocess.run(
    [sys.executable, '-c', program], cwd=REPO, capture_output=True, text=True, timeout=60
  )
  assert (done.returncode, done.stdout) == (130, ''), done.stderr
  assert done.stderr.splitlines()[-1] == 'error: stopped by Ctrl-C at step 3, without a save; rerun'
  assert 'Traceback' not in done.stderr and 'Exception ignored' not in done.stderr


@pytest.mark.slow
def test_sigterm_stops_a_sweep_with_one_line_and_the_resume_exit_code(text_file, tmp_path):
  """`python -m relpos.studies.sweep` on SIGTERM: the run in progress saves, the sweep says so in
  one
  line (no traceback) and exits 143, as train.py does."""
  root = tmp_path / 'sweep'
  command = [sys.executable, '-m', 'relpos.studies.sweep', '--config=configs/char_tiny.py:shaw']
  command += [f'--workdir={root}', '--values=2', '--seeds=0']
  command += _overrides(text_file, steps=100_000, checkpoint_every=0)
  process = subprocess.Popen(
    command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  stderr = _sigterm_after_step(process, root / 'max_relative_position=2' / 'seed=0', 3)
  assert process.returncode == 143, stderr[-2000:]
  assert 'Traceback' not in stderr, stderr[-2000:]
  assert 'rerun the same command to resume (the sweep command resumes it' in stderr
