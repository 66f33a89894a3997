"""Faults around a real run (docs/faults.md), one row per fault class: each is made for real
where it can be (a file in place of the workdir, a read-only workdir, a workdir removed
mid-run, a workdir of the other task, XLA's own RESOURCE_EXHAUSTED error from the step) and
injected where it cannot (a full disk: an OSError(ENOSPC) raised by orbax's background writer).
Each row checks the one-line message, the exit status and that nothing earlier was lost: the
same finished checkpoints, byte for byte, and the same metrics.jsonl lines before and after.

The runs are the tiny character LM of tests/helpers.py, in-process (the launchers' exit status
and line come from `relpos.cli.fault_exit`); one row runs train.py end to end in a subprocess.
"""

import builtins
import errno
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import (
  REPO,
  TINY_CHAR_LM_FLAGS,
  after_training,
  damage_checkpoint,
  load_config,
  tiny_char_config,
  tiny_translate_config,
  write_word_corpus,
)
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from relpos import cli
from relpos.config import command_line
from relpos.faults import FILESYSTEM_EXIT_CODE, FilesystemFaultError, TaskMismatchError
from relpos.studies import plot, shaw_tables, sweep_tables
from relpos.tools import sample, translate
from relpos.training import char_lm_task as char_lm
from relpos.training import restore, run_results, task_base, tasks
from relpos.training import translation_task as translate_task
from relpos.training.checkpoints import TMP_MARKER, finished_steps
from relpos.training.device_memory import OUT_OF_MEMORY_EXIT_CODE
from relpos.training.run_config import read_config

STEPS = 6  # checkpoints at 2, 4 and 6


@pytest.fixture(scope='module')
def text_file(tmp_path_factory):
  return write_word_corpus(tmp_path_factory.mktemp('text') / 'corpus.txt', words=3000)


def _config(text_file):
  config = tiny_char_config(text_file, steps=STEPS)
  config.train.checkpoint_every = 2
  return config


@pytest.fixture(scope='module')
def straight(text_file, tmp_path_factory):
  """The workdir of an uninterrupted run (kept unchanged: rows copy it)."""
  workdir = tmp_path_factory.mktemp('straight') / 'run'
  char_lm.TASK.train_model(_config(text_file), workdir)
  return workdir


def _losses(workdir) -> dict:
  """The last logged loss of every step (a resumed run logs some steps again)."""
  records = map(json.loads, (workdir / 'metrics.jsonl').read_text().splitlines())
  return {r['step']: r['train/loss'] for r in records if 'train/loss' in r}


def _state(workdir) -> tuple[dict, list[str]]:
  """({finished checkpoint step: {file: sha256}}, metrics.jsonl lines) of `workdir`."""
  checkpoints = {}
  for directory in sorted((workdir / 'checkpoints').glob('*')):
    if directory.name.isdigit():
      checkpoints[int(directory.name)] = {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob('*'))
        if path.is_file()
      }
  metrics = workdir / 'metrics.jsonl'
  return checkpoints, metrics.read_text().splitlines() if metrics.exists() else []


def _assert_nothing_lost(before, after):
  """Every checkpoint of `before` is in `after`, unchanged; its metrics lines begin `after`'s."""
  (checkpoints, lines), (checkpoints_after, lines_after) = before, after
  assert {step: checkpoints_after.get(step) for step in checkpoints} == checkpoints
  assert lines_after[: len(lines)] == lines


def _at_checkpoint(monkeypatch, step: int, act) -> list:
  """Makes the run call `act()` once, when it is about to save checkpoint `step` and the save
  before it has committed; returns the list that then holds `act()`'s result."""
  from relpos.training import checkpoints as checkpoints_lib

  real, acted = checkpoints_lib.Checkpoints.save, []

  def save(self, at, items, meta):
    if at == step and not acted:
      self.commit()
      acted.append(act())
    return real(self, at, items, meta)

  monkeypatch.setattr(checkpoints_lib.Checkpoints, 'save', save)
  return acted


def _fault(error, exit_code, *phrases):
  """Checks the launchers' exit status and line for `error`; returns the line."""
  code, line = cli.fault_exit(error)
  assert code == exit_code, (code, line)
  assert '\n' not in line and line.startswith('error: '), line
  for phrase in phrases:
    assert phrase in line, (phrase, line)
  return line


@pytest.fixture
def full_disk_at(monkeypatch):
  """full_disk_at(step): the save of checkpoint `step` fails in orbax's background commit with
  ENOSPC (at its JSON item, after the arrays were written), as a disk filling up mid-save;
  returns the list the workdir's state is appended to when that happens."""
  real = json_checkpoint_handler.JsonCheckpointHandler._save_fn
  seen = []

  def arm(step):
    async def save_fn(self, item, directory):
      if item.get('step') == step:
        seen.append(directory)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / 'meta'))
      return await real(self, item, directory)

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, '_save_fn', save_fn)
    return seen

  yield arm
  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, '_save_fn', real)


def test_a_full_disk_mid_run_loses_nothing_and_the_rerun_resumes(
  text_file, straight, tmp_path, full_disk_at, capfd
):
  workdir = tmp_path / 'run'
  seen = full_disk_at(4)
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  assert seen, 'the fault was not injected'
  line = _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    f'checkpoint 4 was not written to {workdir.resolve()}/checkpoints/4',
    'No space left on device (the disk is full)',
    f'the last good checkpoint is {workdir.resolve()}/checkpoints/2 (step 2), intact',
    'free space on its disk, then rerun the same command to resume',
  )
  assert 'Traceback' not in capfd.readouterr().err, 'orbax printed the failed commit'
  checkpoints, lines = _state(workdir)
  assert sorted(checkpoints) == [2], line  # 4 never finished; 6 was not attempted
  assert not list((workdir / 'checkpoints').glob(f'*{TMP_MARKER}*')), 'half-written save kept'
  assert _losses(workdir) == _losses(straight)  # the steps after 4 ran on before the fault
  # Space freed: the same command resumes from checkpoint 2 and ends as if nothing happened.
  full_disk_at(None)
  char_lm.TASK.train_model(_config(text_file), workdir)
  assert 'resumed from' in capfd.readouterr().out
  _assert_nothing_lost((checkpoints, lines), _state(workdir))
  assert _losses(workdir) == _losses(straight)
  assert sorted(_state(workdir)[0]) == [2, 4, 6]


def test_a_half_written_checkpoint_is_never_resumed_from(text_file, straight, tmp_path, capsys):
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '6')  # as if killed while saving step 6 ...
  shutil.copytree(workdir / 'checkpoints' / '4', workdir / 'checkpoints' / f'6{TMP_MARKER}-1')
  before = _state(workdir)
  char_lm.TASK.train_model(_config(text_file), workdir)
  captured = capsys.readouterr()
  assert f'warning: removed {workdir.resolve()}/checkpoints/6{TMP_MARKER}-1' in captured.err
  assert f'resumed from {workdir.resolve()}/checkpoints/4' in captured.out
  assert not list((workdir / 'checkpoints').glob(f'*{TMP_MARKER}*'))
  _assert_nothing_lost(before, _state(workdir))
  assert _losses(workdir) == _losses(straight)


def test_a_checkpoint_that_fails_to_commit_for_another_reason(text_file, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  real = json_checkpoint_handler.JsonCheckpointHandler._save_fn

  async def save_fn(self, item, directory):
    if item.get('step') == 6:
      raise RuntimeError('DATA_LOSS: the storage backend dropped the write')
    return await real(self, item, directory)

  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, '_save_fn', save_fn)
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    'checkpoint 6 was not written',
    'DATA_LOSS: the storage backend dropped the write',
    f'{workdir.resolve()}/checkpoints/4 (step 4), intact',
    'fix the cause, then rerun the same command to resume',
  )
  assert sorted(_state(workdir)[0]) == [2, 4]


def test_a_file_in_place_of_the_workdir(text_file, tmp_path):
  workdir = tmp_path / 'run'
  workdir.write_text('notes')
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  _fault(caught.value, FILESYSTEM_EXIT_CODE, f'--workdir={workdir} is a file, not a directory')
  assert workdir.read_text() == 'notes'
  with pytest.raises(cli.FAULTS) as caught:  # a file in place of a parent directory
    char_lm.TASK.train_model(_config(text_file), workdir / 'run')
  _fault(caught.value, FILESYSTEM_EXIT_CODE, 'cannot write to --workdir=', 'give a directory')
  # train.py's own lines, not the readers' (its check for a finished run reads no file there).
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_and_evaluate(_config(text_file), workdir)
  _fault(caught.value, FILESYSTEM_EXIT_CODE, f'--workdir={workdir} is a file, not a directory')
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_and_evaluate(_config(text_file), workdir / 'run')
  _fault(caught.value, FILESYSTEM_EXIT_CODE, 'cannot write to --workdir=', 'give a directory')


