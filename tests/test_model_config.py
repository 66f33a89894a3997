"""The models' typed configs (TransformerConfig, TransformerXLConfig): every config file's model
section builds one, and an invalid value is a ValueError naming config.model.<field>; no config
file restates a value a field already has."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest
from helpers import REPO, load_config

from relpos.config.char_lm_defaults import char_lm_config
from relpos.config.translation_defaults import translate_config
from relpos.models.transformer import TransformerConfig
from relpos.models.transformer_xl import TransformerXLConfig

MODELS = {
  'translate': (TransformerConfig, translate_config),
  'char_lm': (TransformerXLConfig, char_lm_config),
}
# Every config file with a model section, and each of its presets.
CONFIG_FILES = (
  [
    ('char_tiny', preset, 'char_lm')
    for preset in ('xl', 'xl_nomem', 'shaw', 'absolute', 'none', 't5', 'alibi', 'rope')
  ]
  + [('translate_tiny', preset, 'translate') for preset in ('t5', 'alibi', 'rope')]
  + [
    ('enwik8_base', None, 'char_lm'),
    ('enwik8_large', None, 'char_lm'),
    ('translate_tiny', 'shaw', 'translate'),
    ('translate_overfit', 'absolute', 'translate'),
    ('wmt_base', 'shaw_absolute', 'translate'),
    ('wmt_big', 'learned', 'translate'),
  ]
)


@pytest.mark.parametrize('name, preset, task', CONFIG_FILES)
def test_every_config_file_builds_a_model_config(name, preset, task):
  config = load_config(name, preset)
  model_config = MODELS[task][0].from_section(config.model, vocab_size=256)
  assert model_config.position == config.model.position
  assert model_config.num_heads * model_config.head_dim > 0


def model_config(task, **overrides):
  """The task's default model section with `overrides` (of any type: a dataclass may be built
  without a ConfigDict, which would refuse some), typed."""
  config_class, defaults = MODELS[task]
  return config_class(**{**defaults().model.to_dict(), **overrides}, vocab_size=256)


# (task, overrides, the start of the error): one row per class of invalid value.
BAD_VALUES = [
  # a choice
  ('char_lm', dict(position='learned'), 'config.model.position must be one of'),
  ('translate', dict(dtype='float16'), 'config.model.dtype must be one of'),
  # an int out of range
  ('char_lm', dict(num_heads=0), 'config.model.num_heads must be >= 1, got 0'),
  ('char_lm', dict(head_dim=0), 'config.model.head_dim must be >= 1'),
  ('char_lm', dict(num_layers=0), 'config.model.num_layers must be >= 1'),
  ('translate', dict(decoder_layers=0), 'config.model.decoder_layers must be >= 1'),
  ('translate', dict(d_ff=0), 'config.model.d_ff must be >= 1'),
  ('translate', dict(max_relative_position=-1), 'config.model.max_relative_position must be >='),
  ('translate', dict(max_len=0), 'config.model.max_len must be >= 1'),
  # a float out of range
  ('char_lm', dict(dropout=1.0), 'config.model.dropout must be < 1.0'),
  ('translate', dict(attention_dropout=-0.1), 'config.model.attention_dropout must be >= 0'),
  ('translate', dict(rope_base=0.0), 'config.model.rope_base must be > 0'),
  ('translate', dict(rope_base=1e300), 'config.model.rope_base must be <= 3e+38, got 1e+300'),
  ('char_lm', dict(remat='all'), 'config.model.remat must be one of'),
  ('char_lm', dict(t5_num_buckets=3), 'config.model.t5_num_buckets must be >= 4'),
  # a type: float or bool for an int, int for a bool, str for a float
  ('char_lm', dict(num_layers=2.0), 'config.model.num_layers must be a int'),
  ('translate', dict(d_model=True), 'config.model.d_model must be a int, got True'),
  ('char_lm', dict(untie_r=1), 'config.model.untie_r must be a bool'),
  ('translate', dict(relative_keys=0), 'config.model.relative_keys must be a bool'),
  ('char_lm', dict(dropout='0.1'), 'config.model.dropout must be a float'),
  # across fields: heads of equal width, sinusoids of an even width, Shaw with a table
  ('translate', dict(d_model=18, num_heads=4), 'config.model.d_model=18 must be a multiple of'),
  ('translate', dict(position='absolute', d_model=15, num_heads=3), 'd_model must be even'),
  ('char_lm', dict(position='xl', d_model=15), 'config.model.d_model must be even, got 15'),
  (
    'char_lm',
    dict(position='shaw', relative_keys=False, relative_values=False),
    "config.model.position='shaw' needs config.model.relative_keys or relative_values",
  ),
  (
    'translate',
    dict(position='shaw_absolute', relative_keys=False, relative_values=False),
    'needs config.model.relative_keys',
  ),
  # RoPE rotates pairs; T5's log-spaced buckets start past the exact ones
  ('char_lm', dict(position='rope', head_dim=7), "position='rope' rotates pairs of features"),
  ('translate', dict(position='rope', d_model=15, num_heads=3), 'must be even, got 5'),
  (
    'char_lm',
    dict(position='t5', t5_num_buckets=32, t5_max_distance=16),
    'config.model.t5_max_distance=16 must exceed config.model.t5_num_buckets // 2 = 16',
  ),
  # cuDNN's flash attention with XL's position term as its bias: XL, bfloat16, no dropout
  (
    'char_lm',
    dict(position='shaw', attention_implementation='cudnn', dtype='bfloat16'),
    "config.model.attention_implementation='cudnn' serves position='xl' only",
  ),
  (
    'char_lm',
    dict(position='xl', attention_implementation='cudnn'),
    "attention_implementation='cudnn' needs config.model.dtype='bfloat16', got 'float32'",
  ),
  (
    'char_lm',
    dict(position='xl', attention_implementation='cudnn', dtype='bfloat16', attention_dropout=0.1),
    'config.model.attention_dropout must be 0, got 0.1',
  ),
  # the Mosaic GPU kernels: Shaw and XL, bfloat16, no dropout
  (
    'char_lm',
    dict(position='rope', attention_implementation='mosaic', dtype='bfloat16'),
    "config.model.attention_implementation='mosaic' serves Shaw's and XL's positions",
  ),
  (
    'translate',
    dict(position='shaw', attention_implementation='mosaic', attention_dropout=0.0),
    "attention_implementation='mosaic' needs config.model.dtype='bfloat16', got 'float32'",
  ),
  (
    'char_lm',
    dict(
      position='shaw', attention_implementation='mosaic', dtype='bfloat16', attention_dropout=0.1
    ),
    'config.model.attention_dropout must be 0, got 0.1',
  ),
]


@pytest.mark.parametrize('task, overrides, message', BAD_VALUES)
def test_an_invalid_value_names_its_field(task, overrides, message):
  with pytest.raises(ValueError, match=re.escape(message)) as error:
    model_config(task, **overrides)
  assert '\n' not in str(error.value)


def test_cross_field_rules_apply_to_their_positions_only():
  """An odd d_model is fine without sinusoids, and no table is fine without Shaw."""
  assert model_config('char_lm', position='shaw', d_model=15).d_model == 15
  assert model_config('translate', position='learned', d_model=15, num_heads=3).head_dim == 5
  assert not model_config('char_lm', relative_keys=False, relative_values=False).relative_keys
  xl_cudnn = dict(attention_implementation='cudnn', dtype='bfloat16', attention_dropout=0.0)
  assert model_config('char_lm', position='xl', **xl_cudnn).attention_implementation == 'cudnn'


def test_the_declarations_and_the_training_layer_import_no_kernel():
  """config.model's implementation names and their rules (`relpos.attention.implementations`)
  load no Pallas: the config declarations and the training layer read them without importing
  a kernel module (they did, through pallas_common, for a name list)."""
  script = (
    'import sys, relpos.config.model_fields, relpos.training.task_base; '
    "print(sorted(m for m in sys.modules if 'experimental.pallas' in m or "
    "m.startswith(('relpos.attention.pallas', 'relpos.attention.mosaic'))))"
  )
  env = {**os.environ, 'PYTHONPATH': str(REPO)}
  done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == '[]'


def test_vocab_size_and_section_fields():
  """vocab_size comes from the data (named by the config class); the section must hold every
  field the model reads and nothing else."""
  with pytest.raises(ValueError, match='^TransformerXLConfig.vocab_size must be >= 1'):
    TransformerXLConfig.from_section(char_lm_config().model, vocab_size=0)
  section = translate_config().model
  section.unlock()
  del section['max_len']
  with pytest.raises(ValueError, match='^config.model.max_len is missing'):
    TransformerConfig.from_section(section, vocab_size=8)
  section = char_lm_config().model
  section.unlock()
  section.mem_len = 8  # moved to config.train
  with pytest.raises(ValueError, match='^config.model.mem_len is not a field of'):
    TransformerXLConfig.from_section(section, vocab_size=8)


def _literal_settings(path: Path) -> set[tuple[str, object]]:
  """(field, value) of every literal a config file writes: `x.update(field=<literal>)` and
  `x.field = <literal>` (a value computed from a preset is not one)."""
  settings = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and getattr(node.func, 'attr', None) == 'update':
      pairs = [(keyword.arg, keyword.value) for keyword in node.keywords]
    elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
      pairs = [(node.targets[0].attr, node.value)]
    else:
      continue
    for name, value in pairs:
      try:
        settings.add((name, ast.literal_eval(value)))
      except ValueError:
        pass
  return settings


@pytest.mark.parametrize(
  'name, preset',
  [(name, preset) for name, preset, _ in CONFIG_FILES]
  + [('length_extrapolation', 'char'), ('length_extrapolation', 'translate')],
)
def test_no_config_file_writes_a_value_a_field_already_has(name, preset, monkeypatch):
  """One source per field: a config file changes values only, so that a default lives in its
  declaration (or the config file a preset builds on) alone. Every write a config file makes
  is traced, and a literal that equals the field's value before it is named."""
  configs = REPO / 'configs'
  restated = []

  def record(section, name, value):
    caller = Path(sys._getframe(2).f_code.co_filename)
    if caller.parent == configs and name in section and not isinstance(value, dict):
      before = section[name]
      if type(before) is type(value) and before == value:
        restated.append((caller, name, value))

  update, setattr_ = ml_collections.ConfigDict.update, ml_collections.ConfigDict.__setattr__

  def traced_update(self, *args, **values):
    for key, value in values.items():
      record(self, key, value)
    return update(self, *args, **values)

  def traced_setattr(self, key, value):
    record(self, key, value)
    return setattr_(self, key, value)

  monkeypatch.setattr(ml_collections.ConfigDict, 'update', traced_update)
  monkeypatch.setattr(ml_collections.ConfigDict, '__setattr__', traced_setattr)
  load_config(name, preset)
  found = [
    f'{path.name}: {field}={value!r}'
    for path, field, value in restated
    if (field, value) in _literal_settings(path)
  ]
  assert not found, f'written with the value the field already has: {sorted(set(found))}'


@pytest.mark.parametrize('declaration', [TransformerConfig, TransformerXLConfig])
def test_shaws_fields_are_read_by_the_shaw_positions_of_each_model(declaration):
  # A class attribute of the same name once hid the module's tuple in the class body, and the
  # fields were declared read by no position: a Shaw run's k was called a field it ignores.
  from relpos.config import fields

  read_by = {name: f.metadata.get('read_by', ()) for name, f in fields.leaves(declaration).items()}
  for name in ('max_relative_position', 'relative_keys', 'relative_values'):
    assert 'shaw' in read_by[name], (name, read_by[name])
