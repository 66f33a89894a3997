"""The grid of a sweep's runs (`relpos.studies.sweep`): each swept value, seed and
`--evaluations` setting as a config, the command line's texts parsed into them, and the
directory each run trains and is scored in.

Each (value v, seed s) trains and evaluates `--config` with `--config.<field>=v` and
`--config.seed=s` in `<workdir>/<field>=v/seed=s` (the field's last part; the value's '/', NUL
and '%' escaped, and a name past 255 bytes shortened with a hash, `directory_name`, so every run
is a directory of the root's own; a path field's leading `~` expanded, as train.py's).
`--field=preset` sweeps the presets of the config file instead (`--config=<file>:v`), for
variants that differ in several fields, such as Shaw et al.'s keys/values ablation. A field of
config.eval (e.g. `--field=eval.mem_len`) changes only how a model is scored: each seed trains
once, in `<workdir>/trained/seed=s`, and every value scores that checkpoint into its own
`<field>=v/seed=s` (the training's recorded config keeps `--config`'s own eval settings).

`--evaluations=tgt_len=64,tgt_len=256,tgt_len=64+mem_len=64` adds an evaluation-only axis to a
sweep of a training field: each trained model is also scored at every setting (`+` joins
config.eval fields of one setting) into `<field>=v/seed=s/<setting>/`, which
`relpos.studies.sweep_tables` tabulates. configs/length_extrapolation.py is such a study: train
short, evaluate long.

The grid is the one place a run's config and directories are made (`runs`, `run_dir`,
`model_dir`), for the training, the tables and `--print_only`'s commands (`commands`) alike;
nothing parses a directory's name back.

A root is one sweep's: its runs are named by the field's last part alone, so a sweep of
eval.max_relative_position in a root of model.max_relative_position's would score into the
trained runs (replacing their eval_results.json), and any two sweeps there replace each other's
sweep.csv, .md and .png. The root records its field (`FIELD_RECORD`), and a sweep of another
field there is refused before anything is made or trained (`check_root`).
"""

import functools
import hashlib
import json
import shlex
from pathlib import Path

import ml_collections

from relpos.config import checks, declaration, fields, load_config_file
from relpos.config.command_line import home_expanded
from relpos.files import write_atomically
from relpos.messages import warn
from relpos.training import run_config, run_results

PRESET = 'preset'  # --field=preset: each value is a preset of the --config file
EVAL_SECTION = 'eval.'  # a field under it: one training per seed, scored at every value


def preset_variants(path, overrides: list[str]):
  """value -> the config file's get_config(value) with the command line's `--config.a.b=v`
  overrides applied (those of --config's own preset apply to every preset)."""

  def variant(preset: str) -> ml_collections.ConfigDict:
    try:
      config = load_config_file(Path(path), preset)
    except ValueError as error:  # a preset it lacks (`unknown_preset` names no file): this one
      raise ValueError(f'{path}: {error}') from None
    for override in overrides:
      name, text = override.removeprefix('--config.').split('=', 1)
      config = with_value(config, name, parse_value(config, name, text, flag=override))
    return config

  return variant


TRUE_TEXTS, FALSE_TEXTS = ('1', 'true', 'yes'), ('0', 'false', 'no')


def field_type(config: ml_collections.ConfigDict, field: str, flag: str) -> type:
  """The type of config.<field>; ValueError naming `flag` (the option that named the field)
  when the config has no such field, or it names a whole section (`--field=model`)."""
  node = config
  *parents, leaf = field.split('.')
  for name in parents:
    node = node.get(name)
    if not isinstance(node, ml_collections.ConfigDict):
      raise ValueError(f'{flag}: the config has no section {name!r} (no field {field})')
  if leaf not in node:
    raise ValueError(f'{flag}: the config has no field {field}')
  if isinstance(node[leaf], ml_collections.ConfigDict):
    example = next(iter(node[leaf]), 'name')
    raise ValueError(
      f'{flag}: config.{field} is a section, not a field: give one of its fields, such as '
      f'{field}.{example}'
    )
  return type(node[leaf])


@functools.cache
def declared_rules(task) -> dict[str, checks.Rule]:
  """{dotted field: rule} of every field config.task `task` declares ({} for another task)."""
  declared = declaration(task)
  return {} if declared is None else fields.rules(declared)


@functools.cache
def declared_paths(task) -> frozenset[str]:
  """The dotted fields config.task `task` declares a file or directory (`fields.paths`)."""
  declared = declaration(task)
  return frozenset() if declared is None else frozenset(fields.paths(declared))