def _read_only(workdir, monkeypatch):
  """Makes `workdir` read-only: by its mode where that stops this process (not root), else by
  failing every write below it with EROFS, as a filesystem mounted read-only does (the opens
  and mkdirs of Python code; tensorstore's are not reached: the run stops before)."""
  for path in [workdir, *workdir.rglob('*')]:
    if path.is_dir():
      path.chmod(0o555)
  probe = workdir / '.probe'
  try:
    probe.write_text('')
  except PermissionError:
    return 'Permission denied (permission denied)'
  probe.unlink()
  real_open, real_mkdir, inside = os.open, os.mkdir, str(workdir.resolve())

  def refuse(path):
    if os.path.abspath(path).startswith(inside):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

  def open_(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
      refuse(path)
    return real_open(path, flags, *args, **kwargs)

  def mkdir(path, *args, **kwargs):
    refuse(path)
    return real_mkdir(path, *args, **kwargs)

  def open_file(path, mode='r', *args, **kwargs):
    if isinstance(path, str | os.PathLike) and set(mode) & set('wax+'):
      refuse(path)
    return real_open_file(path, mode, *args, **kwargs)

  real_open_file = io.open
  monkeypatch.setattr(os, 'open', open_)
  monkeypatch.setattr(os, 'mkdir', mkdir)
  monkeypatch.setattr(io, 'open', open_file)
  monkeypatch.setattr(builtins, 'open', open_file)
  return 'Read-only file system (the filesystem is read-only)'


def _train_read_only(text_file, workdir, monkeypatch):
  """(the read-only cause, the fault) of train.py's run in `workdir` made read-only
  (`_read_only`), the workdir made writable again after."""
  cause = _read_only(workdir, monkeypatch)
  try:
    with pytest.raises(cli.FAULTS) as caught:
      char_lm.TASK.train_model(_config(text_file), workdir)
  finally:
    monkeypatch.undo()
    for path in [workdir, *workdir.rglob('*')]:
      if path.is_dir():
        path.chmod(0o755)
  return cause, caught


def test_a_read_only_workdir(text_file, straight, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '6')  # a run to resume, in a workdir gone read-only
  before = _state(workdir)
  cause, caught = _train_read_only(text_file, workdir, monkeypatch)
  _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    f'cannot write to --workdir={workdir} before training: {cause}',
    f'the last good checkpoint is {workdir.resolve()}/checkpoints/4 (step 4), intact',
    'make it writable or give another --workdir, then rerun',
  )
  _assert_nothing_lost(before, _state(workdir))


