"""The declarations of every config field (`fields`: how a field is declared; `model_fields`,
`shared`, `char_lm_defaults`, `translation_defaults`: the fields), the rules that check them
(`checks`), and `load_config_file` for config files built on other config files (with
`unknown_preset`, the error of a preset a file lacks; `importable_beside` lets a config file
import a module beside it). A command line's --config and its overrides are parsed, each
fault one line, by `command_line`. The config files of configs/ are presets: they start from a
declaration's ConfigDict and change values only."""

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import NamedTuple

import ml_collections


class TaskEntry(NamedTuple):
  """Where a task's parts live, by name: imported on demand, so that reading one task's run
  never imports another task's data modules (nor the config layer the training layer)."""

  task_module: str  # defines TASK, its relpos.training.task_base.Task
  declaration: str  # 'module:Class' of its config's declaration (relpos.config.fields)
  example_config: str  # a config file of the task, named in lines that need one


# The one registry of config.task values: relpos.training.tasks.get, `declaration`,
# relpos.config.command_line and the commands' lines ("expected one of ...") all read it.
# Adding a task is one entry here.
TASKS = {
  'char_lm': TaskEntry(
    'relpos.training.char_lm_task',
    'relpos.config.char_lm_defaults:CharLMConfig',
    'configs/char_tiny.py',
  ),
  'translate': TaskEntry(
    'relpos.training.translation_task',
    'relpos.config.translation_defaults:TranslationConfig',
    'configs/translate_tiny.py',
  ),
}


def no_task_line(config, config_file: str | None) -> str | None:
  """The one line for a `config` (of --config=`config_file`) whose config.task is none of
  `TASKS`, for the commands that take a task's config (train.py, eval.py, show_config); None
  for a task's config. A benchmark's config (configs/xl_eval_speed.py) sets no config.task:
  the line says so, and that its docstring names the command that reads it."""
  task = config.get('task')
  if task in TASKS:
    return None
  given = f'--config={config_file}' if config_file else '--config'
  examples = ' or '.join(entry.example_config for entry in TASKS.values())
  if task is None:
    return (
      f"{given} is no task's config (it sets no config.task), and this command takes one of "
      f"{' or '.join(TASKS)}, such as {examples}; a benchmark's config is read by the command "
      'its docstring names'
    )
  return f'{given}: config.task={task!r}: expected one of {sorted(TASKS)}'


def declaration(task) -> type | None:
  """The declared config (a `relpos.config.fields.section`) of config.task `task`, or None for
  a task relpos does not declare."""
  if task not in TASKS:
    return None
  module, name = TASKS[task].declaration.split(':')
  return getattr(importlib.import_module(module), name)


def unknown_preset(preset: str, presets) -> ValueError:
  """The error a config file's get_config raises for a preset it does not have: it names the
  preset and the file's `presets`, and no file. A file may take its presets from another
  (configs/wmt_big.py from configs/wmt_base.py, through `load_config_file`), whose own name
  would be the wrong one: 'unknown wmt_base preset' for --config=configs/wmt_big.py:nope. The
  commands name the file they were given (`relpos.config.command_line.parse_flags`, the sweep's
  --field=preset)."""
  return ValueError(f'unknown preset {preset!r}: use one of {", ".join(presets)}')


@contextlib.contextmanager
def importable_beside(path):
  """While loading the config file at `path` (and calling its get_config), its directory is on
  sys.path, so it can import a helper module beside it (`from common import base`), as a
  script can: loaded from its path, it could not (ModuleNotFoundError), a researcher's
  common.py next to their configs included. The directory goes last, so a file there never
  shadows an installed module (a config directory holding its own jax.py or types.py), and it
  is taken off again afterwards; a module imported from it stays imported. `path` None (no
  --config): nothing changes."""
  directory = None if path is None else os.path.dirname(os.path.abspath(path))
  added = directory is not None and directory not in sys.path
  if added:
    sys.path.append(directory)
  try:
    yield
  finally:
    if added and directory in sys.path:
      sys.path.remove(directory)


def load_config_file(path: Path, preset: str | None = None) -> ml_collections.ConfigDict:
  """The get_config(preset) of a config file, loaded from its path as train.py loads it, so
  configs/wmt_big.py can start from configs/wmt_base.py without configs/ being importable
  (the file's directory importable meanwhile: `importable_beside`)."""
  spec = importlib.util.spec_from_file_location(f'configs.{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  with importable_beside(path):
    spec.loader.exec_module(module)
    return module.get_config() if preset is None else module.get_config(preset)
