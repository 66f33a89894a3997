"""What SIGTERM and Ctrl-C do in relpos's programs: one line, or a checkpoint first.

- **Everywhere** (`stop_at_ctrl_c_or_sigterm`, which `relpos.runtime.apply_defaults` installs
  first of all): Ctrl-C and SIGTERM end the program at once with one line and exit status 130
  or 143, from its first moment: no KeyboardInterrupt traceback through JAX's imports, none
  that Python swallows in a callback, and no silent end on SIGTERM (`stop_now`).
- **Training** takes both over while it runs (`PreemptionSignal`), as a flag the loop checks
  between steps: it saves a checkpoint at the step it has reached and raises `PreemptedError`;
  the launcher exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT) and
  rerunning the same command resumes from there. In a multi-process run the processes agree on
  the flag after every step (`mesh.any_process`), so a signal to any one of them stops them
  all at the same step. Ctrl-C is taken the same way the first time, with a line on stderr
  saying so, because a researcher who stops a run by hand wants its steps kept, not a
  traceback; a second Ctrl-C stops at once, without a save: one line naming the last good
  checkpoint, exit status 130.

  While a single-process run starts (reading and encoding its data, training its vocabulary,
  restoring its checkpoint, compiling its first step: `PreemptionSignal.starting`), no step has
  been done since its last checkpoint, or since nothing, so there is nothing to save: SIGTERM
  or Ctrl-C stops it at once, in one line saying what is kept, instead of after a first step
  that could be minutes away (a preemption's grace period ran out before it, and the start's
  work was lost to SIGKILL all the same). A multi-process run keeps taking the signal as a
  flag there: its processes agree on it after their first step, where one that left alone
  would leave the others waiting at their next collective.
- **Work a signal cannot save** (an evaluation) ends at once with a line saying what is kept
  (`stop_at_signals`); a few writes that must land together hold the signals back until they
  are done (`holding_signals`); a launcher whose result is written is immune to them
  (`finish_quietly`).
- A long call into C++ would hold the handlers back until it returns: one that releases the
  GIL runs in a worker thread (`call_taking_signals`).

Each of these installs its handlers by the same rule (`take_signals`, `handling`): in the main
thread only (where Python runs handlers), and not over a signal that is ignored (nohup, a
shell's background job: it stays ignored).
"""

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

# How the signals a program is stopped by are named in its lines (`stop_now`; `PreemptedError`
# adds the signal's own name where it differs: 'Ctrl-C (SIGINT)').
SIGNAL_NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}


def _spelled_out(signum: int) -> str:
  """The name of `SIGNAL_NAMES` with the signal's own after it where they differ."""
  name, own = SIGNAL_NAMES[signum], signal.Signals(signum).name
  return name if name == own else f'{name} ({own})'


def take_signals(handlers: dict[int, Callable | signal.Handlers]) -> dict:
  """Installs `handlers` (signal number: handler), each but over a signal that is ignored
  (nohup, a background job: left ignored), and returns those it replaced; outside the main
  thread (where Python cannot install handlers) none, and {}."""
  if threading.current_thread() is not threading.main_thread():
    return {}
  return {
    signum: signal.signal(signum, handler)
    for signum, handler in handlers.items()
    if signal.getsignal(signum) is not signal.SIG_IGN
  }


@contextlib.contextmanager
def handling(handler: Callable) -> Iterator[None]:
  """While active, `handler` takes Ctrl-C and SIGTERM (`take_signals`: in the main thread, but
  not a signal that is ignored); the handlers before it are back on exit."""
  previous = take_signals(dict.fromkeys(SIGNAL_NAMES, handler))
  try:
    yield
  finally:
    for signum, before in previous.items():
      signal.signal(signum, before)


