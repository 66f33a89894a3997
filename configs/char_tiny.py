"""A CPU-sized Transformer-XL character LM on the bundled tinyshakespeare sample.

    python train.py --config=configs/char_tiny.py --workdir=runs/char_tiny
    python eval.py --config=configs/char_tiny.py --workdir=runs/char_tiny   # prints bpc=...

Same model with another position scheme (a fair comparison: only config.model.position changes):
    python train.py --config=configs/char_tiny.py:shaw --workdir=runs/char_tiny_shaw
    (presets: xl | xl_nomem | shaw | absolute | none | t5 | alibi | rope)
Another text file: --config.data.path=/path/to/file.txt (split 90/5/5).
"""

from pathlib import Path

from relpos.config import unknown_preset
from relpos.config.char_lm_defaults import char_lm_config

_SAMPLE = Path(__file__).resolve().parent.parent / 'relpos/data/samples/tinyshakespeare.txt'
# preset -> (config.model.position, config.train.mem_len)
_PRESETS = {
  'xl': ('xl', 64),
  'xl_nomem': ('xl', 0),
  'shaw': ('shaw', 64),
  'absolute': ('absolute', 64),
  'none': ('none', 64),
  't5': ('t5', 64),
  'alibi': ('alibi', 64),
  'rope': ('rope', 64),
}


def get_config(preset: str = 'xl'):
  if preset not in _PRESETS:
    raise unknown_preset(preset, _PRESETS)
  config = char_lm_config()
  config.data.update(kind='text', path=str(_SAMPLE))
  position, mem_len = _PRESETS[preset]
  config.model.update(
    position=position,
    num_layers=4,
    d_model=128,
    num_heads=4,
    head_dim=32,
    d_ff=512,
  )
  config.optim.update(learning_rate=1e-3, final_lr=1e-4, warmup_steps=200)
  config.train.update(
    batch_size=16,
    tgt_len=64,
    mem_len=mem_len,
    steps=3000,
    log_every=100,
    eval_every=1000,
    checkpoint_every=1000,
  )
  config.eval.update(
    batch_size=16,
    tgt_len=64,
    mem_len=192,
    clamp_len=-1,
    same_length=False,
    max_segments_during_training=50,
  )
  return config
