"""Transformer-XL base on enwik8 (Dai et al. 2019): 12 layers, 512 hidden, tgt/mem 512.

    python -m relpos.data.prepare enwik8 --out=data/   # once: data/enwik8.zip
    python train.py --config=configs/enwik8_base.py --workdir=runs/enwik8_base
    python eval.py --config=configs/enwik8_base.py --workdir=runs/enwik8_base
        # test bpc, eval tgt/mem/clamp 80/2100/820

config.data.path defaults to where the prepare command writes (data/enwik8.zip of the
repository, or $RELPOS_DATA_DIR/enwik8.zip); a copy elsewhere: --config.data.path=<file>.

Published bpc comparisons (1.06 base, 0.99 large) use --config.data.vocab=original, which
drops newline bytes as the original preprocessing did and takes as symbols the bytes of the
train, valid and test splits, as the official code's vocabulary counts all three.
"""

from relpos.config.char_lm_defaults import char_lm_config


def get_config():
  return char_lm_config()