def test_a_read_only_workdir_of_a_finished_run(text_file, straight, tmp_path, monkeypatch):
  """A run that reached config.train.steps has nothing to resume: the line said 'rerun the
  same command to resume' (and 'give another --workdir', which would train it all again).
  Now it says the run is finished, and that eval.py with --output_dir scores it."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  before = _state(workdir)
  cause, caught = _train_read_only(text_file, workdir, monkeypatch)
  line = _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    f'cannot write to --workdir={workdir} before training: {cause}',
    f'the last good checkpoint is {workdir.resolve()}/checkpoints/{STEPS} (step {STEPS}), '
    f'intact; the run is finished (config.train.steps={STEPS}), nothing is left to train: '
    'score it with eval.py and an --output_dir that takes files',
  )
  assert 'resume' not in line and 'another --workdir' not in line, line
  _assert_nothing_lost(before, _state(workdir))


def test_a_data_file_gone_by_the_final_evaluation_names_the_saved_run(
  text_file, straight, tmp_path, monkeypatch
):
  """A data file deleted or moved while train.py trained: training finished, and its final
  evaluation said `no text file at ...; set data.path to an existing file`, as if the run had
  not trained on it. Now the line says the run is saved and which file went, and gives the
  eval.py command that scores it once the file is back (the launcher's, from its own; the
  translation task's files: tests/test_translate_training.py)."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  moved = tmp_path / 'moved.txt'
  after_training(monkeypatch, char_lm.TASK, lambda: text_file.rename(moved))
  try:
    with pytest.raises(run_results.UnscoredRunError) as caught:
      char_lm.TASK.train_and_evaluate(_config(text_file), workdir)
  finally:
    if moved.exists():
      moved.rename(text_file)
  assert str(caught.value) == (
    f'training finished and saved its last checkpoint, {workdir}/checkpoints/{STEPS} (step '
    f'{STEPS}), but config.data.path ({text_file}) is gone since training started (deleted or '
    'moved), so the run was not evaluated: restore the data as it was, then score the run '
    f'with `python eval.py --config=<its config file> --workdir={workdir}`'
  )
  argv = ['train.py', '--config=configs/char_tiny.py:shaw', '--config.train.steps=6']
  caught.value.command = tasks.eval_command([*argv, '--allow_config_change'], workdir)
  assert str(caught.value).endswith(
    f'with `python eval.py --config=configs/char_tiny.py:shaw --config.train.steps=6 '
    f'--workdir={workdir}`'
  )


def test_a_data_file_rewritten_while_training_leaves_the_run_unscored(
  text_file, straight, tmp_path, monkeypatch
):
  """A data file overwritten while train.py trained: its final evaluation scored the new file
  with a warning, exit 0, and an eval_results.json no sweep could tell apart. Now it is the
  saved-but-unscored run of a deleted file, naming the change; nothing is scored."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  original = text_file.read_bytes()
  after_training(monkeypatch, char_lm.TASK, lambda: text_file.write_bytes(original * 2))
  (workdir / 'eval_results.json').unlink(missing_ok=True)
  try:
    with pytest.raises(run_results.UnscoredRunError) as caught:
      char_lm.TASK.train_and_evaluate(_config(text_file), workdir)
  finally:
    text_file.write_bytes(original)
  assert str(caught.value) == (
    f'training finished and saved its last checkpoint, {workdir}/checkpoints/{STEPS} (step '
    f'{STEPS}), but config.data.path: {text_file} changed since the run trained on it '
    f'({len(original):,} bytes then, {2 * len(original):,} now), so the run was not evaluated: '
    'restore the data as it was, then score the run with `python eval.py --config=<its config '
    f'file> --workdir={workdir}`'
  )
  assert not (workdir / 'eval_results.json').exists()


def test_a_workdir_removed_mid_run(text_file, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  # Checkpoint 2 finished, then the workdir goes (an unmount, a cleanup job).
  _at_checkpoint(monkeypatch, 4, lambda: shutil.rmtree(workdir))
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    f'cannot write checkpoint 4 to {workdir.resolve()}/checkpoints/4',
    'No such file or directory (the workdir is gone: removed or unmounted)',
    'no checkpoint is left there; restore it or give a new --workdir, then rerun',
  )
  assert not workdir.exists(), 'the checkpoint save made the removed workdir again'


def test_a_workdir_where_another_run_trains_is_refused_until_it_dies(text_file, straight, tmp_path):
  """A second run on a workdir whose lock another process holds (a train.py launched twice):
  one line naming that process, exit 75, nothing touched (not even the holder's half-written
  checkpoints, which a starting run removes as left over from a crash). Once the holder is
  killed (-9: no cleanup), the kernel has dropped its lock and the run resumes."""
  from relpos.training.workdir_lock import LOCK_FILE

  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '6')
  half_written = workdir / 'checkpoints' / f'6{TMP_MARKER}1'
  half_written.mkdir()  # the holder's save in flight
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      'import sys; from relpos.training import workdir_lock\n'
      f'with workdir_lock.hold({str(workdir)!r}):\n  print("held", flush=True); sys.stdin.read()',
    ],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
    cwd=REPO,
  )
  try:
    assert holder.stdout.readline().strip() == 'held'
    before = _state(workdir)
    with pytest.raises(cli.FAULTS) as caught:
      char_lm.TASK.train_model(_config(text_file), workdir)
    _fault(
      caught.value,
      75,
      f'--workdir={workdir} is in use: process {holder.pid} on ',
      f'trains there now (it holds {workdir / LOCK_FILE}); wait for it to end, or give another',
    )
    _assert_nothing_lost(before, _state(workdir))
    assert half_written.is_dir()
  finally:
    holder.kill()
    holder.wait()
  char_lm.TASK.train_model(_config(text_file), workdir)
  assert 6 in _state(workdir)[0] and not half_written.exists()
  assert (workdir / LOCK_FILE).read_text() == ''  # the holder's line goes when its run ends


def test_evaluating_a_run_before_its_first_checkpoint_says_it_trains_now(
  text_file, straight, tmp_path
):
  """eval.py on a workdir where train.py trains now but has saved no checkpoint yet said "no
  checkpoint ...: train first". It is the busy case now (exit 75), naming the holder and the
  step of the first save; with no run holding the lock, "train first" as before."""
  from relpos.training import workdir_lock

  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  shutil.rmtree(workdir / 'checkpoints')  # the run has recorded its config, saved nothing
  with workdir_lock.hold(workdir):  # another open file: flock refuses this process too
    assert workdir_lock.holder(workdir).startswith(f'process {os.getpid()} on ')
    with pytest.raises(cli.FAULTS) as caught:
      char_lm.TASK.evaluate(_config(text_file), workdir)
    _fault(
      caught.value,
      75,
      f'--workdir={workdir} has no checkpoint yet: process {os.getpid()} on ',
      f'trains there now (it holds {workdir / workdir_lock.LOCK_FILE}); its first checkpoint '
      f'comes at step 2 (config.train.checkpoint_every=2, config.train.steps={STEPS}): try '
      'again then',
    )
    (workdir / 'config.json').unlink()  # still reading its data: no config recorded yet
    with pytest.raises(workdir_lock.WorkdirInUseError, match='it has not started its first'):
      restore.check_trained(workdir)
  assert workdir_lock.holder(workdir) is None
  with pytest.raises(FileNotFoundError, match=r'no checkpoint in .*: train first'):
    restore.check_trained(workdir)
  assert workdir_lock.holder(tmp_path / 'no_lock_file') is None


def test_a_start_refused_for_missing_data_leaves_no_workdir_it_made(text_file, tmp_path):
  """train.py refused for a data file that is not there left the workdir it made, and any
  parent it made, holding only a 0-byte .relpos.lock. Now they are gone; a directory the user
  had stays, as does anything in it."""
  from relpos.training.workdir_lock import LOCK_FILE

  config = _config(text_file)
  config.data.path = str(tmp_path / 'missing.txt')
  with pytest.raises(FileNotFoundError, match='no text file at'):
    char_lm.TASK.train_model(config, tmp_path / 'new' / 'run')
  assert sorted(tmp_path.iterdir()) == []
  mine = tmp_path / 'mine'
  mine.mkdir()
  (mine / 'notes.txt').write_text('kept')
  for workdir in (mine, mine / 'run'):
    with pytest.raises(FileNotFoundError, match='no text file at'):
      char_lm.TASK.train_model(config, workdir)
  assert sorted(path.name for path in mine.iterdir()) == [LOCK_FILE, 'notes.txt']


def test_a_lock_file_its_holder_removed_is_opened_again(tmp_path, monkeypatch):
  """A run refused before it wrote anything removes its lock file as it ends (above): a run
  that opened the file just before was left holding a lock on a file no longer in the
  workdir, and a third run took the new file's lock beside it."""
  from relpos.training import workdir_lock

  real_open, removed = os.open, []

  def open_then_removed(path, *args):
    fd = real_open(path, *args)
    if Path(path).name == workdir_lock.LOCK_FILE and not removed:
      removed.append(path)
      os.unlink(path)  # the refused run's leave_no_trace, between this open and its lock
    return fd

  monkeypatch.setattr(workdir_lock.os, 'open', open_then_removed)
  with workdir_lock.hold(tmp_path):
    assert removed
    with pytest.raises(workdir_lock.WorkdirInUseError):
      with workdir_lock.hold(tmp_path):
        pass


def test_a_workdir_path_the_os_refuses_is_one_line(text_file, tmp_path):
  """A loop of symbolic links, a name longer than the filesystem takes: one line naming the
  flag, for train.py and the readers alike (they raised from Path.resolve or Path.stat, and the
  fault's own handler raised again naming the last good checkpoint)."""
  (tmp_path / 'a').symlink_to(tmp_path / 'b')
  (tmp_path / 'b').symlink_to(tmp_path / 'a')
  for workdir, reason in (
    (tmp_path / 'a' / 'run', 'a loop of symbolic links'),
    (tmp_path / ('x' * 300), 'File name too long'),
  ):
    with pytest.raises(ValueError, match=f'^--workdir={workdir}: {reason}; give another path$'):
      char_lm.TASK.train_model(_config(text_file), workdir)
    with pytest.raises(ValueError, match=f'^--workdir={workdir}: {reason}'):
      read_config(workdir)
    with pytest.raises(ValueError, match=f'^{workdir}: {reason}'):
      plot.read_curves(workdir)


def test_a_symbolic_link_to_nothing_is_named_as_such(text_file, straight, tmp_path):
  """A workdir (or --output_dir) that is a symbolic link to a path that does not exist (a
  volume not mounted), or lies under one: train.py said 'File exists (a file is in the way of
  a directory)' and to 'rerun the same command to resume'; a reader, that it is no directory.
  Every command names the link and its target now, as one line (exit 1), before writing."""
  link = tmp_path / 'dangle'
  link.symlink_to('/nonexistent-relpos-target/deep')
  told = 'a symbolic link to /nonexistent-relpos-target/deep, which does not exist: mount it '
  told += 'or point the link elsewhere'
  with pytest.raises(ValueError) as caught:
    char_lm.TASK.train_model(_config(text_file), link)
  assert str(caught.value) == f'--workdir={link}: it is {told}'
  with pytest.raises(ValueError) as caught:
    char_lm.TASK.train_model(_config(text_file), link / 'run')
  assert str(caught.value) == f'--workdir={link / "run"}: {link} is {told}'
  with pytest.raises(ValueError) as caught:
    tasks.check_output_dir(link, straight)
  assert str(caught.value) == f'--output_dir={link}: it is {told}'
  with pytest.raises(ValueError, match=f'^--workdir={link}: it is a symbolic link'):
    read_config(link)
  assert link.is_symlink() and not link.exists()


@pytest.mark.parametrize('name', ['checkpoints', 'tensorboard'])
def test_a_file_where_the_run_keeps_a_directory_is_refused_before_training(
  text_file, straight, tmp_path, name
):
  """A file named checkpoints trained from step 0 and failed at the first save as "the
  workdir is gone"; tensorboard's failed with advice about --workdir. Both are named now,
  before anything is written."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  shutil.rmtree(workdir / name)
  (workdir / name).write_text('x')
  lines = (workdir / 'metrics.jsonl').read_text()
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    f'{workdir / name} is a file where the run keeps its {name} directory; nothing was written',
  )
  assert (workdir / 'metrics.jsonl').read_text() == lines
  if name == 'checkpoints':
    with pytest.raises(FileNotFoundError, match=f"{workdir / name} is a file, not the run's"):
      char_lm.TASK.evaluate(_config(text_file), workdir, output_dir=tmp_path / 'eval')


def test_damaged_run_files_are_named(text_file, straight, tmp_path):
  """A vocab.json that is not JSON, a config.json without a whole section: named as damaged
  (the run's recorded vocab.json as changed since it trained, by every command alike), not as
  a JSON parser's words or as a config change to override."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  (workdir / 'vocab.json').write_text('not json')

  # The copy's own vocabulary is compared with the record first (`data_record`: its place in
  # the workdir), as the run's in place was; a resume is refused even with
  # --allow_config_change (`data_record.check_vocabulary`: the checkpoints' ids are its pieces),
  # and so is a read by the tools (`Task.trained_model`, in eval.py's order).
  def resume(allow: bool):
    return lambda: char_lm.TASK.train_model(_config(text_file), workdir, allow_config_change=allow)

  for read in (resume(False), resume(True), lambda: sample.sample(workdir, None, 5)):
    with pytest.raises(ValueError) as caught:
      read()
    assert re.match(r'the vocabulary: \S*/run/vocab\.json changed since', str(caught.value))
    assert str(caught.value).endswith(
      "restore the run's vocab.json (from a backup or from where the run came from)"
    )
  shutil.copy(straight / 'vocab.json', workdir / 'vocab.json')
  recorded = json.loads((workdir / 'config.json').read_text())
  del recorded['model']
  (workdir / 'config.json').write_text(json.dumps(recorded))
  with pytest.raises(ValueError, match=r'config\.json has no config\.model section: it is damaged'):
    char_lm.TASK.train_model(_config(text_file), workdir)
  with pytest.raises(ValueError, match=r'config\.json has no config\.model section'):
    char_lm.TASK.evaluate(_config(text_file), workdir, output_dir=tmp_path / 'eval')


def test_a_field_this_version_does_not_know_names_the_recorded_config(
  text_file, straight, tmp_path
):
  """A config.json with a field this version does not know (recorded by a newer relpos, or
  added by hand): sample named the field without the file, eval.py and train.py asked for the
  config it was trained with, which no config can be, and translate ignored one in the data
  section. Each now names the file and the field, and says what to do."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  recorded = json.loads((workdir / 'config.json').read_text())
  recorded['model']['foo'] = 1
  (workdir / 'config.json').write_text(json.dumps(recorded))
  line = (
    f'{workdir}/config.json records config.model.foo, a field this version of relpos does '
    'not know: the run was recorded by another version of relpos, or the file was edited by '
    f'hand; use the relpos version that trained it, or remove the field from '
    f'{workdir}/config.json if it was added by hand'
  )
  for command in (
    lambda: char_lm.TASK.train_model(_config(text_file), workdir),
    lambda: char_lm.TASK.evaluate(_config(text_file), workdir, output_dir=tmp_path / 'eval'),
    lambda: sample.sample(workdir, None, 5),
  ):
    with pytest.raises(ValueError) as caught:
      command()
    assert str(caught.value) == line
  translation = tmp_path / 'translation'
  translation.mkdir()
  recorded = json.loads(tiny_translate_config(Path('unused'), steps=1).to_json())
  recorded['data']['bpe'] = True
  (translation / 'config.json').write_text(json.dumps(recorded))
  with pytest.raises(ValueError, match=r'config\.json records config\.data\.bpe, a field this'):
    translate.translate_lines(translation, ['a cat'])
  # A config file's own: refused before anything is written, or config.json would record it.
  config = _config(text_file).copy_and_resolve_references()
  config.data['bpe'] = True
  with pytest.raises(ValueError, match=r'^config\.data\.bpe is not a field of the char_lm config'):
    char_lm.TASK.train_model(config, tmp_path / 'new')
  assert not (tmp_path / 'new').exists()


def test_a_workdir_of_the_other_task_is_named_by_every_command(straight, tmp_path):
  """The char-LM run in `straight` given to the translation commands, and a translation run's
  config to the char-LM ones: one line each, nothing written."""
  before, files = _state(straight), sorted(straight.rglob('*'))
  translation = tmp_path / 'translation'
  translation.mkdir()
  config = tiny_translate_config(Path('unused'), steps=1)
  (translation / 'config.json').write_text(config.to_json())
  translate_config = read_config(translation)
  message = "holds a run of task 'char_lm', not 'translate'"
  commands = [
    (lambda: translate_task.TASK.train_model(translate_config, straight), "config's task"),
    (lambda: translate_task.TASK.evaluate(translate_config, straight), "config's task"),
    (lambda: translate.translate_lines(straight, ['a cat']), 'relpos.tools.translate reads'),
    (lambda: shaw_tables.row_drift(straight), "shaw_tables reads runs of task 'translate'"),
    (lambda: plot.plot_runs([translation, straight], tmp_path / 'c.png'), 'of one task'),
  ]
  for command, phrase in commands:
    with pytest.raises(TaskMismatchError) as caught:
      command()
    assert phrase in _fault(caught.value, 1, message if phrase != 'of one task' else ''), phrase
  with pytest.raises(TaskMismatchError) as caught:
    sample.sample(translation, b'the', 3)
  _fault(caught.value, 1, "holds a run of task 'translate', not 'char_lm' (relpos.tools.sample")
  root = tmp_path / 'sweep'
  shutil.copytree(translation, root / 'max_relative_position=0' / 'seed=0')
  with pytest.raises(TaskMismatchError, match="holds a run of task 'translate', not 'char_lm'"):
    sweep_tables.read_runs(root, 'model.max_relative_position', [0], [0], task='char_lm')
  assert sorted(straight.rglob('*')) == files and _state(straight) == before
  assert not (tmp_path / 'c.png').exists()


def test_eval_py_on_a_workdir_of_the_other_task_is_one_line(commands, straight):
  before = _state(straight)
  result = commands.run(['eval.py', '--config=configs/translate_tiny.py', f'--workdir={straight}'])
  errors = [line for line in result.stderr.splitlines() if line.startswith('error')]
  assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert errors == [result.stderr.strip().splitlines()[-1]], result.stderr[-2000:]
  assert f"--workdir={straight} holds a run of task 'char_lm', not 'translate'" in errors[0]
  assert 'spm.model' not in result.stderr
  assert _state(straight) == before


def test_out_of_accelerator_memory_names_the_shapes_and_what_would_fit(
  text_file, straight, tmp_path, monkeypatch
):
  """The step raises XLA's own out-of-memory error (an allocation no device holds) at step 5,
  after checkpoint 4."""
  workdir = tmp_path / 'run'
  real = char_lm.TASK.training

  def training(config, workdir, mesh):
    run = real(config, workdir, mesh)
    step, calls = run.step, []

    def oversized_step(state, batch):
      calls.append(1)
      if len(calls) == 5:
        jnp.zeros((1 << 42,), jnp.float32).block_until_ready()  # 16 TiB: RESOURCE_EXHAUSTED
      return step(state, batch)

    run.step = oversized_step
    return run

  monkeypatch.setattr(char_lm.TASK, 'training', training)
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  assert isinstance(caught.value.__cause__, jax.errors.JaxRuntimeError)
  assert 'RESOURCE_EXHAUSTED' in str(caught.value.__cause__)
  _fault(
    caught.value,
    OUT_OF_MEMORY_EXIT_CODE,
    'out of accelerator memory at step 5 (batch_size=4, tgt_len=8, mem_len=8, d_model=16, '
    'num_layers=1, dtype=float32, grad_accum_steps=1, remat=none, scan_layers=False; '
    f'{jax.device_count()} cpu device(s))',
    f'the last good checkpoint is {workdir.resolve()}/checkpoints/4 (step 4), intact',
    # not --config.train.batch_size=2: checkpoint 4 holds the memory of 4 rows (resume_shapes)
    '--config.train.grad_accum_steps=2 (the same batch, in parts)'
    ' or --config.model.remat=full or --config.model.scan_layers=True or '
    '--config.model.dtype=bfloat16 or a smaller model (config.model sizes or tables) in a new '
    '--workdir',
  )
  assert 'what would fit (each but the last resumes the run with --allow_config_change)' in str(
    caught.value
  )
  assert sorted(_state(workdir)[0]) == [2, 4]
  assert _losses(workdir) == {s: v for s, v in _losses(straight).items() if s <= 4}


def test_out_of_memory_while_evaluating_names_the_evaluation_sizes(
  straight, text_file, monkeypatch
):
  """eval.mem_len=2**31 - 1 ran out of memory scoring and gave a traceback: now the
  out-of-memory exit status and the evaluation's sizes to lower."""

  def score(config, workdir, output_dir=None):
    raise ValueError('RESOURCE_EXHAUSTED: Out of memory allocating 17179869184 bytes.')

  monkeypatch.setattr(char_lm.TASK, 'score', score)
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.evaluate(_config(text_file), straight)
  assert caught.value.exit_code == OUT_OF_MEMORY_EXIT_CODE
  assert str(caught.value) == (
    'out of memory evaluating (batch_size=4, tgt_len=8, mem_len=8); the checkpoints in '
    f'{straight} are unchanged; a smaller config.eval.batch_size or config.eval.tgt_len or '
    'config.eval.mem_len would fit better'
  )


@pytest.mark.parametrize(
  'error',
  [
    ValueError('RESOURCE_EXHAUSTED: Out of memory allocating 8000000000 bytes.'),
    MemoryError('Unable to allocate 3.73 GiB for an array with shape (999999985,)'),
  ],
)
def test_a_model_too_large_to_build_is_an_out_of_memory_fault(
  text_file, tmp_path, monkeypatch, error
):
  """Out of memory while the model and its state are built (a huge d_ff: jax raised a
  ValueError of RESOURCE_EXHAUSTED there, and train.py printed it with exit status 1): the
  out-of-memory fault, whose remedies end with a smaller model."""

  def training(config, workdir, mesh):
    raise error

  monkeypatch.setattr(char_lm.TASK, 'training', training)
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), tmp_path / 'run')
  assert caught.value.exit_code == OUT_OF_MEMORY_EXIT_CODE
  assert str(caught.value).startswith('out of accelerator memory at step 1 (')
  assert str(caught.value).endswith('or a smaller model (config.model sizes or tables)')


