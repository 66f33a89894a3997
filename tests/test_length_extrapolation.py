"""benchmarks/length_extrapolation.py end to end at its quick size: train, score, report, plot,
resume."""

import csv
import json
import warnings
from pathlib import Path

import pytest
from helpers import load_config, load_module

_BENCHMARKS = Path(__file__).resolve().parent.parent / 'benchmarks'
with warnings.catch_warnings():  # ml_collections loads the default config with load_module()
  warnings.simplefilter('ignore', DeprecationWarning)
  bench = load_module(_BENCHMARKS / 'length_extrapolation.py', 'length_extrapolation_benchmark')


def test_quick_study_trains_scores_and_resumes(tmp_path, capsys):
  config = load_config('length_extrapolation', 'quick')
  rows = bench.study(config, tmp_path)
  labels = ['1x', '2x', '1x+mem']
  assert [(r['position'], r['label']) for r in rows] == [
    (position, label) for position in ('alibi', 'rope') for label in labels
  ]
  scores = json.loads((tmp_path / 'rope' / 'seed=0' / bench.SCORES_FILE).read_text())
  assert {label: (s['tgt_len'], s['mem_len']) for label, s in scores.items()} == {
    '1x': (8, 0),
    '2x': (16, 0),
    '1x+mem': (8, 8),
  }
  # Untrained-ish models sit near log2(256) = 8 bits; each setting is its own number.
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
  assert 'step 2/4' not in out and out.count(': bpc ') == 2  # 4x, once per scheme
  assert [r['bpc'] for r in again if r['label'] != '4x'] == [r['bpc'] for r in rows]


def test_a_bad_position_is_an_error_before_training(tmp_path):
  config = load_config('length_extrapolation', 'quick')
  config.positions = ('alibi', 'learned')
  with pytest.raises(ValueError, match='config.model.position must be one of'):
    bench.study(config, tmp_path)
  assert not (tmp_path / 'alibi').exists()
