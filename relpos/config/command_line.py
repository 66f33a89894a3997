"""The command line of every relpos command that takes a config: `parse_flags`, absl's flag
parsing with each error one line (exit 1) instead of a traceback. train.py and eval.py
(`relpos.training.tasks.launch`), the sweep, and the tools and benchmarks (`relpos.cli.run_main`)
parse theirs here.

Most of it diagnoses --config: a file that is missing, does not load, raises or returns no
ConfigDict (`_config_file_problem`, naming the file and its line), an override of a field the
config lacks or renamed (`_config_flag_problem`), a value of the wrong type (`_wrong_type`), a
--config given twice (`refuse_repeated_config`), a `--config.task` that would switch the task
(`_task_switch_problem`), `--config.<field>=None` for a field that takes None
(`_optional_none_overrides`). The rest is the command line's paths: a leading `~` expanded where
the shell leaves it (`home_expanded`: the path flags `PATH_FLAGS`, --config's file, the config's
declared path fields) and an empty path flag refused (`refuse_empty_paths`).

It imports nothing from relpos.training: the tasks it knows are `relpos.config.TASKS`.
"""

import difflib
import logging as std_logging
import os
import re
import sys
import traceback

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

from relpos import flag_types
from relpos.config import TASKS, checks, declaration, fields, importable_beside
from relpos.faults import exception_chain
from relpos.files import dangling_link


def home_expanded(value: str) -> str:
  """`value` with a leading `~` or `~/` expanded to the home directory: the shell expands it
  only at the start of a word, so `--workdir=~/runs/x` and `--config.data.path=~/a.txt` reach
  relpos as they were typed, and a literal directory named `~` in the working directory is
  never what was meant."""
  return os.path.expanduser(value) if value == '~' or value.startswith('~/') else value


def _config_indices(argv: list[str]) -> list[int]:
  """The index in `argv` of each `--config=VALUE`, or of VALUE after `--config`."""
  indices = []
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      indices.append(i)
    elif arg == '--config' and i + 1 < len(argv):
      indices.append(i + 1)
  return indices


def _config_index(argv: list[str]) -> int | None:
  """The index in `argv` of `--config=VALUE`, or of VALUE after `--config`; None if absent.
  `parse_flags` refuses a repeated --config, so there is one."""
  return next(iter(_config_indices(argv)), None)


def refuse_repeated_config(argv: list[str]) -> None:
  """Exits with one `error:` line naming each --config of `argv` where there is more than
  one (a launch script's, then the user's own): absl used the last, while the lines that name
  the file (`config_arg`) read the first, so a file that raised was '--config: the config did
  not load' or its bare exception, and an override beside two valid files absl's 'flag is
  defined twice'; two valid ones trained with the last in silence."""
  given = [argv[i].removeprefix('--config=') for i in _config_indices(argv)]
  if len(given) > 1:
    sys.exit(f'error: --config is given more than once ({", ".join(given)}): give one')


def config_arg(argv: list[str]) -> str | None:
  """The value of `--config=VALUE` (or `--config VALUE`) in `argv`, None if absent; a leading
  `~` of its file expanded (`home_expanded`)."""
  i = _config_index(argv)
  return None if i is None else home_expanded(argv[i].removeprefix('--config='))


def _home_expanded_config(argv: list[str]) -> list[str]:
  """`argv` with its --config file's leading `~` expanded (`config_arg`)."""
  i = _config_index(argv)
  if i is None:
    return argv
  expanded = list(argv)
  expanded[i] = (
    f'--config={config_arg(argv)}' if argv[i].startswith('--config=') else config_arg(argv)
  )
  return expanded


def expand_config_paths(config) -> None:
  """Expands a leading `~` (`home_expanded`) in each field of `config` that its task declares
  a path (`relpos.config.fields.paths`: config.data.path, translation's files), whether an
  override or the config file set it: a data file named `~/a.txt` was looked for under a
  directory named `~`. A config of no declared task is left as it is."""
  declared = (
    declaration(config.get('task')) if isinstance(config, ml_collections.ConfigDict) else None
  )
  if declared is None:
    return
  for path in fields.paths(declared):
    *sections, name = path.split('.')
    node = config
    for section in sections:
      node = node.get(section) if isinstance(node, ml_collections.ConfigDict) else None
    if isinstance(node, ml_collections.ConfigDict) and isinstance(node.get(name), str):
      node[name] = home_expanded(node[name])


