"""The tasks train.py and eval.py run, chosen by `config.task`, and their shared launcher."""

import contextlib
import errno
import importlib
import logging as std_logging
import os
import re
import shlex
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from relpos import flag_types
from relpos.config import TASKS, checks, declaration, fields, importable_beside
from relpos.faults import FILESYSTEM_EXIT_CODE, RunFaultError, exception_chain
from relpos.files import dangling_link
from relpos.messages import duration
from relpos.signals import PreemptedError, finish_quietly, stop_at_signals
from relpos.training.run_config import TaskMismatchError, check_output_dir
from relpos.training.task_base import Task
from relpos.training.workdir_setup import stopped_evaluation


def get(config: ml_collections.ConfigDict) -> Task:
  """The `relpos.training.task_base.Task` config.task names."""
  task = config.get('task')
  if task not in TASKS:
    raise ValueError(f'config.task={task!r}: expected one of {sorted(TASKS)}')
  return importlib.import_module(TASKS[task].task_module).TASK


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


def exit_for_fault(fault: Exception) -> NoReturn:
  """Prints a `FAULTS` exception's one line to stderr and exits with its status (`fault_exit`):
  how the study tools end on one, as the launchers do (`launch`, which also silences a full
  disk's writers at exit)."""
  code, line = fault_exit(fault)
  print(line, file=sys.stderr, flush=True)
  sys.exit(code)


def _define_distributed_flags():
  """The multi-process flags; returns a function that calls jax.distributed.initialize."""
  mode = flags.DEFINE_enum(
    'distributed',
    'off',
    ['off', 'auto', 'explicit'],
    'Multi-process run: "auto" detects the processes (Cloud TPU, SLURM, Open MPI); "explicit" '
    'takes --coordinator_address, --num_processes and --process_id.',
  )
  coordinator = flags.DEFINE_string(
    'coordinator_address', None, 'host:port of process 0, with --distributed=explicit.'
  )
  num_processes = flags.DEFINE_integer('num_processes', None, 'With --distributed=explicit.')
  process_id = flags.DEFINE_integer('process_id', None, 'With --distributed=explicit.')
  coordinator_timeout = flags.DEFINE_integer(
    'coordinator_timeout',
    DEFAULT_COORDINATOR_TIMEOUT,
    'Seconds a process other than 0 waits for the coordinator, with --distributed=explicit.',
    lower_bound=1,
    upper_bound=MAX_COORDINATOR_TIMEOUT,
  )

  def initialize():
    explicit = {
      'coordinator_address': coordinator.value,
      'num_processes': num_processes.value,
      'process_id': process_id.value,
    }
    given = sorted(f'--{name}' for name, value in explicit.items() if value is not None)
    if flags.FLAGS['coordinator_timeout'].present:
      given = sorted([*given, '--coordinator_timeout'])
    if mode.value == 'explicit':
      if len(given) < len(explicit):
        sys.exit(
          'error: --distributed=explicit needs --coordinator_address, --num_processes and '
          '--process_id'
        )
      _join(explicit, coordinator_timeout.value)
    elif given:
      sys.exit(f'error: {", ".join(given)}: only with --distributed=explicit')
    elif mode.value == 'auto':
      _join({})

  return initialize


# The launchers whose processes --distributed=auto joins by their environment, as jax.distributed
# detects them: the launcher, its command, the variables whose presence says it started this
# process, and those it sets that JAX reads as whole numbers (the launchers' own, documented
# names).
_LAUNCHERS = (
  (
    'Open MPI',
    'mpirun',
    ('OMPI_MCA_orte_hnp_uri',),
    ('OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK'),
  ),
  (
    'SLURM',
    'srun',
    ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID', 'SLURM_LOCALID'),
    ('SLURM_JOB_ID', 'SLURM_NTASKS', 'SLURM_PROCID', 'SLURM_LOCALID'),
  ),
)


def launcher_variable_problem(environ=os.environ) -> str | None:
  """One line naming a variable of the launcher that started this process (`_LAUNCHERS`) that
  is missing or not a whole number (`OMPI_COMM_WORLD_SIZE=abc`), None where there is none: JAX
  reads them with int(), so such a value was 'found no cluster to join' ('invalid literal for
  int()', naming no variable) and a missing one a KeyError traceback."""
  for launcher, command, markers, numbers in _LAUNCHERS:
    if not all(marker in environ for marker in markers):
      continue
    for name in numbers:
      value = environ.get(name)
      if value is None or not value.strip().isdigit():
        what = ' is not set' if value is None else f'={value!r} is not a whole number'
        return (
          f"--distributed=auto: {name}{what}, though {launcher}'s variables "
          f'({", ".join(markers)}) say it started this process ({command} sets {name}): start '
          f'every process with {command}, '
          'or give --distributed=explicit with --coordinator_address, --num_processes and '
          '--process_id'
        )
  return None