_INJECT_FULL_DISK = """
import errno, os, sys
from relpos import runtime
runtime.apply_defaults()  # as train.py: the compilation cache (re-executes this program)
from orbax.checkpoint._src.handlers import json_checkpoint_handler as handler
real = handler.JsonCheckpointHandler._save_fn
async def save_fn(self, item, directory):
  if item.get('step') == 4:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / 'meta'))
  return await real(self, item, directory)
handler.JsonCheckpointHandler._save_fn = save_fn
sys.argv[0] = 'train.py'
from relpos.training import tasks
tasks.launch('train_and_evaluate')
"""


# `_config`'s fields beyond char_tiny's and TINY_CHAR_LM's, as train.py flags.
_FLAGS_OF_CONFIG = {
  'train.steps': STEPS,
  'train.batch_size': 4,
  'train.log_every': 1,
  'train.eval_every': 0,
  'train.checkpoint_every': 2,
  'eval.batch_size': 4,
  'eval.tgt_len': 8,
  'eval.mem_len': 8,
}


def test_train_py_on_a_full_disk_exits_with_one_line(text_file, tmp_path):
  """End to end: train.py's status and stderr when checkpoint 4 finds the disk full.

  The run is `_config`'s on one device, and its compilation cache the test run's own
  (conftest.py): it loads the step the in-process runs compiled instead of compiling it."""
  config = _config(text_file)
  assert {name: config[name.split('.')[0]][name.split('.')[1]] for name in _FLAGS_OF_CONFIG} == (
    _FLAGS_OF_CONFIG
  )
  workdir = tmp_path / 'run'
  environment = {**os.environ, 'PYTHONPATH': str(REPO), 'RELPOS_CPU_DEVICES': '1'}
  if jax.config.jax_compilation_cache_dir:
    environment.update(
      JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir,
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0.3',
    )
  result = subprocess.run(
    [
      sys.executable,
      '-c',
      _INJECT_FULL_DISK,
      '--config=configs/char_tiny.py',
      f'--workdir={workdir}',
      f'--config.data.path={text_file}',
      *TINY_CHAR_LM_FLAGS,
      *(f'--config.{name}={value}' for name, value in _FLAGS_OF_CONFIG.items()),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=environment,
  )
  assert result.returncode == FILESYSTEM_EXIT_CODE, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert 'Traceback' not in result.stderr and 'never retrieved' not in result.stderr, lines
  assert [line for line in lines if line.startswith('error')] == lines[-1:], lines
  assert lines[-1].startswith('error: checkpoint 4 was not written'), lines[-1]
  assert 'No space left on device' in lines[-1] and '(step 2), intact' in lines[-1]
  assert sorted(_state(workdir)[0]) == [2]


def _not_scored(monkeypatch):
  """Makes the char LM's `score` fail the test: the evaluation must stop before it."""

  def score(*args, **kwargs):
    raise AssertionError('scored before the output directory was checked')

  monkeypatch.setattr(char_lm.TASK, 'score', score)


def test_a_refused_evaluation_removes_the_output_dir_it_made(text_file, straight, tmp_path):
  """eval.py made --output_dir (and its missing parents) before scoring, then was refused (data
  it cannot read); the empty directories stayed behind. Now they are removed, as train.py's
  workdir is (`workdir_setup.leave_no_trace`); a directory the user had is kept."""
  config = _config(text_file)
  config.data.path = str(tmp_path / 'moved.txt')
  output = tmp_path / 'scores' / 'k=4'
  with pytest.raises(FileNotFoundError, match='no text file at'):
    char_lm.TASK.evaluate(config, straight, output_dir=output)
  assert not (tmp_path / 'scores').exists()
  (tmp_path / 'scores').mkdir()
  with pytest.raises(FileNotFoundError, match='no text file at'):
    char_lm.TASK.evaluate(config, straight, output_dir=tmp_path / 'scores')
  assert (tmp_path / 'scores').is_dir()


@pytest.mark.parametrize('given_output_dir', [True, False])
def test_a_read_only_output_dir_of_eval_is_found_before_scoring(
  text_file, straight, tmp_path, monkeypatch, given_output_dir
):
  """eval.py scored the whole set, then failed at the write; the line named the temporary
  file (`.eval_results.json.partial-<pid>`) and, with no --output_dir, advised another
  --workdir. Now the directory is checked first, named, and --output_dir is the remedy."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  output = tmp_path / 'scores' if given_output_dir else workdir
  output.mkdir(exist_ok=True)
  before = _state(workdir)
  _not_scored(monkeypatch)
  cause = _read_only(output, monkeypatch)
  try:
    with pytest.raises(cli.FAULTS) as caught:
      char_lm.TASK.evaluate(
        _config(text_file), workdir, output_dir=output if given_output_dir else None
      )
  finally:
    monkeypatch.undo()
    for path in [output, *output.rglob('*')]:
      if path.is_dir():
        path.chmod(0o755)
  remedy = 'another --output_dir' if given_output_dir else '--output_dir'
  line = _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    f'cannot write the evaluation to {output}, checked before scoring: {cause}; the '
    f'checkpoints in {workdir} are unchanged; make it writable or give {remedy}, then rerun',
  )
  assert line.endswith('then rerun'), line
  assert not list(output.glob('.relpos-write-check-*')) and not list(output.glob('*eval_results*'))
  _assert_nothing_lost(before, _state(workdir))


def test_a_file_in_place_of_eval_output_dir_names_that_flag(text_file, straight, tmp_path):
  """The remedy names --output_dir, the flag at fault (it said '--workdir')."""
  output = tmp_path / 'a_file'
  output.write_text('')
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.evaluate(_config(text_file), straight, output_dir=output)
  assert str(caught.value).startswith(
    f'cannot write the evaluation to {output}, checked before scoring: File exists'
  )
  assert str(caught.value).endswith('give a directory as --output_dir, then rerun')


def _full_disk_writing(monkeypatch, prefix):
  """Every text write to a file whose name starts with `prefix` fails as a full disk's does:
  ENOSPC from the write itself, which names no file."""
  real = Path.write_text

  def write_text(path, *args, **kwargs):
    if path.name.startswith(prefix):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(path, *args, **kwargs)

  monkeypatch.setattr(Path, 'write_text', write_text)


def _score_writing_translations(real_score):
  """A char-LM score that also has a file of translations written to output_dir, as the
  translation task's score does (`task_base.FILE_TEXTS`, written by `Task._score_into`)."""

  def score(config, workdir, output_dir=None):
    result = real_score(config, workdir, output_dir)
    translations = str(Path(output_dir) / 'translations_step6.txt')
    return {**result, 'translations': translations, task_base.FILE_TEXTS: {'translations': 'a\n'}}

  return score


@pytest.mark.parametrize('written', ['eval_results.json', 'translations_step6.txt'])
@pytest.mark.parametrize('given_output_dir', [False, True])
def test_a_full_disk_writing_the_evaluation_names_the_file(
  text_file, straight, tmp_path, monkeypatch, written, given_output_dir
):
  """The final evaluation's eval_results.json (and translation's translations file) on a full
  disk ended in a traceback: the write's ENOSPC names no file, so it was not told from a data
  file's error. Now the exit-74 line naming the file."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  output = tmp_path / 'scores' if given_output_dir else workdir
  before = _state(workdir)
  monkeypatch.setattr(char_lm.TASK, 'score', _score_writing_translations(char_lm.TASK.score))
  _full_disk_writing(monkeypatch, f'.{written}')
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.evaluate(_config(text_file), workdir, output_dir=output)
  assert cli.fault_exit(caught.value)[1] == (
    f'error: cannot write the evaluation to {output / written}: No space left on device (the '
    f'disk is full); the checkpoints in {workdir} are unchanged; free space on its disk, then '
    'rerun'
  )
  _assert_nothing_lost(before, _state(workdir))
  assert not list(output.glob(f'.{written}*')), 'a partial file was left'


def test_an_evaluation_takes_the_write_faults_train_py_takes(text_file, straight, monkeypatch):
  """The evaluation had a rule of its own of which OSErrors are its exit-74 line: one naming a
  file under its output directory. A full disk met where the error names no file (a buffered
  write flushed at its close, a scratch file) was reported as it was, a traceback, where
  train.py's workdir, by `relpos.faults.is_write_fault`, gives the line; the evaluation now asks
  that rule. A data file's error is still reported as it is."""

  def score(config, workdir, output_dir=None):
    raise raised

  monkeypatch.setattr(char_lm.TASK, 'score', score)
  raised = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.evaluate(_config(text_file), straight)
  assert cli.fault_exit(caught.value)[1] == (
    f'error: cannot write the evaluation to {straight}: No space left on device (the disk is '
    f'full); the checkpoints in {straight} are unchanged; free space on its disk, then rerun'
  )
  raised = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), text_file)
  with pytest.raises(FileNotFoundError):
    char_lm.TASK.evaluate(_config(text_file), straight)


