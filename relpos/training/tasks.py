"""The tasks train.py and eval.py run, chosen by `config.task`, and their shared launcher."""

import types

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from relpos.training import char_lm

_TASKS = {'char_lm': char_lm}


def get(config: ml_collections.ConfigDict) -> types.ModuleType:
  """The module with `train_and_evaluate(config, workdir)` and `evaluate(config, workdir)`."""
  task = config.get('task')
  if task not in _TASKS:
    raise SystemExit(f'config.task={task!r}: expected one of {sorted(_TASKS)}')
  return _TASKS[task]


def print_result(result: dict):
  """What train.py / eval.py print last; the very last line is `bpc=<float>`."""
  print(
    f'{result["split"]} split, {result["tokens"]} characters, checkpoint {result["checkpoint"]}'
  )
  print(f'bpc={result["bpc"]:.4f}')


def launch(action: str):
  """Parses --config and --workdir, runs the config's task `action`, prints the result."""
  config = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
  workdir = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
  flags.mark_flags_as_required(['config', 'workdir'])

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    if not flags.FLAGS['verbosity'].present:  # orbax logs many INFO lines per checkpoint
      logging.set_verbosity(logging.WARNING)
    print_result(getattr(get(config.value), action)(config.value, workdir.value))

  app.run(main)