# What each process of a multi-process run says at its start: JAX 0.10.2 ends a process whose
# peer died in C++ (SIGABRT, after its heartbeat timeout), so relpos cannot say it then.
PEER_DEATH_NOTE = (
  'relpos: should another process of this run die (killed, crashed), JAX ends this one after '
  'its heartbeat timeout (100 s) with a C++ abort (exit 134); the checkpoints stay intact: '
  "rerun every process's command to resume"
)
# How long a process waits for the coordinator by default: JAX's own initialization_timeout.
DEFAULT_COORDINATOR_TIMEOUT = 300
# The longest wait --coordinator_timeout takes (a day): JAX's client fails on a timeout past
# 2**31 - 1 seconds with a TypeError traceback, and no job waits a day for its process 0.
MAX_COORDINATOR_TIMEOUT = 24 * 3600
# sysexits.h EX_UNAVAILABLE: the coordinator (process 0) did not answer in time.
COORDINATOR_EXIT_CODE = 69


def _coordinator(address: str) -> tuple[str, int]:
  """(host, port) of --coordinator_address=`address` (host:port, an IPv6 host in brackets);
  exits with one `error:` line where it is no host:port or its host does not resolve."""
  host, _, port = address.rpartition(':')
  host = host.removeprefix('[').removesuffix(']')
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    sys.exit(f'error: --coordinator_address={address}: give host:port (such as 10.0.0.1:12355)')
  try:
    socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
  except (socket.gaierror, UnicodeError) as error:
    sys.exit(
      f'error: --coordinator_address={address}: the host {host} does not resolve ('
      f'{getattr(error, "strerror", None) or error}): give the host name or address of the '
      'machine process 0 runs on'
    )
  return host, int(port)


def is_this_machine(host: str) -> bool:
  """Whether `host` (resolved) is an address of this machine: one a socket can be bound to.
  Where JAX's coordinator (process 0) is given another machine's host, its own client waited
  for a coordinator there, then aborted."""
  family, kind, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
  try:
    with socket.socket(family, kind) as probe:
      probe.bind(address)
  except OSError as error:
    return error.errno != errno.EADDRNOTAVAIL
  return True


def port_in_use(host: str, port: int) -> bool:
  """Whether another program listens on `port` at `host` (this machine's): process 0's
  coordinator could not take it (JAX: 'Failed to add port', then a segmentation fault), and the
  other processes would talk to that program. The probe allows reuse, as a server does, so a
  port a run that just ended left in TIME_WAIT is free."""
  family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
  with socket.socket(family, kind) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(address)
    except OSError as error:
      return error.errno == errno.EADDRINUSE
  return False


def coordinator_answers(host: str, port: int) -> bool:
  """Whether a TCP connection to host:port is accepted (the coordinator listens there)."""
  try:
    socket.create_connection((host, port), timeout=5).close()
  except OSError:
    return False
  return True


def wait_for_coordinator(address: str, timeout: int, *, clock=time.monotonic, sleep=time.sleep):
  """Waits up to `timeout` seconds for the coordinator at --coordinator_address=`address` to
  accept a connection, saying so on one line (stderr) where it does not at once; exits with one
  `error:` line and COORDINATOR_EXIT_CODE where it never does. A process other than 0 calls it
  before jax.distributed.initialize: JAX's client, given no coordinator (process 0 not started,
  a wrong port or host), waited its initialization_timeout in silence and then aborted the
  process in C++ (a 30-line 'Check failure' stack, exit 134); JAX 0.10.2 offers no option that
  makes that an exception. A coordinator that starts later is joined as soon as it listens."""
  host, port = _coordinator(address)
  if coordinator_answers(host, port):
    return
  print(
    f'waiting up to {duration(timeout)} for the coordinator (process 0) at {host}:{port} '
    '(--coordinator_address; --coordinator_timeout sets how long)',
    file=sys.stderr,
    flush=True,
  )
  deadline = clock() + timeout
  while clock() < deadline:
    sleep(1)
    if coordinator_answers(host, port):
      return
  print(
    f'error: --coordinator_address={address}: no coordinator answered at {host}:{port} in '
    f'{duration(timeout)}: start process 0 (--process_id=0) with the same '
    '--coordinator_address, check that this machine reaches that host and port, or give a '
    'longer --coordinator_timeout',
    file=sys.stderr,
    flush=True,
  )
  sys.exit(COORDINATOR_EXIT_CODE)