@pytest.fixture
def small_disk(tmp_path):
  """A directory on a 32 MiB tmpfs of its own, room for the run, which the filler then takes
  (skips where mounting is not allowed)."""
  mount = tmp_path / 'disk'
  mount.mkdir()
  made = subprocess.run(
    ['mount', '-t', 'tmpfs', '-o', 'size=32m', 'tmpfs', str(mount)], capture_output=True
  )
  if made.returncode:
    pytest.skip('cannot mount a tmpfs here (not root?): the injected rows cover a full disk')
  try:
    yield mount
  finally:
    subprocess.run(['umount', '-l', str(mount)], check=False)


def _fill(directory):
  """Writes zeros into directory/filler until the disk is full; returns the file. Unbuffered:
  a buffered file would try to flush the bytes the failing write left behind when it closes,
  and fail again (ENOSPC raised out of the `with`, before the file is returned)."""
  filler = directory / 'filler'
  with open(filler, 'wb', buffering=0) as out:
    try:
      while True:
        out.write(b'\0' * (1 << 16))
    except OSError as error:
      assert error.errno == errno.ENOSPC, error
  return filler


def test_a_real_full_disk_mid_run_and_the_rerun_after_freeing_space(
  text_file, straight, small_disk, monkeypatch, capfd
):
  """The disk (a tmpfs) is filled for real after checkpoint 2, before checkpoint 4: the
  first write to fail may be the checkpoint's (in tensorstore) or metrics.jsonl's."""
  workdir = small_disk / 'run'
  filled = _at_checkpoint(monkeypatch, 4, lambda: _fill(small_disk))  # checkpoint 2 is on disk
  with pytest.raises(cli.FAULTS) as caught:
    char_lm.TASK.train_model(_config(text_file), workdir)
  _fault(
    caught.value,
    FILESYSTEM_EXIT_CODE,
    'No space left on device (the disk is full)',
    f'the last good checkpoint is {workdir.resolve()}/checkpoints/2 (step 2), intact',
    'free space on its disk, then rerun the same command to resume',
  )
  err = capfd.readouterr().err
  assert 'Traceback' not in err and 'never retrieved' not in err, err[-3000:]
  before = _state(workdir)
  assert sorted(before[0]) == [2]
  assert not list((workdir / 'checkpoints').glob(f'*{TMP_MARKER}*')), 'half-written save kept'
  filled[0].unlink()  # space freed
  char_lm.TASK.train_model(_config(text_file), workdir)
  _assert_nothing_lost(before, _state(workdir))
  assert _losses(workdir) == _losses(straight)


