"""The k sweep: value parsing, printed commands, table and plot from finished runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_config

from relpos import sweep

REPO = Path(__file__).resolve().parent.parent


def test_parse_value_uses_the_field_type():
  config = load_config('char_tiny')
  assert sweep.parse_value(config, 'model.max_relative_position', '4') == 4
  assert sweep.parse_value(config, 'optim.learning_rate', '0.5') == 0.5
  assert sweep.parse_value(config, 'train.same_length', 'true') is True
  with pytest.raises(ValueError, match='no field'):
    sweep.parse_value(config, 'model.max_relative_positon', '4')
  with pytest.raises(ValueError, match='no section'):
    sweep.parse_value(config, 'modle.mem_len', '4')


def test_with_value_copies():
  config = load_config('char_tiny')
  changed = sweep.with_value(config, 'model.max_relative_position', 2)
  assert changed.model.max_relative_position == 2
  assert config.model.max_relative_position == 16


def test_collect_table_and_plot(tmp_path):
  field = 'model.max_relative_position'
  for value, bleu in ((0, 1.5), (2, 3.25), (16, 4.0)):
    run = sweep.run_dir(tmp_path, field, value)
    run.mkdir()
    (run / 'eval_results.json').write_text(json.dumps({'bleu': bleu, 'step': 10}))
  rows = sweep.collect(tmp_path, field, [0, 2, 4, 16], 'bleu')  # 4 has no run: skipped
  assert [(row[field], row['bleu']) for row in rows] == [(0, 1.5), (2, 3.25), (16, 4.0)]
  markdown = sweep.write_table(rows, tmp_path, field, 'bleu')
  assert '| 2 | 3.25 | 10 |' in markdown
  assert (tmp_path / 'sweep.csv').read_text().splitlines()[2].startswith('2,3.25,10,')
  png = sweep.plot(rows, tmp_path, field, 'bleu')
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match='--metric'):
    sweep.collect(tmp_path, field, [0], 'bpc')


def test_print_only_lists_train_and_eval_commands(tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'relpos.sweep',
      '--config=configs/char_tiny.py:shaw',
      '--config.train.steps=5',
      f'--workdir={tmp_path}',
      '--values=0,4',
      '--print_only',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
  )
  lines = result.stdout.strip().splitlines()
  assert lines == [
    f'python {script} --config=configs/char_tiny.py:shaw --config.train.steps=5 '
    f'--config.model.max_relative_position={value} '
    f'--workdir={tmp_path}/max_relative_position={value}'
    for value in (0, 4)
    for script in ('train.py', 'eval.py')
  ]
