"""One training run at a time in a workdir: an advisory lock held for the run's whole life.

Two train.py processes on one workdir (a command launched twice, a sweep and a hand-started
run, a job restarted while its first copy still runs) would write the same checkpoints, and the
second's start would remove the first's half-written one as left over from a crash. So
`train` holds `fcntl.flock` on `<workdir>/.relpos.lock` from before it touches anything in the
workdir until it returns, and a second run is refused in one line naming the holder's process,
host and start time, which the holder writes into the file.

The kernel drops a flock when its process dies, however it dies (kill -9, a lost node's
process killed), so there is never a stale lock to remove by hand: a run resumed after a
crash takes the lock at once. Only the writing process of a multi-process run (process 0)
locks; the others write nothing in the workdir. Readers (eval.py, the tools) do not lock:
they may read a run while it trains. A reader that finds no checkpoint asks `holder` whether a
run is training there before its first one: "train first" would be the wrong remedy. A
filesystem without flock (some network filesystems answer ENOLCK or EOPNOTSUPP) runs
unlocked, with one warning. An OSError making or writing the file (a full disk, a read-only
filesystem) names it, for the caller's one-line fault.

A run refused before it wrote anything removes the lock file, with the workdir it made, while
it still holds the lock (`relpos.training.workdir_setup.leave_no_trace`). A process that opened the
file just before that removal would then lock a file no longer in the directory, beside the
next run's new one; so a lock taken on a file that is no longer the one at its path is let go,
and the path opened again.
"""

import contextlib
import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from relpos.faults import RunFaultError
from relpos.messages import warn

LOCK_FILE = '.relpos.lock'
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class WorkdirInUseError(RunFaultError):
  """Another process holds the workdir's lock: a run trains there now."""

  exit_code = 75  # sysexits.h EX_TEMPFAIL: try again later


@contextlib.contextmanager
def hold(workdir: Path):
  """Holds the workdir's lock while the block runs (workdir exists).

  Raises:
    WorkdirInUseError: another process holds it; nothing in the workdir was touched.
  """
  path = Path(workdir) / LOCK_FILE
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      while not _is_at(fd, path):  # its holder removed it (module docstring)
        fresh = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.close(fd)
        fd = fresh
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 4096, 0).decode('utf-8', 'replace').strip() or 'a process'
      raise WorkdirInUseError(
        f'--workdir={workdir} is in use: {holder} trains there now (it holds {path}); '
        'wait for it to end, or give another --workdir'
      ) from None
    except OSError as error:
      if error.errno not in _UNSUPPORTED:
        raise
      warn(f'{path}: this filesystem takes no lock ({error.strerror}); nothing stops a second run')
      yield
      return
    started = time.strftime('%Y-%m-%d %H:%M:%S %Z')
    try:
      os.ftruncate(fd, 0)
      os.pwrite(
        fd, f'process {os.getpid()} on {socket.gethostname()}, started {started}'.encode(), 0
      )
    except OSError as error:  # a full disk: the caller's fault line names the file
      raise OSError(error.errno, error.strerror, str(path)) from error
    try:
      yield
    finally:
      os.ftruncate(fd, 0)  # the holder's line goes with it; the lock itself with the close
  finally:
    os.close(fd)


def holder(workdir) -> str | None:
  """The line of the process that holds the workdir's lock ('process <pid> on <host>, started
  <date>'; 'a process' where it wrote none yet), None when no process holds it, or there is no
  lock file (a reader makes none), or the filesystem takes no lock.

  The probe takes a shared lock for as long as two system calls and lets it go: a train.py
  starting in that instant is refused as if a run trained there (its `hold` sees the lock), so
  this is asked only where a reader is about to refuse anyway (no checkpoint to read).
  """
  try:
    fd = os.open(Path(workdir) / LOCK_FILE, os.O_RDONLY)
  except OSError:  # none (no run has started there), or unreadable: nothing to say
    return None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      return os.pread(fd, 4096, 0).decode('utf-8', 'replace').strip() or 'a process'
    except OSError:  # a filesystem without flock: no holder to tell
      return None
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
  """Whether the open file `fd` is the file at `path` now."""
  try:
    here = os.stat(path)
  except FileNotFoundError:
    return False
  opened = os.fstat(fd)
  return (here.st_dev, here.st_ino) == (opened.st_dev, opened.st_ino)
