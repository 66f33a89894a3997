"""Validated configs: one row per class of bad input, each one line naming the field, checked
before any data is read; the launchers print it without a traceback."""

import os
import types

import numpy as np
import pytest
from helpers import load_config, one_error_line

from relpos.config import checks, fields
from relpos.training import char_lm_task as char_lm
from relpos.training import translation_task as translate

FOUR_DEVICES = types.SimpleNamespace(size=4)


def _devices_of(platform: str, size: int = 1):
  """A stand-in mesh of `size` devices of `platform` (what check_config reads of a mesh)."""
  devices = np.array([types.SimpleNamespace(platform=platform)] * size)
  return types.SimpleNamespace(size=size, devices=devices)


CPU = _devices_of('cpu')
TPU = _devices_of('tpu')
GPU = _devices_of('gpu')
BF16_XL = {'model.dtype': 'bfloat16', 'model.attention_dropout': 0.0}

# (task, preset, {field: value}, devices, the start of the error). One row per class of field.
BAD_CONFIGS = [
  # int below its range, both tasks' sections
  ('char_lm', 'xl', {'train.steps': 0}, None, 'config.train.steps must be >= 1, got 0'),
  ('translate', 'shaw', {'eval.beam_size': 0}, None, 'config.eval.beam_size must be >= 1'),
  ('char_lm', 'xl', {'train.mem_len': -1}, None, 'config.train.mem_len must be >= 0'),
  # float outside an open or closed range
  ('char_lm', 'xl', {'optim.learning_rate': 0.0}, None, 'config.optim.learning_rate must be > 0'),
  ('translate', 'shaw', {'optim.b2': 1.0}, None, 'config.optim.b2 must be < 1.0'),
  ('translate', 'shaw', {'optim.label_smoothing': -0.1}, None, 'config.optim.label_smoothing'),
  ('char_lm', 'xl', {'optim.eps': float('nan')}, None, 'config.optim.eps must be finite'),
  # a choice
  ('char_lm', 'xl', {'optim.schedule': 'linear'}, None, 'config.optim.schedule must be one of'),
  ('char_lm', 'xl', {'eval.split': 'dev'}, None, 'config.eval.split must be one of'),
  ('translate', 'shaw', {'data.kind': 'csv'}, None, 'config.data.kind must be one of'),
  # a type the config dict cannot enforce (an optional field)
  ('char_lm', 'xl', {'data.max_bytes': 0}, None, 'config.data.max_bytes must be >= 1'),
  # past int32 (JAX's integers), and a seed past 32 bits (it would repeat seed s - 2**32)
  (
    'char_lm',
    'xl',
    {'train.clamp_len': 2**31},
    None,
    'config.train.clamp_len must be <= 2147483647',
  ),
  ('translate', 'shaw', {'eval.max_decode_extra': 2**31}, None, 'must be <= 2147483647'),
  ('char_lm', 'xl', {'seed': 2**32}, None, 'config.seed must be <= 4294967295, got 4294967296'),
  # the model section (the models' typed configs)
  ('translate', 'shaw', {'model.position': 'xl'}, None, 'config.model.position'),
  ('char_lm', 'xl', {'model.num_heads': 0}, None, 'config.model.num_heads'),
  ('char_lm', 'shaw', {'model.attention_dropout': 1.0}, None, 'config.model.attention_dropout'),
  ('translate', 'shaw', {'model.relative_table_init': 'ones'}, None, 'relative_table_init'),
  ('translate', 'shaw', {'model.relative_table_init_scale': 0.0}, None, 'init_scale must be'),
  # across fields
  ('translate', 'shaw', {'model.num_heads': 3}, None, 'config.model.d_model=256'),
  ('char_lm', 'xl', {'train.same_length': True, 'train.mem_len': 0}, None, 'same_length needs'),
  ('char_lm', 'shaw', {'train.clamp_len': 4}, None, 'config.train.clamp_len=4: only position xl'),
  ('char_lm', 'xl', {'optim.final_lr': 1.0}, None, 'config.optim.final_lr=1.0: the cosine decay'),
  (
    'translate',
    'shaw',
    {'model.relative_table_init': 'zeros', 'model.relative_table_init_scale': 2.0},
    None,
    "with relative_table_init='zeros' leave it at 1",
  ),
  ('translate', 'shaw', {'data.max_length': 300}, None, 'config.model.max_len >= 301'),
  ('translate', 'shaw', {'eval.beam_size': 4001}, None, 'config.eval.beam_size=4001: wider than'),
  ('char_lm', 'xl', {'train.batch_size': 6}, FOUR_DEVICES, 'config.train.batch_size=6'),
  ('translate', 'shaw', {'data.max_tokens': 300}, FOUR_DEVICES, 'config.data.max_tokens=300'),
  ('translate', 'shaw', {'eval.max_relative_position': -2}, None, 'must be >= -1'),
  ('translate', 'shaw', {'eval.max_relative_position': 17}, None, 'must be <= the trained'),
  ('char_lm', 'xl', {'eval.max_relative_position': 2}, None, "clips Shaw's tables, but"),
  # an attention implementation the devices' platform has not (JAX would fail at the compile)
  ('char_lm', 'xl', {'model.attention_implementation': 'cudnn', **BF16_XL}, CPU, 'runs on gpu'),
  ('char_lm', 'xl', {'model.attention_implementation': 'pallas'}, TPU, 'not lower for a TPU'),
  ('translate', 'shaw', {'model.attention_implementation': 'mosaic', **BF16_XL}, TPU, 'on cpu'),
]
TASKS = {'char_lm': (char_lm, 'char_tiny'), 'translate': (translate, 'translate_tiny')}


