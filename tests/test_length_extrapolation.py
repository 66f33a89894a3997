"""benchmarks/length_extrapolation.py end to end at tiny sizes: train, score, report, plot,
resume; the char-LM and the translation study."""

import csv
import json
import math
import warnings
from pathlib import Path

import pytest
from helpers import load_config, load_module, tiny_translate_config, write_pair_corpus

from relpos import scoring

_BENCHMARKS = Path(__file__).resolve().parent.parent / 'benchmarks'
with warnings.catch_warnings():  # ml_collections loads the default config with load_module()
  warnings.simplefilter('ignore', DeprecationWarning)
  bench = load_module(_BENCHMARKS / 'length_extrapolation.py', 'length_extrapolation_benchmark')


def test_char_study_trains_scores_and_resumes(tmp_path, capsys):
  config = load_config('length_extrapolation', 'char_quick')
  config.positions = ('alibi',)
  rows = bench.study(config, tmp_path)
  assert [(r['position'], r['label']) for r in rows] == [
    ('alibi', label) for label in ('1x', '2x', '1x+mem')
  ]
  scores = json.loads((tmp_path / 'alibi' / 'seed=0' / bench.SCORES_FILE).read_text())
  assert {label: s['at'] for label, s in scores.items()} == {
    '1x': [8, 0],
    '2x': [16, 0],
    '1x+mem': [8, 8],
  }
  # Barely trained models sit near log2(256) = 8 bits; each setting is its own number.
  assert all(4.0 < r['bpc'] < 9.0 for r in rows)
  assert len({r['bpc'] for r in rows}) == len(rows)
  table = (tmp_path / 'extrapolation.md').read_text()
  assert '| alibi |' in table and '1x+mem (8 + mem 8)' in table
  with open(tmp_path / 'extrapolation.csv') as file:
    assert len(list(csv.DictReader(file))) == len(rows)
  assert (tmp_path / 'extrapolation.png').stat().st_size > 0
  # A rerun keeps the finished runs and their scores; a new length scores only itself.
  capsys.readouterr()
  config.multiples = (1, 2, 4)
  again = bench.study(config, tmp_path)
  out = capsys.readouterr().out
  assert 'step 2/4' not in out and out.count(': bpc ') == 1  # 4x only
  assert [r['bpc'] for r in again if r['label'] != '4x'] == [r['bpc'] for r in rows]


def test_translation_study_scores_bleu_per_source_length(tmp_path):
  corpus = write_pair_corpus(tmp_path / 'corpus', train=200, eval=40)
  config = load_config('length_extrapolation', 'translate')
  config.run = tiny_translate_config(corpus, steps=4)
  config.positions, config.seeds, config.max_length = ('rope',), (0,), 3
  rows = bench.study(config, tmp_path / 'study')
  assert [r['label'] for r in rows] == ['<=3', '4-6', '7-12', '>12', 'all']
  by_label = {r['label']: r for r in rows}
  assert by_label['all']['count'] == 40
  assert sum(by_label[label]['count'] for label in ('<=3', '4-6', '7-12', '>12')) == 40
  assert by_label['4-6']['count'] > 0  # the tiny corpus has sources past N
  results = json.loads((tmp_path / 'study' / 'rope' / 'seed=0' / 'eval_results.json').read_text())
  assert math.isclose(by_label['all']['bleu'], results['bleu'])
  recorded = json.loads((tmp_path / 'study' / 'rope' / 'seed=0' / 'config.json').read_text())
  assert recorded['data']['max_length'] == 3 and recorded['model']['position'] == 'rope'
  assert '4-6 (' in (tmp_path / 'study' / 'extrapolation.md').read_text()
  # The length report: translations over references for all sentences, as sacreBLEU counts.
  run_dir = tmp_path / 'study' / 'rope' / 'seed=0'
  translations = (run_dir / Path(results['translations']).name).read_text().splitlines()
  run = bench.run_config_for(config, 'rope', 0)
  references = bench.load_eval_data(run.data, run_dir).eval_references
  ratio = scoring.corpus_bleu(translations, references).length_ratio
  lengths = (tmp_path / 'study' / 'extrapolation_lengths.md').read_text().splitlines()
  assert lengths[2] == '| position | <=3 | 4-6 | 7-12 | >12 | all |'
  assert lengths[4].startswith('| rope | ') and lengths[4].endswith(f' | {ratio:.3f} |')
  # A scores file from before the length ratio was recorded is scored again, not misread.
  scores_path = run_dir / bench.SCORES_FILE
  old_scores = json.loads(scores_path.read_text())
  for entry in old_scores.values():
    del entry['length_ratio']
  scores_path.write_text(json.dumps(old_scores))
  again = bench.study(config, tmp_path / 'study')
  assert [r['length_ratio'] for r in again] == [r['length_ratio'] for r in rows]


def test_a_bad_position_is_an_error_before_training(tmp_path):
  config = load_config('length_extrapolation', 'char_quick')
  config.positions = ('alibi', 'learned')
  with pytest.raises(ValueError, match='config.model.position must be one of'):
    bench.study(config, tmp_path)
  assert not (tmp_path / 'alibi').exists()
