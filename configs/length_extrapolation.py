"""Length-extrapolation study of the char LM's position schemes (read by
benchmarks/length_extrapolation.py).

    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py \\
        --workdir=runs/length_extrapolation
    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py:quick \\
        --workdir=/tmp/length_quick   # a smoke run: tiny model, few steps

Every scheme trains `run` (configs/char_tiny.py, with its position replaced) on segments of
`tgt_len` characters with no memory, for `run.train.steps`, once per seed. Each is then scored
on `run.eval.split` in segments of m * tgt_len for m in `multiples`, without memory, and in
segments of tgt_len with a memory of `memory_len`. Any field of the run config can be
overridden on the command line, e.g. `--config.run.train.steps=3000`.
"""

import importlib.util
from pathlib import Path

import ml_collections

from relpos.constants import CHAR_LM_POSITIONS

_CHAR_TINY = Path(__file__).resolve().parent / 'char_tiny.py'


def _char_tiny() -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location('char_tiny', _CHAR_TINY)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config(preset: str = 'full') -> ml_collections.ConfigDict:
  if preset not in ('full', 'quick'):
    raise ValueError(f"unknown length_extrapolation preset {preset!r}: use 'full' or 'quick'")
  config = ml_collections.ConfigDict()
  config.positions = CHAR_LM_POSITIONS
  config.seeds = (0, 1)
  config.tgt_len = 64  # L: training segments, no memory
  config.multiples = (1, 2, 4, 8, 16)  # evaluation segments of m * L, no memory
  config.memory_len = 64  # and segments of L with this memory
  config.run = _char_tiny()
  config.run.train.update(steps=1000, eval_every=0, checkpoint_every=500)
  config.run.eval.update(batch_size=4, clamp_len=-1, same_length=False)
  if preset == 'quick':
    config.positions = ('alibi', 'rope')
    config.seeds = (0,)
    config.tgt_len = 8
    config.multiples = (1, 2)
    config.memory_len = 8
    config.run.model.update(num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=64)
    config.run.data.max_bytes = 40_000
    config.run.train.update(batch_size=4, steps=4, log_every=2, checkpoint_every=4)
    config.run.optim.warmup_steps = 0
  return config
