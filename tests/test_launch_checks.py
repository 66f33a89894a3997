"""What train.py, eval.py and the sweep check before anything else, each refusal one line: a
config file that lacks a field or a section, an empty path flag, a sweep's root or an
evaluation's directory given as a run's workdir, a config file that does not load, a fault of
the sweep's own files."""

import pytest
from helpers import load_config, run_sweep_main

from relpos.training import tasks


def _incomplete(name: str):
  """char_tiny's config without `name` (a field, dotted, or a whole section)."""
  config = load_config('char_tiny', 'shaw')
  *sections, last = name.split('.')
  node = config
  for section in sections:
    node = node[section]
  del node[last]
  return config


@pytest.mark.parametrize(
  ('name', 'message'),
  [
    ('train.steps', 'config.train.steps is missing from the config'),
    ('eval', 'config.eval is missing from the config'),
    ('model', 'config.model is missing from the config'),
  ],
)
def test_a_config_lacking_a_field_is_named_before_any_other_check(tmp_path, name, message):
  """Before, train.py's evaluation plan read config.train.steps first: an AttributeError."""
  config = _incomplete(name)
  task = tasks.get(config)
  with pytest.raises(ValueError, match=message):
    task.train_and_evaluate(config, tmp_path / 'run')
  with pytest.raises(ValueError, match=message):
    task.evaluate(config, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def test_a_sweep_of_a_config_lacking_a_field_names_it(tmp_path, monkeypatch):
  """Before, the sweep's --field read config.model first: 'the config has no section'."""
  config_file = tmp_path / 'only_task.py'
  config_file.write_text(
    'import ml_collections\n\n\ndef get_config():\n'
    "  return ml_collections.ConfigDict({'task': 'char_lm'})\n"
  )
  code = run_sweep_main(
    monkeypatch, f'--config={config_file}', f'--workdir={tmp_path / "sweep"}', '--values=2'
  )
  assert code == 'error: config.seed is missing from the config'
  assert not (tmp_path / 'sweep').exists()
