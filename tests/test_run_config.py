"""The run's config kept in its workdir: a rerun with another config is refused unless allowed."""

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
