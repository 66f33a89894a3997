"""The length-extrapolation study (configs/length_extrapolation.py) on the sweep's machinery, end
to end at tiny sizes: one training per scheme and seed scored at several evaluation settings,
the grid of schemes by setting, resume, and BLEU by source length in pieces."""

import csv
import json
import math
import re
import shlex

import pytest
from helpers import (
  REPO,
  load_config,
  load_module,
  run_sweep_main,
  tiny_translate_config,
  write_pair_corpus,
)

from relpos import scoring
from relpos.data.translation import load_eval_data
from relpos.studies import breakdown, sweep, sweep_grid

_POSITION = 'model.position'


def _char_study(config, root, evaluations):
  settings = sweep_grid.parse_evaluations(config, evaluations)
  return sweep.sweep(
    config, root, _POSITION, ['alibi', 'rope'], [0], 'bpc', 'alibi', evaluations=settings
  )


@pytest.mark.slow
def test_char_study_scores_each_model_at_every_setting_and_resumes(tmp_path, capsys):
  config = load_config('length_extrapolation', 'char_quick')
  _char_study(config, tmp_path, ['tgt_len=8', 'tgt_len=16', 'mem_len=8'])
  out = capsys.readouterr().out
  assert out.count('step 4/4') == 2  # one training per scheme, not per setting
  for position in ('alibi', 'rope'):
    run = sweep_grid.run_dir(tmp_path, _POSITION, position, 0)
    scored = {
      setting: json.loads((run / setting / 'eval_results.json').read_text())['eval']
      for setting in ('tgt_len=8', 'tgt_len=16', 'mem_len=8')
    }
    assert [(e['tgt_len'], e['mem_len']) for e in scored.values()] == [(8, 0), (16, 0), (8, 8)]
    assert json.loads((run / 'config.json').read_text())['eval']['tgt_len'] == 8  # as trained
  with open(tmp_path / 'sweep_by_evaluation_seeds.csv') as file:
    rows = list(csv.DictReader(file))
  assert [(r['value'], r['bucket']) for r in rows] == [
    (position, setting)
    for position in ('alibi', 'rope')
    for setting in ('tgt_len=8', 'tgt_len=16', 'mem_len=8')
  ]
  # Barely trained models sit near log2(256) = 8 bits; each setting is its own number.
  assert all(4.0 < float(r['bpc']) < 9.0 for r in rows)
  assert len({r['bpc'] for r in rows}) == len(rows)
  table = (tmp_path / 'sweep_by_evaluation.md').read_text()
  assert '| model.position | tgt_len=8 (' in table and '| rope | ' in table
  assert (tmp_path / 'sweep_by_evaluation.png').stat().st_size > 0
  # sweep.md is the first setting's sweep.
  assert 'model.position against bpc' in (tmp_path / 'sweep.md').read_text()
  # A rerun keeps the trainings and scores; a new setting scores only itself.
  _char_study(config, tmp_path, ['tgt_len=8', 'tgt_len=16', 'mem_len=8', 'tgt_len=32'])
  out = capsys.readouterr().out
  assert 'step 2/4' not in out and out.count('bpc=') == 2  # tgt_len=32, once per scheme
  with open(tmp_path / 'sweep_by_evaluation_seeds.csv') as file:
    again = {(r['value'], r['bucket']): r['bpc'] for r in csv.DictReader(file)}
  assert all(again[r['value'], r['bucket']] == r['bpc'] for r in rows)


def test_evaluations_name_config_eval_fields():
  config = load_config('length_extrapolation', 'char_quick')
  assert sweep_grid.parse_evaluations(config, ['tgt_len=16+mem_len=8', 'eval.clamp_len=4']) == {
    'tgt_len=16+mem_len=8': {'eval.tgt_len': 16, 'eval.mem_len': 8},
    'eval.clamp_len=4': {'eval.clamp_len': 4},
  }
  with pytest.raises(ValueError, match='no field'):
    sweep_grid.parse_evaluations(config, ['tgt_lenn=16'])
  with pytest.raises(ValueError, match='is not field=value'):
    sweep_grid.parse_evaluations(config, ['16'])