def stop_now(signum: int, context: str = '') -> None:
  """Ends the program at once on signal `signum`: one line, `error: stopped by <signal>`
  followed by `context` (what the program was doing and what is left to do), exit status
  128 + `signum`. It leaves the process by `os._exit`, from the signal's handler: no
  exception, which Python would swallow where it lands in a garbage-collection callback (JAX
  runs one at every collection), and no clean-up of Python's (buffers not flushed, `finally`
  blocks not run, threads not joined), so what it leaves on disk is what a killed process
  leaves, which relpos's writes are made to survive (each file written whole or not at all,
  checkpoints renamed into place once complete).

  In an interactive session (`in_interactive_session`: a notebook's kernel, a Python prompt)
  Ctrl-C raises KeyboardInterrupt after the line instead: there the process is the user's
  session, with its state, and an interrupt that ended it (a notebook's kernel dying at a
  second interrupt of a training cell, or at the first during its start-up) would lose more
  than the run. Where the signal landed in a garbage-collection or weakref callback, which
  would swallow it (the run then trained on to its end, in 2 of 7 tries, after the line said
  it stopped), the interrupt is delivered again 50 ms later, until it lands elsewhere
  (`_redeliver_swallowed`). SIGTERM ends the process there too (a kernel's shutdown sends
  it)."""
  global _redelivering
  interrupt = signum == signal.SIGINT and in_interactive_session()
  if not (interrupt and _redelivering):  # a redelivered interrupt (below) is told already
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # noqa: BLE001, S110 (a flush the signal interrupted: exiting anyway)
        pass
    os.write(2, f'\nerror: stopped by {SIGNAL_NAMES[signum]}{context}\n'.encode())
  if not interrupt:
    os._exit(128 + signum)
    return  # (never reached but where a test stands in for os._exit)
  _redelivering = False
  take_unraisable('redelivers_interrupts', _redeliver_swallowed)
  raise KeyboardInterrupt


# Whether `stop_now`'s interactive KeyboardInterrupt was swallowed and is being delivered again
# (its line is out).
_redelivering = False
_REDELIVER_SECONDS = 0.05


def _redeliver_swallowed(unraisable) -> bool:
  """Takes (True) a KeyboardInterrupt of `stop_now`'s that Python swallowed, and delivers it
  again 50 ms later (`_thread.interrupt_main`): one raised where the signal's handler had
  interrupted a garbage-collection callback (JAX's `_xla_gc_callback`), a weakref callback or a
  `__del__`, whose exceptions Python reports as "Exception ignored in" and drops. Anything
  else is not taken (`take_unraisable`)."""
  global _redelivering
  trace = unraisable.exc_traceback
  while trace is not None and trace.tb_next is not None:
    trace = trace.tb_next
  raised_here = trace is not None and trace.tb_frame.f_code is stop_now.__code__
  if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and raised_here):
    return False
  _redelivering = True
  threading.Timer(_REDELIVER_SECONDS, _thread.interrupt_main, (signal.SIGINT,)).start()
  return True


def take_unraisable(name: str, takes: Callable[[Any], bool]) -> None:
  """Puts `unraisable_layer(takes, ...)` on sys.unraisablehook, once per `name`: a layer is
  told by its name among the flags of the hook on top, which carries those of every layer
  below it, so a layer put on again after another one (relpos's layers, a test's) is not
  stacked twice."""
  if not getattr(sys.unraisablehook, name, False):
    sys.unraisablehook = unraisable_layer(takes, sys.unraisablehook, name)


def unraisable_layer(takes: Callable[[Any], bool], below: Callable, name: str = '') -> Callable:
  """A sys.unraisablehook that hands each unraisable exception (what Python reports as
  "Exception ignored in ...") to `takes`, and on to `below` where `takes` does not take it
  (returns False); flagged `name` (True), with the flags of `below` (`take_unraisable`)."""

  def hook(unraisable):
    if not takes(unraisable):
      below(unraisable)

  hook.__dict__.update(getattr(below, '__dict__', {}))
  if name:
    setattr(hook, name, True)
  return hook


def in_interactive_session() -> bool:
  """Whether this Python is a user's interactive session: an IPython shell or Jupyter kernel
  (one is running, not merely imported), the prompt, or `python -i`."""
  ipython = sys.modules.get('IPython')
  if ipython is not None and getattr(ipython, 'get_ipython', lambda: None)() is not None:
    return True
  return hasattr(sys, 'ps1') or bool(sys.flags.interactive)


def _stop_at_signal(signum, frame) -> None:
  del frame
  if not _held_back(signum):
    stop_now(signum)


# The signals taken while `holding_signals` holds them back (None: not holding).
_held: list[int] | None = None


def _held_back(signum: int) -> bool:
  """Whether `signum` is held back (`holding_signals`), noted to be delivered again after."""
  if _held is None:
    return False
  _held.append(signum)
  return True


