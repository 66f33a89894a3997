"""A CPU-sized translation Transformer on Tatoeba English-German (163k short everyday pairs).

    python -m relpos.data.prepare tatoeba --out=data/   # once
    python train.py --config=configs/translate_tiny.py:shaw --workdir=runs/tiny_shaw
    python eval.py --config=configs/translate_tiny.py:shaw --workdir=runs/tiny_shaw  # bleu=...

Presets: shaw (k=16, the default) | absolute | learned | shaw_absolute | none | t5 | alibi |
rope, and Shaw et al.'s Table 3 ablations shaw_keys_only (w^K only) | shaw_values_only (w^V
only). The model, the
data and the number of steps are fixed here, so a run learns the same thing on any machine;
docs/translation.md gives its BLEU on Tatoeba test and its wall time on 2 cores. The corpus is
data/tatoeba_ende of this repository, which the prepare command above writes (without it the run
stops with one line naming that command), or $RELPOS_DATA_DIR/tatoeba_ende where that variable
names another data directory (`relpos.data.data_directory`).
Evaluation translates Tatoeba test (2,914 pairs) with beam 4.

The k sweep of Shaw et al. Table 2, and their Table 3 ablation, three seeds each:
    python -m relpos.studies.sweep --config=configs/translate_tiny.py:shaw --workdir=runs/k_sweep \\
        --values=0,1,2,4,16,64 --seeds=0,1,2
    python -m relpos.studies.sweep --config=configs/translate_tiny.py --workdir=runs/ablation \\
        --field=preset --values=shaw,shaw_keys_only,shaw_values_only,none --seeds=0,1,2

OpenNMT toy-ende (WMT pairs, Moses-tokenised) instead, as the peer harness runs it; here the
bundled slice (2,000 training pairs, 200 newstest2013 pairs to evaluate on); the peer harness
reads the whole set (10,000 pairs, OpenNMT-py's data/ folder, relpos/data/samples/README.md):
    python train.py --config=configs/translate_tiny.py:shaw --workdir=runs/toy_shaw \\
        --config.data.train_src=relpos/data/samples/toy_ende/src-train.txt.gz \\
        --config.data.train_tgt=relpos/data/samples/toy_ende/tgt-train.txt.gz \\
        --config.data.eval_src=relpos/data/samples/toy_ende/src-val.txt.gz \\
        --config.data.eval_tgt=relpos/data/samples/toy_ende/tgt-val.txt.gz \\
        --config.data.moses_detokenize=True
"""

from pathlib import Path

from relpos.config import unknown_preset
from relpos.config.translation_defaults import translate_config
from relpos.constants import TRANSLATE_POSITIONS
from relpos.data import data_directory, tatoeba


def tatoeba_directory() -> Path:
  """data/tatoeba_ende of the repository, or of $RELPOS_DATA_DIR (`relpos.data.data_directory`)."""
  return data_directory() / tatoeba.DIRECTORY


# Shaw et al. Table 3: one of the two relative tables left out.
_ABLATIONS = {
  'shaw_keys_only': dict(relative_values=False),
  'shaw_values_only': dict(relative_keys=False),
}


def get_config(preset: str = 'shaw'):
  if preset not in (*TRANSLATE_POSITIONS, *_ABLATIONS):
    raise unknown_preset(preset, (*TRANSLATE_POSITIONS, *_ABLATIONS))
  position = 'shaw' if preset in _ABLATIONS else preset
  config = translate_config()
  train_src, train_tgt = tatoeba.split_files(tatoeba_directory(), 'train')
  eval_src, eval_tgt = tatoeba.split_files(tatoeba_directory(), 'test')
  config.data.update(
    kind='text',
    train_src=str(train_src),
    train_tgt=str(train_tgt),
    eval_src=str(eval_src),
    eval_tgt=str(eval_tgt),
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
    pre_layer_norm=True,
    max_len=256,
  )
  config.optim.update(learning_rate=0.5, warmup_steps=400)
  config.train.update(steps=900, log_every=50, eval_every=0, checkpoint_every=300)
  config.model.update(_ABLATIONS.get(preset, {}))
  return config
