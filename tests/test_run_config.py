"""The run's config kept in its workdir: a rerun with another config is refused unless allowed."""

import json

import pytest
from helpers import load_config

from relpos.training import run_config


def test_a_rerun_with_another_config_is_refused_unless_allowed(tmp_path):
  config = load_config('char_tiny')
  run_config.record_config(config, tmp_path, allow_change=False)
  run_config.record_config(config, tmp_path, allow_change=False)  # same config: fine
  config.eval.mem_len = 64  # evaluation settings may change
  run_config.record_config(config, tmp_path, allow_change=False)
  config.train.mem_len = 32
  with pytest.raises(ValueError, match=r'config.train.mem_len: 64 -> 32.*--allow_config_change'):
    run_config.record_config(config, tmp_path, allow_change=False)
  run_config.record_config(config, tmp_path, allow_change=True)
  assert (tmp_path / 'config.1.json').exists()
  assert '"mem_len": 32' in (tmp_path / 'config.json').read_text()


def test_config_changes_lists_added_removed_and_nested_fields():
  old = {'model': {'k': 1, 'd': 2}, 'seed': 0}
  new = {'model': {'k': 4, 'h': 8}, 'seed': 0}
  assert run_config.config_changes(old, new) == [
    "config.model.d: 2 -> '<absent>'",
    "config.model.h: '<absent>' -> 8",
    'config.model.k: 1 -> 4',
  ]


def test_a_run_recorded_before_a_field_was_added_reads_with_its_neutral_value(tmp_path):
  """Runs recorded before the T5 / RoPE fields existed still evaluate and resume: a missing
  `ADDED` field reads as the value that leaves them unchanged; any other difference counts."""
  config = load_config('translate_tiny', 'shaw')
  run_config.record_config(config, tmp_path, allow_change=False)
  path = tmp_path / run_config.CONFIG_FILE
  recorded = json.loads(path.read_text())
  for name, neutral in run_config.ADDED.items():
    section, field = name.split('.')
    assert recorded[section][field] == neutral  # today's default
    del recorded[section][field]
  path.write_text(json.dumps(recorded))
  assert run_config.read_config(tmp_path).model.t5_num_buckets == 32
  assert run_config.changes_from_recorded(config, tmp_path) == []
  config.model.rope_base = 500.0
  assert run_config.changes_from_recorded(config, tmp_path) == [
    'config.model.rope_base: 10000.0 -> 500.0'
  ]
