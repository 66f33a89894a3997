"""Each config field is declared once (relpos.config.fields): its ConfigDict, its check, the
typed config the layers read and the value old recorded runs read for it all come from that
declaration, so adding a field takes its declaration and its use, nothing else."""

import dataclasses
import json

import pytest
from flax import nnx

from relpos.config import checks, fields
from relpos.config import recorded as recording
from relpos.config.char_lm_defaults import CharLMConfig, CharLMEval, Span, char_lm_config
from relpos.config.fields import field, section, subsection
from relpos.config.model_fields import TransformerXLConfig
from relpos.config.shared import OptimConfig
from relpos.config.translation_defaults import TranslationConfig, TranslationOptim
from relpos.models import transformer_xl
from relpos.models.multihead_attention import MultiHeadAttention
from relpos.training import char_lm_task, run_config


@section
class GatedXLConfig(TransformerXLConfig):
  """TransformerXLConfig with one more field, declared as any field is (a subclass here, so
  that the test leaves the real declaration alone)."""

  attention_gate: float = field(
    1.0, checks.positive(), 'scales the attention outputs', read_by=('xl',)
  )


@section
class GatedCharLMConfig(CharLMConfig):
  model: type = subsection(GatedXLConfig, 'the Transformer-XL LM, gated')


def test_a_model_field_takes_its_declaration_and_its_use(tmp_path, monkeypatch):
  """The declared field is in the ConfigDict at its default, checked by its rule (one line,
  before any data is read), in the typed config every attention layer gets, unread by the
  positions that do not read it, and read at its default from a run recorded before it."""
  monkeypatch.setattr(char_lm_task.TASK, 'declaration', GatedCharLMConfig)
  monkeypatch.setattr(recording, 'declaration', {'char_lm': GatedCharLMConfig}.get)
  config = fields.config_dict(GatedCharLMConfig)
  assert config.model.attention_gate == 1.0
  config.model.update(num_layers=2, d_model=16, num_heads=2, head_dim=8, d_ff=16)
  config.model.attention_gate = 0.0
  with pytest.raises(ValueError) as error:
    char_lm_task.TASK.check_config(config)
  assert str(error.value) == 'config.model.attention_gate must be > 0.0, got 0.0'

  config.model.attention_gate = 0.5
  char_lm_task.TASK.check_config(config)
  seen = []

  class Spy(MultiHeadAttention):
    def __init__(self, layer_config, **kwargs):
      seen.append(layer_config)
      super().__init__(layer_config, **kwargs)

  monkeypatch.setattr(transformer_xl, 'MultiHeadAttention', Spy)
  transformer_xl.TransformerXL(char_lm_task.model_config(config, 8), rngs=nnx.Rngs(0))
  assert [layer_config.attention_gate for layer_config in seen] == [0.5, 0.5]
  assert 'attention_gate' not in char_lm_task.TASK.unread_fields(config)
  config.model.position = 'shaw'
  assert 'attention_gate' in char_lm_task.TASK.unread_fields(config)

  config.model.attention_gate = 1.0
  recording.record_config(config, tmp_path, allow_change=False)
  path = tmp_path / recording.CONFIG_FILE
  recorded = json.loads(path.read_text())
  del recorded['model']['attention_gate']  # recorded before the field existed
  path.write_text(json.dumps(recorded))
  assert run_config.read_config(tmp_path).model.attention_gate == 1.0
  assert recording.changes_from_recorded(config, tmp_path) == []


def test_a_task_gives_an_inherited_field_its_default_and_keeps_its_rule_and_doc():
  """`tgt_len = 80` in CharLMEval and `b2 = 0.98` in TranslationOptim change defaults only."""
  for section_class, base, name, default in (
    (CharLMEval, Span, 'tgt_len', 80),
    (TranslationOptim, OptimConfig, 'b2', 0.98),
  ):
    declared = {f.name: f for f in dataclasses.fields(section_class)}[name]
    inherited = {f.name: f for f in dataclasses.fields(base)}[name]
    assert declared.default == default != inherited.default
    assert declared.metadata == inherited.metadata and declared.type == inherited.type


@pytest.mark.parametrize('declaration', [CharLMConfig, TranslationConfig])
def test_every_declared_field_has_a_rule_a_doc_and_is_in_the_config_dict(declaration):
  config = fields.config_dict(declaration)
  rules, docs = fields.rules(declaration), fields.docs(declaration)
  assert set(rules) == set(docs) and all(docs.values())
  assert all(isinstance(rule, checks.Rule) for rule in rules.values())
  checks.check(config, rules)  # every default meets its rule
  assert json.loads(config.to_json()) == fields.defaults(declaration)


def test_an_optional_field_keeps_its_type_in_the_config_dict():
  """data.max_bytes defaults to None but takes an int override, as a typed FieldReference."""
  config = char_lm_config()
  config.data.max_bytes = 1000
  assert config.data.max_bytes == 1000
  with pytest.raises(TypeError):
    config.data.max_bytes = 'many'
