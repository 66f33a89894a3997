r"""Length extrapolation of the position schemes: train short, evaluate long (a sweep preset).

The study is a `relpos.studies.sweep` of config.model.position over these runs:

    python -m relpos.studies.sweep --config=configs/length_extrapolation.py:char \
        --workdir=runs/length_extrapolation/char --field=model.position \
        --values=xl,shaw,absolute,none,t5,alibi,rope --seeds=0,1 \
        --evaluations=tgt_len=64,tgt_len=128,tgt_len=256,tgt_len=512,tgt_len=1024,mem_len=64
    python -m relpos.studies.sweep --config=configs/length_extrapolation.py:translate \
        --workdir=runs/length_extrapolation/translate --field=model.position \
        --values=absolute,shaw,shaw_absolute,none,t5,alibi,rope --seeds=0,1 \
        --by_source_pieces=8,16,32

The second needs the Tatoeba data: `python -m relpos.data.prepare tatoeba --out=data/`. Preset
char_quick is a smoke run of the char study (a tiny model for a few steps).

- char: configs/char_tiny.py trained on segments of L = 64 characters with no memory (so no
  distance >= L is ever seen) for 1000 steps. `--evaluations` scores each model on the test
  split in segments of m * L without memory and in segments of L with a memory of 64 (a context
  never trained with either); every segment after a row's first starts cold, so a scheme that
  extrapolates gets better with m and one that does not gets worse. The grid of schemes by
  setting, with mean ± std, differences from the first scheme and both p-values, is
  `sweep_by_evaluation.md` (docs/results/length_char.*).
- translate: configs/translate_tiny.py trained on the pairs whose sides both have at most
  N = 8 pieces (config.data.max_length) for 400 steps; the whole test set is translated and
  `--by_source_pieces` reports BLEU and the translations' length over the references' per
  bucket of source length in pieces, 1-N, N+1-2N, 2N+1-4N and longer (`sweep_by_pieces.md`;
  `sweep.md` is BLEU over all sentences; docs/results/length_translate.*). 'learned' is left
  out: its rows past N would be untrained initial values, not a position scheme's
  extrapolation.
"""

from pathlib import Path

import ml_collections

from relpos.config import load_config_file, unknown_preset

_CONFIGS = Path(__file__).resolve().parent
PRESETS = ('char', 'char_quick', 'translate')


def _char(preset: str) -> ml_collections.ConfigDict:
  config = load_config_file(_CONFIGS / 'char_tiny.py')
  config.train.update(mem_len=0)
  config.train.update(steps=1000, eval_every=0, checkpoint_every=500)
  config.eval.update(batch_size=4, mem_len=0)
  if preset == 'char_quick':
    config.model.update(num_layers=1, d_model=32, num_heads=2, head_dim=16, d_ff=64)
    config.data.max_bytes = 40_000
    config.train.update(tgt_len=8, batch_size=4, steps=4, log_every=2, checkpoint_every=4)
    config.eval.tgt_len = 8
    config.optim.warmup_steps = 0
  return config


def _translate() -> ml_collections.ConfigDict:
  config = load_config_file(_CONFIGS / 'translate_tiny.py')
  config.data.max_length = 8  # N: training pairs have both sides within N pieces
  config.train.update(steps=400, checkpoint_every=400)
  config.optim.warmup_steps = 200
  return config


def get_config(preset: str = 'char') -> ml_collections.ConfigDict:
  if preset not in PRESETS:
    raise unknown_preset(preset, PRESETS)
  return _translate() if preset == 'translate' else _char(preset)
