"""Faults around a run (docs/faults.md): their exception types, and the one-line diagnosis of a
write the filesystem refused.

A fault is not in a run's config: its filesystem, its workdir, the accelerator's memory. Each
is a `RunFaultError` (`relpos.training.workdir_lock.WorkdirInUseError`,
`relpos.training.device_memory.DeviceMemoryError`, `FilesystemFaultError` here) whose message
is one line naming what failed, what is still intact and what to do; the launchers print it
and exit with its `exit_code` (`relpos.cli.fault_exit`). So is `TaskMismatchError`, a workdir
holding a run of another task.

A filesystem's fault (a full disk, a read-only, vanished or misplaced workdir, a checkpoint that
did not commit) is told from an error's errno, wherever in its chain it is, or from the text
orbax and tensorstore give it (`error_errno`), and worded by `filesystem_fault`, the one line of
train.py's workdir, an evaluation's output directory, a sweep's root and a study's figure.
`is_write_fault` is the one rule for which OSErrors are such faults rather than a data file's
error, reported as it is.

This module imports nothing but the standard library: a command that writes a figure or a
table words a full disk without importing JAX.
"""

import errno
import os
from pathlib import Path

FILESYSTEM_EXIT_CODE = 74  # sysexits.h EX_IOERR
# What to do about an OSError, by errno: (what it means, what to do).
_REMEDIES = {
  errno.ENOSPC: ('the disk is full', 'free space on its disk'),
  errno.EDQUOT: ('the disk quota is used up', 'free space within the quota'),
  errno.EROFS: ('the filesystem is read-only', 'make it writable or give another --workdir'),
  errno.EACCES: ('permission denied', 'make it writable or give another --workdir'),
  errno.EPERM: ('permission denied', 'make it writable or give another --workdir'),
  errno.ENOENT: ('the workdir is gone: removed or unmounted', 'restore it or give a new --workdir'),
  errno.ENOTDIR: ('a file is in the way of a directory', 'give a directory as --workdir'),
  errno.EEXIST: ('a file is in the way of a directory', 'give a directory as --workdir'),
}
# The errnos of a write the filesystem refused (`is_write_fault`): a full disk, and a read-only
# filesystem or a file the process may not write. No read gives the first three.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class RunFaultError(Exception):
  """A fault around a run, not in its config: the message is one line naming what failed,
  what is still intact and what to do; the launchers print it and exit with `exit_code`."""

  exit_code = 1


class FilesystemFaultError(RunFaultError):
  """A write to the workdir failed (full disk, read-only or vanished workdir, a file in its
  place, a checkpoint that did not commit); earlier checkpoints and metrics are intact."""

  exit_code = FILESYSTEM_EXIT_CODE


class TaskMismatchError(ValueError):
  """The workdir holds a run of another task than the command was given or reads
  (`relpos.training.run_config.check_task`): a ValueError, exit status 1."""

  exit_code = 1


def exception_chain(error: BaseException, *, context: bool = True) -> list[BaseException]:
  """`error` and the exceptions it was raised from (`__cause__`) or, where it names none, while
  handling (`__context__`; `context` False: not followed), outermost first, so that the last
  is the root cause. An exception met again ends it: a chain may loop (an exception raised
  again while handling one it caused), and a walk along one must still end."""
  chain, seen = [], set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    chain.append(error)
    error = error.__cause__ or (error.__context__ if context else None)
  return chain


def error_errno(error: BaseException) -> int | None:
  """The errno of `error` or of an error in its chain; for errors orbax and tensorstore raise
  as text (`RESOURCE_EXHAUSTED ... No space left on device`), the errno that text names."""
  for inner in exception_chain(error):
    if isinstance(inner, OSError) and inner.errno:
      return inner.errno
    text = str(inner)
    for number in _REMEDIES:
      if os.strerror(number) in text:
        return number
  return None


def error_path(error: OSError) -> Path | None:
  """The file `error` names, None where it names none."""
  return Path(error.filename) if isinstance(error.filename, (str, os.PathLike)) else None