def parse_value(config: ml_collections.ConfigDict, field: str, text: str, flag: str = '--values'):
  """`text` converted to the type of config.<field>; ValueError naming `flag`, the option the
  text came from, for an unknown field or a text that is not of the field's type (a bool is
  one of 1/true/yes or 0/false/no). The type is the declared one (`relpos.config.fields`)
  where the task declares the field, so that a field that is None by default (an optional
  one, which 'None' sets back) still converts; else the value's own. A field declared a path
  (`declared_paths`) has a leading `~` expanded, as `--config.data.path=~/a.txt` has
  (`home_expanded`): the shell leaves it in `--values=~/a.txt,~/b.txt`."""
  kind = field_type(config, field, flag)
  if field in declared_paths(config.get('task')):
    text = home_expanded(text)
  rule = declared_rules(config.get('task')).get(field)
  if rule is not None:
    if rule.optional and text == 'None':
      return None
    kind = rule.kind
  if kind is bool:
    if text.lower() not in TRUE_TEXTS + FALSE_TEXTS:
      raise ValueError(f'{flag}: {text!r} is not a bool, as {field} is (true or false)')
    return text.lower() in TRUE_TEXTS
  try:
    return kind(text)
  except ValueError:
    raise ValueError(f'{flag}: {text!r} is not a {kind.__name__}, as {field} is') from None


def with_value(config: ml_collections.ConfigDict, field: str, value) -> ml_collections.ConfigDict:
  """A copy of `config` with config.<field> = value."""
  copy = ml_collections.ConfigDict(config.to_dict())
  node = copy
  *parents, leaf = field.split('.')
  for name in parents:
    node = node[name]
  node[leaf] = value
  return copy


def parse_evaluations(config, texts) -> dict[str, dict]:
  """{setting: {eval field: value}} of `--evaluations`: each text one evaluation setting,
  `field=value` pairs of config.eval joined by '+' (`tgt_len=64+mem_len=64`), named by its
  text. ValueError for an unknown field or a value of the wrong type."""
  settings = {}
  for text in texts:
    overrides = {}
    for part in text.split('+'):
      name, equals, value = part.partition('=')
      if not equals:
        raise ValueError(f'--evaluations: {text!r} is not field=value[+field=value...]')
      field = EVAL_SECTION + name.removeprefix(EVAL_SECTION)
      overrides[field] = parse_value(config, field, value, flag=f'--evaluations={text}')
    settings[text] = overrides
  return settings


def check_values(values: list) -> None:
  """ValueError for an empty --values or one holding a value twice (a run would repeat)."""
  if not values:
    raise ValueError('--values is empty: give the values to sweep, comma-separated')
  repeated = sorted({str(v) for v in values if values.count(v) > 1})
  if repeated:
    raise ValueError(f'--values gives {", ".join(repeated)} more than once')


def check_evaluations(field: str, evaluations: dict) -> None:
  """ValueError for `--evaluations` on a sweep of an eval field, which has one axis only."""
  if evaluations and field.startswith(EVAL_SECTION):
    raise ValueError(
      f'--evaluations with --field={field}: an eval field is an evaluation axis already; '
      'give its values in --evaluations and sweep a training field'
    )


def evaluated(config, overrides: dict) -> ml_collections.ConfigDict:
  """`config` with the eval fields of one `parse_evaluations` setting."""
  for field, value in overrides.items():
    config = with_value(config, field, value)
  return config


# What a value's text may not hold in a directory name, escaped as `%XX` (its code in hex) by
# `directory_name`: the separator, NUL, and the escape character itself.
_UNSAFE_IN_NAMES = '%/\0'
# The most bytes a directory name may have (Linux's NAME_MAX, that of ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255
# What ends a name `directory_name` shortened, before its hash: '%' followed by what is not two
# hex digits, which no escaped name holds.
_SHORTENED = '%-'
_DIGEST_CHARS = 16


def directory_name(text: str) -> str:
  """`text` as one directory name: each character of _UNSAFE_IN_NAMES as `%XX`, the rest as
  it is. A '/' would nest the run's directory or, in a value such as `../a.txt` or an
  absolute path, put it outside the sweep's root; with '%' escaped too the name is
  `urllib.parse.unquote`'s to read back and two values never share one. The names a value
  of a number, a bool or a name (`shaw`, `tgt_len=64+mem_len=64`) gives are those of
  `str(value)`, as before, so sweeps already on disk find their runs. A name of '.' or '..'
  cannot arise: `run_dir`'s names start with the field's name and '='.

  A name over NAME_MAX bytes (a long path value, its '/' tripled by the escape) is one no
  filesystem takes: the sweep ended in a traceback (File name too long). It is shortened to
  its first bytes, `_SHORTENED` and the start of the SHA-256 of the whole name: the same text
  always gives the same name (a rerun finds its runs), two texts with the same beginning get
  two, and no name short enough to be kept as it is ends so (an escaped name has no '%'
  without two hex digits after it). Only the tables show the value
  (`sweep_tables.value_label`); the name of such a run is not read back."""
  name = ''.join(f'%{ord(c):02X}' if c in _UNSAFE_IN_NAMES else c for c in text)
  encoded = name.encode('utf-8', 'surrogateescape')
  if len(encoded) <= NAME_MAX:
    return name
  digest = hashlib.sha256(encoded).hexdigest()[:_DIGEST_CHARS]
  kept = NAME_MAX - len(_SHORTENED) - _DIGEST_CHARS
  # A character cut in two is left out whole ('ignore'): the name stays valid UTF-8.
  prefix = encoded[:kept].decode('utf-8', 'ignore')
  return f'{prefix}{_SHORTENED}{digest}'


