"""Plain-text character corpora: read a file's bytes and cut them into contiguous splits."""

import pathlib

import numpy as np

from relpos.data.data_file import read_data_file, refuse_dangling_link, refuse_pipe

SPLITS = ('train', 'valid', 'test')


def read_text_bytes(path) -> bytes:
  """The bytes of the file at `path`, decompressed if it is compressed (gzip, bzip2, xz or a
  zip of one file: `relpos.data.data_file.read_data_file`).

  Raises:
    FileNotFoundError: `path` is not a file.
    ValueError: `path` is a directory (`directory_message`) or a pipe (`refuse_pipe`), the
      file (or what it decompresses to) is empty, or it is a truncated or corrupt compressed
      file, or a zip of several files.
  """
  path = pathlib.Path(path)
  refuse_pipe(path, 'config.data.path')
  if path.is_dir():
    raise ValueError(directory_message(path))
  if not path.is_file():
    refuse_dangling_link(path, 'config.data.path')
    raise FileNotFoundError(f'no text file at {path}; set data.path to an existing file')
  data = read_data_file(path)
  if not data:
    raise ValueError(f'{path} is empty; a character corpus needs at least a few bytes')
  return data


def directory_message(path: pathlib.Path) -> str:
  """The line for a directory given as config.data.path of kind 'text', which reads one file
  and cuts it itself ('no text file at <dir>' read as if nothing were there). relpos reads no
  corpus already split into files (the Transformer-XL prep's train.txt, valid.txt, test.txt);
  where the directory holds enwik8 (that prep's layout), kind 'enwik8' reads it."""
  holds_enwik8 = any((path / name).is_file() for name in ('enwik8', 'enwik8.zip'))
  other = (
    "; it holds enwik8, which --config.data.kind='enwik8' reads from this directory"
    if holds_enwik8
    else ' (relpos reads no corpus already split into train/valid/test files)'
  )
  return (
    f"config.data.path={path} is a directory: config.data.kind='text' reads one file (plain, "
    'or gzip, bzip2, xz or a zip of one file) and splits it 90/5/5 into train/valid/test; '
    f'give that file{other}'
  )


def split_at(data: bytes, boundaries) -> dict[str, np.ndarray]:
  """Cuts `data` at the two indices `boundaries` into train/valid/test uint8 arrays.

  Raises:
    ValueError: a split would be empty.
  """
  array = np.frombuffer(data, dtype=np.uint8)
  pieces = np.split(array, boundaries)
  for name, piece in zip(SPLITS, pieces, strict=True):
    if not piece.size:
      raise ValueError(
        f'the {name} split of {len(data)} bytes cut at {tuple(boundaries)} is empty; give '
        'more text (config.data.max_bytes, where set, keeps only the first bytes)'
      )
  return dict(zip(SPLITS, pieces, strict=True))


def contiguous_splits(data: bytes, fractions=(0.9, 0.05, 0.05)) -> dict[str, np.ndarray]:
  """Contiguous train/valid/test uint8 arrays holding `fractions` of `data`, in that order.

  Raises:
    ValueError: `fractions` are not three non-negative numbers summing to 1, or a split
      would be empty.
  """
  fractions = np.asarray(fractions, dtype=np.float64)
  if fractions.shape != (3,) or (fractions < 0).any() or not np.isclose(fractions.sum(), 1):
    raise ValueError(f'fractions must be 3 non-negative numbers summing to 1; got {fractions}')
  boundaries = [round(len(data) * f) for f in np.cumsum(fractions)[:2]]
  return split_at(data, boundaries)
