"""Data pipelines: enwik8 and plain-text character corpora, ordered LM batches, parallel text.

Where the data lives, for configs and benchmarks that run from a fresh clone:

- `SAMPLES`: data bundled in the repository (relpos/data/samples; its README gives each file's
  source, licence and md5): the tinyshakespeare text of configs/char_tiny.py and a slice of
  OpenNMT's toy-ende (`TOY_ENDE`) for configs/translate_overfit.py and the step benchmarks.
- `data_directory()`: where `python -m relpos.data.prepare` writes corpora and configs read
  them, `data/` of the repository (git-ignored) unless the environment variable
  RELPOS_DATA_DIR names another directory (a copy shared between checkouts, say).
"""

import os
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent / 'samples'
TOY_ENDE = SAMPLES / 'toy_ende'
DATA_DIR_VARIABLE = 'RELPOS_DATA_DIR'
_REPOSITORY_DATA = Path(__file__).resolve().parents[2] / 'data'


def data_directory() -> Path:
  """$RELPOS_DATA_DIR if set, else the repository's data/ (see the module docstring)."""
  return Path(os.environ.get(DATA_DIR_VARIABLE) or _REPOSITORY_DATA)


def toy_ende(split: str) -> tuple[str, str]:
  """(English, German) paths of the bundled toy-ende slice's 'train', 'val' or 'test' split."""
  if split not in ('train', 'val', 'test'):
    raise ValueError(f"toy-ende has splits 'train', 'val' and 'test', not {split!r}")
  return tuple(str(TOY_ENDE / f'{side}-{split}.txt.gz') for side in ('src', 'tgt'))
