"""Transformer-XL large on enwik8 (Dai et al. 2019): 24 layers, 1024 hidden, tgt/mem 768.

    python -m relpos.data.prepare enwik8 --out=data/   # once: data/enwik8.zip
    python train.py --config=configs/enwik8_large.py --workdir=runs/enwik8_large
    python eval.py --config=configs/enwik8_large.py --workdir=runs/enwik8_large
        # test bpc, eval tgt/mem/clamp 128/3800/1000

config.data.path defaults to where the prepare command writes (data/enwik8.zip of the
repository, or $RELPOS_DATA_DIR/enwik8.zip); a copy elsewhere: --config.data.path=<file>.
"""

from relpos.config.char_lm_defaults import char_lm_config


def get_config():
  config = char_lm_config()
  config.model.update(
    num_layers=24,
    d_model=1024,
    head_dim=128,
    d_ff=3072,
    dropout=0.15,
    attention_dropout=0.15,  # as the original run_enwik8_large.sh (base uses 0.0)
  )
  config.train.update(tgt_len=768, mem_len=768)
  # The original run_enwik8_large.sh: 4000 warmup steps, batch 64 (over 16 TPU cores).
  config.optim.warmup_steps = 4000
  config.train.batch_size = 64
  config.eval.update(tgt_len=128, mem_len=3800, clamp_len=1000)
  return config
