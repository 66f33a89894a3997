"""The resolved config of a run, kept in its workdir, and the check that a rerun matches it.

It sits with the declarations because it is about them: a recorded config is read back with
the fields it lacks filled from their declared defaults (`with_added`), and compared with the
current one field by field. `relpos.training.loop` checks a rerun's config before any data is
read and records it once the latest checkpoint restored with it;
the tools that start from a finished run read it (`relpos.training.run_config.read_config`).
"""

import json
from collections.abc import Collection
from pathlib import Path

import ml_collections

from relpos.config import checks, declaration, fields
from relpos.files import write_atomically
from relpos.messages import warn

CONFIG_FILE = 'config.json'
# Sections that may change between runs on one workdir: evaluation settings do not touch what
# was trained.
_FREE_SECTIONS = ('eval',)
# Data fields that say where data are kept, not which data: tensorflow-datasets finds a
# dataset, prepared and versioned, by config.data.tfds_name and its splits, in whichever
# data_dir holds it, so a copied or moved prepared directory is the run's data. Compared as
# a path, it was "other data": an evaluation refused to score into the workdir, a sweep
# called the run stale, a resume asked for --allow_config_change.
DATA_LOCATIONS = ('data.tfds_data_dir',)


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


def check_known_fields(recorded: dict, path: Path) -> None:
  """Checks that every field of the sections of `recorded` (the config at `path`) is one its
  task declares, or an older name of one (`checks.RENAMED`).

  A field this version does not know was recorded by another version of relpos (a newer one,
  whose field may change what the run is: a model part, a tokenisation) or added by hand. It
  is refused, not ignored: the model's own check would name it without the file, and a
  comparison with the config given would ask for a config that no config of this version can
  be. Sections its task does not declare are left alone (nothing reads them).

  Raises:
    ValueError: naming the file and the first such field.
  """
  declared = declaration(recorded.get('task'))
  if declared is None:
    return
  unknown = [name for name in fields.undeclared(recorded, declared) if name not in checks.RENAMED]
  if unknown:
    raise ValueError(
      f'{path} records config.{unknown[0]}, a field this version of relpos does not know: the '
      'run was recorded by another version of relpos, or the file was edited by hand; use the '
      f'relpos version that trained it, or remove the field from {path} if it was added by hand'
    )


def read_recorded(path: Path, current: dict | None = None, *, known_fields: bool = True) -> dict:
  """The config recorded at path, `with_added` fields; `known_fields`: whether to check
  them (`check_known_fields`; `relpos.training.run_config.check_task` checks the task first).

  Raises:
    ValueError: the file is not a JSON object, lacks a whole section of its task's config
      (damaged or edited by hand), naming it, or holds a field this version does not know.
  """
  try:
    recorded = json.loads(path.read_text())
  except json.JSONDecodeError as error:
    raise ValueError(
      f'{path} is not valid JSON ({error}): restore it from config.*.json or a copy'
    ) from None
  if not isinstance(recorded, dict):
    raise ValueError(f'{path} holds no config (a JSON object): restore it from a copy')
  declared = declaration(recorded.get('task', (current or {}).get('task')))
  if declared is not None:
    lacking = [
      section
      for section, defaults in fields.defaults(declared).items()
      if isinstance(defaults, dict) and not isinstance(recorded.get(section), dict)
    ]
    if lacking:  # a field may be missing (added since), a whole section only if damaged
      raise ValueError(
        f'{path} has no config.{lacking[0]} section: it is damaged or was edited by hand; '
        'restore it from config.*.json or a copy'
      )
  if known_fields:
    check_known_fields(recorded, path)
  return with_added(recorded, current)


def config_changes(
  old: dict, new: dict, prefix: str = 'config', change: str = '{field}: {before!r} -> {after!r}'
) -> list[str]:
  """'field: old -> new' for every leaf that differs (added and removed fields included);
  `change` formats each line from `field`, `before` and `after`."""
  changes = []
  for name in sorted(set(old) | set(new)):
    field = f'{prefix}.{name}'
    before, after = old.get(name, '<absent>'), new.get(name, '<absent>')
    if isinstance(before, dict) and isinstance(after, dict):
      changes += config_changes(before, after, field, change)
    elif before != after:
      changes.append(change.format(field=field, before=before, after=after))
  return changes


