"""Evaluation speed: Transformer-XL with memory vs a vanilla Transformer that re-encodes windows.

    python benchmarks/xl_eval_speed.py --config=configs/xl_eval_speed.py        # L = 128..800
    python benchmarks/xl_eval_speed.py --config=configs/xl_eval_speed.py:quick  # L = 128, 256

Dai et al. 2019, section 4 ("evaluation speed"): at attention length L,
- Transformer-XL (position='xl', mem_len = L) scores a segment of L tokens per forward call
  and carries the memory to the next segment;
- the vanilla model of Al-Rfou et al. 2018 (the same TransformerXL class with
  position='absolute' and mem_len = 0: same layers, same parameters up to the position scheme)
  re-encodes the window of the previous L tokens for every token and keeps only the last
  position's prediction: one forward of length L per token. B sequences share a call, one
  window per sequence.
One call of each method is one timing sample: a segment (B x L tokens) for Transformer-XL, a
window (B x 1 token) for vanilla. Both calls are jitted, include the cross-entropy of the
predicted tokens, and are compiled before timing (warmup); the median over interleaved rounds
is reported as tokens/s. Parameters and tokens are random: speed does not depend on them.
"""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import config_flags
from timing import interleaved_median_seconds

from relpos import runtime
from relpos.attention import autotune
from relpos.config import checks
from relpos.config.char_lm_defaults import char_lm_config
from relpos.models.transformer_xl import TransformerXL, TransformerXLConfig, nats_per_token

_CONFIG = config_flags.DEFINE_config_file(
  'config',
  str(Path(__file__).resolve().parent.parent / 'configs' / 'xl_eval_speed.py'),
  'Benchmark sizes.',
)

TABLE_HEADER = '| L | XL tokens/s | vanilla tokens/s | speed-up |'


def model_config(config, *, position: str) -> TransformerXLConfig:
  """The char-LM model at the benchmark's size, with position 'xl' or 'absolute'."""
  model = char_lm_config().model
  model.update(
    num_layers=config.num_layers,
    d_model=config.d_model,
    num_heads=config.num_heads,
    head_dim=config.head_dim,
    d_ff=config.d_ff,
    dtype=config.dtype,
    dropout=0.0,
    position=position,
  )
  return TransformerXLConfig.from_section(model, vocab_size=config.vocab_size)


# The rules of configs/xl_eval_speed.py's fields (`relpos.config.checks`); config.lengths must
# be a non-empty list (no length, no row).
RULES = {
  'vocab_size': checks.integer(1),
  'num_layers': checks.integer(1),
  'd_model': checks.integer(1),
  'num_heads': checks.integer(1),
  'head_dim': checks.integer(1),
  'd_ff': checks.integer(1),
  'dtype': checks.one_of('float32', 'bfloat16'),
  'batch': checks.integer(1),
  'tokens_per_row': checks.integer(1),
  'rounds': checks.integer(1),
  'seed': checks.integer(),
}
LISTS = {'lengths': checks.integer(1)}


def check_config(config) -> None:
  """Raises ValueError naming the field for a config this benchmark cannot run, before any
  model is built: another kind of config (--config), a value out of range, no lengths; then
  the two models' own checks (`TransformerXLConfig`)."""
  checks.require_fields(
    config, (*RULES, *LISTS), 'configs/xl_eval_speed.py (num_layers, lengths, batch, ...)'
  )
  checks.check(config, RULES)
  checks.check_sequences(config, LISTS)
  for position in ('xl', 'absolute'):
    model_config(config, position=position)


def parameter_count(model) -> int:
  return sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


def make_steps(xl_model, vanilla_model, length: int, batch: int):
  """The two jitted evaluation calls, each scoring tokens of a stream int32 [batch, time].

  xl_step(state, memory, stream, start) -> (nats [batch, L], memory): the segment
    stream[:, start : start + L] predicting stream[:, start + 1 : start + L + 1].
  vanilla_step(state, stream, start) -> nats [batch]: the window stream[:, start : start + L]
    predicting stream[:, start + L], from the last position's logits only.
  """
  xl_graphdef, xl_state = nnx.split(xl_model)
  vanilla_graphdef, vanilla_state = nnx.split(vanilla_model)

  @jax.jit
  @autotune.forward_only()
  def xl_step(state, memory, stream, start):
    chunk_BT = jax.lax.dynamic_slice_in_dim(stream, start, length + 1, axis=1)
    logits_BTV, memory = nnx.merge(xl_graphdef, state)(chunk_BT[:, :-1], memory, deterministic=True)
    return nats_per_token(logits_BTV, chunk_BT[:, 1:]), memory

  @jax.jit
  @autotune.forward_only()
  def vanilla_step(state, stream, start):
    model = nnx.merge(vanilla_graphdef, state)
    window_BT = jax.lax.dynamic_slice_in_dim(stream, start, length + 1, axis=1)
    logits_BTV, _ = model(window_BT[:, :-1], model.init_memory(batch, 0), deterministic=True)
    return nats_per_token(logits_BTV[:, -1:], window_BT[:, -1:])[:, 0]

  return (xl_step, xl_state), (vanilla_step, vanilla_state)


