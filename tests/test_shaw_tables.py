"""relpos.studies.shaw_tables: the drift table and plot over runs, and its one-line errors (the
drift
of a trained run is checked in test_translate_training, which trains one)."""

import json

import numpy as np
import pytest
from absl import flags
from helpers import call_absl_main, load_config

from relpos.cli import guarded
from relpos.config.translation_defaults import translate_config
from relpos.studies import shaw_tables


def _translation(position: str) -> dict:
  config = translate_config()
  config.model.position = position
  return config.to_dict()


def test_distances_are_zero_and_powers_of_two_up_to_k():
  assert shaw_tables._distances(0) == [0]
  assert shaw_tables._distances(3) == [-3, -2, -1, 0, 1, 2, 3]
  assert shaw_tables._distances(16) == [-16, -8, -4, -2, -1, 0, 1, 2, 4, 8, 16]


def test_runs_of_one_k_are_averaged_into_one_row_per_stack(monkeypatch, tmp_path):
  drifts = {
    'a': (1, {'encoder': np.array([1.0, 2.0, 3.0]), 'decoder': np.array([4.0, 5.0, 0.0])}, 2.0),
    'b': (1, {'encoder': np.array([3.0, 4.0, 5.0]), 'decoder': np.array([6.0, 7.0, 0.0])}, 4.0),
    'c': (2, {stack: np.arange(5.0) for stack in shaw_tables.STACKS}, 1.0),
  }
  monkeypatch.setattr(shaw_tables, 'row_drift', lambda workdir: drifts[workdir])
  by_k = shaw_tables.drift_by_k(['a', 'c', 'b'])
  assert list(by_k) == [1, 2]
  drift, initial_norm, runs = by_k[1]
  np.testing.assert_array_equal(drift['encoder'], [2.0, 3.0, 4.0])
  assert (initial_norm, runs) == (3.0, 2)
  text = shaw_tables.markdown(by_k)
  assert '| 1 | 2 | 3.00 |  | 2.00 | 3.00 | 4.00 |  |' in text  # d = -2 .. 2; k = 1 lacks ±2
  assert '| 2 | 1 | 1.00 | 0.00 | 1.00 | 2.00 | 3.00 | 4.00 |' in text
  assert shaw_tables.plot(by_k, tmp_path / 'drift.png').stat().st_size > 0


@pytest.mark.parametrize(
  'config, message',
  [
    (None, 'run is not a directory: give the workdir'),
    (load_config('char_tiny').to_dict(), "holds a run of task 'char_lm', not 'translate'"),
    (_translation('absolute'), "config.model.position='absolute' has no tables"),
    (_translation('shaw'), 'no checkpoint in'),
  ],
)
def test_a_workdir_it_cannot_read_is_one_line(tmp_path, config, message):
  """main in this process: each refusal is a SystemExit whose text (what Python prints, exit
  status 1) is one `error: ` line; any other exception would be a traceback, and fails here."""
  workdir = tmp_path / 'run'
  if config is not None:
    workdir.mkdir()
    (workdir / 'config.json').write_text(json.dumps(config))
  command = guarded(shaw_tables.main, positional=True)  # as its __main__ runs it
  code = call_absl_main(lambda: None, command, ['shaw_tables', str(workdir)])
  assert isinstance(code, str) and code.strip().splitlines() == [code.strip()]
  assert code.startswith('error: ') and message in code, code
  assert not code.startswith('error: --workdir'), code  # its workdirs are positional


def test_the_command_exits_1_with_its_error_line_and_no_traceback(commands, tmp_path):
  """A real `python -m relpos.studies.shaw_tables` process (the cases above call its main),
  forked from the command server (conftest's `commands`)."""
  result = commands.run(['-m', 'relpos.studies.shaw_tables', str(tmp_path / 'run')])
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and 'run is not a directory: give the workdir' in last, last


def test_a_run_named_twice_is_one_run(monkeypatch, tmp_path, capsys):
  """`shaw_tables W W/` reported runs=2 for one run, and averaged it twice."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  read = []
  drift = {stack: np.zeros(3) for stack in shaw_tables.STACKS}
  monkeypatch.setattr(shaw_tables, 'row_drift', lambda w: read.append(w) or (1, drift, 1.0))
  argv = ['shaw_tables', str(workdir), f'{workdir}/', str(tmp_path / '.' / 'run')]
  define = lambda: flags.DEFINE_string('out', None, '')  # noqa: E731 (as its __main__)
  assert call_absl_main(define, shaw_tables.main, argv) is None
  assert read == [str(workdir)]
  captured = capsys.readouterr()
  assert '| 1 | 1 | 1.00 |' in captured.out
  assert captured.err.count('warning:') == 1 and f'{workdir}/' in captured.err