def _with(config, overrides: dict):
  for path, value in overrides.items():
    *sections, name = path.split('.')
    node = config
    for section in sections:
      node = node[section]
    node[name] = value
  return config


@pytest.mark.parametrize('task, preset, overrides, devices, message', BAD_CONFIGS)
def test_a_bad_field_is_one_line_naming_it(task, preset, overrides, devices, message):
  module, config_name = TASKS[task]
  config = _with(load_config(config_name, preset), overrides)
  with pytest.raises(ValueError) as error:
    module.TASK.check_config(config, devices)
  assert message in str(error.value) and '\n' not in str(error.value), str(error.value)


@pytest.mark.parametrize('task, preset', [('char_lm', 'xl'), ('translate', 'shaw')])
def test_every_field_a_run_reads_has_a_rule(task, preset):
  module, config_name = TASKS[task]
  config = load_config(config_name, preset)
  flat = _leaves(config.to_dict())
  assert sorted(flat) == sorted(fields.rules(module.TASK.declaration))  # declared, so ruled
  module.TASK.check_config(config, types.SimpleNamespace(size=1))  # the defaults pass


def _leaves(tree: dict, prefix: str = '') -> list[str]:
  fields = []
  for name, value in tree.items():
    if isinstance(value, dict):
      fields += _leaves(value, f'{prefix}{name}.')
    else:
      fields.append(f'{prefix}{name}')
  return fields


def test_bad_model_fields_are_named_before_data_is_read(tmp_path):
  config = load_config('translate_tiny', 'shaw')
  config.data.train_src = str(tmp_path / 'absent.en')  # reading it would fail: never reached
  config.model.num_heads = 3
  with pytest.raises(ValueError, match='config.model.num_heads'):
    translate.TASK.train_and_evaluate(config, tmp_path / 'run')
  assert not (tmp_path / 'run' / 'config.json').exists()


@pytest.mark.parametrize(
  'rule, value, problem',
  [
    (checks.integer(1), 0, 'must be >= 1, got 0'),
    (checks.integer(1), True, 'must be a int, got True (bool)'),
    (checks.integer(0), 2.5, 'must be a int, got 2.5 (float)'),
    (checks.number(0.0), 3, None),  # an int is a float
    (checks.positive(), 0.0, 'must be > 0.0, got 0.0'),
    (checks.fraction(), 1.0, 'must be < 1.0, got 1.0'),
    (checks.fraction(), 0.0, None),
    # a closed bound holds its own value (the largest seed, a minimum of 1, a whole fraction)
    (checks.integer(0, checks.SEED_MAX), checks.SEED_MAX, None),
    (checks.integer(1), 1, None),
    (checks.number(0.0, 1.0), 1.0, None),
    (checks.integer(0, 10), 11, 'must be <= 10, got 11'),
    (checks.one_of('a', 'b'), 'c', "must be one of ('a', 'b'), got 'c'"),
    (checks.FLAG, 1, 'must be a bool, got 1 (int)'),
    (checks.OPTIONAL_TEXT, None, None),
    (checks.TEXT, None, 'must be a str, got None (NoneType)'),
  ],
)
def test_rules(rule, value, problem):
  assert rule.problem(value) == problem