def run_dir(root: Path, field: str, value, seed: int, evaluation: str | None = None) -> Path:
  """Where the run of (value, seed) keeps its eval_results.json (and, unless the field is
  an eval field, its checkpoints): `<root>/<field's last part>=<value>/seed=<seed>`, the
  value as one directory name (`directory_name`), so a run is always a directory of the
  root's own; that of an `--evaluations` setting, in a folder of the setting's name below.
  The one place a run's directory is named (`run_config.SWEEP_RUNS` is its pattern); the
  tables take the value from the sweep's --values, and only `root_fields`, for a root older
  than its field record, reads a field back from the names."""
  directory = root / directory_name(f'{field.split(".")[-1]}={value}') / f'seed={seed}'
  return directory / directory_name(evaluation) if evaluation else directory


def model_dir(root: Path, field: str, value, seed: int) -> Path:
  """Where the run of (value, seed) trains: its run_dir, or for an eval field the seed's one
  training, shared by every value."""
  if field.startswith(EVAL_SECTION):
    return root / run_config.SWEEP_TRAINED / f'seed={seed}'
  return run_dir(root, field, value, seed)


def as_trained(config, field: str, variant) -> ml_collections.ConfigDict:
  """The config that trains `variant`'s model: for an eval field, with the evaluation settings
  of `config` rather than the swept value, so that the one training every value shares keeps
  its own in its workdir (eval.py, relpos.tools.translate and relpos.tools.sample read them
  there)."""
  if not field.startswith(EVAL_SECTION):
    return variant
  trained = ml_collections.ConfigDict(variant.to_dict())
  trained.eval = ml_collections.ConfigDict(config.eval.to_dict())
  return trained


def runs(config, field: str, values, seeds, variant_of=None):
  """(value, seed, config) of every run, value-major. `variant_of` (value -> config, as
  `preset_variants` gives) replaces setting config.<field>."""
  for value in values:
    for seed in seeds:
      variant = with_value(config, field, value) if variant_of is None else variant_of(value)
      variant.seed = seed
      yield value, seed, variant


def commands(
  config_arg: str, overrides: list[str], root: Path, field: str, values, seeds, evaluations=None
):
  """The shell commands that train and evaluate every run (at each of `evaluations`, given),
  each argument quoted for the shell where it needs it (a workdir with spaces, say): what the
  sweep itself runs (`relpos.studies.sweep.train_unfinished`). train.py scores its run into its
  workdir with the config's own evaluation settings, so an eval.py line follows only for a
  score it does not write: an `--evaluations` setting, or a value of an eval field (scored
  from the seed's one training, `model_dir`, which trains with `--config`'s own config.eval as
  the sweep's does, `as_trained`). An eval.py line for the workdir train.py just scored scored
  the run again (a full test pass each)."""

  def command(*args) -> str:
    return ' '.join(shlex.quote(str(arg)) for arg in args)

  lines = []
  for value in values:
    for seed in seeds:
      if field == PRESET:
        chosen = [f'--config={config_arg.split(":")[0]}:{value}', *overrides]
      else:
        chosen = [f'--config={config_arg}', *overrides, f'--config.{field}={value}']
      chosen.append(f'--config.seed={seed}')
      workdir, results_dir = model_dir(root, field, value, seed), run_dir(root, field, value, seed)
      if workdir == results_dir:
        lines.append(command('python', 'train.py', *chosen, f'--workdir={workdir}'))
      elif value == values[0]:  # an eval field: one training per seed, with --config's config.eval
        # --config and its overrides as given (an override of the swept eval field too: the
        # sweep trains with it), without the swept value.
        trained = [f'--config={config_arg}', *overrides, f'--config.seed={seed}']
        lines.append(command('python', 'train.py', *trained, f'--workdir={workdir}'))
      for setting, eval_fields in (evaluations or {None: {}}).items():
        scored = [f'--config.{name}={v}' for name, v in eval_fields.items()]
        output_dir = run_dir(root, field, value, seed, setting)
        if output_dir == workdir and not scored:
          continue  # train.py's own score
        output = [] if workdir == output_dir else [f'--output_dir={output_dir}']
        lines.append(
          command('python', 'eval.py', *chosen, *scored, f'--workdir={workdir}', *output)
        )
  return lines


