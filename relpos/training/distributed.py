"""Joining jax.distributed for a multi-process run of train.py or eval.py: the launchers'
--distributed flags (`define_flags`), and the checks that make each way a join can fail one
`error:` line before JAX is asked, where JAX said it late or not at all: a variable of the
launcher that started the process that JAX would misread (`launcher_variable_problem`), a
--coordinator_address that cannot work (no host:port, a host that does not resolve, process 0
given another machine's host or a port in use), and a coordinator that never answers
(`wait_for_coordinator`: exit `COORDINATOR_EXIT_CODE`). The mesh the joined processes then
share is `relpos.training.mesh`; the faults of a run: docs/faults.md.
"""

import errno
import os
import socket
import sys
import time

import jax
from absl import flags

from relpos.messages import duration

# The flags `define_flags` defines belong to the module that calls it (the launcher,
# `relpos.training.tasks.launch`), not to this one, so that they are key flags of train.py and
# eval.py and their `--help` lists them (as `relpos.flag_types`). This module defines no flag.
flags.disclaim_key_flags()


def define_flags():
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