# Errors raised while absl parses the flags (an unknown or renamed field, a preset the config
# file rejects, a value of the wrong type): one line and exit 1, as every other config error.
FLAG_ERRORS = [
  (
    'configs/char_tiny.py',
    ['--config.model.n_head=4'],
    'config.model.n_head is now config.model.num_heads',
  ),
  (
    'configs/char_tiny.py',
    ['--config.model.tgt_len=4'],
    'config.model.tgt_len is now config.train.tgt_len',
  ),
  ('configs/char_tiny.py', ['--config.model.foo=1'], '--config.model.foo: the config has no field'),
  ('configs/char_tiny.py:bogus', [], "unknown preset 'bogus': use one of xl, xl_nomem, shaw"),
  ('configs/translate_tiny.py', ['--config.train.steps=abc'], '--config.train.steps=abc'),
  ('configs/translate_tiny.py', ['--config.model.num_heads=3'], 'config.model.num_heads'),
  # A field misspelled after a valid override: the misspelled one is named, not the first.
  (
    'configs/char_tiny.py',
    ['--config.train.steps=20', '--config.model.postion=shaw'],
    '--config.model.postion: the config has no field model.postion; did you mean '
    'model.position? (`python -m relpos.tools.show_config --config=configs/char_tiny.py` lists '
    'every field)',
  ),
  # The nearest fields named (a researcher's train.num_steps is train.steps), none where none
  # is close.
  (
    'configs/char_tiny.py',
    ['--config.train.num_steps=5'],
    '--config.train.num_steps: the config has no field train.num_steps; did you mean '
    'train.steps or',
  ),
  ('configs/char_tiny.py', ['--config.optim.lr=1'], 'no field optim.lr (`python -m relpos'),
  # A section given a value: ml_collections' parse error printed an AST node's repr.
  (
    'configs/char_tiny.py',
    ['--config.model=foo'],
    '--config.model: config.model is a section, not a field: set its fields (--config.model.',
  ),
  (
    'configs/char_tiny.py:bogus',
    ['--config.train.steps=3'],
    "unknown preset 'bogus': use one of xl, xl_nomem, shaw",
  ),
  ('configs/nope.py', [], '--config=configs/nope.py: configs/nope.py does not exist'),
  # A benchmark's config: 'config.task=None: expected one of [...]' before.
  (
    'configs/xl_eval_speed.py',
    [],
    "--config=configs/xl_eval_speed.py is no task's config (it sets no config.task), and this "
    'command takes one of char_lm or translate',
  ),
  ('configs', [], '--config=configs: configs is a directory, not a config file'),
  ('configs/char_tiny.py', ['extra'], "unexpected arguments ['extra']"),
  ('configs/char_tiny.py', ['--num_processes=2'], 'only with --distributed=explicit'),
  ('configs/char_tiny.py', ['--coordinator_timeout=5'], '--coordinator_timeout: only with'),
  # JAX's client failed on a timeout past 2**31 - 1 s with a TypeError traceback.
  (
    'configs/char_tiny.py',
    [
      '--distributed=explicit',
      '--coordinator_address=127.0.0.1:1',
      '--num_processes=2',
      '--process_id=1',
      '--coordinator_timeout=2147483648',
    ],
    'flag --coordinator_timeout=2147483648: 2147483648 is not an integer in the range [1, 86400]',
  ),
  # JAX's own refusal of an explicit setting, as one line (it was a traceback).
  (
    'configs/char_tiny.py',
    [
      '--distributed=explicit',
      '--coordinator_address=127.0.0.1:1',
      '--num_processes=2',
      '--process_id=5',
    ],
    '--distributed=explicit: process_id and num_processes must be nonnegative, with process_id '
    '< num_processes',
  ),
]


@pytest.mark.parametrize('config, flags, message', FLAG_ERRORS)
def test_the_launcher_prints_one_line_and_exits_1(commands, tmp_path, config, flags, message):
  result = commands.run(['eval.py', f'--config={config}', *flags, f'--workdir={tmp_path}'])
  assert message in one_error_line(result), result.stderr


# The environment variables by which JAX detects a cluster (Open MPI, SLURM, Kubernetes) or is
# told a coordinator.
_CLUSTER_VARIABLES = ('OMPI_MCA_orte_hnp_uri', 'SLURM_JOB_ID', 'KUBERNETES_SERVICE_HOST')


@pytest.mark.skipif(
  any(name in os.environ for name in (*_CLUSTER_VARIABLES, 'JAX_COORDINATOR_ADDRESS')),
  reason='runs inside a cluster JAX would join',
)
@pytest.mark.parametrize('script', ['train.py', 'eval.py'])
def test_distributed_auto_outside_a_cluster_is_one_line(commands, tmp_path, script):
  """Before: a 20-line traceback through jax.distributed ending in `ValueError:
  coordinator_address should be defined.`"""
  result = commands.run(
    [script, '--config=configs/char_tiny.py', f'--workdir={tmp_path}', '--distributed=auto']
  )
  line = one_error_line(result)
  assert line.startswith(
    'error: --distributed=auto found no cluster to join (it looks for a Cloud TPU pod slice, '
    'SLURM (srun) or Open MPI (mpirun); JAX: coordinator_address should be defined.): leave '
    '--distributed out to run one process, or give --distributed=explicit with'
  ), line


