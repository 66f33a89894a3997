"""SIGTERM (the usual preemption notice) and Ctrl-C as a flag the training loop checks between
steps.

The loop saves a checkpoint at the step it has reached and raises `PreemptedError`; the launcher
exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT) and rerunning the same
command resumes from there. In a multi-process run the processes agree on the flag after every
step (`mesh.any_process`), so a signal to any one of them stops them all at the same step.

Ctrl-C (SIGINT) is taken the same way the first time, with a line on stderr saying so, because
a researcher who stops a run by hand wants its steps kept, not a traceback; a second Ctrl-C
stops at once (Python's KeyboardInterrupt, which `train` turns into `InterruptedRunError`: one
line naming the last good checkpoint).

`RunFaultError` is the other way a run stops on purpose: a fault around it (its filesystem, its
workdir, the accelerator's memory) that the launchers print as its one-line message, exiting
with the fault's own status (docs/faults.md lists them).
"""

import os
import signal
import threading

_SIGNALS = {signal.SIGTERM: 'SIGTERM', signal.SIGINT: 'Ctrl-C (SIGINT)'}


class PreemptedError(Exception):
  """Training stopped on SIGTERM or Ctrl-C after saving a checkpoint; the message says which.

  Attributes:
    exit_code: 128 + the signal's number (143 when the signal reached another process).
  """

  exit_code = 128 + signal.SIGTERM

  @classmethod
  def saved(cls, step: int, checkpoint, signum: int | None = None) -> 'PreemptedError':
    """The error after saving `checkpoint` at `step`, on signal `signum` to this process (None:
    to another process of the run)."""
    what = _SIGNALS[signum] if signum else 'SIGTERM or Ctrl-C to another process of the run'
    error = cls(f'{what} at step {step}: saved {checkpoint}; rerun the same command to resume')
    error.exit_code = 128 + (signum or signal.SIGTERM)
    return error


class RunFaultError(Exception):
  """A fault around a run, not in its config: the message is one line naming what failed,
  what is still intact and what to do; the launchers print it and exit with `exit_code`."""

  exit_code = 1


class InterruptedRunError(RunFaultError):
  """Training stopped at once by a second Ctrl-C (KeyboardInterrupt), without a save."""

  exit_code = 128 + signal.SIGINT


class PreemptionSignal:
  """Context manager: while active, SIGTERM and a first Ctrl-C set `requested` (and `signum`,
  the signal's number) instead of ending the process; a second Ctrl-C raises KeyboardInterrupt
  (which `train` turns into `InterruptedRunError`). On exit the handlers before it are back
  (relpos's programs: Ctrl-C and SIGTERM end them at once in one line,
  `relpos.runtime.stop_at_ctrl_c_or_sigterm`).

  Outside the main thread (where Python cannot install handlers) it does nothing.
  """

  def __init__(self):
    self.requested = False
    self.signum = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.signum == signal.SIGINT:  # again: stop at once
      raise KeyboardInterrupt
    self.requested, self.signum = True, signum
    if signum == signal.SIGINT:
      os.write(  # not print: a handler may run inside a print of the loop's
        2,
        b'\nCtrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again stops at '
        b'once, losing the steps since the last checkpoint)\n',
      )

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = {
        signum: signal.signal(signum, self._handle)
        for signum in _SIGNALS
        if signal.getsignal(signum) != signal.SIG_IGN  # nohup, a background job: left ignored
      }
    return self

  def __exit__(self, *exc_info):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
    return False
