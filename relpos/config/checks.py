"""Rules for config fields (type, range, choices) and the check that applies them.

Every field declares its rule (`relpos.config.fields.field`); a task checks the rules of its
declaration, and its cross-field rules, before reading any data, so that a bad value ends the
run with one line naming the field. The model sections are checked the same way by the
models' typed configs (`relpos.config.model_fields`). `RENAMED` maps the fields of older
configs to their current names, so a command line written for them gets a line saying what to
write instead.
"""

import dataclasses
import math
from collections.abc import Mapping

from relpos.constants import INT32_MAX

# Old field -> current field (the char LM took the translation model's vocabulary).
RENAMED = {
  'model.attention': 'model.position',
  'model.n_layer': 'model.num_layers',
  'model.n_head': 'model.num_heads',
  'model.d_head': 'model.head_dim',
  'model.d_inner': 'model.d_ff',
  'model.dropatt': 'model.attention_dropout',
  'model.pre_lnorm': 'model.pre_layer_norm',
  'model.tgt_len': 'train.tgt_len',
  'model.mem_len': 'train.mem_len',
  'model.clamp_len': 'train.clamp_len',
  'model.same_length': 'train.same_length',
}


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field may hold: a value of `kind` (bool is not an int; an int is a float)
  between `minimum` and `maximum` (each excluded if `open_minimum` / `open_maximum`), or one
  of `choices`; None too if `optional`."""

  kind: type
  minimum: float | None = None
  maximum: float | None = None
  open_minimum: bool = False
  open_maximum: bool = False
  choices: tuple = ()
  optional: bool = False

  def problem(self, value) -> str | None:
    """Why `value` breaks the rule ('must be ...'), or None."""
    if value is None and self.optional:
      return None
    kinds = (int, float) if self.kind is float else (self.kind,)
    if isinstance(value, bool) and self.kind is not bool or not isinstance(value, kinds):
      return f'must be a {self.kind.__name__}, got {value!r} ({type(value).__name__})'
    if self.choices and value not in self.choices:
      return f'must be one of {self.choices}, got {value!r}'
    if self.kind is float and not math.isfinite(value):
      return f'must be finite, got {value!r}'
    if self.minimum is not None:
      if value < self.minimum or self.open_minimum and value == self.minimum:
        return f'must be {">" if self.open_minimum else ">="} {self.minimum}, got {value!r}'
    if self.maximum is not None:
      if value > self.maximum or self.open_maximum and value == self.maximum:
        return f'must be {"<" if self.open_maximum else "<="} {self.maximum}, got {value!r}'
    return None


# Seeds: JAX's PRNG keys and nnx.Rngs keep 32 bits, so 2**32 + s would be seed s again.
SEED_MAX = 2**32 - 1


def integer(minimum: int | None = None, maximum: int | None = INT32_MAX, *, optional=False) -> Rule:
  return Rule(int, minimum, maximum, optional=optional)


def number(minimum: float | None = None, maximum: float | None = None) -> Rule:
  return Rule(float, minimum, maximum)


def positive() -> Rule:
  """A float > 0 (learning rates, epsilons)."""
  return Rule(float, 0.0, open_minimum=True)


def fraction() -> Rule:
  """A probability in [0, 1): dropout rates, Adam's betas, label smoothing."""
  return Rule(float, 0.0, 1.0, open_maximum=True)


def one_of(*choices) -> Rule:
  return Rule(type(choices[0]), choices=choices)


FLAG = Rule(bool)
TEXT = Rule(str)
OPTIONAL_TEXT = Rule(str, optional=True)


def _field(config: Mapping, path: str, prefix: str):
  """config.<path> (dotted); ValueError naming `prefix`.<path> when it is missing."""
  node, names = config, path.split('.')
  for depth, name in enumerate(names):
    if name not in node:  # a whole section missing is named as such
      raise ValueError(f'{prefix}.{".".join(names[: depth + 1])} is missing from the config')
    node = node[name]
  return node


def check_present(config: Mapping, paths, prefix: str = 'config') -> None:
  """ValueError naming `prefix`.<path> for the first of `paths` (dotted) that `config` lacks,
  a whole section included: what every check of values needs first."""
  for path in paths:
    _field(config, path, prefix)


def require_fields(config: Mapping, fields, kind: str) -> None:
  """ValueError naming --config unless `config` has every top-level field of `fields`: a
  command given a config of another kind (`kind` says which it reads) fails on its first
  missing field instead of deep inside with a KeyError."""
  missing = [field for field in fields if field not in config]
  if missing:
    raise ValueError(
      f'--config: config.{missing[0]} is missing: this command reads a config of {kind}'
    )


def check(config: Mapping, rules: Mapping[str, Rule], prefix: str = 'config') -> None:
  """Raises ValueError('<prefix>.<field> must be ..., got ...') for the first field of
  `rules` (dotted paths into `config`) whose value breaks its rule; a missing field is an
  error too."""
  for path, rule in rules.items():
    node = _field(config, path, prefix)
    problem = rule.problem(node)
    if problem:
      raise ValueError(f'{prefix}.{path} {problem}')


def check_sequences(config: Mapping, rules: Mapping[str, Rule], prefix: str = 'config') -> None:
  """`check` for list fields (a benchmark's lengths, say): raises ValueError naming the first
  field of `rules` that is missing, not a non-empty list or tuple, or has an entry that breaks
  its rule (a table of no rows is no answer)."""
  for path, rule in rules.items():
    node = _field(config, path, prefix)
    if not isinstance(node, list | tuple) or not node:
      raise ValueError(f'{prefix}.{path} must be a non-empty list, got {node!r}')
    for entry in node:
      if problem := rule.problem(entry):
        raise ValueError(f'{prefix}.{path}: each entry {problem}')