def test_a_malformed_launcher_variable_is_named_under_distributed_auto():
  """OMPI_COMM_WORLD_SIZE=abc under mpirun's variables was 'found no cluster to join (...
  JAX: invalid literal for int() with base 10: 'abc')', naming no variable, and one left unset
  a KeyError traceback. Now the line names the variable and its launcher."""
  from relpos.training import distributed

  ompi = {
    'OMPI_MCA_orte_hnp_uri': '1.0;tcp://127.0.0.1:1',
    'OMPI_COMM_WORLD_SIZE': 'abc',
    'OMPI_COMM_WORLD_RANK': '0',
    'OMPI_COMM_WORLD_LOCAL_RANK': '0',
  }
  assert distributed.launcher_variable_problem(ompi) == (
    "--distributed=auto: OMPI_COMM_WORLD_SIZE='abc' is not a whole number, though Open MPI's "
    'variables (OMPI_MCA_orte_hnp_uri) say it started this process (mpirun sets '
    'OMPI_COMM_WORLD_SIZE): start every process with mpirun, or give --distributed=explicit '
    'with --coordinator_address, --num_processes and --process_id'
  )
  del ompi['OMPI_COMM_WORLD_SIZE']
  assert 'OMPI_COMM_WORLD_SIZE is not set, though' in distributed.launcher_variable_problem(ompi)
  slurm = dict.fromkeys(
    ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID', 'SLURM_LOCALID'), '1'
  )
  assert distributed.launcher_variable_problem(slurm) is None
  assert "SLURM_PROCID='x' is not" in distributed.launcher_variable_problem(
    {**slurm, 'SLURM_PROCID': 'x'}
  )
  # Part of SLURM's variables (an sbatch shell outside srun) is no SLURM process to JAX either.
  assert distributed.launcher_variable_problem({'SLURM_JOB_ID': 'x'}) is None


@pytest.mark.parametrize(
  ('config', 'delegate'), [('wmt_big', 'wmt_base'), ('translate_overfit', 'translate_tiny')]
)
def test_a_preset_a_delegating_config_file_lacks_names_that_file(
  commands, tmp_path, config, delegate
):
  """configs/wmt_big.py:nope said 'unknown wmt_base preset', the file it takes its presets from
  (`relpos.config.unknown_preset` names none; the launcher names the one given)."""
  given = f'configs/{config}.py'
  result = commands.run(['eval.py', f'--config={given}:nope', f'--workdir={tmp_path}'])
  line = one_error_line(result)
  assert line.startswith(f'error: --config={given}:nope: {given} raised ValueError at line '), line
  assert ": unknown preset 'nope': use one of absolute, learned, shaw," in line, line
  assert delegate not in line, line


# Config files that do not load: one line naming the file and what is wrong with it.
BAD_CONFIG_FILES = [
  ('def get_config(:\n', 'line 1: SyntaxError'),
  ('def get_config():\n  return undefined_name\n', 'raised NameError at line 2'),
  ('CONFIG = 1\n', 'defines no get_config() returning a ConfigDict'),
]


@pytest.mark.parametrize('text, message', BAD_CONFIG_FILES)
def test_a_config_file_that_does_not_load_is_one_line(commands, tmp_path, text, message):
  path = tmp_path / 'my_config.py'
  path.write_text(text)
  result = commands.run(['eval.py', '--config', str(path), f'--workdir={tmp_path}'])
  line = one_error_line(result)
  assert f'--config={path}: {path}' in line and message in line, line


@pytest.mark.parametrize('implementation', ['auto', 'xla', 'pallas', 'cudnn', 'mosaic'])
def test_every_implementation_passes_on_a_gpu(implementation):
  config = _with(load_config('char_tiny', 'xl'), BF16_XL)
  config.model.attention_implementation = implementation
  char_lm.TASK.check_config(config, GPU)


def test_evaluating_a_cudnn_run_off_a_gpu_is_one_line(tmp_path):
  """A run trained with 'cudnn' on a GPU, scored on a CPU: one line naming the field, before
  any checkpoint is read (any other implementation gives the same scores)."""
  config = _with(load_config('char_tiny', 'xl'), BF16_XL)
  config.model.attention_implementation = 'cudnn'
  with pytest.raises(ValueError, match="attention_implementation='cudnn' runs on gpu") as error:
    char_lm.TASK.evaluate(config, tmp_path)
  assert '\n' not in str(error.value)