@pytest.mark.slow
def test_translation_study_scores_bleu_per_source_length_in_pieces(tmp_path):
  corpus = write_pair_corpus(tmp_path / 'corpus', train=200, eval=40)
  config = tiny_translate_config(corpus, steps=4, position='rope')
  config.data.max_length = 3
  config.eval.beam_size = 1  # the buckets' BLEU is checked against the translations, any beam
  root = tmp_path / 'study'
  sweep.sweep(
    config,
    root,
    _POSITION,
    ['rope'],
    [0],
    'bleu',
    'rope',
    breakdowns=[(breakdown.SOURCE_PIECES, [3, 6, 12])],
  )
  run = sweep_grid.run_dir(root, _POSITION, 'rope', 0)
  recorded = json.loads((run / 'config.json').read_text())
  assert recorded['data']['max_length'] == 3 and recorded['model']['position'] == 'rope'
  with open(root / 'sweep_by_pieces_seeds.csv') as file:
    rows = {r['bucket']: r for r in csv.DictReader(file)}
  # The buckets count the sources' pieces in the run's vocabulary.
  data = load_eval_data(config.data, run)
  lengths = [len(data.tokenizer.encode(source)) for source in data.eval_sources]
  assert any(length > 3 for length in lengths)  # the tiny corpus has sources past N
  results = json.loads((run / 'eval_results.json').read_text())
  translations = (run / f'translations_step{results["step"]}.txt').read_text().splitlines()
  for label, low, high in breakdown.buckets([3, 6, 12], breakdown.SOURCE_PIECES):
    chosen = [i for i, n in enumerate(lengths) if low <= n and (high is None or n <= high)]
    if not chosen:
      assert label not in rows
      continue
    bleu = scoring.corpus_bleu(
      [translations[i] for i in chosen],
      [data.eval_references[i] for i in chosen],
      target_lang=config.data.target_lang,
    )
    assert math.isclose(float(rows[label]['bleu']), bleu.score)
    assert math.isclose(float(rows[label]['length_ratio']), bleu.length_ratio)
  table = (root / 'sweep_by_pieces.md').read_text()
  assert 'bleu by source length in pieces' in table and 'Translation length / reference' in table


def test_an_eval_field_sweep_takes_no_evaluations(tmp_path):
  config = load_config('length_extrapolation', 'char_quick')
  with pytest.raises(ValueError, match='an eval field is an evaluation axis already'):
    sweep_grid.check_evaluations(
      'eval.mem_len', sweep_grid.parse_evaluations(config, ['tgt_len=16'])
    )


def _documented_commands() -> list[list[str]]:
  """The sweep commands of configs/length_extrapolation.py's docstring, as argument lists."""
  doc = load_module(REPO / 'configs' / 'length_extrapolation.py', 'length_extrapolation').__doc__
  joined = re.sub(r'\\\n\s*', ' ', doc)
  return [
    shlex.split(line)[3:]  # after `python -m relpos.studies.sweep`
    for line in joined.splitlines()
    if line.strip().startswith('python -m relpos.studies.sweep')
  ]


@pytest.mark.parametrize('preset', ['char', 'translate'])
def test_the_documented_study_commands_train_once_per_scheme_and_seed(
  tmp_path, monkeypatch, capsys, preset
):
  """--print_only of the docstring's command (the command's parser and main, in this process):
  its flags parse and its checks pass, and it trains 7 schemes x 2 seeds once each, scoring
  each at every evaluation setting."""
  (arguments,) = [c for c in _documented_commands() if c[0].endswith(f':{preset}')]
  arguments = [a for a in arguments if not a.startswith('--workdir=')]
  code = run_sweep_main(monkeypatch, f'--workdir={tmp_path}', *arguments, '--print_only')
  assert code is None
  lines = capsys.readouterr().out.strip().splitlines()
  settings = 6 if preset == 'char' else 0  # translate's: train.py's own score, no eval.py line
  assert sum(line.startswith('python train.py') for line in lines) == 7 * 2
  assert sum(line.startswith('python eval.py') for line in lines) == 7 * 2 * settings
  if preset == 'char':
    assert lines[2].endswith(
      f'--config.eval.tgt_len=128 --workdir={tmp_path}/position=xl/seed=0 '
      f'--output_dir={tmp_path}/position=xl/seed=0/tgt_len=128'
    )


@pytest.mark.parametrize(
  ('name', 'metric', 'table', 'baseline'),
  [
    ('length_char', 'bpc', 'length_char.md', 'xl'),
    ('length_translate', 'bleu', 'length_translate.md', 'absolute'),
    ('length_translate', 'length_ratio', 'length_translate_lengths.md', 'absolute'),
  ],
)
def test_the_published_tables_are_the_breakdown_statistics_of_their_runs(
  name, metric, table, baseline
):
  """docs/results' length tables (written by the study's earlier runner) are what
  `breakdown.by_bucket`, which the sweep's grids use, makes of their per-run CSV: mean ± std
  over seeds per scheme and column."""
  results = REPO / 'docs' / 'results'
  with open(results / f'{name}.csv') as file:
    runs = list(csv.DictReader(file))
  per_run = [
    {'value': r['position'], 'seed': int(r['seed']), 'bucket': r['label'], metric: float(r[metric])}
    for r in runs
  ]
  counts = {r['label']: int(r['count']) for r in runs}
  summary, _ = breakdown.by_bucket(per_run, counts, baseline, metric, None)
  cells = {}
  for line in (results / table).read_text().splitlines()[4:]:
    position, *values = [cell.strip() for cell in line.strip('|').split('|')]
    cells.update({(position, label): value for label, value in zip(counts, values, strict=True)})
  assert len(cells) == len(summary)
  for row in summary:
    assert cells[row['value'], row['bucket']] == f'{row["mean"]:.3f} ± {row["std"]:.3f}'
