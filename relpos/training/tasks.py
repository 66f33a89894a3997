"""The tasks train.py and eval.py can run, chosen by `config.task`."""

import types

import ml_collections

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