class _Device:
  """A device that reports `bytes_limit` bytes of memory (XLA:CPU reports none)."""

  device_kind = 'small accelerator'

  def __init__(self, bytes_limit):
    self.bytes_limit = bytes_limit

  def memory_stats(self):
    return {'bytes_limit': self.bytes_limit}


def test_the_step_memory_estimate_warns_before_training_when_it_will_not_fit():
  from relpos.training.device_memory import step_memory_warning

  step = jax.jit(lambda x, y: (x @ y, x.sum()))
  args = (jnp.ones((64, 256)), jnp.ones((256, 128)))
  assert step_memory_warning(step, *args) is None  # XLA:CPU reports no limit: no estimate
  assert step_memory_warning(step, *args, device=_Device(1 << 30)) is None
  line = step_memory_warning(step, *args, device=_Device(1 << 10))
  assert line.startswith('the training step needs about 0.00 GiB per device') and (
    'small accelerator reports 0.00 GiB: it will likely run out of memory' in line
  ), line


def test_a_checkpoint_of_another_model_is_refused_before_orbax_reads_it(tmp_path, monkeypatch):
  """Restoring into other shapes names the first array that differs, and orbax never starts
  the read (a read it abandons leaves coroutines that were never awaited, which Python
  reports as 'Exception ignored in: <coroutine ...>' long after)."""
  import gc

  from relpos.training.checkpoints import Checkpoints

  unraisable = []
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)
  state = {'model': {'layers': [{'w': jnp.ones((4, 3))}], 'b': jnp.zeros(3)}}
  checkpoints = Checkpoints(tmp_path, keep=2, writer=True)
  checkpoints.save(1, state, {'step': 1})
  checkpoints.commit()
  other = {'model': {'layers': [{'w': jnp.ones((5, 3))}], 'b': jnp.zeros(3)}}
  for reader in (checkpoints, Checkpoints(tmp_path)):  # the training run's, and eval.py's
    assert reader.restore(1, state)[0]['model']['layers'][0]['w'].shape == (4, 3)
    with pytest.raises(ValueError, match=r"model\['layers'\]\[0\]\['w'\] has shape \[4, 3\] "):
      reader.restore(1, other)
    with pytest.raises(ValueError, match=r"model\['c'\] is not in the checkpoint"):
      reader.restore(1, {'model': {'c': jnp.zeros(3)}})
    with pytest.raises(ValueError, match=r'no readable checkpoint .*has shape \[4, 3\]'):
      reader.restore_latest(other)
  gc.collect()
  assert not unraisable


def test_a_damaged_checkpoint_is_named_with_its_cause_and_readers_leave_it(
  tmp_path, monkeypatch, capsys
):
  """A checkpoint whose files are truncated: restoring it names it and tensorstore's cause in
  one line (not orbax's wrapper with its TensorStore spec); a reader falls back to the older
  one with one warning line and moves nothing (only training sets checkpoints aside)."""
  import gc

  from relpos.training.checkpoints import Checkpoints, UnreadableCheckpointError

  unraisable = []
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)
  keys = jax.random.split(jax.random.key(0), 8)  # random: arrays big enough for data files
  state = {'model': {'layers': [{'w': jax.random.normal(key, (64, 32))} for key in keys]}}
  writer = Checkpoints(tmp_path, writer=True)
  for step in (2, 4):
    writer.save(step, state, {'step': step})
  writer.close()
  damage_checkpoint(tmp_path / 'checkpoints' / '4')
  files = sorted(tmp_path.rglob('*'))
  reader = Checkpoints(tmp_path)
  with pytest.raises(UnreadableCheckpointError) as caught:
    reader.restore(4, state)
  message = str(caught.value)
  assert message.startswith(f'checkpoint {tmp_path.resolve()}/checkpoints/4 is unreadable: ')
  assert 'is not valid for value of size 50' in message, message
  assert '\n' not in message and 'TensorStore' not in message, message
  step, restored, _ = reader.restore_latest(state)
  assert step == 2 and restored['model']['layers'][0]['w'].shape == (64, 32)
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 1 and warnings[0].startswith(
    f'warning: checkpoint {tmp_path.resolve()}/checkpoints/4 is unreadable (OUT_OF_RANGE: '
  ), warnings
  assert warnings[0].endswith('); trying an older one'), warnings
  assert sorted(tmp_path.rglob('*')) == files, 'a reader changed the workdir'
  reader.close()
  gc.collect()
  assert not unraisable


def _evict_as_orbax_starts(step_directory: Path) -> None:
  """What orbax's eviction of a checkpoint leaves a moment in: its top-level files and its
  'model' item unlinked, its other items and the directory still there."""
  for path in step_directory.iterdir():
    if path.is_file():
      path.unlink()
  shutil.rmtree(step_directory / 'model')


def _training_on(monkeypatch, saves: int, *, evict=shutil.rmtree) -> list[int]:
  """Makes each of the first `saves` checkpoint reads happen after a run training in the
  workdir saved a newer checkpoint (a copy of the newest, two steps on) and evicted the oldest
  (keep_checkpoints; `evict` of its directory), as a reader that lists then reads meets it;
  returns the steps read."""
  from relpos.training.checkpoints import Checkpoints

  real, read = Checkpoints.restore, []

  def restore(self, step, like):
    read.append(step)
    if len(read) <= saves:
      there = finished_steps(self.directory.parent)
      shutil.copytree(self.directory / str(there[-1]), self.directory / str(there[-1] + 2))
      evict(self.directory / str(there[0]))
    return real(self, step, like)

  monkeypatch.setattr(Checkpoints, 'restore', restore)
  return read


