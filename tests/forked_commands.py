"""Runs relpos's command lines (`python train.py ...`, `python -m relpos.tools.sample ...`) as
real processes without paying Python's and JAX's imports each time: one server process applies
relpos's process defaults (relpos.runtime, as every launcher does), imports the heavy modules
once, and forks a child per command. The child runs the script or module as `__main__` with its
own cwd, argv, stdin, stdout and stderr (files), and ends as the interpreter ends it: a
traceback for an exception, `sys.exit('message')` printed with exit status 1, atexit handlers
run (`_exit_as_the_interpreter_would`, which skips only the modules' teardown). The caller
gets a subprocess.CompletedProcess, as from subprocess.run.

Forking is safe here because the server never starts a thread or a JAX backend: each child
initialises its own devices, as a fresh process does. Used through conftest's `commands`
fixture; tests about the process itself (signals, kill -9, several processes, environment
variables) start real subprocesses instead."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the launchers and tools import; a child imports anything else itself.
PRELOADED = (
  'relpos.training.tasks',
  'relpos.training.char_lm_task',
  'relpos.training.translation_task',
  'relpos.tools.sample',
  'relpos.tools.translate',
  # The kernels the benchmark scripts import (Pallas' Triton and Mosaic GPU lowerings: ~0.5 s
  # a command otherwise, each refused flag of benchmarks/kernel_cost.py and attention.py).
  'relpos.attention.pallas_shaw',
  'relpos.attention.pallas_xl',
  'relpos.attention.mosaic_shaw',
  'relpos.attention.mosaic_xl',
)


def _child(request: dict):
  """In the forked child: becomes the command (never returns to the server loop normally)."""
  import runpy

  os.chdir(request['cwd'])
  sys.stdout.flush()
  sys.stderr.flush()
  for fd, path, mode in (
    (0, request['stdin'], os.O_RDONLY),
    (1, request['stdout'], os.O_WRONLY | os.O_TRUNC),
    (2, request['stderr'], os.O_WRONLY | os.O_TRUNC),
  ):
    opened = os.open(path, mode)
    os.dup2(opened, fd)
    os.close(opened)
  sys.stdin = open(0, closefd=False)  # not the server's buffer of requests
  argv = request['argv']
  if argv[0] == '-m':
    sys.argv = argv[1:]
    sys.path[0] = request['cwd']
    runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
  else:
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)
    runpy.run_path(argv[0], run_name='__main__')


def _exit_as_the_interpreter_would(request: dict):
  """In the forked child: runs the command, then ends the process as Python's shutdown would,
  in its order (non-daemon threads joined, atexit handlers, stdout and stderr flushed) and
  with its exit status (SystemExit's code, printed where it is not an int; 1 after a traceback
  of an uncaught exception; death by SIGINT after an uncaught KeyboardInterrupt), then
  `os._exit`. What that skips is the interpreter's teardown of every module, which wrote to
  most of the server's pages (copy-on-write faults): 0.2 s of each command's 0.26 s. Where a
  flush of stdout or stderr fails, the interpreter's own exit runs instead, which reports it
  (exit status 120) as a real process would."""
  import atexit
  import threading

  code, interrupted = 0, False
  try:
    _child(request)
  except SystemExit as exiting:
    if exiting.code is None or isinstance(exiting.code, int):
      code = exiting.code or 0
    else:
      print(exiting.code, file=sys.stderr)
      code = 1
  except BaseException as error:  # the traceback as the interpreter prints it
    sys.excepthook(type(error), error, error.__traceback__)
    code, interrupted = 1, isinstance(error, KeyboardInterrupt)
  threading._shutdown()  # what Py_FinalizeEx does first: wait for non-daemon threads
  atexit._run_exitfuncs()
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except Exception:  # noqa: BLE001 - the interpreter's exit reports it (status 120)
    sys.exit(code)
  if interrupted:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  os._exit(code)


def serve():
  """The server: one JSON request a line on stdin, one JSON answer a line on stdout."""
  from relpos import runtime

  runtime.apply_defaults()  # may re-execute this process with the allocator's tunables
  import importlib

  for name in sys.argv[1:]:
    importlib.import_module(name)
  # What the imports made (about 200,000 objects) moves to the collector's permanent generation,
  # as Python's documentation advises before fork() without exec(): a child's collections,
  # the several of its interpreter's finalisation among them, then skip them. Without it each
  # command spent about 1 s of its exit scanning the server's modules.
  gc.freeze()
  answers = sys.stdout
  print(json.dumps({'ready': True}), file=answers, flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _exit_as_the_interpreter_would(request)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({'returncode': os.waitstatus_to_exitcode(status)}), file=answers, flush=True)


class Commands:
  """A client of one server process; `run` is subprocess.run for `python <argv...>`."""

  def __init__(self, preload=PRELOADED, env=None):
    self._process = subprocess.Popen(
      [sys.executable, str(Path(__file__).resolve()), *preload],
      cwd=REPO,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
      env={**os.environ, **(env or {})},
      start_new_session=True,  # its own process group: close() ends the server and any child
    )
    self._answer(timeout=300)

  def _answer(self, timeout: float) -> dict:
    ready, _, _ = select.select([self._process.stdout], [], [], timeout)
    line = self._process.stdout.readline() if ready else ''
    if not line:
      self.close()
      raise RuntimeError(f'the command server gave no answer within {timeout} s')
    return json.loads(line)

  def run(
    self, argv, *, cwd=REPO, input: str | bytes = '', timeout=300
  ) -> subprocess.CompletedProcess:
    """Runs `python *argv` (argv[0] a script, or '-m' and a module) in `cwd`."""
    with tempfile.TemporaryDirectory() as directory:
      paths = {name: Path(directory) / name for name in ('stdin', 'stdout', 'stderr')}
      if isinstance(input, bytes):  # text that need not be UTF-8
        paths['stdin'].write_bytes(input)
      else:
        paths['stdin'].write_text(input)
      paths['stdout'].touch()
      paths['stderr'].touch()
      request = {'argv': [str(a) for a in argv], 'cwd': str(cwd)}
      request.update({name: str(path) for name, path in paths.items()})
      self._process.stdin.write(json.dumps(request) + '\n')
      self._process.stdin.flush()
      returncode = self._answer(timeout)['returncode']
      return subprocess.CompletedProcess(
        [sys.executable, *argv],
        returncode,
        paths['stdout'].read_text(),
        paths['stderr'].read_text(),
      )

  def close(self):
    if self._process.poll() is None:
      os.killpg(self._process.pid, signal.SIGKILL)
    self._process.wait()


if __name__ == '__main__':
  serve()
