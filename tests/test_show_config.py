"""relpos.tools.show_config: every declared field of a config with its value, its default where
that differs, its rule and description, from the declarations alone."""

import pytest
from helpers import load_config, refusal

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
