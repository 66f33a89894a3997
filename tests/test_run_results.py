"""A run's results (eval_results.json): whose they are, and where the files they name are, once
runs move."""

import json
from pathlib import Path

import ml_collections

from relpos.training import run_results


def test_a_result_recording_where_it_was_written_is_the_run_s_wherever_the_run_moves(tmp_path):
  """recheck15-1/2: a run moved to another parent (runs/c1 -> archive/c1) took its own result
  for another run's (the last two path parts differ): a rerun scored it again, and with its
  checkpoints deleted it was trained again from step 0 in silence. A result records where it
  was written (`WRITTEN_TO`): the run's directory, seen from there, is the run's wherever
  both moved, and so are its translations (an absolute path into the old place)."""
  own = {
    'checkpoint': '/old/runs/c1/checkpoints/20',
    run_results.WRITTEN_TO: '/old/runs/c1',
    'translations': '/old/runs/c1/translations_step20.txt',
  }
  setting = {**own, run_results.WRITTEN_TO: '/old/runs/c1/beam8'}
  setting['translations'] = '/old/runs/c1/beam8/translations_step20.txt'
  run, other = tmp_path / 'archive' / 'c1', tmp_path / 'archive' / 'c2'
  assert run_results.foreign_checkpoint(own, run, run) is None
  assert run_results.foreign_checkpoint(setting, run, run / 'beam8') is None
  # Another run's result: in its own directory, or scored into this run's.
  assert run_results.foreign_checkpoint(own, run, other) == own['checkpoint']
  assert run_results.foreign_checkpoint(own, other, other) is None  # c2 a copy of c1: its own
  assert run_results.foreign_checkpoint(setting, other, run / 'beam8') == own['checkpoint']
  assert run_results.result_file(own, 'translations', run) == run / 'translations_step20.txt'
  assert run_results.result_file(setting, 'translations', run / 'beam8') == (
    run / 'beam8' / 'translations_step20.txt'
  )
  # Older results (no record of where): the file beside the result once its path is gone.
  older = {'translations': '/gone/sweep/k=2/seed=0/translations_step20.txt'}
  assert run_results.result_file(older, 'translations', run) == Path(older['translations'])
  run.mkdir(parents=True)
  (run / 'translations_step20.txt').write_text('x\n')
  assert run_results.result_file(older, 'translations', run) == run / 'translations_step20.txt'


def test_only_a_result_of_a_later_step_is_newer_than_an_evaluation(tmp_path):
  """`newer_result`: eval.py of the newest checkpoint keeps (and only prints over) a result of a
  later step whose checkpoint is there; a result of the same step (the run's own, scored again
  with other settings) or an earlier one is replaced, and so is one whose checkpoint is gone or
  where config.eval.step asked for a step."""
  for step in (4, 8):
    (tmp_path / 'checkpoints' / str(step)).mkdir(parents=True)
  (tmp_path / run_results.RESULTS_FILE).write_text(json.dumps({'step': 8, 'bpc': 1.5}))
  newest = ml_collections.ConfigDict({'eval': {'step': 0}})
  assert 'holds the score of step 8' in run_results.newer_result(newest, tmp_path, tmp_path, 4)
  assert run_results.newer_result(newest, tmp_path, tmp_path, 8) is None
  assert run_results.newer_result(newest, tmp_path, tmp_path, 12) is None
  asked = ml_collections.ConfigDict({'eval': {'step': 4}})
  assert run_results.newer_result(asked, tmp_path, tmp_path, 4) is None
  (tmp_path / 'checkpoints' / '8').rmdir()
  assert run_results.newer_result(newest, tmp_path, tmp_path, 4) is None


def test_an_output_dir_of_an_earlier_evaluation_is_replaced_with_a_warning(tmp_path):
  """eval.py --config.eval.step=30 --output_dir=<step 20's directory> replaced that result
  without a word: the warning names the file and what changed; none for the same evaluation,
  an empty directory or the workdir itself (the run's own result)."""
  from relpos.training.task_base import replaced_evaluation

  workdir, output_dir = tmp_path / 'run', tmp_path / 'step20'
  output_dir.mkdir()
  result = {'bpc': 2.0, 'step': 30, 'eval': {'step': 30, 'mem_len': 64}}
  assert replaced_evaluation(output_dir, workdir, result) is None  # nothing there
  earlier = {'bpc': 2.1, 'step': 20, 'eval': {'step': 20, 'mem_len': 64}}
  (output_dir / 'eval_results.json').write_text(json.dumps(earlier))
  assert replaced_evaluation(output_dir, workdir, result) == (
    f'replacing the evaluation in {output_dir}/eval_results.json (step 20 -> 30; eval.step '
    '20 -> 30)'
  )
  assert replaced_evaluation(output_dir, workdir, earlier | {'bpc': 2.2}) is None
  assert replaced_evaluation(output_dir, output_dir, result) is None
