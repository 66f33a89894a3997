"""SIGTERM, the usual preemption notice, as a flag the training loop checks between steps.

The loop saves a checkpoint at the step it has reached and raises `PreemptedError`; the launcher
exits with status 143 (128 + SIGTERM) and rerunning the same command resumes from there. In a
multi-process run the processes agree on the flag after every step (`mesh.any_process`), so a
signal to any one of them stops them all at the same step.

`RunFaultError` is the other way a run stops on purpose: a fault around it (its filesystem, its
workdir, the accelerator's memory) that the launchers print as its one-line message, exiting
with the fault's own status (docs/faults.md lists them).
"""

import signal
import threading


class PreemptedError(Exception):
  """Training stopped on SIGTERM after saving a checkpoint; the message says which."""

  @classmethod
  def saved(cls, step: int, checkpoint) -> 'PreemptedError':
    """The error after saving `checkpoint` at `step`."""
    return cls(
      f'SIGTERM at step {step} (sent to this process or another process of the run): saved '
      f'{checkpoint}; rerun the same command to resume'
    )


class RunFaultError(Exception):
  """A fault around a run, not in its config: the message is one line naming what failed,
  what is still intact and what to do; the launchers print it and exit with `exit_code`."""

  exit_code = 1


class PreemptionSignal:
  """Context manager: while active, SIGTERM sets `requested` instead of killing the process.

  Outside the main thread (where Python cannot install handlers) it does nothing.
  """

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc_info):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False