@contextlib.contextmanager
def holding_signals() -> Iterator[None]:
  """While active, SIGTERM and Ctrl-C, where their handler would end the program at once
  (`stop_at_signals`, `stop_at_ctrl_c_or_sigterm`), are held back, and the first is delivered
  again as the block ends (`signal.raise_signal`), to the handler installed then: for a few
  writes that must land together (eval.py's translations and its eval_results.json,
  `relpos.training.task_base.Task.evaluate`), so that a signal ends the program before them
  or after them, never between, and its line (told when the handler runs, from the disk:
  `relpos.training.workdir_setup.stopped_evaluation`) says which. Only for writes of a moment:
  a signal waits for the whole block. Training's handler (`PreemptionSignal`, which only notes
  the signal) is not held back; outside the main thread, and inside another such block,
  nothing changes."""
  global _held
  if _held is not None or threading.current_thread() is not threading.main_thread():
    yield
    return
  _held = []
  try:
    yield
  finally:
    held, _held = _held, None
    if held:
      signal.raise_signal(held[0])


def finish_quietly() -> None:
  """Makes the rest of the program immune to SIGTERM and Ctrl-C turning it into a failure: for
  a launcher whose result is on disk and about to be printed (train.py, eval.py), where a
  signal could only cut short its exit (JAX's teardown, a second or less) and, with
  `error: stopped by SIGTERM` and exit status 143, call a finished evaluation failed. Ending
  `stop_at_signals` alone does not do that: it hands the signals back to the launcher's
  handler, `stop_at_ctrl_c_or_sigterm`'s, which is that line. SIGTERM (a scheduler's notice)
  is ignored from here on; a Python handler would not do, for Python hands every signal it
  handles back to its default action (the process killed, exit 143 with no line at all)
  before it frees its modules, the last 0.2 s of an exit (measured: a plain JAX program, after
  its last atexit call). Ctrl-C (a person's) ends the program at once with exit status 0,
  after flushing what was printed (in those last 0.2 s, as Python's default: exit 130, no
  line), so that a person may still stop an exit that hangs (a multi-process run waiting on a
  peer in JAX's shutdown); a scheduler that must stop one sends SIGKILL after its grace
  period. A signal ignored stays ignored; outside the main thread nothing changes."""
  take_signals({signal.SIGTERM: signal.SIG_IGN, signal.SIGINT: _finished})


def _finished(signum, frame) -> None:
  """`finish_quietly`'s Ctrl-C: the program's work is done, so it ends at once with status 0."""
  del signum, frame
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):  # a flush the signal interrupted: exiting anyway
      stream.flush()
  os._exit(0)


@contextlib.contextmanager
def stop_at_signals(context: str | Callable[[], str]) -> Iterator[None]:
  """While active, SIGTERM and Ctrl-C end the program at once as `stop_at_ctrl_c_or_sigterm`
  does, with `context` after `error: stopped by <signal>` (' during the final evaluation:
  ...'), exit status 128 + the signal's number: for work that a signal cannot save, whose line
  says what is kept and how to finish it (train.py's evaluation after training, eval.py).
  `context` may be a function that returns the text when the signal comes, for a line true to
  what is on disk then (eval.py's: `relpos.training.workdir_setup.stopped_evaluation`, which
  may also tidy what the work made and left empty); it runs in the handler, so it must not
  raise. The handlers before it are back on exit; a signal ignored (nohup, a background job)
  stays ignored; outside the main thread nothing changes."""

  def stop(signum, frame):
    del frame
    if not _held_back(signum):
      stop_now(signum, context() if callable(context) else context)

  with handling(stop):
    yield


_SIGNAL_POLL_S = 0.05
"""The longest a signal that another thread took waits for its handler while the main thread
waits for a `call_in_thread`."""


