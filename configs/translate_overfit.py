"""Overfit check: memorise 200 real toy-ende pairs, then translate the same 200 (BLEU ~100).

    python train.py --config=configs/translate_overfit.py --workdir=runs/overfit

Proves tokenisation, beam search (beam 4), detokenisation and sacreBLEU fit together: a model
that has learned its training pairs must score near 100 on them. No dropout, no label
smoothing, constant learning rate after warmup. Preset = position mode (default shaw).

The pairs are the first 200 of toy-ende's training set, bundled in relpos/data/samples/toy_ende
(so the command runs from a fresh clone), named here rather than taken from translate_tiny,
which trains on Tatoeba: 200 Tatoeba pairs are too short for a 1000-piece vocabulary.
"""

from pathlib import Path

from relpos.config import load_config_file
from relpos.data import toy_ende


def get_config(position: str = 'shaw'):
  config = load_config_file(Path(__file__).with_name('translate_tiny.py'), position)
  src, tgt = toy_ende('train')
  config.data.update(
    train_src=src,
    train_tgt=tgt,
    eval_src=src,
    eval_tgt=tgt,
    moses_detokenize=True,  # toy-ende is Moses-tokenised
    max_train_examples=200,
    max_eval_examples=200,
    vocab_size=1000,
    max_length=200,  # keep every pair: a dropped pair cannot be learned
    max_tokens=4096,
  )
  config.model.update(dropout=0.0, encoder_layers=2, decoder_layers=2)
  config.optim.update(
    schedule='constant', learning_rate=1e-3, warmup_steps=100, label_smoothing=0.0
  )
  config.train.update(steps=600, checkpoint_every=0)
  return config
