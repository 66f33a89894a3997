"""relpos.studies.plot: curves from metrics.jsonl, and its one-line errors."""

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from absl import flags
from helpers import call_absl_main

from relpos.cli import guarded
from relpos.faults import FilesystemFaultError
from relpos.studies import figures, plot, shaw_tables


def _run(directory: Path, records: list[dict], tail: str = '') -> Path:
  directory.mkdir(parents=True)
  lines = [json.dumps({'time': 0.0, **record}) for record in records]
  (directory / 'metrics.jsonl').write_text('\n'.join(lines) + '\n' + tail)
  return directory


def test_curves_keep_the_resumed_values_and_skip_throughput(tmp_path):
  run = _run(
    tmp_path / 'a',
    [
      {'step': 2, 'train/loss': 3.0, 'train/tok_per_s': 100.0},
      {'step': 4, 'train/loss': 2.5, 'train/tok_per_s': 100.0},
      {'step': 4, 'valid/bpc': 2.0},
      {'step': 4, 'train/loss': 2.4, 'train/tok_per_s': 90.0},  # the resumed run's step 4
    ],
    tail='{"step": 6, "train/lo',  # cut by a kill
  )
  curves = plot.read_curves(run)
  assert curves == {'train/loss': {2: 3.0, 4: 2.4}, 'valid/bpc': {4: 2.0}}


def test_one_png_for_several_runs(tmp_path):
  first = _run(tmp_path / 'a', [{'step': s, 'train/loss': 4.0 / s} for s in (1, 2, 3)])
  second = _run(
    tmp_path / 'b',
    [{'step': 1, 'train/loss': 3.0}, {'step': 2, 'train/loss': 2.0, 'eval/perplexity': 9.0}],
  )
  out = plot.plot_runs([first, second], tmp_path / 'curves.png')
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_the_path_printed_is_the_file_written(tmp_path):
  """--out without a suffix: matplotlib writes NAME.png, and the path returned (and printed)
  says so; a directory is refused (matplotlib wrote a PNG named after it beside it)."""
  run = _run(tmp_path / 'a', [{'step': 1, 'train/loss': 1.0}])
  out = plot.plot_runs([run], tmp_path / 'curves')
  assert out == tmp_path / 'curves.png' and out.read_bytes()[:4] == b'\x89PNG'
  with pytest.raises(ValueError, match=r'is a directory: give a file name, e\.g\. .*figure\.png'):
    plot.plot_runs([run], tmp_path)
  assert plot.plot_runs([run], tmp_path / 'dotted.') == tmp_path / 'dotted.png'
  with pytest.raises(FilesystemFaultError, match=r'^cannot write --out=\S*missing/c\.png: No such'):
    plot.plot_runs([run], tmp_path / 'missing' / 'c.png')
  with pytest.raises(ValueError, match=r"^--out=\S*c\.xyz: Format 'xyz' is not supported"):
    plot.plot_runs([run], tmp_path / 'c.xyz')


def test_command_line(tmp_path, commands):
  # Real processes, forked from conftest's `commands` server (Python's and JAX's imports
  # done once for the run), as the command-line tests below.
  bad_flag = commands.run(['-m', 'relpos.studies.plot', 'W', '--outt=x.png'])
  assert bad_flag.returncode == 1
  assert bad_flag.stderr == "error: Unknown command line flag 'outt'. Did you mean: out ?\n"
  run = _run(tmp_path / 'a', [{'step': 1, 'train/loss': 1.0}])
  out = tmp_path / 'c.png'
  done = commands.run(['-m', 'relpos.studies.plot', str(run), f'--out={out}'])
  assert done.returncode == 0 and out.exists(), done.stderr


def _bad_config(workdir: Path) -> Path:
  (workdir / 'config.json').write_text('{task: char_lm')  # damaged by hand
  return workdir


@pytest.mark.parametrize(
  ('make', 'message'),
  [
    (lambda root: root / 'absent', 'is not a directory'),
    (lambda root: root.joinpath('empty').mkdir() or root / 'empty', 'has not logged a step'),
    (lambda root: _run(root / 'no_scalars', [{'step': 1}]), 'holds no scalars'),
    (lambda root: _run(root / 'no_step', [{'loss': 1.0}]), 'is not a metrics record'),
    (lambda root: _run(root / 'a_list', [{'step': 1, 'loss': 1.0}], '[1, 2]\n'), 'not a metrics'),
    (lambda root: _bad_config(_run(root / 'bad', [{'step': 1, 'loss': 1.0}])), 'is not valid JSON'),
  ],
)
def test_missing_or_unstarted_workdirs_are_one_line(tmp_path, make, message, commands):
  done = commands.run(
    ['-m', 'relpos.studies.plot', str(make(tmp_path)), f'--out={tmp_path / "x.png"}']
  )
  assert done.returncode == 1 and 'Traceback' not in done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith('error: ') and message in done.stderr