def test_a_checkpoint_evicted_while_eval_reads_it_is_listed_again(
  text_file, straight, tmp_path, monkeypatch, capsys
):
  """eval.py averaging the last 3 checkpoints of a run training now: the trainer evicted the
  oldest between eval's listing and its read, and eval said its files were damaged. Now the
  checkpoints are listed and read again: the newest 3 there now."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  config = _config(text_file)
  config.eval.average_checkpoints = 3
  read = _training_on(monkeypatch, saves=1)  # 2, 4, 6 listed; 4, 6, 8 there as 6 is read
  result = char_lm.TASK.evaluate(config, workdir, output_dir=tmp_path / 'eval')
  assert read == [6, 2, 8, 4, 6], read
  assert result['checkpoint'] == f'{workdir.resolve()}/checkpoints/8', result
  assert 'unreadable' not in capsys.readouterr().err


def test_a_checkpoint_evicted_as_eval_reads_it_is_listed_again(
  text_file, straight, tmp_path, monkeypatch, capsys
):
  """As above, but eval's read of step 2 meets orbax's eviction half way: the directory is
  still there and listed, its 'model' item gone, and orbax's restore fails with 'Item "model"
  was not found' (one of the errors a raced read gives). Orbax finishes the eviction while
  the reader waits; listed again, step 2 is gone, so it was evicted, not damaged, and the
  checkpoints there now are read."""
  from relpos.training import checkpoints as checkpoints_lib

  def orbax_finishes(seconds):
    assert seconds == checkpoints_lib.EVICTION_SETTLE_SECONDS
    for step_directory in (workdir / 'checkpoints').iterdir():
      if not (step_directory / 'model').exists():
        shutil.rmtree(step_directory)

  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  config = _config(text_file)
  config.eval.average_checkpoints = 3
  read = _training_on(monkeypatch, saves=1, evict=_evict_as_orbax_starts)
  monkeypatch.setattr(checkpoints_lib.time, 'sleep', orbax_finishes)
  result = char_lm.TASK.evaluate(config, workdir, output_dir=tmp_path / 'eval')
  assert read == [6, 2, 8, 4, 6], read
  assert result['checkpoint'] == f'{workdir.resolve()}/checkpoints/8', result
  assert 'unreadable' not in capsys.readouterr().err


@pytest.fixture
def two_checkpoints(tmp_path):
  """A workdir with checkpoints 2 and 4 of a small state, and that state."""
  from relpos.training.checkpoints import Checkpoints

  state = {'model': {'w': jnp.ones((4, 4))}}
  writer = Checkpoints(tmp_path, writer=True)
  for step in (2, 4):
    writer.save(step, state, {'step': step})
  writer.close()
  return tmp_path, state


# What orbax and tensorstore raise when a read races an eviction, or meets damage.
_TENSORSTORE_NOT_FOUND = (
  'NOT_FOUND: Error opening "cast" driver: Error opening "zarr" driver: Metadata at '
  '"w/.zarray" in OCDBT database at local file "/x/checkpoints/2/model/" does not exist '
  '[tensorstore_spec[1]=\'{\\"base\\":{\\"driver\\":\\"zarr\\",' + 'x' * 400 + "}'"
)
_READ_ERRORS = [
  FileNotFoundError(errno.ENOENT, 'No such file or directory'),
  ValueError(
    'FAILED_PRECONDITION: Error reading "w/0.0" in OCDBT database at local file '
    '"/x/checkpoints/2/model/": Truncated Zstd-compressed stream; at byte 0'
  ),
  KeyError('Item "model" was not found in the checkpoint. Available items: [\'meta\']'),
  ValueError(_TENSORSTORE_NOT_FOUND),
]
_READ_ERROR_KINDS = ['no_such_file', 'truncated_zstd', 'item_not_found', 'tensorstore_json']


def _failing_read(checkpoints, monkeypatch, error, then=lambda: None):
  """Makes orbax's restore of `checkpoints` call `then` (what the trainer does meanwhile) and
  raise `error`."""

  def restore(*args, **kwargs):
    then()
    raise error

  monkeypatch.setattr(checkpoints._manager, 'restore', restore)


@pytest.mark.parametrize('error', _READ_ERRORS, ids=_READ_ERROR_KINDS)
def test_a_read_that_fails_as_its_checkpoint_goes_is_an_eviction(
  two_checkpoints, monkeypatch, error
):
  """Whatever orbax raises, a reader's failed read of a checkpoint whose directory went, or
  lost a file, under it is a VanishedCheckpointError: the trainer evicted it."""
  from relpos.training import checkpoints as checkpoints_lib

  workdir, state = two_checkpoints
  step_directory = workdir / 'checkpoints' / '2'
  for evict in (shutil.rmtree, lambda path: (path / 'commit_success.txt').unlink()):
    reader = checkpoints_lib.Checkpoints(workdir)
    _failing_read(reader, monkeypatch, error, then=lambda: evict(step_directory))  # noqa: B023
    with pytest.raises(checkpoints_lib.VanishedCheckpointError):
      reader.restore(2, state)
    reader.close()
    shutil.rmtree(step_directory, ignore_errors=True)
    shutil.copytree(workdir / 'checkpoints' / '4', step_directory)


@pytest.mark.parametrize('error', _READ_ERRORS, ids=_READ_ERROR_KINDS)
def test_a_read_that_fails_then_its_step_is_unlisted_is_an_eviction(
  two_checkpoints, monkeypatch, error
):
  """A failed read of a checkpoint still whole on disk, which is no longer listed a moment
  later (orbax removed it between the reader's second look at its files and the listing):
  evicted, not damaged. The reader waits EVICTION_SETTLE_SECONDS (not slept here)."""
  from relpos.training import checkpoints as checkpoints_lib

  workdir, state = two_checkpoints
  waited = []
  monkeypatch.setattr(checkpoints_lib.time, 'sleep', waited.append)
  reader = checkpoints_lib.Checkpoints(workdir)
  _failing_read(reader, monkeypatch, error)
  monkeypatch.setattr(reader._manager, 'all_steps', lambda: [4])  # the listing after the read
  with pytest.raises(checkpoints_lib.VanishedCheckpointError):
    reader.restore(2, state)
  assert waited == [checkpoints_lib.EVICTION_SETTLE_SECONDS]
  reader.close()


@pytest.mark.parametrize('error', _READ_ERRORS, ids=_READ_ERROR_KINDS)
def test_a_read_that_fails_on_a_checkpoint_still_there_is_damage_in_one_short_line(
  two_checkpoints, monkeypatch, error
):
  """Still listed and whole after the wait: the checkpoint is unreadable, and its cause is one
  line of at most 300 characters, without tensorstore's spec (a line of ~600 before)."""
  from relpos.training import checkpoints as checkpoints_lib

  workdir, state = two_checkpoints
  monkeypatch.setattr(checkpoints_lib.time, 'sleep', lambda seconds: None)
  reader = checkpoints_lib.Checkpoints(workdir)
  _failing_read(reader, monkeypatch, error)
  with pytest.raises(checkpoints_lib.UnreadableCheckpointError) as caught:
    reader.restore(2, state)
  reader.close()
  assert type(caught.value) is checkpoints_lib.UnreadableCheckpointError
  cause = caught.value.cause
  assert len(cause) <= 300 and 'tensorstore_spec' not in cause and '\n' not in cause, cause
  assert not cause.startswith("'"), cause  # a KeyError's text, not the repr of it


def test_checkpoints_evicted_under_every_read_are_one_line(
  text_file, straight, tmp_path, monkeypatch
):
  """Checkpoints that vanish under each of the reads: one line saying the run training there
  removed them, and to rerun; not that their files are damaged."""
  from relpos.training.checkpoints import Checkpoints, VanishedCheckpointError

  def restore(self, step, like):
    raise VanishedCheckpointError(self.directory / str(step))

  monkeypatch.setattr(Checkpoints, 'restore', restore)
  with pytest.raises(ValueError) as caught:
    char_lm.TASK.evaluate(_config(text_file), straight, output_dir=tmp_path / 'eval')
  assert str(caught.value) == (
    f'checkpoint {straight.resolve()}/checkpoints/6 was removed while it was read: the run '
    f'training in {straight.resolve()} removed it, keeping only its newest checkpoints '
    '(config.train.keep_checkpoints); the checkpoints changed under each of 3 reads: rerun '
    'once that run has ended, or with fewer config.eval.average_checkpoints'
  )


def test_an_empty_checkpoint_directory_is_one_warning_line(tmp_path, capsys, caplog):
  """A checkpoint directory left empty: the fallback's warning alone, not also orbax's absl
  warnings that its metadata file does not exist (two W... lines before)."""
  from relpos.training.checkpoints import Checkpoints

  state = {'model': {'w': jnp.ones((4, 4))}}
  writer = Checkpoints(tmp_path, writer=True)
  writer.save(2, state, {'step': 2})
  writer.close()
  (tmp_path / 'checkpoints' / '50').mkdir()
  reader = Checkpoints(tmp_path)
  capsys.readouterr()
  with caplog.at_level('WARNING'):
    assert reader.restore_latest(state)[0] == 2
  reader.close()
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1 and lines[0].startswith(
    f'warning: checkpoint {tmp_path.resolve()}/checkpoints/50 is unreadable ('
  ), lines
  orbax_lines = [r.getMessage() for r in caplog.records if 'orbax' in r.pathname]
  assert not [line for line in orbax_lines if 'does not exist' in line], orbax_lines


def test_a_reader_makes_no_directory_and_names_a_file_given_as_workdir(tmp_path):
  """eval.py and the tools (`check_trained`) on a workdir that does not exist, or is a file:
  one line each, saying what to give, and nothing made."""

  missing = tmp_path / 'missing'
  with pytest.raises(FileNotFoundError, match=f'no checkpoint in {missing}/checkpoints: train'):
    restore.check_trained(missing)
  assert not missing.exists()
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match='no checkpoint in'):
    restore.check_trained(empty)
  assert not list(empty.iterdir())
  a_file = tmp_path / 'a_file'
  a_file.write_text('')
  with pytest.raises(FileNotFoundError) as caught:
    restore.check_trained(a_file)
  assert str(caught.value) == (
    f'--workdir={a_file} is not a directory: give the workdir of a training run'
  )


@pytest.mark.parametrize('given', ['a_file', 'a_file/sub', 'a_link/sub'])
@pytest.mark.parametrize(
  'task, config',
  [(char_lm.TASK, ('char_tiny', 'xl')), (translate_task.TASK, ('translate_tiny', 'shaw'))],
)
def test_eval_py_names_a_file_given_as_workdir(tmp_path, task, config, given):
  """eval.py's evaluation on a file as --workdir, or below one (a file in the way of a parent,
  also through a symbolic link to it): the readers' line, as the tools give it, before any
  file under it is read (it was a NotADirectoryError traceback from reading
  <file>/data_files.json)."""
  (tmp_path / 'a_file').write_text('')
  (tmp_path / 'a_link').symlink_to(tmp_path / 'a_file')
  workdir = tmp_path / given
  with pytest.raises(FileNotFoundError) as caught:
    task.evaluate(load_config(*config), workdir)
  assert str(caught.value) == (
    f'--workdir={workdir} is not a directory: give the workdir of a training run'
  )


