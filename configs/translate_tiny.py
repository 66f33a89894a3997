"""A CPU-sized translation Transformer on OpenNMT toy-ende (10k real WMT en-de pairs).

    python train.py --config=configs/translate_tiny.py:shaw --workdir=runs/tiny_shaw
    python eval.py --config=configs/translate_tiny.py:shaw --workdir=runs/tiny_shaw  # bleu=...

Presets: shaw (k=16, the default) | absolute | learned | shaw_absolute | none. The data default
to the toy-ende copy next to this repository (../shared/data/wmt_ende_toy); elsewhere pass
--config.data.train_src=... --config.data.train_tgt=... --config.data.eval_src=...
--config.data.eval_tgt=... The files are Moses-tokenised and are detokenised when read.
Evaluation translates the first 1000 sentences of newstest2013 (toy-ende's validation set).

The k sweep of Shaw et al. Table 3:
    python -m relpos.sweep --config=configs/translate_tiny.py:shaw --workdir=runs/k_sweep \\
        --values=0,1,2,4,16,64
"""

from pathlib import Path

from relpos.config.translate import translate_config
from relpos.constants import TRANSLATE_POSITIONS

TOY_ENDE = Path(__file__).resolve().parent.parent.parent / 'shared/data/wmt_ende_toy'


def get_config(position: str = 'shaw'):
  if position not in TRANSLATE_POSITIONS:
    raise ValueError(
      f'unknown translate_tiny preset {position!r}: use one of {TRANSLATE_POSITIONS}'
    )
  config = translate_config()
  config.data.update(
    kind='text',
    train_src=str(TOY_ENDE / 'src-train.txt'),
    train_tgt=str(TOY_ENDE / 'tgt-train.txt'),
    eval_src=str(TOY_ENDE / 'src-val.txt'),
    eval_tgt=str(TOY_ENDE / 'tgt-val.txt'),
    moses_detokenize=True,
    max_eval_examples=1000,
    vocab_size=4000,
    max_length=96,
    max_tokens=2048,
    length_buckets=6,
  )
  config.model.update(
    position=position,
    encoder_layers=3,
    decoder_layers=3,
    d_model=256,
    num_heads=4,
    d_ff=1024,
    dropout=0.1,
    pre_layer_norm=True,
    max_len=256,
  )
  config.optim.update(learning_rate=0.5, warmup_steps=400)
  config.train.update(steps=800, log_every=50, eval_every=400, checkpoint_every=400)
  config.eval.update(beam_size=4, batch_size=64)
  return config