# The root's record of the field its sweep varies (`record_field`, `check_root`).
FIELD_RECORD = 'sweep_field.json'


def _trained_field(config_file: Path, directory: str) -> str:
  """The field of the training sweep whose run directory `directory` (`<leaf>=<value>`)
  recorded `config_file`: the recorded field of that last part whose value gives the name
  (`run_dir`), else the first of that last part, else `...<leaf>` (a damaged record)."""
  leaf = directory.split('=', 1)[0]
  if leaf == PRESET:
    return PRESET
  try:
    recorded = json.loads(config_file.read_text())
  except (OSError, ValueError):
    recorded = None
  named = []

  def visit(node, prefix):
    for name, value in node.items():
      if isinstance(value, dict):
        visit(value, f'{prefix}{name}.')
      elif name == leaf:
        named.append((f'{prefix}{name}', value))

  if isinstance(recorded, dict):
    visit(recorded, '')
  for field, value in named:
    if directory_name(f'{leaf}={value}') == directory:
      return field
  return named[0][0] if named else f'...{leaf}'


def root_fields(root: Path) -> tuple[list[str], bool]:
  """The fields of the sweeps `root` holds, and whether the root recorded them: its record's
  one (`FIELD_RECORD`); for a root an older relpos made, which has none (or a damaged one),
  those its run directories `<leaf>=<value>/seed=<s>` show: one that trained
  (config.json) is of the training field whose last part the name gives (`_trained_field`), one
  that holds only eval_results.json beside a trained/seed=<s> run of the eval field
  (`model_dir`); results copied without their runs (for --collect_only) tell nothing. ([],
  False) for a root with no sweep (or none yet)."""
  try:
    field = json.loads((root / FIELD_RECORD).read_text())['field']
    if isinstance(field, str):
      return [field], True
  except (OSError, ValueError, KeyError, TypeError):
    pass
  fields = []
  trained_once = any(
    (run / run_config.CONFIG_FILE).is_file()
    for run in root.glob(f'{run_config.SWEEP_TRAINED}/seed=*')
  )
  for run in sorted(root.glob(run_config.SWEEP_RUNS)):
    if (run / run_config.CONFIG_FILE).is_file():
      field = _trained_field(run / run_config.CONFIG_FILE, run.parent.name)
    elif trained_once and (run / run_results.RESULTS_FILE).is_file():
      field = EVAL_SECTION + run.parent.name.split('=', 1)[0]
    else:
      continue  # a run that never started, or a result copied alone (--collect_only's)
    if field not in fields:
      fields.append(field)
  return fields, False


def _last_part(field: str) -> str:
  return field.split('.')[-1]


def check_root(root: Path, field: str) -> None:
  """Raises ValueError, before the sweep of `field` makes or trains anything in `root`, where
  the root holds the sweep of another field (`root_fields`): as recorded, or, in a root an older
  relpos made, where no run of `field` is there or one of another field has the same last
  part (its run directories are this sweep's: an eval field's values score into a training
  field's trained runs; a training field's values train in directories holding only an eval
  field's scores). Adding values, seeds or `--evaluations` to the same field's sweep is that
  sweep. An older root holding runs of this field and of others with other names (sweeps that
  shared it, before the record) goes on as before, with a warning that their tables replace
  each other's, and is not recorded as this field's."""
  fields, recorded = root_fields(root)
  others = [other for other in fields if other != field]
  if not others:
    return
  same_names = [other for other in others if _last_part(other) == _last_part(field)]
  if recorded or field not in fields or same_names:
    where = f'its {FIELD_RECORD}' if recorded else 'as its run directories show'
    clash = (
      f', whose run directories {_last_part(field)}=<value>/seed=<s> a sweep of {field} would '
      'write into'
      if same_names
      else ', whose tables (sweep.csv, .md, .png) a sweep of another field replaces'
    )
    raise ValueError(
      f'--workdir={root} holds the sweep of {", ".join(others)} ({where}){clash}; '
      f"a root is one sweep's: give the sweep of {field} another --workdir"
    )
  warn(
    f'--workdir={root} holds the runs of sweeps of {", ".join(fields)} (made before roots '
    f"recorded their field), which replace each other's sweep.csv, .md and .png; a new "
    f'sweep is best given a --workdir of its own'
  )


def record_field(root: Path, field: str) -> None:
  """Records `field` as the sweep of `root` (`FIELD_RECORD`), after `check_root`, before its
  first run trains (or --collect_only writes its tables): also in a root an older relpos made
  for this field alone, not in one holding several fields' runs (`check_root`'s warning)."""
  fields, recorded = root_fields(root)
  if not recorded and fields in ([], [field]):
    write_atomically(root / FIELD_RECORD, json.dumps({'field': field}) + '\n')
