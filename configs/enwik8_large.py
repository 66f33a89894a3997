"""Transformer-XL large on enwik8 (Dai et al. 2019): 24 layers, 1024 hidden, tgt/mem 768.

    python train.py --config=configs/enwik8_large.py --workdir=runs/enwik8_large \
        --config.data.path=/path/to/enwik8.zip
    python eval.py --config=configs/enwik8_large.py --workdir=runs/enwik8_large \
        --config.data.path=/path/to/enwik8.zip   # test bpc, eval tgt/mem/clamp 128/3800/1000

Attention-probability dropout (dropatt) is not supported yet (the kernels do not expose the
probabilities), so this runs with dropatt = 0.
"""

from configs.char_lm_defaults import char_lm_config


def get_config():
  config = char_lm_config()
  config.model.update(
    n_layer=24,
    d_model=1024,
    n_head=8,
    d_head=128,
    d_inner=3072,
    dropout=0.15,
    tgt_len=768,
    mem_len=768,
  )
  config.eval.update(tgt_len=128, mem_len=3800, clamp_len=1000)
  return config
