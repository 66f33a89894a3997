"""How a config field is declared, once: a field of a frozen dataclass with its type, default,
rule and one-line doc, and what is generated from the declarations.

A section of a config (config.data, config.model, ...) is a `section` class whose fields are
`field(default, rule, doc)`s; a task's whole config is a `section` whose fields are its
top-level fields (task, seed) and its sections, each declared with the section class as its
default (`relpos.config.char_lm_defaults.CharLMConfig`). From that one declaration come

- the ml_collections ConfigDict the config files start from (`config_dict`), every field at
  its default, so an override of a field that does not exist fails at parse time;
- the rules the task checks before reading any data (`rules`: dotted path -> `checks.Rule`);
- the values a run recorded before a field existed reads for it (`defaults`, used by
  `relpos.config.recorded`).

A section may extend another and give an inherited field another default with a bare
assignment (`steps = 400_000`): the field keeps its rule and doc, so a field's meaning is
declared once however many tasks use it. The models' sections
(`relpos.config.model_fields`) are the typed configs the layers read.

Adding a field takes its declaration, one `field(...)` line in its section, and its use: the
config files, the checks, the typed config a layer reads and old runs' config.json (read with
the field at its default, so a new field defaults to what runs did before it) follow.
"""

import dataclasses
from typing import Any

import ml_collections

from relpos.config import checks


def field(default, rule: checks.Rule, doc: str, **meta) -> Any:
  """A declared field: its `default`, the `rule` a value must meet and a one-line `doc`;
  `meta` adds facts a section's users read (a model field's `read_by` positions; `path=True`
  for a field that names a file or directory, `paths`)."""
  return dataclasses.field(default=default, metadata={'rule': rule, 'doc': doc, **meta})


def subsection(cls: type, doc: str) -> Any:
  """A field of a task's config that is a whole section, declared by the section class `cls`."""
  return dataclasses.field(default=cls, metadata={'doc': doc})


def section(cls: type) -> type:
  """`cls` as a frozen dataclass; a bare class attribute naming an inherited field (no
  annotation) is that field with a new default, its rule and doc kept."""
  inherited = {
    f.name: f
    for base in reversed(cls.__mro__[1:])
    if dataclasses.is_dataclass(base)
    for f in dataclasses.fields(base)
  }
  annotations = dict(cls.__dict__.get('__annotations__', {}))
  for name, value in list(vars(cls).items()):
    if name in inherited and name not in annotations:
      setattr(cls, name, dataclasses.field(default=value, metadata=inherited[name].metadata))
      annotations[name] = inherited[name].type
  cls.__annotations__ = annotations
  return dataclasses.dataclass(frozen=True)(cls)


def _is_section(value) -> bool:
  return isinstance(value, type) and dataclasses.is_dataclass(value)


def declared(cls: type) -> list[dataclasses.Field]:
  """The fields of `cls` a config holds: those with a default (a typed model config's
  `vocab_size` comes from the data, not the config)."""
  return [f for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING]


def config_dict(cls: type) -> ml_collections.ConfigDict:
  """A ConfigDict of every declared field at its default, sections as nested ConfigDicts; an
  optional field that defaults to None is typed by its rule, so an override still converts."""
  config = ml_collections.ConfigDict()
  for f in declared(cls):
    if _is_section(f.default):
      config[f.name] = config_dict(f.default)
    elif f.default is None:
      config[f.name] = ml_collections.FieldReference(None, field_type=f.metadata['rule'].kind)
    else:
      config[f.name] = f.default
  return config


def defaults(cls: type) -> dict:
  """{field: default} of every declared field, sections as nested dicts (what a recorded
  config that lacks a field reads for it)."""
  return {
    f.name: defaults(f.default) if _is_section(f.default) else f.default for f in declared(cls)
  }


def undeclared(config: dict, cls: type, *, skip=()) -> list[str]:
  """The dotted names of the fields in `config`'s sections (a config as a dict) that the
  sections `cls` declares do not hold: a field of another version of relpos, or one a config
  file added. Sections `cls` does not declare, and those named in `skip`, are left alone."""
  found = []
  for name, default in defaults(cls).items():
    if name not in skip and isinstance(default, dict) and isinstance(config.get(name), dict):
      found += [f'{name}.{field}' for field in config[name] if field not in default]
  return found


def leaves(cls: type, prefix: str = '', *, skip=()) -> dict[str, dataclasses.Field]:
  """{dotted path: field} of every declared field that is no section, sections' fields under
  their section; the sections named in `skip` left out."""
  found = {}
  for f in declared(cls):
    if f.name in skip:
      continue
    if _is_section(f.default):
      found |= leaves(f.default, f'{prefix}{f.name}.')
    else:
      found[f'{prefix}{f.name}'] = f
  return found


def rules(cls: type, *, skip=()) -> dict[str, checks.Rule]:
  """{dotted path: rule} of every declared field (what `checks.check` takes); the sections
  named in `skip` left out (config.model, which its typed config checks)."""
  return {path: f.metadata['rule'] for path, f in leaves(cls, skip=skip).items()}


def paths(cls: type) -> list[str]:
  """The dotted paths of the declared fields that name a file or directory (`path=True`): the
  launchers expand a `~` in them (`relpos.config.command_line.parse_flags`), which the shell
  does not do after `--config.data.path=`."""
  return [path for path, f in leaves(cls).items() if f.metadata.get('path')]


def docs(cls: type) -> dict[str, str]:
  """{dotted path: one-line doc} of every declared field, for help texts and tables."""
  return {path: f.metadata['doc'] for path, f in leaves(cls).items()}