def is_write_fault(
  error: OSError, directory: Path, path: Path | None, *, reads_others_there: bool = False
) -> bool:
  """Whether `error`, naming `path` (None: no file), is a fault of writing into `directory`
  that a command ends with its exit-74 line (`filesystem_fault`) rather than reporting the
  error as it is (a data file's): the one rule of train.py's workdir (`loop.train`), an
  evaluation's output directory (`Task._score_into`, eval.py's and train.py's final one) and
  the sweep's root (`relpos.studies.sweep.root_write_fault`).

  - A full disk or a read-only filesystem (ENOSPC, EDQUOT, EROFS), wherever it is met and also
    where the error names no file (a buffered file flushed at its close): no read gives them.
  - A file under `directory` that may not be written (EACCES, EPERM).
  - Any other error of a file under `directory` (ENOENT: the directory is gone; ENOTDIR, EEXIST:
    a file is in the way), except where the command also reads files there that it did not
    write (`reads_others_there`: the sweep reads its runs' eval_results.json and translations
    under its root), for there such an error is as likely a read's, which its own text
    reports, naming the file: a missing run's file is no fault of the filesystem.
  """
  number = error_errno(error)
  if number in (*FULL_DISK, errno.EROFS):
    return True
  if path is None:
    return False
  resolved = path.resolve()
  if directory.resolve() not in (resolved, *resolved.parents):
    return False
  return not reads_others_there or number in UNWRITABLE


def first_line(error: BaseException, limit: int = 200) -> str:
  """The first line of `error`'s text, at most `limit` characters (cut ones end in '...')."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  # A KeyError's str() is the repr of its key: orbax's 'Item "model" was not found' in quotes.
  text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
  return bounded((text.strip().splitlines() or [type(error).__name__])[0], limit)


def bounded(line: str, limit: int) -> str:
  """`line`, cut to `limit` characters, the cut ones ending in '...'."""
  return line if len(line) <= limit else line[: limit - 3] + '...'


# A fault's words where no finished checkpoint is left to resume from
# (`relpos.training.checkpoints.Checkpoints.last_good`): before the first save, and at a save
# that had none before it.
NO_CHECKPOINT_YET = 'no checkpoint was written yet'
NO_EARLIER_CHECKPOINT = 'there is no earlier checkpoint'


def rerun_remedy(last_good: str) -> str:
  """What rerunning the same command does after a fault whose last good checkpoint is
  `last_good` (`Checkpoints.last_good`, `last_good_in`): resumes from the checkpoint it names,
  or, where it names none, starts the run again from step 0. One rule for every fault's
  remedy, so that none invites resuming from a checkpoint that is not there."""
  nothing = last_good in (NO_CHECKPOINT_YET, NO_EARLIER_CHECKPOINT)
  return f'rerun the same command to {"start again" if nothing else "resume"}'


def filesystem_fault(
  error: BaseException,
  what: str,
  *,
  last_good: str,
  resume: bool = True,
  flag: str = '--workdir',
  flag_given: bool = True,
  todo: str | None = None,
  flag_names_file: bool = False,
) -> FilesystemFaultError:
  """The one-line fault of `error`: '<what>: <cause> (<meaning>); <last_good>; <what to do>'.
  `resume`: whether rerunning the same command afterwards resumes the run. `flag`: the flag
  naming the directory written to (eval.py's --output_dir, say), which the remedy names;
  `flag_given`: False where that flag was left out (eval.py writing into the workdir), so the
  remedy gives it rather than "another" one. `flag_names_file`: it names a file written instead
  (a study's --out, which is not made with its directories), so that a directory missing from
  its path, or a file in the way of one, asks for another path rather than a directory as the
  flag. `todo`: the whole remedy, where the errno's does not fit (a finished run, which a rerun
  would not resume)."""
  number = error_errno(error)
  meaning, remedy = _REMEDIES.get(number, ('', 'fix the cause'))
  if flag != '--workdir':
    remedy = remedy.replace('--workdir', flag)
    if number == errno.ENOENT:
      meaning, remedy = (
        'a directory on its path is missing and cannot be made',
        f'give another {flag}',
      )
  if not flag_given:
    remedy = remedy.replace(f'another {flag}', flag)
  if flag_names_file and number in (errno.ENOENT, errno.ENOTDIR, errno.EEXIST):
    missing = number == errno.ENOENT
    meaning = 'a directory on its path is missing' if missing else meaning
    remedy = f'make that directory or give another {flag}' if missing else f'give another {flag}'
  cause = first_line(error) + (f' ({meaning})' if meaning else '')
  if todo is None:
    then = f', then {rerun_remedy(last_good)}' if resume else ', then rerun'
    todo = f'{remedy}{then}'
  return FilesystemFaultError(f'{what}: {cause}; {last_good}; {todo}')
