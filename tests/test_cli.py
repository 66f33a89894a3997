"""relpos.cli: every command's guard (`guarded`, what `run_main` runs), in this process."""

import os

import pytest
from absl import flags
from helpers import call_absl_main

from relpos.cli import USER_ERRORS, guarded
from relpos.faults import FilesystemFaultError


def _raising(error):
  def main(argv):
    raise error

  return main


def _define_out():
  flags.DEFINE_string('out', None, '')


def test_a_stray_argument_is_one_line_unless_the_command_takes_positional_ones():
  seen = []
  main = seen.append
  assert call_absl_main(_define_out, guarded(main), ['tool', 'W']) == (
    "error: unexpected arguments ['W']: every option is a flag, --name=value"
  )
  assert call_absl_main(_define_out, guarded(main, positional=True), ['tool', 'W']) is None
  assert seen == [['tool', 'W']]


def test_a_positional_command_gets_the_home_of_its_path_flags_expanded():
  """Its parser (`relpos.flag_types.parse_flags`) knows no --config and leaves `--out=~/x`."""
  out = []
  main = lambda argv: out.append(flags.FLAGS.out)  # noqa: E731
  argv = ['tool', 'W', '--out=~/x.png']
  assert call_absl_main(_define_out, guarded(main, positional=True), argv) is None
  assert out == [os.path.expanduser('~/x.png')]


@pytest.mark.parametrize('positional', [False, True])
def test_user_errors_are_one_line_and_faults_their_own_status(positional, capsys):
  argv = ['tool', *(['W'] if positional else [])]
  for error in (ValueError('bad value'), FileNotFoundError('no file'), PermissionError('no')):
    command = guarded(_raising(error), positional=positional)
    assert call_absl_main(_define_out, command, argv) == f'error: {error}'
  fault = FilesystemFaultError('cannot write --out=x.png: disk full')
  command = guarded(_raising(fault), positional=positional)
  assert call_absl_main(_define_out, command, argv) == 74
  assert capsys.readouterr().err == f'error: {fault}\n'


def test_a_command_says_more_errors_as_one_line_only_where_it_asks():
  """`user_errors` (relpos.studies.significance: any OSError); other errors stay tracebacks."""
  error = IsADirectoryError(21, 'Is a directory', 'd')
  assert not isinstance(error, USER_ERRORS)
  with pytest.raises(IsADirectoryError):
    call_absl_main(_define_out, guarded(_raising(error), positional=True), ['tool', 'd'])
  command = guarded(_raising(error), positional=True, user_errors=(OSError, ValueError))
  assert call_absl_main(_define_out, command, ['tool', 'd']) == f'error: {error}'
