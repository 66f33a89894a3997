"""What every relpos command shares on its way in and out: `run_main` (absl's app.run with the
launchers' manners, for the benchmarks, tools and studies) and the exit policy: a `USER_ERRORS`
exception (a bad config, data file or workdir) is one `error:` line and exit status 1, a
`FAULTS` one (a fault around a run, docs/faults.md) its own line and status (`exit_for_fault`).
train.py and eval.py (`relpos.training.tasks.launch`) end the same way. Flags are parsed by
`relpos.config.command_line.parse_flags` (one line for each error, `~` expanded in path flags).
"""

import os
import sys
from typing import NoReturn

from absl import app, flags, logging

from relpos import flag_types
from relpos.config.command_line import expand_home, parse_flags
from relpos.faults import FILESYSTEM_EXIT_CODE, RunFaultError, TaskMismatchError

# What bad configs, data and workdirs raise: the launchers print these as one line (a data file
# that cannot be read raises PermissionError, which names it; the workdir's own faults are
# `FAULTS`, below).
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError, FloatingPointError)
# Faults around a run (docs/faults.md): one line each, their own exit status (RunFaultError's
# exit_code; 1 for a workdir of another task).
FAULTS = (RunFaultError, TaskMismatchError)


def _silence_stderr():
  """Points stderr (Python's and the file descriptor) at /dev/null: the fault's one line was
  the last thing to say."""
  sys.stderr.flush()
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stderr.fileno())
  os.close(devnull)


def fault_exit(fault: Exception) -> tuple[int, str]:
  """(exit status, the one line to print) of a `FAULTS` exception."""
  return getattr(fault, 'exit_code', 1), f'error: {fault}'


def exit_for_fault(fault: Exception, *, silence_full_disk: bool = False) -> NoReturn:
  """Prints a `FAULTS` exception's one line to stderr and exits with its status (`fault_exit`):
  how every command ends on one. `silence_full_disk` (train.py and eval.py's `launch`): after
  a full disk's line stderr goes to /dev/null (`_silence_stderr`), as writers still holding
  data for that disk (TensorBoard's, at exit) would fail again, with tracebacks."""
  code, line = fault_exit(fault)
  print(line, file=sys.stderr, flush=True)
  if silence_full_disk and code == FILESYSTEM_EXIT_CODE:
    _silence_stderr()
  sys.exit(code)


def quiet_logging() -> None:
  """absl logging at WARNING unless --verbosity was given: orbax logs many INFO lines per
  checkpoint read or written, which would bury a command's own lines."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def start_command(argv: list[str]) -> None:
  """What every relpos command without positional arguments does first with what absl left of
  its command line: a stray argument is one error line (every option is a flag), and absl
  logging goes to WARNING (`quiet_logging`)."""
  if len(argv) > 1:
    sys.exit(f'error: unexpected arguments {argv[1:]}: every option is a flag, --name=value')
  quiet_logging()


def guarded(main, *, positional: bool = False, user_errors: tuple = USER_ERRORS):
  """`main` with the launchers' manners, as `run_main` runs it: a stray argument is one line
  (`start_command`), absl logging is at WARNING (`quiet_logging`), a `user_errors` exception
  from `main` is one `error:` line with exit status 1, not a traceback, and a `FAULTS` one its
  line and status (`exit_for_fault`: a run that trains there now, before its first checkpoint,
  is 75).

  `positional`: `main` takes positional arguments (the studies' workdirs and files) and checks
  them itself (how many; `relpos.config.command_line.refuse_empty_paths` for workdirs); its
  path flags get their `~` expanded here (`expand_home`: its parser, `relpos.flag_types.
  parse_flags`, knows no --config and leaves them). `user_errors`: the exceptions a command
  says as its one line, USER_ERRORS unless it says more (`relpos.studies.significance`: any
  OSError)."""

  def guarded_main(argv):
    if positional:
      quiet_logging()
      expand_home(flags.FLAGS)
    else:
      start_command(argv)
    try:
      return main(argv)
    except user_errors as error:
      sys.exit(f'error: {error}')
    except FAULTS as fault:  # (a TaskMismatchError is a ValueError: the line above)
      exit_for_fault(fault)

  return guarded_main


def run_main(main, *, positional: bool = False, user_errors: tuple = USER_ERRORS) -> None:
  """`app.run(main)` for relpos's other commands (benchmarks, tools, studies), with the
  launchers' manners (`guarded`): flags parsed by `parse_flags` (a config file, field or value
  that is wrong is one line), or with `positional` (commands with positional arguments and no
  --config) by `relpos.flag_types.parse_flags` (a bad flag is one line); Ctrl-C and SIGTERM:
  `relpos.signals.stop_at_ctrl_c_or_sigterm`."""
  parser = flag_types.parse_flags if positional else parse_flags
  app.run(guarded(main, positional=positional, user_errors=user_errors), flags_parser=parser)