def _join(explicit: dict, timeout: int = DEFAULT_COORDINATOR_TIMEOUT) -> None:
  """jax.distributed.initialize with `explicit`'s settings (none: what it detects), its
  ValueError one `error:` line. With none given, JAX looks for a cluster whose processes it can
  count (a Cloud TPU pod slice, SLURM's srun, Open MPI's mpirun); outside one it finds none
  and says only 'coordinator_address should be defined.', at the end of a traceback through
  its internals. A launcher's variable that JAX would misread is named first
  (`launcher_variable_problem`). An explicit setting it refuses (a --process_id not below
  --num_processes) is its own words. With explicit settings the coordinator's host is resolved
  first (process 0 runs the coordinator, so an unknown host was JAX's C++ abort after
  `timeout` seconds), and a process other than 0 waits for the coordinator first
  (`wait_for_coordinator`); JAX is given the same `timeout`."""
  if not explicit and (problem := launcher_variable_problem()):
    sys.exit(f'error: {problem}')
  if explicit:
    address = explicit['coordinator_address']
    host, port = _coordinator(address)
    if explicit['process_id'] == 0 and not is_this_machine(host):
      sys.exit(
        f'error: --coordinator_address={address}: process 0 runs the '
        f'coordinator, but {host} is no address of this machine: start process 0 on that '
        "host, or give this machine's own host name or address"
      )
    if explicit['process_id'] == 0 and port_in_use(host, port):
      sys.exit(
        f'error: --coordinator_address={address}: port {port} on {host} is in use by another '
        'program, so the coordinator cannot listen there: give every process another port'
      )
    if 0 < explicit['process_id'] < explicit['num_processes']:
      wait_for_coordinator(explicit['coordinator_address'], timeout)
    explicit = {**explicit, 'initialization_timeout': timeout}
  try:
    jax.distributed.initialize(**explicit)
    if jax.process_count() > 1:
      print(PEER_DEATH_NOTE, file=sys.stderr, flush=True)
  except ValueError as error:
    if explicit:
      sys.exit(f'error: --distributed=explicit: {error}')
    sys.exit(
      'error: --distributed=auto found no cluster to join (it looks for a Cloud TPU pod slice, '
      f'SLURM (srun) or Open MPI (mpirun); JAX: {error}): leave --distributed out to run one '
      'process, or give --distributed=explicit with --coordinator_address, --num_processes and '
      '--process_id'
    )


def home_expanded(value: str) -> str:
  """`value` with a leading `~` or `~/` expanded to the home directory: the shell expands it
  only at the start of a word, so `--workdir=~/runs/x` and `--config.data.path=~/a.txt` reach
  relpos as they were typed, and a literal directory named `~` in the working directory is
  never what was meant."""
  return os.path.expanduser(value) if value == '~' or value.startswith('~/') else value


def _config_indices(argv: list[str]) -> list[int]:
  """The index in `argv` of each `--config=VALUE`, or of VALUE after `--config`."""
  indices = []
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      indices.append(i)
    elif arg == '--config' and i + 1 < len(argv):
      indices.append(i + 1)
  return indices


def _config_index(argv: list[str]) -> int | None:
  """The index in `argv` of `--config=VALUE`, or of VALUE after `--config`; None if absent.
  `parse_flags` refuses a repeated --config, so there is one."""
  return next(iter(_config_indices(argv)), None)


def refuse_repeated_config(argv: list[str]) -> None:
  """Exits with one `error:` line naming each --config of `argv` where there is more than
  one (a launch script's, then the user's own): absl used the last, while the lines that name
  the file (`config_arg`) read the first, so a file that raised was '--config: the config did
  not load' or its bare exception, and an override beside two valid files absl's 'flag is
  defined twice'; two valid ones trained with the last in silence."""
  given = [argv[i].removeprefix('--config=') for i in _config_indices(argv)]
  if len(given) > 1:
    sys.exit(f'error: --config is given more than once ({", ".join(given)}): give one')