def test_a_sweep_root_or_an_evaluation_only_directory_is_named_as_such(tmp_path):
  """It said 'metrics.jsonl does not exist: the run has not logged a step yet'."""
  from helpers import eval_field_sweep_root

  trained, scored = eval_field_sweep_root(tmp_path)
  with pytest.raises(FileNotFoundError, match=f'is the root of a sweep, not a run: .* {trained}$'):
    plot.read_curves(tmp_path)
  with pytest.raises(
    FileNotFoundError, match=f'holds only an evaluation .* of the run in {trained}'
  ):
    plot.read_curves(scored)


def _read_only(path, content):
  raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


def _plot_main(tmp_path, out):
  run = _run(tmp_path / 'a', [{'step': 1, 'train/loss': 1.0}])
  define = lambda: flags.DEFINE_string('out', None, '')  # noqa: E731 (as plot's __main__)
  return call_absl_main(
    define, guarded(plot.main, positional=True), ['plot', str(run), f'--out={out}']
  )


def _shaw_tables_main(tmp_path, out, monkeypatch):
  drift = {stack: np.zeros(3) for stack in shaw_tables.STACKS}
  monkeypatch.setattr(shaw_tables, 'drift_by_k', lambda workdirs: {1: (drift, 1.0, 1)})
  define = lambda: flags.DEFINE_string('out', None, '')  # noqa: E731 (as its __main__)
  command = guarded(shaw_tables.main, positional=True)  # as its __main__ runs it
  return call_absl_main(define, command, ['shaw_tables', 'run', f'--out={out}'])


@pytest.mark.parametrize('tool', ['plot', 'shaw_tables'])
@pytest.mark.parametrize(
  ('place', 'cause'),
  [
    (
      'read_only',
      'Read-only file system (the filesystem is read-only); nothing was written; '
      'make it writable or give another --out',
    ),
    (
      'under_a_file',
      'Not a directory (a file is in the way of a directory); nothing was '
      'written; give another --out',
    ),
    (
      'missing',
      'No such file or directory (a directory on its path is missing); nothing was '
      'written; make that directory or give another --out',
    ),
  ],
)
def test_an_out_file_that_cannot_be_written_is_the_exit_74_line(
  tmp_path, monkeypatch, capsys, tool, place, cause
):
  """Every study tool that writes --out (`figures.save`, their one path): plot gave an OSError
  traceback on a read-only directory and NotADirectoryError under a file; shaw_tables one
  line with exit 1."""
  (tmp_path / 'notes').write_text('')
  out = {
    'read_only': tmp_path / 'x.png',
    'under_a_file': tmp_path / 'notes' / 'x.png',
    'missing': tmp_path / 'missing' / 'x.png',
  }[place]
  if place == 'read_only':
    monkeypatch.setattr(figures, 'write_atomically', _read_only)
  if tool == 'plot':
    code = _plot_main(tmp_path, out)
  else:
    code = _shaw_tables_main(tmp_path, out, monkeypatch)
  assert code == 74
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert last == f'error: cannot write --out={out}: {cause}, then rerun'
  assert not out.exists()


def test_labels_too_long_for_a_tight_layout_write_the_figure_without_a_warning(tmp_path):
  """A sweep over long value names (paths) printed matplotlib's two-line 'Tight layout not
  applied' UserWarning on stderr; the figure is written as before, without it."""
  import warnings

  figure, axes = figures.subplots(figsize=(5, 3.5))
  axes.plot([0, 1], [0, 1])
  axes.set_xticks([0, 1], ['/tmp/' + 'a' * 200 + '.txt', '/tmp/' + 'b' * 200 + '.txt'])
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    written = figures.save(figure, tmp_path / 'sweep.png')
  assert written.stat().st_size > 0
  assert [str(warning.message) for warning in caught] == []


def test_a_run_named_twice_is_drawn_once(tmp_path, monkeypatch, capsys):
  """`plot W W/` drew the run's curves twice, under two labels."""
  run = _run(tmp_path / 'a', [{'step': 1, 'train/loss': 1.0}])
  drawn = []
  monkeypatch.setattr(plot, 'plot_runs', lambda workdirs, out: drawn.append(workdirs) or out)
  define = lambda: flags.DEFINE_string('out', None, '')  # noqa: E731 (as plot's __main__)
  argv = ['plot', str(run), f'{run}/', f'--out={tmp_path / "c.png"}']
  assert call_absl_main(define, plot.main, argv) is None
  assert drawn == [[str(run)]]
  assert capsys.readouterr().err.count('warning:') == 1
