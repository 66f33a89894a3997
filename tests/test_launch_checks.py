"""What train.py, eval.py and the sweep check before anything else, each refusal one line: a
config file that lacks a field or a section, an empty path flag, a sweep's root or an
evaluation's directory given as a run's workdir, a config file that does not load, a fault of
the sweep's own files."""

import pytest
from helpers import REPO, load_config, one_error_line, run_sweep_main

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


CHAR_TINY = REPO / 'configs' / 'char_tiny.py'


@pytest.mark.parametrize(
  ('argv', 'flag'),
  [
    (['train.py', f'--config={CHAR_TINY}', '--workdir='], '--workdir='),
    (
      ['eval.py', f'--config={CHAR_TINY}', '--workdir=runs/x', '--output_dir='],
      '--output_dir=',
    ),
    (['relpos/tools/sample.py', '--workdir='], '--workdir='),
    (['relpos/tools/translate.py', '--workdir=', '--text=a'], '--workdir='),
    (['relpos/studies/sweep.py', f'--config={CHAR_TINY}', '--workdir='], '--workdir='),
    (['relpos/studies/plot.py', 'runs/x', '--out='], '--out='),
    (['relpos/studies/plot.py', ''], 'a workdir given is empty'),
    (['relpos/studies/shaw_tables.py', ''], 'a workdir given is empty'),
  ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_directory(commands, tmp_path, argv, flag):
  """Before, `train.py --workdir=` trained a whole run into the current directory and
  `eval.py --output_dir=` wrote eval_results.json there."""
  argv = [str(REPO / argv[0]) if argv[0].endswith('.py') else argv[0], *argv[1:]]
  line = one_error_line(commands.run(argv, cwd=tmp_path, timeout=120))
  assert line.startswith(f'error: {flag}'), line
  assert list(tmp_path.iterdir()) == []