def call_in_thread(function: Callable, /, *args, **kwargs):
  """`function(*args, **kwargs)` run in a new thread while this one waits for it; the
  worker's exception is raised here. Two uses: a call outside any JAX trace of this thread
  (the autotuner times kernels while a model is traced), and a long call into C++ during which
  signals must still be taken (`call_taking_signals`). The wait is short joins, not one: the
  kernel may hand a process's signal to any of its threads, and one that another thread took
  only marks Python's handler due, which a main thread blocked in one join would not see until
  the worker ended (measured: a signal sent to another thread ran its handler 1.2 s late, when
  SentencePiece's training returned); between joins it runs within `_SIGNAL_POLL_S`. A handler
  that ends the program (`stop_now`) ends the worker with it; one that raises (Python's own
  KeyboardInterrupt) raises here and leaves the worker to finish alone, a daemon thread."""
  outcome = {}

  def work():
    try:
      outcome['result'] = function(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 (raised in the waiting thread below)
      outcome['error'] = error

  worker = threading.Thread(target=work, name=getattr(function, '__name__', 'work'), daemon=True)
  worker.start()
  while worker.is_alive():
    worker.join(_SIGNAL_POLL_S)  # a signal to this thread interrupts the wait at once
  if 'error' in outcome:
    raise outcome['error']
  return outcome['result']


def call_taking_signals(function: Callable, /, *args, **kwargs):
  """`function(*args, **kwargs)`, run in a worker thread while this (the main) thread waits
  for it, so that a signal's handler runs as the signal comes (`call_in_thread`). Python runs
  handlers in the main thread between its bytecodes: one long call into C++ holds them back
  until it returns (SentencePiece's training: a minute and more, during which Ctrl-C or SIGTERM
  went unheard), while one in another thread that releases the GIL, as SentencePiece's does,
  lets the main thread take them (checked: tests/test_runtime.py). Outside the main thread,
  `function` just runs."""
  if threading.current_thread() is not threading.main_thread():
    return function(*args, **kwargs)
  return call_in_thread(function, *args, **kwargs)


def stop_at_ctrl_c_or_sigterm() -> None:
  """Makes Ctrl-C and SIGTERM end this program at once with one line, `error: stopped by
  Ctrl-C` (exit status 130) or `error: stopped by SIGTERM` (143), the line `stop_at_signals`
  gives with its context. Without it a KeyboardInterrupt, raised wherever the program happens
  to be, prints a traceback through JAX's imports or kernels, and inside a garbage-collection
  callback Python ignores it ("Exception ignored in: ...") and the program runs on; and
  SIGTERM ends it with no line at all (the tools, a benchmark). A program that must save
  something on a signal takes both over while it can (training: `PreemptionSignal`) and hands
  them back. An ignored signal (nohup, a shell's background job) stays ignored; outside the
  main thread nothing changes."""
  take_signals(dict.fromkeys(SIGNAL_NAMES, _stop_at_signal))


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
    what = _spelled_out(signum) if signum else 'SIGTERM or Ctrl-C to another process of the run'
    error = cls(f'{what} at step {step}: saved {checkpoint}; rerun the same command to resume')
    error.exit_code = 128 + (signum or signal.SIGTERM)
    return error


class PreemptionSignal:
  """Context manager: while active, SIGTERM and a first Ctrl-C set `requested` (and `signum`,
  the signal's number) instead of ending the process; a second Ctrl-C, or either signal while
  `starting`, ends it at once (`stop_now`: `error: stopped by <signal>` and the words `unsaved`
  returns as it comes, exit status 128 + the signal's number). Not by raising
  KeyboardInterrupt, which Python swallows where it lands in a garbage-collection callback (JAX
  runs one at every collection): the run went on to its next step ("Exception ignored in:
  <function _xla_gc_callback>"). On exit the handlers before it are back (`handling`; relpos's
  programs: Ctrl-C and SIGTERM end them at once in one line, `stop_at_ctrl_c_or_sigterm`).

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
    self._handling = None

  def _handle(self, signum, frame):
    del frame
    if self.starting or signum == self.signum == signal.SIGINT:  # Ctrl-C again: at once
      stop_now(signum, self.unsaved())
    self.requested, self.signum = True, signum
    if signum == signal.SIGINT:
      os.write(  # not print: a handler may run inside a print of the loop's
        2,
        b'\nCtrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again stops at '
        b'once, losing the steps since the last checkpoint)\n',
      )

  def __enter__(self):
    self._handling = handling(self._handle)
    self._handling.__enter__()
    return self

  def __exit__(self, *exc_info):
    handlers, self._handling = self._handling, None
    return handlers.__exit__(*exc_info)
