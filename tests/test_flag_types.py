"""relpos.flag_types.define_int_list: the one parser of relpos's integer-list flags (sweep seeds,
benchmark lengths and distances, device counts), its values and its refusals."""

import pytest
from absl import flags

from relpos import flag_types


def _parse(argv, **kwargs):
  registry = flags.FlagValues()
  flag_types.define_int_list('counts', '1,2', 'counts', **kwargs, flag_values=registry)
  registry(['program', *argv])
  return registry.counts


def test_values_are_integers_in_order():
  assert _parse([]) == [1, 2]
  assert _parse(['--counts=8,-3, 0']) == [8, -3, 0]
  assert _parse(['--counts=4,4']) == [4, 4]  # repeats only refused with distinct=True
  assert _parse(['--counts='], allow_empty=True) == []
  assert _parse(['--counts=1,5'], minimum=1, maximum=5) == [1, 5]  # the bounds are allowed


@pytest.mark.parametrize(
  'argv, kwargs, message',
  [
    (['--counts=x'], {}, 'flag --counts=x: give integers, comma-separated'),
    (['--counts=1.5'], {}, 'flag --counts=1.5: give integers, comma-separated'),
    (['--counts='], {}, 'flag --counts=: give one or more integers, comma-separated, none empty'),
    (['--counts=1,,2'], {}, 'flag --counts=1,,2: give one or more integers'),
    (['--counts=0,2'], {'minimum': 1}, 'flag --counts=0,2: each must be at least 1'),
    (
      ['--counts=3,1,3'],
      {'distinct': True},
      'flag --counts=3,1,3: a value is given more than once',
    ),
  ],
)
def test_refusals_name_the_flag_and_its_value(argv, kwargs, message):
  with pytest.raises(flags.IllegalFlagValueError) as error:
    _parse(argv, **kwargs)
  assert str(error.value) == message or str(error.value).startswith(message)


def test_a_flag_belongs_to_the_module_that_defines_it():
  """The flags were filed under relpos.flag_types, so a command's `--help` (its own key flags)
  left out sweep's --seeds, pretune's --lengths and the benchmarks' lengths and distances."""
  registry = flags.FlagValues()
  flag_types.define_int_list('counts', '1,2', 'counts', flag_values=registry)
  assert [flag.name for flag in registry.get_key_flags_for_module(__name__)] == ['counts']
  assert '--counts' in registry.module_help(__name__)


def test_a_boolean_flag_given_another_value_says_what_it_takes(monkeypatch):
  """`--config.model.pre_layer_norm=yes` (or empty) was absl's tuple repr: "flag --...=yes:
  ('Non-boolean argument to boolean flag', 'yes')", naming no value a boolean flag takes.
  The launchers' config overrides go through the same words
  (`relpos.config.command_line._flag_error`)."""
  from helpers import REPO
  from test_launch_checks import _parse_error

  registry = flags.FlagValues()
  flags.DEFINE_bool('quick', False, 'quick', flag_values=registry)
  for value in ('yes', ''):
    with pytest.raises(flags.IllegalFlagValueError) as caught:
      registry(['program', f'--quick={value}'])
    assert flag_types.error_line(str(caught.value)) == (
      f'flag --quick={value}: a boolean flag takes true or false (or 1 or 0)'
    )
  config = REPO / 'configs' / 'char_tiny.py'
  assert _parse_error(monkeypatch, f'--config={config}', '--config.model.pre_layer_norm=yes') == (
    'error: flag --config.model.pre_layer_norm=yes: a boolean flag takes true or false (or 1 or 0)'
  )
  assert flag_types.error_line('flag --counts=x: give integers') == 'flag --counts=x: give integers'
