"""Transformer big on WMT14 en-de (Shaw et al. 2018 Table 1, big rows).

    python train.py --config=configs/wmt_big.py:shaw --workdir=runs/wmt_big_shaw
    python eval.py --config=configs/wmt_big.py:shaw --workdir=runs/wmt_big_shaw  # bleu=...

Presets as configs/wmt_base.py. d_model 1024, 16 heads, FFN 4096, dropout 0.3, 300k steps
(the paper's big setting); data as configs/wmt_base.py.
"""

from pathlib import Path

from relpos.config import load_config_file


def get_config(position: str = 'shaw'):
  config = load_config_file(Path(__file__).with_name('wmt_base.py'), position)
  config.model.update(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3)
  config.train.steps = 300_000
  return config