def measure_row(config, length: int) -> dict:
  """Tokens/s of both methods at attention length L = `length`.

  Returns {'xl_tokens_per_s', 'vanilla_tokens_per_s', 'xl_s', 'vanilla_s', 'calls',
  'xl_params', 'vanilla_params'}; xl_s / vanilla_s are the median seconds of one call.
  """
  batch = config.batch
  segments = math.ceil(config.tokens_per_row / length)
  calls = max(config.rounds, segments)
  xl_model = TransformerXL(model_config(config, position='xl'), rngs=nnx.Rngs(config.seed))
  vanilla_model = TransformerXL(
    model_config(config, position='absolute'), rngs=nnx.Rngs(config.seed)
  )
  (xl_step, xl_state), (vanilla_step, vanilla_state) = make_steps(
    xl_model, vanilla_model, length, batch
  )
  # L tokens of context for the first vanilla window, then the tokens both methods predict.
  rng = np.random.default_rng(config.seed)
  stream = jnp.asarray(
    rng.integers(0, config.vocab_size, (batch, (segments + 1) * length + 1)), jnp.int32
  )
  empty_memory = xl_model.init_memory(batch, length)  # Transformer-XL's memory: L
  walk = {'memory': empty_memory, 'segment': 0, 'window': 0}

  def xl_call():
    """The next segment, carrying the memory; a new pass over the stream starts empty."""
    if walk['segment'] == segments:
      walk['segment'], walk['memory'] = 0, empty_memory
    start = np.int32(length + walk['segment'] * length)
    nats, walk['memory'] = xl_step(xl_state, walk['memory'], stream, start)
    walk['segment'] += 1
    return nats, walk['memory']

  def vanilla_call():
    """The next window: the L tokens before one predicted token, in every sequence."""
    start = np.int32(walk['window'] % (segments * length) + 1)
    walk['window'] += 1
    return vanilla_step(vanilla_state, stream, start)

  seconds = interleaved_median_seconds({'xl': xl_call, 'vanilla': vanilla_call}, rounds=calls)
  return {
    'xl_tokens_per_s': batch * length / seconds['xl'],
    'vanilla_tokens_per_s': batch / seconds['vanilla'],
    'xl_s': seconds['xl'],
    'vanilla_s': seconds['vanilla'],
    'calls': calls,
    'xl_params': parameter_count(xl_model),
    'vanilla_params': parameter_count(vanilla_model),
  }


def _rate(tokens_per_s: float) -> str:
  return f'{tokens_per_s:.0f}' if tokens_per_s >= 100 else f'{tokens_per_s:.3g}'


def table_lines(config):
  """Yields the header line, then the markdown table, one row per L as it is measured."""
  rows = []
  for length in config.lengths:
    row = measure_row(config, length)
    if not rows:
      yield (
        f'device: {jax.devices()[0].device_kind}  model: num_layers={config.num_layers} '
        f'd_model={config.d_model} num_heads={config.num_heads} head_dim={config.head_dim} '
        f'd_ff={config.d_ff} vocab={config.vocab_size} {config.dtype}  '
        f'params: xl {row["xl_params"] / 1e6:.2f}M, vanilla {row["vanilla_params"] / 1e6:.2f}M  '
        f'batch={config.batch}  per L: median of max(rounds={config.rounds}, '
        f'ceil(tokens_per_row={config.tokens_per_row} / L)) interleaved calls of each'
      )
      yield TABLE_HEADER
      yield '|---|---|---|---|'
    rows.append(row)
    speed_up = row['xl_tokens_per_s'] / row['vanilla_tokens_per_s']
    yield (
      f'| {length} | {_rate(row["xl_tokens_per_s"])} | {_rate(row["vanilla_tokens_per_s"])} '
      f'| {speed_up:.1f} |'
    )


def main(argv):
  del argv
  check_config(_CONFIG.value)
  for line in table_lines(_CONFIG.value):
    print(line, flush=True)


if __name__ == '__main__':
  runtime.apply_defaults()  # relpos's allocator (re-executes), as train.py
  from relpos.cli import run_main  # after apply_defaults: it imports jax, as train.py

  run_main(main)