def config_overrides(argv: list[str]) -> list[str]:
  """The `--config.<field>=<value>` overrides of `argv`, each as one text, also where the value
  was given as the next argument (`--config.<field> <value>`)."""
  overrides = []
  for i, arg in enumerate(argv):
    if not arg.startswith('--config.'):
      continue
    if '=' not in arg and i + 1 < len(argv) and not argv[i + 1].startswith('--'):
      arg = f'{arg}={argv[i + 1]}'
    overrides.append(arg)
  return overrides


def _root_cause(error: BaseException) -> BaseException:
  """The innermost exception of `error`'s chain (`exception_chain`: ml_collections wraps a
  config file's own error in an OSError saying "an earlier failure to load")."""
  return exception_chain(error)[-1]


def _config_file_problem(argv: list[str]) -> tuple[str | None, ml_collections.ConfigDict | None]:
  """(one line, None) if --config's file (with its preset after ':') does not load on its own,
  else (None, the config it gives, before any --config.<field> override)."""
  value = config_arg(argv)
  if value is None:
    return None, None
  path = value.split(':')[0]
  if not os.path.isfile(path):
    if problem := dangling_link(path):
      return f'--config={value}: {problem}', None
    what = 'is a directory, not a config file' if os.path.isdir(path) else 'does not exist'
    return f'--config={value}: {path} {what}', None
  alone, alone_argv = flags.FlagValues(), [argv[0], f'--config={value}']
  # sys_argv: ml_collections takes the overrides from sys.argv, not from the parsed list.
  config_flags.DEFINE_config_file('config', None, '', flag_values=alone, sys_argv=alone_argv)
  try:
    alone(alone_argv)
    config = alone['config'].value
    if type(config).__name__ == '_ErrorConfig':
      config.get('task')  # ml_collections' stand-in for a file that did not load: its error
    elif not isinstance(config, ml_collections.ConfigDict):
      returned = 'None' if config is None else type(config).__name__
      return _not_a_config_dict(value, path, returned), None
  except Exception as error:  # noqa: BLE001 (whatever the file raised, reported as one line)
    cause = _root_cause(error)
    if not path.endswith('.py'):  # a run's config.json, say, read as Python
      return (
        f'--config={value}: {path} is no config file: --config takes a config .py file (such '
        "as configs/char_tiny.py); a run's recorded config.json is read from its directory: "
        'give that as --workdir (train.py resumes the run, eval.py scores it) with the config '
        'file it was trained with'
      ), None
    if isinstance(cause, SyntaxError):
      return f'--config={value}: {path} line {cause.lineno}: SyntaxError: {cause.msg}', None
    if isinstance(cause, AttributeError) and 'get_config' in str(cause):
      return f'--config={value}: {path} defines no get_config() returning a ConfigDict', None
    if isinstance(cause, flags.IllegalFlagValueError) and 'other than None' in str(cause):
      return _not_a_config_dict(value, path, 'None'), None
    if isinstance(cause, TypeError) and _takes_no_preset(cause, value):
      return (
        f'--config={value}: {path} has no presets (its get_config() takes no argument): give '
        f'--config={path}'
      ), None
    frame = _last_frame_in(error, path)
    if wrong_type := _wrong_type(error, frame):
      where = f' line {frame.lineno}' if frame else ''
      return f'--config={value}: {path}{where}: {wrong_type}', None
    where = f' at line {frame.lineno}' if frame else ''
    line = _flag_error(cause).removeprefix(f'flag --config={value}: ')
    return f'--config={value}: {path} raised {type(cause).__name__}{where}: {line}', None
  return None, config


def _last_frame_in(error: BaseException, path: str) -> traceback.FrameSummary | None:
  """The innermost frame of the config file at `path` in the tracebacks of `error`'s chain
  (`exception_chain`), None where none runs its code: the root cause's own traceback may hold only a
  library's frames (ml_collections raises a field's cast error again, from its caller's
  line)."""
  frames = [
    frame
    for inner in exception_chain(error)
    for frame in traceback.extract_tb(inner.__traceback__)
    if os.path.abspath(frame.filename) == os.path.abspath(path)
  ]
  return frames[-1] if frames else None