def test_train_py_with_every_checkpoint_damaged_is_one_line(commands, straight, tmp_path):
  """End to end: orbax's other reads of a failed restore fail too, and what they leave
  ("Exception ignored in: <coroutine ...>" at exit, futures whose error nobody retrieved) is
  kept off stderr: one error line naming the checkpoints, their causes and what to do."""
  workdir = tmp_path / 'run'
  shutil.copytree(straight, workdir)
  for step in (2, 4, 6):
    damage_checkpoint(workdir / 'checkpoints' / str(step))
  result = commands.run(
    [
      'train.py',
      '--config=configs/char_tiny.py',
      f'--workdir={workdir}',
      f'--config.data.path={read_config(workdir).data.path}',
      *TINY_CHAR_LM_FLAGS,
      *(f'--config.{name}={value}' for name, value in _FLAGS_OF_CONFIG.items()),
    ]
  )
  lines = [line for line in result.stderr.splitlines() if not line.startswith('relpos: CPU')]
  assert result.returncode == 1, result.stderr[-3000:]
  # A warning line as each checkpoint is skipped, newest first, then the one error line.
  *warnings, error = lines
  assert len(warnings) == 3, result.stderr[-3000:]  # nothing else: --traceback shows where
  for line, step in zip(warnings, (6, 4, 2), strict=True):
    assert line.startswith(f'warning: checkpoint {workdir}/checkpoints/{step} is unreadable (')
  assert error.startswith(f'error: no readable checkpoint in {workdir}/checkpoints (step 6: ')
  assert error.endswith(
    'their files are damaged: restore them from a copy, or give a new --workdir'
  )


def test_what_a_failed_restore_leaves_is_kept_off_stderr(tmp_path):
  """Orbax's other reads of a failed restore fail too, and what they leave is reported when
  collected, at random (as late as the interpreter's exit): coroutines closed half way
  ("Exception ignored in: <coroutine object _read_array_index_and_device_put>") and futures
  holding tensorstore's error, which names the checkpoint's file but no orbax source. Both are
  dropped; the same from elsewhere is not."""
  import logging as std_logging

  from relpos import signals
  from relpos.training import checkpoints as checkpoints_lib

  passed_on = []
  hook = signals.unraisable_layer(checkpoints_lib._orbax_leftover, passed_on.append)
  coroutines = {}
  for where in (f'{os.sep}site-packages{os.sep}orbax{os.sep}serialization.py', 'mine.py'):
    namespace = {}
    exec(compile('async def read(): pass', where, 'exec'), namespace)  # noqa: S102
    coroutines[where] = namespace['read']()
  for coroutine in coroutines.values():
    hook(type('Unraisable', (), {'exc_value': Exception('read failed'), 'object': coroutine}))
    coroutine.close()
  assert [u.object for u in passed_on] == [coroutines['mine.py']]

  checkpoints_lib.Checkpoints(tmp_path / 'run', writer=True).close()
  directory = tmp_path.resolve() / 'run' / 'checkpoints'

  def never_retrieved(path):
    message = (
      f'Future exception was never retrieved\nfuture: <Future exception=ValueError({path!r})>'
    )
    return std_logging.LogRecord('asyncio', std_logging.ERROR, 'x.py', 1, message, (), None)

  assert not checkpoints_lib._FILTER.filter(never_retrieved(f'{directory}/4/model/'))
  assert checkpoints_lib._FILTER.filter(never_retrieved('/elsewhere/model/'))


def test_a_checkpoint_evicted_as_a_reader_lists_them_is_listed_again(two_checkpoints, monkeypatch):
  """Opening the checkpoints lists each one; a step the trainer evicted between the listing
  and a look inside it was the exit-74 'cannot open the checkpoints ... (the workdir is gone)'
  for eval.py, with the workdir intact. A reader lists again; a writer, whose run is the only
  one there, still says so at once."""
  from relpos.training import checkpoints as checkpoints_lib

  workdir, _ = two_checkpoints
  manager = checkpoints_lib.ocp.CheckpointManager
  calls = []

  def evicting(directory, **kwargs):
    calls.append(directory)
    if len(calls) == 1:
      raise FileNotFoundError(errno.ENOENT, 'No such file or directory', str(directory / '2'))
    return manager(directory, **kwargs)

  monkeypatch.setattr(checkpoints_lib, 'EVICTION_SETTLE_SECONDS', 0.0)
  monkeypatch.setattr(checkpoints_lib.ocp, 'CheckpointManager', evicting)
  reader = checkpoints_lib.Checkpoints(workdir)
  assert reader.all_steps() == [2, 4] and len(calls) == 2
  reader.close()
  calls.clear()
  with pytest.raises(FilesystemFaultError, match='cannot open the checkpoints'):
    checkpoints_lib.Checkpoints(workdir, writer=True)


def test_out_of_memory_offers_no_field_a_resume_cannot_change():
  """`fixed` (a run with checkpoints: `Task.resume_shapes`) takes config.train.batch_size off
  the remedies; a run without checkpoints is offered half its batch."""
  from relpos.training.device_memory import out_of_memory_fault

  config = load_config('char_tiny')
  fixed, _ = char_lm.TASK.resume_shapes(config)
  assert fixed == ('train.batch_size', 'train.mem_len')
  fresh = str(out_of_memory_fault(config, 1, 'no checkpoint yet'))
  resumed = str(out_of_memory_fault(config, 9, 'checkpoint 8', fixed=fixed, resumes=True))
  assert 'what would fit: --config.train.batch_size=8 or --config.train.grad_accum_steps=2' in fresh
  assert 'batch_size=8' not in resumed
  assert (
    'what would fit (each but the last resumes the run with --allow_config_change): '
    '--config.train.grad_accum_steps=2 (the same batch, in parts)'
  ) in resumed
  assert resumed.endswith('or a smaller model (config.model sizes or tables) in a new --workdir')
  assert fresh.endswith('or a smaller model (config.model sizes or tables)')
  config.train.mem_len = 0
  assert char_lm.TASK.resume_shapes(config)[0] == ()


def test_a_figure_on_a_missing_directory_is_its_fault_line_without_importing_jax(tmp_path):
  """A study's figure whose --out could not be written imported orbax and JAX (seconds, and a
  GPU's start) only to word the fault: the diagnosis lived in the checkpoints' module. It is
  in `relpos.faults` now, which imports the standard library alone."""
  code = (
    'import sys\n'
    'from relpos.studies import figures\n'
    'figure, _ = figures.subplots()\n'
    'try:\n'
    f'  figures.save(figure, {str(tmp_path / "missing" / "f.png")!r}, flag="--out")\n'
    'except Exception as fault:\n'  # a FilesystemFaultError
    '  print(fault)\n'
    "print('jax' in sys.modules)\n"
  )
  done = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, timeout=120, cwd=REPO
  )
  assert done.returncode == 0, done.stderr[-3000:]
  line, imported = done.stdout.splitlines()
  assert line.startswith('cannot write --out=') and 'make that directory' in line, line
  assert imported == 'False'


def _looped() -> tuple[Exception, Exception]:
  """Two exceptions each of which is the other's cause or context: raising one again while
  handling the other (a retry that re-raises the first error) closes such a loop."""
  first, second = ValueError('first'), RuntimeError('second')
  first.__cause__, second.__context__ = second, first
  return first, second


def test_a_looped_exception_chain_is_walked_once():
  """`tasks._chain` (the config file's root cause and its frames) followed an exception's
  cause or context with no guard: a chain that loops never ended it. `exception_chain` is the
  one walk (`error_errno`, the checkpoints' `_read_cause`, the config file's errors), each
  exception once, the cause before the context, and along causes alone where asked."""
  from relpos.faults import error_errno, exception_chain
  from relpos.training.checkpoints import _read_cause

  first, second = _looped()
  assert exception_chain(first) == [first, second]
  assert exception_chain(second) == [second, first]
  assert exception_chain(second, context=False) == [second]
  assert command_line._root_cause(first) is second
  assert command_line._last_frame_in(first, __file__) is None
  assert error_errno(first) is None
  assert _read_cause(first) == 'second'

  caused = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  handled = KeyError('handled')
  wrapper = RuntimeError('wrapper')
  wrapper.__cause__, wrapper.__context__ = caused, handled
  assert exception_chain(wrapper) == [wrapper, caused]  # the cause, not the context
  assert error_errno(wrapper) == errno.ENOSPC
  handled.__context__ = wrapper
  assert exception_chain(handled) == [handled, wrapper, caused]
  assert exception_chain(handled, context=False) == [handled]
  assert _read_cause(handled) == 'handled'
