"""Length-extrapolation study of the position schemes (read by benchmarks/length_extrapolation.py).

    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py:char \\
        --workdir=runs/length_extrapolation/char
    python benchmarks/length_extrapolation.py --config=configs/length_extrapolation.py:translate \\
        --workdir=runs/length_extrapolation/translate
    (a smoke run of the char study, a tiny model for a few steps: preset char_quick)

- char: every char-LM scheme trains `run` (configs/char_tiny.py, its position replaced) on
  segments of `tgt_len` characters with no memory, for `run.train.steps`, once per seed. Each
  is scored on `run.eval.split` in segments of m * tgt_len for m in `multiples` without
  memory, and in segments of tgt_len with a memory of `memory_len`.
- translate: every translation scheme trains `run` (configs/translate_tiny.py) on the pairs
  whose sides both have at most `max_length` pieces (`run.data.max_length`), then translates
  the whole test set and reports BLEU per source-length bucket: up to N, N to 2N, 2N to 4N
  and longer pieces. 'learned' is left out: its rows past N would be untrained initial values,
  not a position scheme's extrapolation.

Any field can be overridden on the command line, e.g. `--config.run.train.steps=3000`.
"""

from pathlib import Path

import ml_collections

from relpos.config import load_config_file
from relpos.constants import CHAR_LM_POSITIONS, TRANSLATE_POSITIONS

_CONFIGS = Path(__file__).resolve().parent
PRESETS = ('char', 'char_quick', 'translate')


def _run_config(name: str) -> ml_collections.ConfigDict:
  """configs/<name>.py's default config."""
  return load_config_file(_CONFIGS / f'{name}.py')


def _char(config):
  config.positions = CHAR_LM_POSITIONS
  config.tgt_len = 64  # L: training segments, no memory
  config.multiples = (1, 2, 4, 8, 16)  # evaluation segments of m * L, no memory
  config.memory_len = 64  # and segments of L with this memory
  config.run = _run_config('char_tiny')
  config.run.train.update(steps=1000, eval_every=0, checkpoint_every=500)
  config.run.eval.update(batch_size=4, clamp_len=-1, same_length=False)


def _translate(config):
  config.positions = tuple(p for p in TRANSLATE_POSITIONS if p != 'learned')
  config.max_length = 8  # N: training pairs have both sides within N pieces
  config.run = _run_config('translate_tiny')
  config.run.train.update(steps=400, checkpoint_every=400)
  config.run.optim.warmup_steps = 200


def get_config(preset: str = 'char') -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise ValueError(f'unknown length_extrapolation preset {preset!r}: use one of {PRESETS}')
  config = ml_collections.ConfigDict()
  config.task = preset.split('_')[0]
  config.seeds = (0, 1)
  (_char if config.task == 'char' else _translate)(config)
  if preset == 'char_quick':
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