# ml_collections' TypeError for a field of a config file given a value of another type.
_CAST_ERROR = re.compile(
  r"Could not override field '(?P<name>\w+)' \(reference\)\. (?P<value>.*) is of original "
  r"type <class '(?P<given>[\w.]+)'> and cannot be casted to type <class '(?P<type>[\w.]+)'>"
)


def _wrong_type(error: BaseException, frame: traceback.FrameSummary | None) -> str | None:
  """'config.<field> takes an int, not 20.0 (float)' where `error`'s chain holds ml_collections'
  cast error of a field set to a value of another type (`c.train.steps = 20.0`), else None.
  The error names only the field's last part, so its dotted name is read from the config file's
  line (`frame`) where that sets it (`c.train.steps = ...`, `c.train.update(steps=...)`); it
  was the cast error alone, naming neither the field nor the line."""
  cast = next((m for e in exception_chain(error) if (m := _CAST_ERROR.search(str(e)))), None)
  if cast is None:
    return None
  name, field = cast['name'], f'field {cast["name"]!r}'
  if frame is not None and frame.line:
    assigned = re.match(rf'\s*\w+((?:\.\w+)*\.{name})\s*=[^=]', frame.line)
    updated = re.match(rf'\s*\w+((?:\.\w+)*)\.update\(.*\b{name}\s*=', frame.line)
    dotted = (assigned[1] if assigned else f'{updated[1]}.{name}' if updated else '')[1:]
    # A field of a section the file holds under another name (`t = c.train; t.steps = ...`)
    # reads as no declared field: then only its name is given.
    if any(dotted in fields.leaves(declaration(task)) for task in TASKS):
      field = f'config.{dotted}'
  article = 'an' if cast['type'][0] in 'aeiou' else 'a'
  return f'{field} takes {article} {cast["type"]}, not {cast["value"]} ({cast["given"]})'


def _not_a_config_dict(value: str, path: str, returned: str) -> str:
  """The line for --config=`value` whose file's get_config() returned `returned` (None, or the
  name of a type: 'dict', 'list'): a plain dict is a natural first attempt, and it was '--config:
  the config did not load' (a list: an AttributeError the file was blamed for)."""
  article = '' if returned == 'None' else 'a '
  return (
    f'--config={value}: {path}: get_config() returned {article}{returned}, not an '
    'ml_collections.ConfigDict: start from relpos.config.char_lm_defaults.char_lm_config() or '
    'relpos.config.translation_defaults.translate_config() and set its fields, as the files of '
    'configs/ do'
  )


def _takes_no_preset(error: TypeError, value: str) -> bool:
  """Whether `error` is calling a get_config() that takes no argument with the preset of
  --config=`value` (ml_collections passes the text after ':')."""
  return ':' in value and str(error).startswith('get_config() takes 0 positional arguments')


