"""Evaluation-speed benchmark sizes (benchmarks/xl_eval_speed.py reads this config).

    python benchmarks/xl_eval_speed.py --config=configs/xl_eval_speed.py          # full table
    python benchmarks/xl_eval_speed.py --config=configs/xl_eval_speed.py:quick    # L = 128, 256
    python benchmarks/xl_eval_speed.py --config=configs/xl_eval_speed.py:quick \\
        --config.lengths=32, --config.tokens_per_row=32 --config.rounds=1

Transformer-XL (Dai et al. 2019, section 4, "evaluation speed") reports its enwik8 model
evaluating 363x faster than the vanilla model of Al-Rfou et al. (2018) at attention length 800,
on GPU. The default model here is small enough for a CPU; on an accelerator, set the paper's
sizes (--config.num_layers=24 --config.d_model=1024 --config.num_heads=8 --config.head_dim=128
--config.d_ff=3072).
"""

import ml_collections

from relpos.config import unknown_preset


def get_config(preset: str = 'full') -> ml_collections.ConfigDict:
  if preset not in ('full', 'quick'):
    raise unknown_preset(preset, ('full', 'quick'))
  config = ml_collections.ConfigDict()
  # Model: the same for both methods, except the position scheme ('xl' vs 'absolute').
  config.vocab_size = 256  # bytes
  config.num_layers = 4
  config.d_model = 256
  config.num_heads = 4
  config.head_dim = 64
  config.d_ff = 1024
  config.dtype = 'float32'  # compute dtype: 'float32' | 'bfloat16'
  config.batch = 4  # B sequences evaluated side by side
  # Attention lengths L: Transformer-XL evaluates segments of L tokens with a memory of L;
  # the vanilla model re-encodes a window of the previous L tokens for every token.
  config.lengths = (128, 256, 512, 800) if preset == 'full' else (128, 256)
  # Each row of the table times ceil(tokens_per_row / L) calls of each method (at least
  # `rounds`): enough Transformer-XL segments to predict tokens_per_row tokens per sequence.
  # The vanilla model is timed on as many windows (1 token each) and extrapolated per token.
  config.tokens_per_row = 1600 if preset == 'full' else 512
  config.rounds = 3  # minimum number of interleaved timing rounds; the median is reported
  config.seed = 0
  return config
