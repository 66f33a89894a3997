"""The directory a command writes into, made and checked at its start, and left as it was found
where the command stops before writing anything.

train.py's workdir and a sweep's root are made and checked to take files before anything else
(`prepare_workdir`, `relpos.files.check_takes_files`), eval.py's --output_dir before anything is
scored: a read-only or full filesystem is one line before any data is read or anything
compiled, not a fault after the work. A start refused before it wrote anything (data it
cannot read, a bad workdir, out of memory at its first step) leaves nothing behind: the
directories it made and its lock file (`leave_no_trace`), and the vocabulary it made before its
run was recorded (`remove_unrecorded`), so that the next command, or a typo of --workdir, meets
no empty directory and no vocabulary of data since fixed. A vocabulary a sweep copied in for a
start that died before its run was recorded is decided again by the next start
(`remove_stale_copy`). An evaluation stopped by a signal
says, from what is on disk then, whether its results were written (`stopped_evaluation`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from relpos.faults import FilesystemFaultError, filesystem_fault
from relpos.files import (
  check_takes_files,
  made_mark,
  recorded_original,
  recorded_source,
  source_mark,
)
from relpos.training import data_record, workdir_lock
from relpos.training import mesh as mesh_lib
from relpos.training.checkpoints import CHECKPOINTS, finished_steps, last_good_in
from relpos.training.metric_writer import TENSORBOARD
from relpos.training.run_config import has_run
from relpos.training.run_results import RESULTS_FILE

if TYPE_CHECKING:
  from relpos.training.task_base import Task


def prepare_workdir(workdir: Path, steps: int | None = None, *, probe_fault=None) -> list[Path]:
  """Makes `workdir` and checks that it takes files (`check_takes_files`), before anything else
  of the run; returns the directories it made (the workdir and any parents that were
  missing), innermost first, for `leave_no_trace`. `steps`: config.train.steps; a run that
  reached them has nothing left to train, so the remedy of a workdir that takes no files is
  eval.py with --output_dir, not a rerun to resume (None: a directory that is no run's, a
  sweep's root). `probe_fault`: the caller's own fault (or None) for the OSError of a
  directory that takes no files, where train.py's words ('before training', a rerun that
  resumes) are not what it does: the sweep's root, whose first write is its lock or, with
  --collect_only, its tables (`relpos.studies.sweep.root_write_fault`).

  The sweep's root is prepared here too. A dangling symbolic link in its place was refused
  before, naming the link and its target (`run_config.check_path`, which every command runs
  first).

  Raises:
    FilesystemFaultError: a file is in its place, it cannot be made, or it is not writable
      (what it made is removed again).
  """
  if workdir.exists() and not workdir.is_dir():
    raise FilesystemFaultError(
      f'--workdir={workdir} is a file, not a directory; nothing was written; give a directory '
      '(a new one is made), then rerun'
    )
  for name in (CHECKPOINTS, TENSORBOARD):  # the directories a run writes into
    inside = workdir / name
    if inside.exists() and not inside.is_dir():
      raise FilesystemFaultError(
        f'{inside} is a file where the run keeps its {name} directory; nothing was written; '
        'move it away, then rerun'
      )
  made = missing_directories(workdir)
  try:
    check_takes_files(workdir)
  except OSError as error:
    leave_no_trace(workdir, made)
    if probe_fault is not None and (fault := probe_fault(error)) is not None:
      raise fault from error
    what, last_good = f'cannot write to --workdir={workdir} before training', last_good_in(workdir)
    try:
      done = max(finished_steps(workdir), default=0)
    except (OSError, RuntimeError):  # a path that cannot be one (too long, a symlink loop)
      done = 0
    if steps is None or done < steps:
      raise filesystem_fault(error, what, last_good=last_good) from error
    todo = (
      f'the run is finished (config.train.steps={steps}), nothing is left to train: score it '
      'with eval.py and an --output_dir that takes files, or make the workdir writable, then '
      'rerun'
    )
    raise filesystem_fault(error, what, last_good=last_good, todo=todo) from error
  return made


def missing_directories(directory: Path) -> list[Path]:
  """`directory` and those of its parents that do not exist (a symbolic link does, also one to
  nothing), innermost first: what making it makes, for `leave_no_trace`."""
  missing, absent = [], directory
  while not (absent.exists() or absent.is_symlink()):
    missing.append(absent)
    absent = absent.parent
  return missing


def leave_no_trace(workdir: Path, made: list[Path]) -> None:
  """Removes what a run that stopped before writing anything left of the directories it made
  (`made`, innermost first, from `prepare_workdir`): the workdir's lock file (removed while
  the lock is held: `workdir_lock.hold` reopens a lock file its holder removed), then each of
  `made` that is empty. A start refused for missing data or a bad workdir left a new directory
  that held only a 0-byte `.relpos.lock`, where the next command (or a sweep's root, a typo of
  --workdir) would meet it. Nothing is removed from a directory the user had (not in `made`),
  nor from one that holds anything but the lock: `rmdir` removes only empty directories. The
  error that stopped the run is what to report, so an OSError here is let go."""
  if not made:
    return
  try:
    if {path.name for path in workdir.iterdir()} - {workdir_lock.LOCK_FILE}:
      return  # the run wrote something: a record of it, kept
    (workdir / workdir_lock.LOCK_FILE).unlink(missing_ok=True)
    for directory in made:
      directory.rmdir()
  except OSError:
    pass


def stopped_evaluation(output_dir, unscored: str | None = None) -> Callable[[], str]:
  """eval.py's words after `error: stopped by <signal>` (`signals.stop_at_signals`, which ends
  the program at once: no `except` or `finally` runs after the signal), told when the signal
  comes from what is on disk then, not from how far the program got: SIGTERM in the instant
  after `write_atomically` renamed eval_results.json into `output_dir` said 'no
  eval_results.json' of a file written whole. The file is this evaluation's where it is not
  the one there when this was called, before the evaluation (`_file_identity`: the rename puts
  another file in its place); one there from before is named as an earlier evaluation's. The
  files the results name (translations) are written with them, a signal held back between
  (`Task._score_into`), so a run whose results were not written is unchanged: its
  translations too.

  Where no result was written, an `output_dir` the evaluation made is removed again where it
  holds nothing (`leave_no_trace`, as `evaluate` does when it is refused): SIGTERM left an
  empty --output_dir. What it made is what was missing when this was called, on the writer
  (the only process that makes it); a directory that holds anything or that existed before
  stays.

  `unscored`: train.py's words for its final evaluation stopped before it wrote its results
  (the run is trained but not scored, and the eval.py command that scores it:
  `Task.train_and_evaluate`), where eval.py's would say to rerun; once they are written, the
  words say so for train.py too."""
  output_dir = Path(output_dir)
  results = output_dir / RESULTS_FILE
  made = missing_directories(output_dir) if mesh_lib.is_writer() else []
  before = _file_identity(results)
  command = 'eval.py' if unscored is None else 'train.py'

  def words() -> str:
    now = _file_identity(results)
    if now is not None and now != before:
      evaluation = 'eval.py' if unscored is None else "train.py's final evaluation"
      return (
        f' after {evaluation} wrote its results, {results}, whole: the run is scored; that '
        f'file holds what {command} would have printed'
      )
    if unscored is not None:
      return unscored
    leave_no_trace(output_dir, made)
    there = f"the {RESULTS_FILE} there is an earlier evaluation's" if now else f'no {RESULTS_FILE}'
    return (
      f' before eval.py wrote its results ({there}): the run is unchanged; rerun the same '
      'command to score it'
    )

  return words


def _file_identity(path: Path) -> tuple[int, int, int] | None:
  """Which file is at `path` (its device, inode and modification time), None for none: a file
  renamed into its place has another inode, a file rewritten in place another time."""
  try:
    stat = path.stat()
  except OSError:
    return None
  return stat.st_dev, stat.st_ino, stat.st_mtime_ns


def files_a_start_makes(task: Task, config, workdir: Path) -> list[Path]:
  """The task's data files inside the workdir (its vocabulary: `Task.data_files`) that are not
  there yet: those this start makes."""
  root = workdir.absolute()
  return [
    path
    for path in task.data_files(config, workdir).values()
    if root in path.absolute().parents and not path.exists()
  ]


def remove_unrecorded(workdir: Path, made_files: list[Path]) -> None:
  """Removes the files a start made in the workdir (`files_a_start_makes`) when it stopped
  before its run was recorded (`has_run`): a vocabulary of data since fixed would otherwise
  meet the next start as one placed there to share, which it uses (`TranslationTask`). Once a
  run is recorded they are its own. An OSError here is let go: the error that stopped the
  start is the one to report."""
  if has_run(workdir):
    return
  for path in made_files:
    for made in (path, made_mark(path)):  # and its mark, if it has one (`files.write_marked`)
      try:
        made.unlink(missing_ok=True)
      except OSError:
        pass


def vocabulary_donor_changes(task: Task, config, donor: Path) -> list[str]:
  """Why the vocabulary of the run in `donor` is not the one a run of `config` would train in
  its own workdir, a line each; none where it is, and a copy of it serves that run (a sweep's
  `relpos.studies.sweep.reuse_vocabulary`). A donor's vocabulary is one a sweep trained or
  copied, as recorded beside it (`files.recorded_source`: not one placed there by hand, nor
  one changed since), for which the task finds nothing that makes the two differ
  (`Task.vocabulary_changes`: the data and fields it is trained on, the draw's seed; a task
  without such a vocabulary hands none on)."""
  theirs = task.data_files(config, donor).get(data_record.VOCABULARY)
  if theirs is None or recorded_source(theirs) is None:
    return [f'{theirs or donor} is no vocabulary a sweep trained or copied']
  changes = task.vocabulary_changes(config, donor)
  return ['the task hands no vocabulary on'] if changes is None else changes


class UnownedCopy(NamedTuple):
  """A vocabulary copied into a workdir that no recorded run owns (`unowned_copy`)."""

  vocabulary: Path  # the copy
  original: Path  # the file it was copied from (`files.recorded_original`)
  changes: list[str]  # why it is not the copy a run of the config would be given now


def unowned_copy(task: Task, config, workdir: Path) -> UnownedCopy | None:
  """For a vocabulary copied into `workdir` from another run's (`files.copy_with_source`: a
  sweep's, before the run's first start) that no recorded run owns yet (`has_run`): the copy,
  its original, and why it is not the copy a run of `config` would be given now, a line each
  (its original replaced or gone, or the donor's data and fields not this config's:
  `vocabulary_donor_changes`); no changes where it still is. None where there is no such copy.
  The start the copy was made for may have died before it recorded its run (SIGKILL, a refusal
  such as a missing eval file), and the data changed before the next start: that start trained
  on the new data with the old data's vocabulary, in silence."""
  vocabulary = task.data_files(config, workdir).get(data_record.VOCABULARY)
  if vocabulary is None or has_run(workdir):
    return None
  original = recorded_original(vocabulary)
  if original is None:
    return None
  try:
    same = original.read_bytes() == vocabulary.read_bytes()
  except OSError:
    return UnownedCopy(vocabulary, original, [f'{original} is gone'])
  if not same:
    return UnownedCopy(vocabulary, original, [f'{original} holds another vocabulary now'])
  # A task's vocabulary is a file at the top of its workdir (`Task.data_files`).
  changes = vocabulary_donor_changes(task, config, original.parent)
  return UnownedCopy(vocabulary, original, changes)


def remove_stale_copy(task: Task, config, workdir: Path) -> bool:
  """Removes a copied vocabulary in `workdir` that no recorded run owns and that is no longer
  the copy a run of `config` would be given (`unowned_copy`), with its record, and says so in
  one line; whether it did. Then the run trains its own (train.py), or a sweep copies that of
  another of its runs that fits (`relpos.studies.sweep.reuse_vocabulary`). Both check it
  before a start: a copy still its donor's is used as the sweep made it."""
  copy = unowned_copy(task, config, workdir)
  if copy is None or not copy.changes:
    return False
  for path in (copy.vocabulary, source_mark(copy.vocabulary)):
    path.unlink(missing_ok=True)
  print(
    f'vocabulary: {copy.vocabulary}, copied from {copy.original} for a start that stopped '
    'before its run was recorded, removed: it is not the vocabulary this run would train '
    f'({"; ".join(copy.changes)})',
    flush=True,
  )
  return True