class _NoNoneConfigWarning(std_logging.Filter):
  """Drops ml_collections' warning of a get_config() that returned None, logged (before absl
  logging is set up, so with absl's note on that) at each load: `_config_file_problem` says it
  in the command's one error line."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return 'get_config() returned None' not in record.getMessage()


def _optional_none_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
  """(argv without its `--config.<field>=None` overrides of fields whose rule takes None
  (`relpos.config.checks.Rule.optional`), the fields the last of whose overrides is None):
  ml_collections parses an override by the type of the field's value in the config file, so
  'None' was no int (`--config.data.max_bytes=None`) or the text 'None'; `parse_flags` sets
  these fields to None once the config is parsed. Unchanged where no override is 'None' or the
  config file or its task does not load (the parse says why)."""
  values, spans = {}, {}
  for i, arg in enumerate(argv):
    if not arg.startswith('--config.'):
      continue
    separate = '=' not in arg and i + 1 < len(argv) and not argv[i + 1].startswith('--')
    field, _, value = (f'{arg}={argv[i + 1]}' if separate else arg).partition('=')
    field = field.removeprefix('--config.')
    values[field] = value  # the last override of a field wins
    if value == 'None':
      spans.setdefault(field, []).append(range(i, i + 1 + separate))
  if not spans:
    return argv, []
  problem, config = _config_file_problem(argv)
  declared = None if problem or config is None else declaration(config.get('task'))
  if declared is None:
    return argv, []
  rules = fields.rules(declared, skip=('model',))
  optional = [field for field in spans if field in rules and rules[field].optional]
  dropped = {i for field in optional for span in spans[field] for i in span}
  kept = [arg for i, arg in enumerate(argv) if i not in dropped]
  return kept, [field for field in optional if values[field] == 'None']


def _config_flag_problem(argv: list[str], config) -> str | None:
  """The first --config.<field> override of `argv` naming a renamed field, no field at all of
  `config` (the file's config before overrides) or a whole section (ml_collections' parse error
  of the value, with an AST node's repr, said nothing of that), as one line; None if there is
  none."""
  for arg in argv:
    if not arg.startswith('--config.'):
      continue
    field = arg.removeprefix('--config.').split('=')[0]
    if field in checks.RENAMED:
      return f'--config.{field}: config.{field} is now config.{checks.RENAMED[field]}'
    node = config
    for name in field.split('.'):
      if not isinstance(node, ml_collections.ConfigDict) or name not in node:
        return f'--config.{field}: the config has no field {field}' + _closest_fields(
          field, config, config_arg(argv)
        )
      node = node[name]
    if isinstance(node, ml_collections.ConfigDict):
      some = ', '.join(f'--config.{field}.{name}' for name in list(node)[:2])
      return (
        f'--config.{field}: config.{field} is a section, not a field: set its fields ({some}, ...)'
      )
  return None


def _closest_fields(field: str, config, config_file: str) -> str:
  """'; did you mean X?' (or 'X or Y') for the dotted fields of `config` whose names come
  closest to `field` (difflib's ratio; the last name weighs as much as the whole path, so
  `train.step` finds `train.steps` and `num_steps` finds it too), then where every field is
  listed: `relpos.tools.show_config` for a task's config (`config_file`), the file itself for
  a benchmark's."""
  paths = list(_dotted_fields(config))
  last = {path: path.rpartition('.')[2] for path in paths}
  close = difflib.get_close_matches(field, paths, n=2, cutoff=0.85)
  close += difflib.get_close_matches(field.rpartition('.')[2], set(last.values()), n=2, cutoff=0.6)
  found = [path for path in paths if path in close or last[path] in close]
  found = sorted(found, key=lambda path: -difflib.SequenceMatcher(None, field, path).ratio())
  closest = f'; did you mean {" or ".join(found[:2])}?' if found else ''
  if config.get('task') in TASKS:
    lister = f'`python -m relpos.tools.show_config --config={config_file}` lists'
  else:
    lister = f'{config_file.partition(":")[0]} lists'
  return f'{closest} ({lister} every field)'


def _dotted_fields(config, prefix: str = ''):
  """The dotted path of every field of `config` that is no section."""
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _dotted_fields(value, f'{prefix}{name}.')
    else:
      yield f'{prefix}{name}'


def _task_switch_problem(argv: list[str]) -> str | None:
  """One line where the last `--config.task=` override of `argv` names another task of
  `TASKS` than --config's file builds, else None: the tasks' configs hold other fields, so the
  switched config was refused for a field of the other task it lacks ('config.data.tfds_name is
  missing from the config'), naming neither the override nor the file. A value no task has is
  left to `relpos.training.tasks.get`'s line, and the file is loaded again only where the flag
  is given."""
  given = [
    arg.partition('=')[2] for arg in config_overrides(argv) if arg.startswith('--config.task=')
  ]
  if not given or given[-1] not in TASKS:
    return None
  problem, config = _config_file_problem(argv)
  built = None if problem or config is None else config.get('task')
  if built is None or built == given[-1]:
    return None
  return (
    f'--config.task={given[-1]}: config.task cannot be switched by a flag (each task has its own '
    f'fields): --config={config_arg(argv)} builds a {built!r} config; give a config file of task '
    f'{given[-1]!r}, such as {TASKS[given[-1]].example_config}'
  )


def _flag_error(error: BaseException) -> str:
  """One line for an error raised while parsing flags: a config file (or preset) that raised,
  a value of the wrong type, anything else absl reports."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  if len(lines) > 1:  # a traceback from loading the config file: its first and last lines
    return f'{lines[0].rstrip(":")}: {lines[-1]}'
  return flag_types.error_line(lines[0]) if lines else type(error).__name__


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, each error one line (exit 1) instead of a traceback: a config file
  that is missing, does not parse or raises, an unknown or renamed config field, a preset
  that raised, a value of the wrong type, a --config given twice (`refuse_repeated_config`),
  a `--config.task` naming the other task (`_task_switch_problem`).

  On an error the config file is loaded again on its own, so that a fault of the file is told
  from a fault of an override (ml_collections leaves the flag unset after either, and names
  only the field's last part). A path flag given as `--workdir=~/runs/x` gets its `~`
  expanded, as the shell does for `--workdir ~/runs/x` but not after an `=`
  (`expand_home`), and so do --config's file and the config's path fields
  (`expand_config_paths`): every command that takes a config parses it here.
  `--config.<field>=None` sets a field whose rule takes None to None
  (`_optional_none_overrides`). The config file's directory is importable while it loads
  (`relpos.config.importable_beside`), so it may import a helper module beside it."""
  refuse_repeated_config(argv)
  absl_logger = logging.get_absl_logger()
  absl_logger.addFilter(quiet := _NoNoneConfigWarning())
  argv = _home_expanded_config(argv)
  # A config file imports a module beside it while it loads, here and in every reload below.
  with importable_beside((config_arg(argv) or '').split(':')[0] or None):
    try:
      parsed, to_none = _optional_none_overrides(argv) if 'config' in flags.FLAGS else (argv, [])
      rest = flags.FLAGS(parsed)
      config = flags.FLAGS['config'].value if 'config' in flags.FLAGS else None
      if config is not None and not isinstance(config, ml_collections.ConfigDict):
        # A file that does not load gives a stand-in that raises at its first use, later.
        sys.exit(f'error: {_config_file_problem(argv)[0] or "--config: the config did not load"}')
      if switched := _task_switch_problem(argv):
        sys.exit(f'error: {switched}')
      for field in to_none:
        *sections, name = field.split('.')
        node = config
        for section in sections:
          node = node[section]
        node[name] = None
      expand_home(flags.FLAGS)
      expand_config_paths(config)
      refuse_empty_paths(flags.FLAGS)
      return rest
    except Exception as error:  # noqa: BLE001 (the one line below; --traceback is not parsed yet)
      file_problem, config = _config_file_problem(argv)
      line = file_problem or (config is not None and _config_flag_problem(argv, config))
      sys.exit(f'error: {line or _flag_error(error)}')
    finally:
      absl_logger.removeFilter(quiet)


# The flags that name a path (a workdir, a file written or read) in relpos's commands.
PATH_FLAGS = ('workdir', 'output_dir', 'out', 'zip', 'profile_dir', 'plot')


def expand_home(registry) -> None:
  """Expands a leading `~` or `~/` in the value of each of PATH_FLAGS that was given: a
  literal directory named `~` in the working directory is never what was meant."""
  for name in PATH_FLAGS:
    if name in registry and registry[name].present and isinstance(registry[name].value, str):
      registry[name].value = home_expanded(registry[name].value)


def refuse_empty_paths(registry, workdirs=()) -> None:
  """Exits with one `error:` line when one of PATH_FLAGS was given empty (`--workdir=`, as a
  shell variable that was never set gives it), or one of `workdirs` (a command's positional
  workdirs) is empty: every path function reads '' as the current directory, so train.py
  wrote a whole run there and eval.py's eval_results.json landed beside the code. An empty
  --output_dir is refused too, not read as absent: the command line meant a directory."""
  for name in PATH_FLAGS:
    if name in registry and registry[name].present and registry[name].value == '':
      out = '' if name == 'workdir' else ', or leave the flag out'
      sys.exit(
        f'error: --{name}= is empty: give a path (an empty one is the current directory){out}'
      )
  if '' in workdirs:
    sys.exit('error: a workdir given is empty (""): give the directory of a run')
