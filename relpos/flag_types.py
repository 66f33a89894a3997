"""absl flag helpers shared by relpos's commands: a comma-separated list of integers, and flag
errors as one line (in relpos's words: `error_line`) for every command.

It imports nothing of relpos but its constants, so that a benchmark or tool can define its flags
at import time, before `relpos.runtime.apply_defaults` and the heavy imports.
"""

import re
import sys

from absl import flags

from relpos.constants import INT32_MAX

# The flags `define_int_list` defines belong to the module that calls it, not to this one, so
# that they are key flags of that command and its `--help` lists them (absl otherwise files them
# under relpos.flag_types, where only `--helpfull` shows them). This module defines no flag.
flags.disclaim_key_flags()


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing for a command without --config (the studies' plot, significance and
  shaw_tables): an unknown, missing or bad flag is one `error:` line and exit status 1, not
  absl's two FATAL lines. (The launchers' `relpos.config.command_line.parse_flags` adds the
  config file's faults.)"""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    sys.exit(f'error: {error_line(str(error).splitlines()[0])}')


# absl's line for a boolean flag given another value: its ValueError's args as a tuple.
_NOT_BOOLEAN = re.compile(r"^(flag --[\w.]+=.*): \('Non-boolean argument to boolean flag', .*\)$")


def error_line(line: str) -> str:
  """absl's one-line flag error `line` in relpos's words where absl's are its internals: a
  boolean flag (`--traceback`, a config's boolean field) given another value than absl takes
  ('yes', '') was "flag --config.model.pre_layer_norm=yes: ('Non-boolean argument to boolean
  flag', 'yes')", a tuple's repr that named no value it takes."""
  if not_boolean := _NOT_BOOLEAN.match(line):
    return f'{not_boolean[1]}: a boolean flag takes true or false (or 1 or 0)'
  return line


class _IntListParser(flags.ArgumentParser):
  """Parses a comma-separated list of integers (`define_int_list`); a ValueError's text is what
  absl's `flag --NAME=VALUE: ...` line says."""

  syntactic_help = 'a comma-separated list of integers'

  def __init__(self, minimum, maximum, distinct: bool, allow_empty: bool):
    self.minimum, self.maximum = minimum, maximum
    self.distinct, self.allow_empty = distinct, allow_empty

  def parse(self, argument) -> list[int]:
    texts = argument if isinstance(argument, list) else str(argument).split(',')
    texts = [str(text).strip() for text in texts]
    if self.allow_empty and not any(texts):
      return []
    try:
      values = [int(text) for text in texts if text]
    except ValueError:
      raise ValueError('give integers, comma-separated') from None
    if not values or len(values) < len(texts):
      raise ValueError('give one or more integers, comma-separated, none empty')
    if self.minimum is not None and min(values) < self.minimum:
      raise ValueError(f'each must be at least {self.minimum}')
    if self.maximum is not None and max(values) > self.maximum:
      raise ValueError(f'each must be at most {self.maximum}')
    if self.distinct and len(set(values)) < len(values):
      raise ValueError('a value is given more than once')
    return values

  def flag_type(self) -> str:
    return 'int list'


def define_int_list(
  name: str,
  default: str,
  help: str,
  *,
  minimum: int | None = None,
  maximum: int | None = INT32_MAX,
  distinct: bool = False,
  allow_empty: bool = False,
  flag_values=flags.FLAGS,
):
  """A flag holding a list of integers, given as `--NAME=1,2,4`: the value is list[int]; a text
  that is not one, one outside [`minimum`, `maximum`] (by default within int32, what JAX
  computes in), (with `distinct`) a repeat, or (without
  `allow_empty`) no value is refused when flags are parsed, as one `error: flag --NAME=VALUE:
  ...` line (`relpos.config.command_line.parse_flags`). The one parser of relpos's integer-list
  flags (sweep seeds, benchmark lengths and distances, device counts)."""
  return flags.DEFINE(
    _IntListParser(minimum, maximum, distinct, allow_empty),
    name,
    default,
    help,
    flag_values,
    serializer=flags.CsvListSerializer(','),
  )