def config_arg(argv: list[str]) -> str | None:
  """The value of `--config=VALUE` (or `--config VALUE`) in `argv`, None if absent; a leading
  `~` of its file expanded (`home_expanded`)."""
  i = _config_index(argv)
  return None if i is None else home_expanded(argv[i].removeprefix('--config='))


def _home_expanded_config(argv: list[str]) -> list[str]:
  """`argv` with its --config file's leading `~` expanded (`config_arg`)."""
  i = _config_index(argv)
  if i is None:
    return argv
  expanded = list(argv)
  expanded[i] = (
    f'--config={config_arg(argv)}' if argv[i].startswith('--config=') else config_arg(argv)
  )
  return expanded


def expand_config_paths(config) -> None:
  """Expands a leading `~` (`home_expanded`) in each field of `config` that its task declares
  a path (`relpos.config.fields.paths`: config.data.path, translation's files), whether an
  override or the config file set it: a data file named `~/a.txt` was looked for under a
  directory named `~`. A config of no declared task is left as it is."""
  declared = (
    declaration(config.get('task')) if isinstance(config, ml_collections.ConfigDict) else None
  )
  if declared is None:
    return
  for path in fields.paths(declared):
    *sections, name = path.split('.')
    node = config
    for section in sections:
      node = node.get(section) if isinstance(node, ml_collections.ConfigDict) else None
    if isinstance(node, ml_collections.ConfigDict) and isinstance(node.get(name), str):
      node[name] = home_expanded(node[name])


def config_overrides(argv: list[str]) -> list[str]:
  """The `--config.<field>=<value>` overrides of `argv`, each as one text, also where the value
  was given as the next argument (`--config.<field> <value>`)."""
  overrides = []
  for i, arg in enumerate(argv):
    if not arg.startswith('--config.'):
      continue
    if '=' not in arg and i + 1 < len(argv) and not argv[i + 1].startswith('--'):
      arg = f'{arg}={argv[i + 1]}'
    overrides.append(arg)
  return overrides


def _root_cause(error: BaseException) -> BaseException:
  """The innermost exception of `error`'s chain (`exception_chain`: ml_collections wraps a
  config file's own error in an OSError saying "an earlier failure to load")."""
  return exception_chain(error)[-1]


def _config_file_problem(argv: list[str]) -> tuple[str | None, ml_collections.ConfigDict | None]:
  """(one line, None) if --config's file (with its preset after ':') does not load on its own,
  else (None, the config it gives, before any --config.<field> override)."""
  value = config_arg(argv)
  if value is None:
    return None, None
  path = value.split(':')[0]
  if not os.path.isfile(path):
    if problem := dangling_link(path):
      return f'--config={value}: {problem}', None
    what = 'is a directory, not a config file' if os.path.isdir(path) else 'does not exist'
    return f'--config={value}: {path} {what}', None
  alone, alone_argv = flags.FlagValues(), [argv[0], f'--config={value}']
  # sys_argv: ml_collections takes the overrides from sys.argv, not from the parsed list.
  config_flags.DEFINE_config_file('config', None, '', flag_values=alone, sys_argv=alone_argv)
  try:
    alone(alone_argv)
    config = alone['config'].value
    if type(config).__name__ == '_ErrorConfig':
      config.get('task')  # ml_collections' stand-in for a file that did not load: its error
    elif not isinstance(config, ml_collections.ConfigDict):
      returned = 'None' if config is None else type(config).__name__
      return _not_a_config_dict(value, path, returned), None
  except Exception as error:  # noqa: BLE001 (whatever the file raised, reported as one line)
    cause = _root_cause(error)
    if not path.endswith('.py'):  # a run's config.json, say, read as Python
      return (
        f'--config={value}: {path} is no config file: --config takes a config .py file (such '
        "as configs/char_tiny.py); a run's recorded config.json is read from its directory: "
        'give that as --workdir (train.py resumes the run, eval.py scores it) with the config '
        'file it was trained with'
      ), None
    if isinstance(cause, SyntaxError):
      return f'--config={value}: {path} line {cause.lineno}: SyntaxError: {cause.msg}', None
    if isinstance(cause, AttributeError) and 'get_config' in str(cause):
      return f'--config={value}: {path} defines no get_config() returning a ConfigDict', None
    if isinstance(cause, flags.IllegalFlagValueError) and 'other than None' in str(cause):
      return _not_a_config_dict(value, path, 'None'), None
    if isinstance(cause, TypeError) and _takes_no_preset(cause, value):
      return (
        f'--config={value}: {path} has no presets (its get_config() takes no argument): give '
        f'--config={path}'
      ), None
    frame = _last_frame_in(error, path)
    if wrong_type := _wrong_type(error, frame):
      where = f' line {frame.lineno}' if frame else ''
      return f'--config={value}: {path}{where}: {wrong_type}', None
    where = f' at line {frame.lineno}' if frame else ''
    line = _flag_error(cause).removeprefix(f'flag --config={value}: ')
    return f'--config={value}: {path} raised {type(cause).__name__}{where}: {line}', None
  return None, config