def test_a_run_refused_by_its_devices_writes_nothing(tmp_path):
  """The devices' checks (here 'cudnn' on a CPU) run before the workdir is made: nothing is
  left behind to mistake for a run."""
  config = _with(load_config('char_tiny', 'xl'), BF16_XL)
  config.model.attention_implementation = 'cudnn'
  with pytest.raises(ValueError, match="'cudnn' runs on gpu devices only"):
    char_lm.TASK.train_model(config, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def _free_port() -> int:
  """A local TCP port nothing listens on (bound, then released)."""
  import socket  # noqa: PLC0415

  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


@pytest.mark.parametrize(
  ('address', 'process_id', 'message'),
  [
    (
      'nohost.invalid:1',
      0,
      'error: --coordinator_address=nohost.invalid:1: the host nohost.invalid does not resolve',
    ),
    ('127.0.0.1', 1, 'error: --coordinator_address=127.0.0.1: give host:port'),
    (
      '192.0.2.1:12355',  # TEST-NET-1: never an address of this machine
      0,
      'error: --coordinator_address=192.0.2.1:12355: process 0 runs the coordinator, but '
      '192.0.2.1 is no address of this machine',
    ),
  ],
)
def test_a_coordinator_address_that_cannot_work_is_one_line_at_once(address, process_id, message):
  """An unknown host waited 5 minutes in silence, then aborted in C++ (exit 134)."""
  from relpos.training import distributed

  explicit = {'coordinator_address': address, 'num_processes': 2, 'process_id': process_id}
  with pytest.raises(SystemExit) as stopped:
    distributed._join(explicit, timeout=1)
  assert str(stopped.value.code).startswith(message), stopped.value.code


def test_process_0_on_a_port_another_program_listens_on_is_one_line():
  """Process 0 given a port another program listens on: JAX's coordinator failed to add the
  port and the process ended in a segmentation fault (exit 139), while process 1 talked to
  the other program. It is one line before JAX starts."""
  import socket  # noqa: PLC0415

  from relpos.training import distributed

  with socket.socket() as listening:
    listening.bind(('127.0.0.1', 0))
    listening.listen()
    port = listening.getsockname()[1]
    explicit = {'coordinator_address': f'127.0.0.1:{port}', 'num_processes': 2, 'process_id': 0}
    with pytest.raises(SystemExit) as stopped:
      distributed._join(explicit, timeout=1)
  assert str(stopped.value.code) == (
    f'error: --coordinator_address=127.0.0.1:{port}: port {port} on 127.0.0.1 is in use by '
    'another program, so the coordinator cannot listen there: give every process another port'
  )
  assert not distributed.port_in_use('127.0.0.1', port)  # closed now: free


def test_a_process_waits_for_a_coordinator_on_one_line_then_ends_with_one(capsys):
  """Process 1 with no coordinator (process 0 not started, a wrong port) waited JAX's 5 minutes
  in silence, then aborted in C++ (a 30-line stack, exit 134). Now it says that it waits, for
  how long, and ends with one line and exit 69 (the clock here is a stand-in)."""
  from relpos.training import distributed

  address, now = f'127.0.0.1:{_free_port()}', [0.0]

  def sleep(seconds):
    now[0] += seconds

  with pytest.raises(SystemExit) as stopped:
    distributed.wait_for_coordinator(address, 120, clock=lambda: now[0], sleep=sleep)
  assert stopped.value.code == distributed.COORDINATOR_EXIT_CODE == 69
  assert capsys.readouterr().err.splitlines() == [
    f'waiting up to 2m00s for the coordinator (process 0) at {address} (--coordinator_address; '
    '--coordinator_timeout sets how long)',
    f'error: --coordinator_address={address}: no coordinator answered at {address} in 2m00s: '
    'start process 0 (--process_id=0) with the same --coordinator_address, check that this '
    'machine reaches that host and port, or give a longer --coordinator_timeout',
  ]


def test_a_process_joins_a_coordinator_that_listens_without_a_line(capsys):
  import socket  # noqa: PLC0415

  from relpos.training import distributed

  with socket.socket() as listening:
    listening.bind(('127.0.0.1', 0))
    listening.listen()
    address = f'127.0.0.1:{listening.getsockname()[1]}'
    distributed.wait_for_coordinator(address, 5, sleep=pytest.fail)
  assert capsys.readouterr().err == ''
