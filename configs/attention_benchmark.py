"""Attention kernel benchmark sizes (benchmarks/attention.py reads this config).

    python benchmarks/attention.py --config=configs/attention_benchmark.py          # full table
    python benchmarks/attention.py --config=configs/attention_benchmark.py:quick    # ~1 min
    python benchmarks/attention.py --config=configs/attention_benchmark.py \
        --config.lengths=1024 --config.distances=16 --config.rounds=3
"""

import ml_collections


def get_config(preset: str = 'full') -> ml_collections.ConfigDict:
  if preset not in ('full', 'quick'):
    raise ValueError(f"unknown preset {preset!r}: use 'full' or 'quick'")
  config = ml_collections.ConfigDict()
  config.heads = 8
  config.head_dim = 64
  # Every row uses batch = max(1, tokens // n), so rows of different n cost alike.
  config.tokens = 4096
  config.lengths = (128, 512, 2048) if preset == 'full' else (128, 512)
  config.distances = (4, 16, 64) if preset == 'full' else (16,)
  config.rounds = 5  # interleaved timing rounds per row; the median is reported
  return config