def _last_frame_in(error: BaseException, path: str) -> traceback.FrameSummary | None:
  """The innermost frame of the config file at `path` in the tracebacks of `error`'s chain
  (`exception_chain`), None where none runs its code: the root cause's own traceback may hold only a
  library's frames (ml_collections raises a field's cast error again, from its caller's
  line)."""
  frames = [
    frame
    for inner in exception_chain(error)
    for frame in traceback.extract_tb(inner.__traceback__)
    if os.path.abspath(frame.filename) == os.path.abspath(path)
  ]
  return frames[-1] if frames else None


# ml_collections' TypeError for a field of a config file given a value of another type.
_CAST_ERROR = re.compile(
  r"Could not override field '(?P<name>\w+)' \(reference\)\. (?P<value>.*) is of original "
  r"type <class '(?P<given>[\w.]+)'> and cannot be casted to type <class '(?P<type>[\w.]+)'>"
)


def _wrong_type(error: BaseException, frame: traceback.FrameSummary | None) -> str | None:
  """'config.<field> takes an int, not 20.0 (float)' where `error`'s chain holds ml_collections'
  cast error of a field set to a value of another type (`c.train.steps = 20.0`), else None.
  The error names only the field's last part, so its dotted name is read from the config file's
  line (`frame`) where that sets it (`c.train.steps = ...`, `c.train.update(steps=...)`); it
  was the cast error alone, naming neither the field nor the line."""
  cast = next((m for e in exception_chain(error) if (m := _CAST_ERROR.search(str(e)))), None)
  if cast is None:
    return None
  name, field = cast['name'], f'field {cast["name"]!r}'
  if frame is not None and frame.line:
    assigned = re.match(rf'\s*\w+((?:\.\w+)*\.{name})\s*=[^=]', frame.line)
    updated = re.match(rf'\s*\w+((?:\.\w+)*)\.update\(.*\b{name}\s*=', frame.line)
    dotted = (assigned[1] if assigned else f'{updated[1]}.{name}' if updated else '')[1:]
    # A field of a section the file holds under another name (`t = c.train; t.steps = ...`)
    # reads as no declared field: then only its name is given.
    if any(dotted in fields.leaves(declaration(task)) for task in TASKS):
      field = f'config.{dotted}'
  article = 'an' if cast['type'][0] in 'aeiou' else 'a'
  return f'{field} takes {article} {cast["type"]}, not {cast["value"]} ({cast["given"]})'


def _not_a_config_dict(value: str, path: str, returned: str) -> str:
  """The line for --config=`value` whose file's get_config() returned `returned` (None, or the
  name of a type: 'dict', 'list'): a plain dict is a natural first attempt, and it was '--config:
  the config did not load' (a list: an AttributeError the file was blamed for)."""
  article = '' if returned == 'None' else 'a '
  return (
    f'--config={value}: {path}: get_config() returned {article}{returned}, not an '
    'ml_collections.ConfigDict: start from relpos.config.char_lm_defaults.char_lm_config() or '
    'relpos.config.translation_defaults.translate_config() and set its fields, as the files of '
    'configs/ do'
  )


def _takes_no_preset(error: TypeError, value: str) -> bool:
  """Whether `error` is calling a get_config() that takes no argument with the preset of
  --config=`value` (ml_collections passes the text after ':')."""
  return ':' in value and str(error).startswith('get_config() takes 0 positional arguments')


