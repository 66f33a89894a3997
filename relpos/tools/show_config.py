"""Prints a config as a run would read it: every field, its value, its default and what it is.

    python -m relpos.tools.show_config --config=configs/char_tiny.py:shaw
    python -m relpos.tools.show_config --config=configs/wmt_base.py:shaw --changed
    python -m relpos.tools.show_config --config=configs/char_tiny.py --config.model.d_model=64

Each field is one line, `section.field = value`, starred where the value is not the field's
declared default (which follows in parentheses), then the field's description: the
declarations (`relpos.config.fields`) are the one source of all three, so this lists every
field a config can set, with its meaning, without reading relpos/config/. Model fields the
config's position scheme never reads (`ModelConfig.unread_fields`), and run fields its model
never reads, are marked `unread`. `--changed` shows only the starred fields. Overrides are
taken as train.py takes them. The config is then checked as train.py checks it before a run
in a new workdir, with the same function (`relpos.training.loop.check_before_run`): its
fields, the batch against this machine's devices, and whether the checkpoints the run will keep
can give config.eval.step and config.eval.average_checkpoints. A value the run cannot use is
one `error:` line after the listing, and exit status 1; a schedule whose warmup outlasts the
run is train.py's `warning:` line. Nothing is trained, compiled, written or read from data
files.
"""

import sys
import textwrap

from absl import flags
from ml_collections import config_flags

from relpos import runtime
from relpos.config import checks, declaration, fields
from relpos.config.command_line import config_arg


def field_lines(config, *, changed_only: bool = False, unread=(), width: int = 100) -> list[str]:
  """The listing: per declared field of config.task's declaration (sections in their declared
  order; a field the config lacks shows as missing) a line `section.field = value`, starred
  with its default where that differs, then its rule and description, indented and wrapped
  at `width`; `unread`: dotted names to mark."""
  declared = declaration(config.get('task'))
  if declared is None:
    raise ValueError(f'config.task={config.get("task")!r} is not a task relpos declares')
  lines = []
  for path, field in fields.leaves(declared).items():
    value = config
    for part in path.split('.'):
      value = value.get(part, _MISSING) if value is not _MISSING else _MISSING
    default = field.default
    differs = value is _MISSING or value != default or type(value) is not type(default)
    if changed_only and not differs:
      continue
    shown = '(missing)' if value is _MISSING else repr(value)
    lines.append(
      f'{"*" if differs else " "} {path} = {shown}'
      + (f'  (default {default!r})' if differs else '')
    )
    about = ('unread by this model; ' if path in unread else '') + field.metadata['doc']
    about += f' [{rule_text(field.metadata["rule"])}]'
    lines += textwrap.wrap(about, width, initial_indent=' ' * 6, subsequent_indent=' ' * 6)
  return lines


def rule_text(rule: checks.Rule) -> str:
  """What a field may hold, in a few words: 'int >= 1', one of its choices, 'or None'."""
  if rule.choices:
    text = 'one of ' + ', '.join(map(repr, rule.choices))
  else:
    text = rule.kind.__name__
    if rule.minimum is not None:
      text += f' {">" if rule.open_minimum else ">="} {rule.minimum:g}'
    if rule.maximum is not None and rule.maximum not in (checks.INT32_MAX, checks.SEED_MAX):
      text += f', {"<" if rule.open_maximum else "<="} {rule.maximum:g}'
  return text + (' or None' if rule.optional else '')


_MISSING = object()


def unread_paths(config) -> set[str]:
  """Dotted names of the fields the model of `config` never reads."""
  from relpos.training import tasks  # noqa: PLC0415 (imports jax: after the flags parsed)

  task = tasks.get(config)
  model = {f'model.{name}' for name in task.unread_fields(config)}
  return model | set(task.unread_run_fields(config))


def main(argv) -> None:
  del argv  # none: `run_main` refuses positional arguments
  from relpos.training import tasks  # noqa: PLC0415

  options = flags.FLAGS
  config = options.config
  task = tasks.get(config, config_arg(sys.argv))  # a config of no task: one line
  try:
    task.check_complete(config)  # unread_paths reads config.model's fields
    unread = unread_paths(config)
  except ValueError:  # listed as it is (a missing field as missing); the check below names it
    unread = set()
  listing = field_lines(config, changed_only=options.changed, unread=unread)
  count = sum(line.startswith('*') for line in field_lines(config, changed_only=True))
  source = config_arg(sys.argv)
  differ = '1 field differs from its' if count == 1 else f'{count} fields differ from their'
  print(f'{source}: task {config.task!r}; {differ} defaults (*)')
  if listing:
    print('\n'.join(listing))
  sys.stdout.flush()
  from relpos.training import loop  # noqa: PLC0415
  from relpos.training import mesh as mesh_lib  # noqa: PLC0415

  # What train.py checks before it trains, on this machine's devices, for a fresh workdir.
  loop.check_before_run(tasks.get(config), config, mesh_lib.data_mesh())


def define_flags() -> None:
  """The command line's flags: defined when it runs, not on import."""
  config_flags.DEFINE_config_file('config', None, 'A config file[:preset], as train.py takes.')
  flags.DEFINE_bool('changed', False, 'Show only the fields whose value is not the default.')
  flags.mark_flags_as_required(['config'])


if __name__ == '__main__':
  runtime.apply_defaults()  # as every command that imports JAX (the config check does)
  define_flags()
  from relpos.cli import run_main

  run_main(main)
