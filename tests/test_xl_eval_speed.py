"""benchmarks/xl_eval_speed.py at a tiny size: what each timed call computes, and the table."""

import re
import sys
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import load_config, load_module, one_error_line

from relpos.models.transformer_xl import TransformerXL, nats_per_token

pytestmark = pytest.mark.usefixtures('attention_test_config')

_BENCHMARKS = Path(__file__).resolve().parent.parent / 'benchmarks'
# The benchmark imports its neighbour timing.py, as it does when run as a script.
sys.modules.setdefault('timing', load_module(_BENCHMARKS / 'timing.py', 'timing'))
with warnings.catch_warnings():  # ml_collections loads the default config with load_module()
  warnings.simplefilter('ignore', DeprecationWarning)
  bench = load_module(_BENCHMARKS / 'xl_eval_speed.py', 'xl_eval_speed_benchmark')


@nnx.jit
def forward(model, tokens_BT, memory):
  """The model's own logits and memory (compiled: much faster than eager on CPU)."""
  return model(tokens_BT, memory, deterministic=True)


def tiny_config(lengths=(8,)):
  config = load_config('xl_eval_speed', 'quick')
  config.update(
    vocab_size=11,
    num_layers=1,
    d_model=16,
    num_heads=2,
    head_dim=8,
    d_ff=32,
    batch=2,
    lengths=lengths,
    tokens_per_row=16,
    rounds=1,
  )
  return config


def test_timed_calls_score_the_same_tokens_as_the_models():
  config, length, batch = tiny_config(), 8, 2
  xl = TransformerXL(bench.model_config(config, position='xl'), rngs=nnx.Rngs(0))
  vanilla = TransformerXL(bench.model_config(config, position='absolute'), rngs=nnx.Rngs(1))
  (xl_step, xl_state), (vanilla_step, vanilla_state) = bench.make_steps(xl, vanilla, length, batch)
  stream = jnp.asarray(np.random.default_rng(0).integers(0, 11, (batch, 3 * length + 1)), 'int32')

  # Transformer-XL: two segments with the memory carried = the model called segment by segment.
  memory, expected_memory = xl.init_memory(batch, length), xl.init_memory(batch, length)
  for start in (length, 2 * length):
    nats, memory = xl_step(xl_state, memory, stream, np.int32(start))
    logits, expected_memory = forward(xl, stream[:, start : start + length], expected_memory)
    expected = nats_per_token(logits, stream[:, start + 1 : start + length + 1])
    np.testing.assert_allclose(nats, expected, rtol=1e-5)
    np.testing.assert_allclose(memory.hidden, expected_memory.hidden, rtol=1e-5)
  assert int(memory.length) == length
  assert xl_step._cache_size() == 1  # the carried memory does not retrigger compilation

  # Vanilla: the window of the L tokens before the predicted one, last position only.
  for start in (1, 5):
    nats = vanilla_step(vanilla_state, stream, np.int32(start))
    logits, _ = forward(vanilla, stream[:, start : start + length], vanilla.init_memory(batch, 0))
    expected = nats_per_token(logits[:, -1:], stream[:, start + length : start + length + 1])
    np.testing.assert_allclose(nats, expected[:, 0], rtol=1e-5)
  assert vanilla_step._cache_size() == 1


def test_table_has_one_row_per_length_with_positive_rates():
  lines = list(bench.table_lines(tiny_config(lengths=(4, 8))))
  assert lines[0].startswith('device: ') and 'batch=2' in lines[0]
  assert lines[1] == bench.TABLE_HEADER
  rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[3:]]
  assert [row[0] for row in rows] == ['4', '8']
  for _, xl_rate, vanilla_rate, speed_up in rows:
    xl_rate, vanilla_rate, speed_up = float(xl_rate), float(vanilla_rate), float(speed_up)
    assert xl_rate > 0 and vanilla_rate > 0
    np.testing.assert_allclose(speed_up, xl_rate / vanilla_rate, rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'lengths': ()}, 'config.lengths must be a non-empty list, got ()'),
    ({'lengths': (0,)}, 'config.lengths: each entry must be >= 1, got 0'),
    ({'lengths': (-16,)}, 'config.lengths: each entry must be >= 1, got -16'),
    ({'batch': 0}, 'config.batch must be >= 1, got 0'),
    ({'rounds': 0}, 'config.rounds must be >= 1, got 0'),
    ({'dtype': 'bogus'}, "config.dtype must be one of ('float32', 'bfloat16'), got 'bogus'"),
  ],
)
def test_a_config_it_cannot_run_is_refused_naming_the_field(overrides, message):
  bench.check_config(tiny_config())
  config = tiny_config()
  config.update(overrides)
  with pytest.raises(ValueError, match=re.escape(message)):
    bench.check_config(config)


QUICK = '--config=configs/xl_eval_speed.py:quick'


@pytest.mark.parametrize(
  'args, message',
  [
    (['--config=configs/char_tiny.py'], '--config: config.vocab_size is missing: this command'),
    ([QUICK, '--config.lengths=()'], 'config.lengths must be a non-empty list'),
    ([QUICK, '--config.batch=0'], 'config.batch must be >= 1, got 0'),
    ([QUICK, '--config.lenghts=16,'], '--config.lenghts: the config has no field lenghts'),
  ],
)
def test_the_command_refuses_a_bad_config_in_one_line(commands, args, message):
  result = commands.run(['benchmarks/xl_eval_speed.py', *args], timeout=120)
  assert message in one_error_line(result)