class _NoNoneConfigWarning(std_logging.Filter):
  """Drops ml_collections' warning of a get_config() that returned None, logged (before absl
  logging is set up, so with absl's note on that) at each load: `_config_file_problem` says it
  in the command's one error line."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return 'get_config() returned None' not in record.getMessage()


def _optional_none_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
  """(argv without its `--config.<field>=None` overrides of fields whose rule takes None
  (`relpos.config.checks.Rule.optional`), the fields the last of whose overrides is None):
  ml_collections parses an override by the type of the field's value in the config file, so
  'None' was no int (`--config.data.max_bytes=None`) or the text 'None'; `parse_flags` sets
  these fields to None once the config is parsed. Unchanged where no override is 'None' or the
  config file or its task does not load (the parse says why)."""
  values, spans = {}, {}
  for i, arg in enumerate(argv):
    if not arg.startswith('--config.'):
      continue
    separate = '=' not in arg and i + 1 < len(argv) and not argv[i + 1].startswith('--')
    field, _, value = (f'{arg}={argv[i + 1]}' if separate else arg).partition('=')
    field = field.removeprefix('--config.')
    values[field] = value  # the last override of a field wins
    if value == 'None':
      spans.setdefault(field, []).append(range(i, i + 1 + separate))
  if not spans:
    return argv, []
  problem, config = _config_file_problem(argv)
  try:
    task = None if problem or config is None else get(config)
  except ValueError:
    task = None
  if task is None:
    return argv, []
  rules = fields.rules(task.declaration, skip=('model',))
  optional = [field for field in spans if field in rules and rules[field].optional]
  dropped = {i for field in optional for span in spans[field] for i in span}
  kept = [arg for i, arg in enumerate(argv) if i not in dropped]
  return kept, [field for field in optional if values[field] == 'None']


def _config_flag_problem(argv: list[str], config) -> str | None:
  """The first --config.<field> override of `argv` naming a renamed field or no field at all
  of `config` (the file's config before overrides), as one line; None if there is none."""
  for arg in argv:
    if not arg.startswith('--config.'):
      continue
    field = arg.removeprefix('--config.').split('=')[0]
    if field in checks.RENAMED:
      return f'--config.{field}: config.{field} is now config.{checks.RENAMED[field]}'
    node = config
    for name in field.split('.'):
      if not isinstance(node, ml_collections.ConfigDict) or name not in node:
        return f'--config.{field}: the config has no field {field} (config files list every field)'
      node = node[name]
  return None


# A config file of each task, for the lines that ask for one.
def _task_switch_problem(argv: list[str]) -> str | None:
  """One line where the last `--config.task=` override of `argv` names another task of
  `TASKS` than --config's file builds, else None: the tasks' configs hold other fields, so the
  switched config was refused for a field of the other task it lacks ('config.data.tfds_name is
  missing from the config'), naming neither the override nor the file. A value no task has is
  left to `get`'s line, and the file is loaded again only where the flag is given."""
  given = [
    arg.partition('=')[2] for arg in config_overrides(argv) if arg.startswith('--config.task=')
  ]
  if not given or given[-1] not in TASKS:
    return None
  problem, config = _config_file_problem(argv)
  built = None if problem or config is None else config.get('task')
  if built is None or built == given[-1]:
    return None
  return (
    f'--config.task={given[-1]}: config.task cannot be switched by a flag (each task has its own '
    f'fields): --config={config_arg(argv)} builds a {built!r} config; give a config file of task '
    f'{given[-1]!r}, such as {TASKS[given[-1]].example_config}'
  )


def _flag_error(error: BaseException) -> str:
  """One line for an error raised while parsing flags: a config file (or preset) that raised,
  a value of the wrong type, anything else absl reports."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  if len(lines) > 1:  # a traceback from loading the config file: its first and last lines
    return f'{lines[0].rstrip(":")}: {lines[-1]}'
  return flag_types.error_line(lines[0]) if lines else type(error).__name__


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, each error one line (exit 1) instead of a traceback: a config file
  that is missing, does not parse or raises, an unknown or renamed config field, a preset
  that raised, a value of the wrong type, a --config given twice (`refuse_repeated_config`),
  a `--config.task` naming the other task (`_task_switch_problem`).

  On an error the config file is loaded again on its own, so that a fault of the file is told
  from a fault of an override (ml_collections leaves the flag unset after either, and names
  only the field's last part). A path flag given as `--workdir=~/runs/x` gets its `~`
  expanded, as the shell does for `--workdir ~/runs/x` but not after an `=`
  (`expand_home`), and so do --config's file and the config's path fields
  (`expand_config_paths`): every command that takes a config parses it here.
  `--config.<field>=None` sets a field whose rule takes None to None
  (`_optional_none_overrides`). The config file's directory is importable while it loads
  (`relpos.config.importable_beside`), so it may import a helper module beside it."""
  refuse_repeated_config(argv)
  absl_logger = logging.get_absl_logger()
  absl_logger.addFilter(quiet := _NoNoneConfigWarning())
  argv = _home_expanded_config(argv)
  # A config file imports a module beside it while it loads, here and in every reload below.
  with importable_beside((config_arg(argv) or '').split(':')[0] or None):
    try:
      parsed, to_none = _optional_none_overrides(argv) if 'config' in flags.FLAGS else (argv, [])
      rest = flags.FLAGS(parsed)
      config = flags.FLAGS['config'].value if 'config' in flags.FLAGS else None
      if config is not None and not isinstance(config, ml_collections.ConfigDict):
        # A file that does not load gives a stand-in that raises at its first use, later.
        sys.exit(f'error: {_config_file_problem(argv)[0] or "--config: the config did not load"}')
      if switched := _task_switch_problem(argv):
        sys.exit(f'error: {switched}')
      for field in to_none:
        *sections, name = field.split('.')
        node = config
        for section in sections:
          node = node[section]
        node[name] = None
      expand_home(flags.FLAGS)
      expand_config_paths(config)
      refuse_empty_paths(flags.FLAGS)
      return rest
    except Exception as error:  # noqa: BLE001 (the one line below; --traceback is not parsed yet)
      file_problem, config = _config_file_problem(argv)
      line = file_problem or (config is not None and _config_flag_problem(argv, config))
      sys.exit(f'error: {line or _flag_error(error)}')
    finally:
      absl_logger.removeFilter(quiet)


# The flags that name a path (a workdir, a file written or read) in relpos's commands.
PATH_FLAGS = ('workdir', 'output_dir', 'out', 'zip', 'profile_dir', 'plot')


def expand_home(registry) -> None:
  """Expands a leading `~` or `~/` in the value of each of PATH_FLAGS that was given: a
  literal directory named `~` in the working directory is never what was meant."""
  for name in PATH_FLAGS:
    if name in registry and registry[name].present and isinstance(registry[name].value, str):
      registry[name].value = home_expanded(registry[name].value)


def refuse_empty_paths(registry, workdirs=()) -> None:
  """Exits with one `error:` line when one of PATH_FLAGS was given empty (`--workdir=`, as a
  shell variable that was never set gives it), or one of `workdirs` (a command's positional
  workdirs) is empty: every path function reads '' as the current directory, so train.py
  wrote a whole run there and eval.py's eval_results.json landed beside the code. An empty
  --output_dir is refused too, not read as absent: the command line meant a directory."""
  for name in PATH_FLAGS:
    if name in registry and registry[name].present and registry[name].value == '':
      out = '' if name == 'workdir' else ', or leave the flag out'
      sys.exit(
        f'error: --{name}= is empty: give a path (an empty one is the current directory){out}'
      )
  if '' in workdirs:
    sys.exit('error: a workdir given is empty (""): give the directory of a run')


def quiet_logging() -> None:
  """absl logging at WARNING unless --verbosity was given: orbax logs many INFO lines per
  checkpoint read or written, which would bury a command's own lines."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def start_command(argv: list[str]) -> None:
  """What every relpos command does first with what absl left of its command line: a stray
  argument is one error line (every option is a flag), and absl logging goes to WARNING
  (`quiet_logging`)."""
  if len(argv) > 1:
    sys.exit(f'error: unexpected arguments {argv[1:]}: every option is a flag, --name=value')
  quiet_logging()


def run_main(main) -> None:
  """`app.run(main)` for relpos's other commands (benchmarks, tools, studies), with the
  launchers' manners: flags parsed by `parse_flags` (a config file, field or value that is wrong
  is one line), a stray argument one line (every option is a flag), absl logging at WARNING
  (`quiet_logging`), and a `USER_ERRORS` exception from `main` one `error:` line with exit
  status 1, not a traceback (Ctrl-C and SIGTERM: `relpos.signals.stop_at_ctrl_c_or_sigterm`);
  a `FAULTS` one is its line and status (`exit_for_fault`: a run that trains there now, before
  its first checkpoint, is 75)."""

  def guarded(argv):
    start_command(argv)
    try:
      return main(argv)
    except USER_ERRORS as error:
      sys.exit(f'error: {error}')
    except FAULTS as fault:  # (a TaskMismatchError is a ValueError: the line above)
      exit_for_fault(fault)

  app.run(guarded, flags_parser=parse_flags)


def eval_command(argv: list[str], workdir) -> str:
  """The eval.py command that scores the run `argv` (a train.py command line) trains in
  `workdir`: train.py's --config and --config.<field> overrides, each argument quoted for the
  shell where it needs it."""
  config = config_arg(argv)
  args = [
    'python',
    str(Path(argv[0]).with_name('eval.py')),
    *([f'--config={config}'] if config else []),
    *config_overrides(argv),
    f'--workdir={workdir}',
  ]
  return ' '.join(shlex.quote(arg) for arg in args)


def launch(action: str):
  """Parses --config and --workdir, runs the config's task `action`, prints the result.

  `action` is 'train_and_evaluate' (which also takes --allow_config_change) or 'evaluate'
  (which also takes --output_dir, where eval_results.json and translations go). A
  USER_ERRORS exception ends the run with `error: <message>` and exit code 1, without a
  traceback unless --traceback is given; SIGTERM or a first Ctrl-C during training saves a
  checkpoint and exits with 128 + the signal's number (`PreemptedError.exit_code`); during
  the evaluation (train.py's after training, eval.py's) either ends it at once with one line
  saying what is kept and how to score the run (`relpos.signals.stop_at_signals`); either
  elsewhere ends it at once in one line (`relpos.signals.stop_at_ctrl_c_or_sigterm`), but for
  after the result is written: printing it and exiting, where a signal ends nothing that is
  not done (`relpos.signals.finish_quietly`: SIGTERM is ignored, Ctrl-C exits 0). With
  --distributed, every process runs the same command (its own --process_id) and
  jax.distributed is initialised before anything touches a device.
  """
  config = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
  workdir = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
  show_traceback = flags.DEFINE_bool(
    'traceback', False, 'Show the traceback of config/data errors.'
  )
  initialize_distributed = _define_distributed_flags()
  kwargs = {}
  if action == 'train_and_evaluate':
    allow_change = flags.DEFINE_bool(
      'allow_config_change', False, 'Continue a run in --workdir with a different config.'
    )
  else:
    output_dir = flags.DEFINE_string(
      'output_dir', None, 'Where eval_results.json (and translations) go; default --workdir.'
    )
  flags.mark_flags_as_required(['config', 'workdir'])
  # `train.py --help` lists the key flags of the program (sys.argv[0]); these are defined here.
  for flag in flags.FLAGS.flags_by_module_dict().get(__name__, []):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

  def main(argv):
    start_command(argv)
    initialize_distributed()
    if action == 'train_and_evaluate':
      kwargs['allow_config_change'] = allow_change.value
      kwargs['score_command'] = eval_command(sys.argv, workdir.value)
      signals = contextlib.nullcontext()  # training saves on them; its evaluation stops
    else:
      kwargs['output_dir'] = output_dir.value
    try:
      if action == 'evaluate':  # before anything is read: nothing there it would destroy
        check_output_dir(kwargs['output_dir'], workdir.value)
        # Its line is told as the signal comes, from what is on disk then.
        signals = stop_at_signals(stopped_evaluation(Path(kwargs['output_dir'] or workdir.value)))
      task = get(config.value)
      with signals:
        result = getattr(task, action)(config.value, workdir.value, **kwargs)
      finish_quietly()  # written (or kept): a signal now fails nothing (its docstring)
    except PreemptedError as stopped:
      print(stopped, file=sys.stderr)
      sys.exit(stopped.exit_code)
    except FAULTS as fault:
      if show_traceback.value:
        raise
      code, line = fault_exit(fault)
      print(line, file=sys.stderr, flush=True)
      if code == FILESYSTEM_EXIT_CODE:  # a full disk: writers still holding data for it
        _silence_stderr()  # (TensorBoard's, at exit) would fail again, with tracebacks
      sys.exit(code)
    except USER_ERRORS as error:
      if show_traceback.value:
        raise
      sys.exit(f'error: {error}')  # one line; --traceback (docs/faults.md) shows where
    print('\n'.join(task.result_lines(result)))

  app.run(main, flags_parser=parse_flags)