def _recorded_and_current(
  config: ml_collections.ConfigDict, workdir, same_data: Collection[str] = ()
) -> tuple[dict, dict]:
  """(the config recorded in workdir, `with_added` the fields of `config`; `config`), as
  dicts; the first is None when none is recorded.

  `same_data`: the data fields ('config.<section>.<field>') whose path `config` gives
  otherwise than the run recorded it but that name the run's data all the same (the file it
  read, or its bytes: `relpos.training.data_record.same_data`, the one rule of what is the
  same data); they are read as recorded, so that another spelling of the run's data is no
  change of config. What that file holds now is `data_record.changes`'s to compare. The
  fields of `DATA_LOCATIONS` (where tfds keeps its data) are read as recorded too."""
  path = Path(workdir) / CONFIG_FILE
  current = json.loads(config.to_json())
  if not path.is_file():
    return None, current
  recorded = read_recorded(path, current)
  for name in (*same_data, *DATA_LOCATIONS):
    section, _, field = name.removeprefix('config.').partition('.')
    if field in recorded.get(section, {}) and field in current.get(section, {}):
      current[section][field] = recorded[section][field]
  return recorded, current


def changes_from_recorded(
  config: ml_collections.ConfigDict,
  workdir,
  same_data: Collection[str] = (),
  change: str = '{field}: {before!r} -> {after!r}',
) -> list[str]:
  """`config_changes` from the config recorded in workdir to `config`, outside the sections
  that may change between runs (eval) and the data fields in `same_data` (see
  `_recorded_and_current`); [] when none is recorded. `change`: as in `config_changes`
  ('{field}': the changed fields' dotted names)."""
  recorded, current = _recorded_and_current(config, workdir, same_data)
  if recorded is None:
    return []
  free = {name: None for name in _FREE_SECTIONS}
  return config_changes(recorded | free, current | free, change=change)


def section_changes_from_recorded(
  config: ml_collections.ConfigDict,
  workdir,
  section: str,
  free: tuple[str, ...] = (),
  same_data: Collection[str] = (),
) -> list[str]:
  """ "<section>.<field>: trained <old>, given <new>" for every field of config.<section>
  outside `free` that differs from the run recorded in workdir, the data fields in
  `same_data` read as recorded (`_recorded_and_current`); [] when none is recorded."""
  recorded, current = _recorded_and_current(config, workdir, same_data)
  if recorded is None:
    return []
  ignored = {name: None for name in free}
  return config_changes(
    recorded.get(section, {}) | ignored,
    current.get(section, {}) | ignored,
    section,
    '{field}: trained {before!r}, given {after!r}',
  )


def check_config_change(
  config: ml_collections.ConfigDict,
  workdir: Path,
  *,
  allow_change: bool,
  same_data: Collection[str] = (),
) -> list[str]:
  """The changes from the config recorded in workdir to `config` (outside `eval`, and but
  for the data fields in `same_data`: another spelling of the run's data, see
  `_recorded_and_current`), checked before a run writes or reads anything there.

  Raises:
    ValueError: there are changes and not `allow_change`; the line lists them.
  """
  changes = changes_from_recorded(config, workdir, same_data)
  if changes and not allow_change:
    raise ValueError(
      f'{workdir} holds a run with another config ({"; ".join(changes)}): use a new '
      '--workdir, or pass --allow_config_change to continue this run with the new config'
    )
  return changes


def record_config(
  config: ml_collections.ConfigDict,
  workdir: Path,
  *,
  allow_change: bool,
  same_data: Collection[str] = (),
):
  """Writes workdir/config.json, after `check_config_change` (`same_data` as there).

  A run calls it once its checkpoint restored with `config` (train), so that a change the
  checkpoints refuse (another model's shapes) leaves config.json the run's own. A change
  allowed keeps the old file as config.<n>.json, with a warning.
  """
  path = Path(workdir) / CONFIG_FILE
  changes = check_config_change(config, workdir, allow_change=allow_change, same_data=same_data)
  if changes:
    previous = 1 + sum(1 for _ in path.parent.glob('config.*.json'))
    path.rename(path.parent / f'config.{previous}.json')
    warn(f'config changed ({"; ".join(changes)}); the old one is config.{previous}.json')
  write_atomically(path, config.to_json(indent=2))
