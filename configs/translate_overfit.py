"""Overfit check: memorise 200 real toy-ende pairs, then translate the same 200 (BLEU ~100).

    python train.py --config=configs/translate_overfit.py --workdir=runs/overfit

Proves tokenisation, beam search (beam 4), detokenisation and sacreBLEU fit together: a model
that has learned its training pairs must score near 100 on them. No dropout, no label
smoothing, constant learning rate after warmup. Preset = position mode (default shaw).
"""

from pathlib import Path

from relpos.config import load_config_file


def get_config(position: str = 'shaw'):
  config = load_config_file(Path(__file__).with_name('translate_tiny.py'), position)
  toy = Path(config.data.train_src).parent  # toy-ende
  config.data.update(
    eval_src=str(toy / 'src-train.txt'),
    eval_tgt=str(toy / 'tgt-train.txt'),
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
  config.train.update(steps=600, log_every=50, eval_every=0, checkpoint_every=0)
  return config
