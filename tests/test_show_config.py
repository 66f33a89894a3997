"""relpos.tools.show_config: every declared field of a config with its value, its default where
that differs, its rule and description, from the declarations alone."""

import pytest
from helpers import REPO, load_config, one_error_line, refusal

from relpos.config import checks, declaration, fields
from relpos.tools import show_config


def _named(lines):
  """{dotted field: its first line} of a listing."""
  return {line[2:].split(' = ')[0]: line for line in lines if not line.startswith('      ')}


def test_every_declared_field_is_listed_and_each_change_starred_with_its_default():
  config = load_config('char_tiny', 'shaw')
  config.model.d_model = 96
  lines = show_config.field_lines(config)
  named = _named(lines)
  assert list(named) == list(fields.leaves(declaration('char_lm')))
  assert named['model.d_model'] == '* model.d_model = 96  (default 512)'
  assert named['model.dropout'] == '  model.dropout = 0.1'  # char_tiny keeps the default
  starred = {name for name, line in named.items() if line.startswith('*')}
  defaults = fields.defaults(declaration('char_lm'))
  assert (
    starred
    == {
      f'{section}.{name}'
      for section, values in defaults.items()
      if isinstance(values, dict)
      for name, default in values.items()
      if config[section][name] != default
    }
    and 'model.position' in starred
  )
  assert set(_named(show_config.field_lines(config, changed_only=True))) == starred


def test_the_rule_description_and_unread_mark_follow_each_field():
  config = load_config('char_tiny', 'shaw')
  unread = show_config.unread_paths(config)
  assert {'model.t5_num_buckets', 'train.clamp_len', 'eval.clamp_len'} <= unread
  assert 'model.max_relative_position' not in unread
  lines = show_config.field_lines(config, unread=unread)
  after = lines[lines.index('  model.t5_num_buckets = 32') + 1]
  assert after.startswith('      unread by this model; ') and after.endswith('[int >= 4]')
  assert all(len(line) <= 100 for line in lines if line.startswith('      '))


def test_a_field_a_config_lacks_shows_as_missing():
  config = load_config('translate_tiny', 'shaw')
  del config.eval['beam_size']
  assert _named(show_config.field_lines(config))['eval.beam_size'].startswith(
    '* eval.beam_size = (missing)  (default '
  )


@pytest.mark.parametrize(
  'rule, text',
  [
    (checks.integer(1), 'int >= 1'),
    (checks.fraction(), 'float >= 0, < 1'),
    (checks.one_of('a', 'b'), "one of 'a', 'b'"),
    (checks.integer(1, optional=True), 'int >= 1 or None'),
  ],
)
def test_rule_text(rule, text):
  assert show_config.rule_text(rule) == text


def test_the_command_lists_then_checks_as_train_py_does(commands):
  done = commands.run(
    [
      '-m',
      'relpos.tools.show_config',
      '--config=configs/char_tiny.py:shaw',
      '--changed',
      '--config.train.steps=7',
    ]
  )
  assert done.returncode == 0, done.stderr
  first, *listing = done.stdout.splitlines()
  assert first.startswith("configs/char_tiny.py:shaw: task 'char_lm'; ")
  assert '* train.steps = 7  (default 400000)' in listing
  line = refusal(
    commands,
    '-m',
    'relpos.tools.show_config',
    '--config=configs/char_tiny.py',
    '--config.optim.final_lr=1.0',
  )
  assert line.startswith('error: config.optim.final_lr=1.0: the cosine decay ends there')


# A small run, as train.py would take it: 20 steps, a checkpoint every 10, batches of 4.
_SMALL_RUN = [
  '--config.train.steps=20',
  '--config.train.checkpoint_every=10',
  '--config.train.batch_size=4',
  '--config.optim.warmup_steps=5',
]


@pytest.mark.parametrize(
  'override, refused',
  [
    (
      '--config.eval.step=15',
      'error: config.eval.step=15: the run will keep checkpoints [10, 20] '
      '(config.train.checkpoint_every=10, keep_checkpoints=3, steps=20); give one of them, or 0 '
      'for the newest',
    ),
    (
      '--config.eval.average_checkpoints=9',
      'error: config.eval.average_checkpoints=9: the run will keep 2 checkpoint(s) up to step 20',
    ),
    (
      '--config.train.grad_accum_steps=3',
      'error: config.train.batch_size=4 is the global batch of a step, split across ',
    ),
  ],
)
def test_the_command_refuses_what_train_py_refuses_before_training(commands, override, refused):
  """train.py's checks before a run (`loop.check_before_run`) are show_config's: an evaluation
  the run's checkpoints cannot serve, and a batch the devices and micro-batches cannot split,
  were accepted here and refused by train.py."""
  line = refusal(
    commands,
    '-m',
    'relpos.tools.show_config',
    '--config=configs/char_tiny.py',
    '--changed',
    *_SMALL_RUN,
    override,
  )
  assert line.startswith(refused), line


def test_the_command_warns_of_a_warmup_the_run_outlasts_as_train_py_does(commands):
  done = commands.run(
    [
      '-m',
      'relpos.tools.show_config',
      '--config=configs/char_tiny.py',
      '--changed',
      *_SMALL_RUN,
      '--config.optim.warmup_steps=30',
    ]
  )
  assert done.returncode == 0, done.stderr
  said = [line for line in done.stderr.splitlines() if not line.startswith('relpos: CPU')]
  assert said == [
    'warning: config.optim.warmup_steps=30 with config.train.steps=20: the learning rate never '
    "reaches its peak ('cosine' schedule); lower the warmup unless that is what you want"
  ], done.stderr


def test_the_checks_before_a_run_check_the_config_first():
  """A config lacking a field is the config check's line, not the evaluation plan's
  AttributeError."""
  from relpos.training import loop, tasks
  from relpos.training import mesh as mesh_lib

  config = load_config('char_tiny')
  del config.train['steps']
  with pytest.raises(ValueError, match=r'^config\.train\.steps is missing'):
    loop.check_before_run(tasks.get(config), config, mesh_lib.data_mesh())


def test_a_config_without_its_model_section_is_listed_then_named(commands, tmp_path):
  """show_config read config.model's fields to mark the unread ones before any check, so a
  config file that dropped the section was a traceback (train.py says it in one line)."""
  path = tmp_path / 'no_model.py'
  path.write_text(
    'from pathlib import Path\n'
    'from relpos.config import load_config_file\n\n\n'
    'def get_config():\n'
    f'  config = load_config_file(Path({str(REPO / "configs" / "char_tiny.py")!r}))\n'
    "  del config['model']\n"
    '  return config\n'
  )
  done = commands.run(['-m', 'relpos.tools.show_config', f'--config={path}'])
  assert one_error_line(done) == 'error: config.model is missing from the config'
  assert '* model.position = (missing)  (default ' in done.stdout
