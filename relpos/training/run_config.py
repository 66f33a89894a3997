"""The resolved config of a run, kept in its workdir, and the check that a rerun matches it."""

import json
from pathlib import Path

import ml_collections
from absl import logging

from relpos.config import checks, declaration, fields

CONFIG_FILE = 'config.json'
# Sections that may change between runs on one workdir: evaluation settings do not touch what
# was trained.
_FREE_SECTIONS = ('eval',)


def with_added(recorded: dict, current: dict | None = None) -> dict:
  """`recorded` (a config or some of its sections, as a dict) with the fields it lacks read
  from their declared defaults (the declaration of its config.task, `relpos.config
  .declaration`), so runs recorded before a field existed still evaluate and resume: a field
  added later defaults to what such runs did. Only sections `recorded` holds are filled, with
  `current` only the fields `current` has there, and never a field whose old name
  (`checks.RENAMED`) the section holds."""
  declared = declaration(recorded.get('task', (current or {}).get('task')))
  if declared is None:
    return recorded
  for section, defaults in fields.defaults(declared).items():
    if not isinstance(defaults, dict) or section not in recorded:
      continue
    wanted = defaults if current is None else current.get(section, {})
    renamed = {checks.RENAMED.get(f'{section}.{old}') for old in recorded[section]}
    for field, value in defaults.items():
      if field in wanted and f'{section}.{field}' not in renamed:
        recorded[section].setdefault(field, value)
  return recorded


def _recorded(path: Path, current: dict | None = None) -> dict:
  """The config recorded at path, `with_added` fields."""
  return with_added(json.loads(path.read_text()), current)


def config_changes(old: dict, new: dict, prefix: str = 'config') -> list[str]:
  """'field: old -> new' for every leaf that differs (added and removed fields included)."""
  changes = []
  for name in sorted(set(old) | set(new)):
    field = f'{prefix}.{name}'
    before, after = old.get(name, '<absent>'), new.get(name, '<absent>')
    if isinstance(before, dict) and isinstance(after, dict):
      changes += config_changes(before, after, field)
    elif before != after:
      changes.append(f'{field}: {before!r} -> {after!r}')
  return changes


def changes_from_recorded(config: ml_collections.ConfigDict, workdir) -> list[str]:
  """`config_changes` from the config recorded in workdir to `config`, outside the sections
  that may change between runs (eval); [] when none is recorded."""
  path = Path(workdir) / CONFIG_FILE
  if not path.exists():
    return []
  free = {name: None for name in _FREE_SECTIONS}
  current = json.loads(config.to_json())
  return config_changes(_recorded(path, current) | free, current | free)


def record_config(config: ml_collections.ConfigDict, workdir: Path, *, allow_change: bool):
  """Writes workdir/config.json, after checking a previous run there used the same config.

  A different config (outside `eval`) raises ValueError listing the changed fields, unless
  `allow_change`: then the old file is kept as config.<n>.json and a warning is logged.
  """
  path = Path(workdir) / CONFIG_FILE
  changes = changes_from_recorded(config, workdir)
  if changes and not allow_change:
    raise ValueError(
      f'{workdir} holds a run with another config ({"; ".join(changes)}): use a new '
      '--workdir, or pass --allow_config_change to continue this run with the new config'
    )
  if changes:
    previous = 1 + sum(1 for _ in path.parent.glob('config.*.json'))
    path.rename(path.parent / f'config.{previous}.json')
    logging.warning('config changed (%s); the old one is config.%d.json', changes, previous)
  path.write_text(config.to_json(indent=2))


def read_config(workdir, flag: str | None = '--workdir') -> ml_collections.ConfigDict:
  """The config a run recorded in workdir/config.json (what the tools that read a finished run
  start from). `flag` names the command-line flag that gave workdir, for the error (None: a
  positional argument).

  Raises:
    FileNotFoundError: no such directory, or no config.json in it.
  """
  workdir = Path(workdir)
  if not workdir.is_dir():
    given = f'{flag}={workdir}' if flag else str(workdir)
    raise FileNotFoundError(f'{given} is not a directory: give the workdir of a run')
  path = workdir / CONFIG_FILE
  if not path.is_file():
    raise FileNotFoundError(f'{path} does not exist: {workdir} holds no relpos run (train first)')
  return ml_collections.ConfigDict(_recorded(path))


class TaskMismatchError(ValueError):
  """The workdir holds a run of another task than the command was given or reads."""

  exit_code = 1


_TASK_NOUNS = {'translate': 'translation', 'char_lm': 'character-LM'}


def check_task(
  workdir, task: str | None, *, flag: str | None = '--workdir', needs: str | None = None
) -> ml_collections.ConfigDict | None:
  """The config recorded in `workdir`, after checking that its run is of `task`: the one
  check of every command that takes a workdir (train.py, eval.py, relpos.tools.translate and
  .sample, relpos.studies.plot, .sweep and .shaw_tables), made before anything else, so that
  a mismatch is named as such rather than as the first file the other task lacks. None when
  the workdir records no run (yet); `task` None checks nothing but reads the config. `flag`:
  as in `read_config`; `needs`: what reads `task` runs, for the message of a command that
  takes no config (default: the config's task).

  Raises:
    TaskMismatchError: the recorded run is of another task.
  """
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    return None
  recorded = read_config(workdir, flag)
  kind = recorded.get('task')
  if task is not None and kind != task:
    given = f'{flag}={workdir}' if flag else str(workdir)
    noun = _TASK_NOUNS.get(task, task)
    todo = (
      f'({needs}): give the workdir of a {noun} run'
      if needs
      else f"(the config's task is {task}): give the workdir of a {noun} run, or a config of "
      f'task {kind} for this one'
    )
    raise TaskMismatchError(f'{given} holds a {kind} run, not a {noun} run {todo}')
  return recorded
