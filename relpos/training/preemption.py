"""SIGTERM (the usual preemption notice) and Ctrl-C as a flag the training loop checks between
steps.

The loop saves a checkpoint at the step it has reached and raises `PreemptedError`; the launcher
exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT) and rerunning the same
command resumes from there. In a multi-process run the processes agree on the flag after every
step (`mesh.any_process`), so a signal to any one of them stops them all at the same step.

Ctrl-C (SIGINT) is taken the same way the first time, with a line on stderr saying so, because
a researcher who stops a run by hand wants its steps kept, not a traceback; a second Ctrl-C
stops at once, without a save: one line naming the last good checkpoint, exit status 130.

While a single-process run starts (reading and encoding its data, training its vocabulary,
restoring its checkpoint, compiling its first step: `PreemptionSignal.starting`), no step has
been done since its last checkpoint, or since nothing, so there is nothing to save: SIGTERM
or Ctrl-C stops it at once, in one line saying what is kept, instead of after a first step
that could be minutes away (a preemption's grace period ran out before it, and the start's
work was lost to SIGKILL all the same). A multi-process run keeps taking the signal as a flag
there: its processes agree on it after their first step, where one that left alone would
leave the others waiting at their next collective.

`RunFaultError` is the other way a run stops on purpose: a fault around it (its filesystem, its
workdir, the accelerator's memory) that the launchers print as its one-line message, exiting
with the fault's own status (docs/faults.md lists them).
"""

import os
import signal
import threading

from relpos import runtime

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


class PreemptionSignal:
  """Context manager: while active, SIGTERM and a first Ctrl-C set `requested` (and `signum`,
  the signal's number) instead of ending the process; a second Ctrl-C, or either signal while
  `starting`, ends it at once (`relpos.runtime.stop_now`: `error: stopped by <signal>` and the
  words `unsaved` returns as it comes, exit status 128 + the signal's number). Not by raising
  KeyboardInterrupt, which Python swallows where it lands in a garbage-collection callback
  (JAX runs one at every collection): the run went on to its next step ("Exception ignored in:
  <function _xla_gc_callback>"). On exit the handlers before it are back (relpos's programs:
  Ctrl-C and SIGTERM end them at once in one line, `relpos.runtime.stop_at_ctrl_c_or_sigterm`).

  Outside the main thread (where Python cannot install handlers) it does nothing.

  Attributes:
    starting: True while nothing is there to save (the training sets it: a single-process run
      until its first step is compiled): a signal ends the process at once.
    unsaved: what `error: stopped by <signal>` goes on with where the process ends at once:
      what is kept and what to do (the training sets it; it runs in the handler, so it must
      not raise).
  """

  def __init__(self):
    self.requested = False
    self.signum = None
    self.starting = False
    self.unsaved = lambda: ''
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.starting or signum == self.signum == signal.SIGINT:  # Ctrl-C again: at once
      runtime.stop_now(signum, self.unsaved())
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
