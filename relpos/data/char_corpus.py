"""Character vocabularies and the train/valid/test id arrays named by a data config.

Two vocabularies:
- 'bytes': all 256 byte values, id == byte.
- 'original': the Transformer-XL enwik8 pipeline's. Its prep script writes one integer per
  byte and a line break for each newline byte; its line-based reader never emits those, so
  newline bytes are dropped from every split. Its `Corpus` counts the symbols of train.txt,
  valid.txt and test.txt alike (for enwik8, text8, ptb and wt2), so the symbols are the distinct
  bytes of all three splits, here in sorted order (the official code orders them by frequency;
  the ids differ, the model does not). Built from the training split alone, a valid or test
  byte that train lacks could not be encoded, and the run was refused.

A run records its vocabulary (VOCAB_FILE, `CharVocab.read`) and is resumed and evaluated with
that record, not with one made again from the data given (`load_char_splits`' `vocab`): the
ids are the model's. A run recorded when 'original' counted the training split alone has a
vocabulary that also holds every valid and test byte (it trained only if they did), which is
what counting all three gives on the same data.
"""

import dataclasses
import json
import pathlib

import numpy as np

from relpos.config import checks
from relpos.data import enwik8, text

NEWLINE = ord('\n')
VOCAB_FILE = 'vocab.json'  # where a run keeps its CharVocab (`CharVocab.read`)
KINDS = ('enwik8', 'text')
VOCABS = ('bytes', 'original')
# The rules of config.data.kind and config.data.vocab: the declaration's
# (relpos.config.char_lm_defaults), and `load_char_splits`' own check, for callers that start
# no run (benchmarks, tools), with one message.
CHOICES = {'kind': checks.one_of(*KINDS), 'vocab': checks.one_of(*VOCABS)}


@dataclasses.dataclass(frozen=True)
class CharVocab:
  """A map between byte values and ids 0..size-1.

  Attributes:
    symbols: distinct byte values in id order: id i is byte `symbols[i]`.
  """

  symbols: tuple[int, ...]

  def __post_init__(self):
    if len(set(self.symbols)) != len(self.symbols) or not all(0 <= s < 256 for s in self.symbols):
      raise ValueError(f'symbols must be distinct byte values 0..255; got {self.symbols}')

  @classmethod
  def from_data(cls, data, drop_newlines: bool) -> 'CharVocab':
    """The sorted distinct bytes of `data` (uint8 array or bytes, or a list of them, counted
    without joining them: the splits), less newline if asked."""
    parts = data if isinstance(data, list | tuple) else [data]
    symbols = np.flatnonzero(sum(byte_counts(part) for part in parts))
    if drop_newlines:
      symbols = symbols[symbols != NEWLINE]
    return cls(tuple(int(s) for s in symbols))

  @property
  def size(self) -> int:
    """The number of ids."""
    return len(self.symbols)

  def encode(self, data) -> np.ndarray:
    """uint8 ids [N] of `data` (uint8 array [N] or bytes): a vocabulary of byte values has at
    most 256 ids, so they stay a byte each, as the text is, until `relpos.data.ordered` cuts
    them into int32 segments (int32 ids took 4 bytes per byte of a corpus, 400 MB of 100 MB).
    The 'bytes' vocabulary's ids are the bytes themselves: `data` is returned as it is, a view
    of it for bytes, not copied.

    Raises:
      ValueError: `data` holds a byte outside the vocabulary.
    """
    data = as_uint8(data)
    if self == CharVocab.bytes():
      return data
    # A byte outside a vocabulary of fewer than 256 symbols maps to 255, which is then no id.
    ids = np.full(256, 255, dtype=np.uint8)
    ids[list(self.symbols)] = np.arange(self.size, dtype=np.uint8)
    encoded = ids[data]
    # max(): no temporary array the size of the data, as `encoded == 255` would be
    if self.size < 256 and encoded.size and encoded.max() == 255:
      position = int(np.flatnonzero(encoded == 255)[0])
      byte = int(data[position])
      raise ValueError(
        f'byte {byte} ({bytes([byte])!r}) at position {position} is not in the '
        f'{self.size}-symbol vocabulary'
      )
    return encoded

  def decode(self, ids) -> bytes:
    """The bytes of int ids [N]."""
    return np.asarray(self.symbols, dtype=np.uint8)[np.asarray(ids)].tobytes()

  def to_json(self) -> str:
    """A JSON string that `from_json` reads back."""
    return json.dumps({'symbols': list(self.symbols)})

  @classmethod
  def from_json(cls, text: str) -> 'CharVocab':
    """The vocabulary written by `to_json`."""
    return cls(tuple(json.loads(text)['symbols']))

  @classmethod
  def read(cls, path) -> 'CharVocab':
    """The vocabulary a run saved at `path` (its vocab.json).

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is not one (damaged), naming it and the fix.
    """
    try:
      return cls.from_json(pathlib.Path(path).read_text())
    except (ValueError, KeyError, TypeError) as error:
      raise ValueError(
        f'{path} is damaged ({error}); remove it and rerun train.py: it is made again from '
        'config.data (the same data, the same vocabulary)'
      ) from None

  # Last in the class body, so that `bytes` in the annotations above is the builtin.
  @classmethod
  def bytes(cls) -> 'CharVocab':
    """All 256 byte values, id == byte."""
    return cls(tuple(range(256)))


# Bytes counted per np.bincount call: it counts in intp, 8 bytes for each byte it is given.
_COUNT_CHUNK = 1 << 20


def byte_counts(data) -> np.ndarray:
  """How often each of the 256 byte values occurs in `data` (bytes or a uint8 array), counted
  in chunks: np.bincount of all of it at once took 8 bytes of memory per byte (800 MB of a
  100 MB corpus)."""
  data = as_uint8(data)
  counts = np.zeros(256, dtype=np.int64)
  for start in range(0, data.size, _COUNT_CHUNK):
    counts += np.bincount(data[start : start + _COUNT_CHUNK], minlength=256)
  return counts


def as_uint8(data) -> np.ndarray:
  """`data` (bytes or an array of byte values) as a uint8 array."""
  if isinstance(data, bytes | bytearray):
    return np.frombuffer(data, dtype=np.uint8)
  return np.asarray(data, dtype=np.uint8)


def _drop_newlines(name: str, split: np.ndarray, path) -> np.ndarray:
  """The `name` split's bytes less its newlines (config.data.vocab='original').

  Raises:
    ValueError: the split held newlines only, so nothing is left: said as such, with the
      vocabulary that keeps them ('0 tokens give rows of 0' for the batch size hid that the
      bytes were there and dropped).
  """
  kept = split[split != NEWLINE]
  if split.size and not kept.size:
    raise ValueError(
      f'the {name} split of {path} (config.data.path) is {split.size:,} newline bytes, which '
      "config.data.vocab='original' drops (as the Transformer-XL enwik8 pipeline did), leaving "
      "nothing to read: use config.data.vocab='bytes', which keeps them, or give more text"
    )
  return kept


def load_char_splits(
  data_config, vocab: CharVocab | None = None, *, recorded_in=None, encode=text.SPLITS
) -> tuple[dict[str, np.ndarray], CharVocab]:
  """uint8 id arrays (`CharVocab.encode`) for the splits named in `encode` (default 'train',
  'valid', 'test') and their vocabulary.

  Args:
    data_config: ConfigDict with
      kind: 'enwik8' (raw file, zip or directory; checksum-checked, split at 90%/95%) or
        'text' (any file, split 90/5/5%);
      path: str;
      vocab: 'bytes' or 'original' (drop newlines; the symbols of all three splits);
      max_bytes (optional): int or None; if set, only the first max_bytes of the raw data
        are split (for enwik8, after the checksum of the full file).
    vocab: the vocabulary to encode with, a run's own (`CharVocab.read`); None: the one
      `data_config.vocab` makes of this data.
    recorded_in: where `vocab` was read from, for the message about a byte it lacks.
    encode: the splits to encode, and return: an evaluation needs only the one it scores, and
      a byte outside the run's `vocab` in another split (the training text, say) refused
      scoring the test split. A vocabulary made here is still made of all three.
  Raises:
    ValueError: unknown kind or vocab, an empty split, or a byte outside the given `vocab` in
      a split of `encode` (the message names the split, the file, the byte, config.data.vocab
      and the remedy).
    FileNotFoundError: nothing at `path`.
  """
  checks.check(data_config, CHOICES, prefix='config.data')
  if data_config.kind == 'enwik8':
    data = enwik8.read_enwik8(data_config.path)
  else:
    data = text.read_text_bytes(data_config.path)
  data = data[: data_config.get('max_bytes')]
  split = enwik8.enwik8_splits if data_config.kind == 'enwik8' else text.contiguous_splits
  try:
    splits = split(data)
  except ValueError as e:
    raise ValueError(f'config.data.path={data_config.path}: {e}') from None
  del data  # the splits are views of it: it is freed once they are (copies without newlines)
  if data_config.vocab == 'original':
    splits = {name: _drop_newlines(name, split, data_config.path) for name, split in splits.items()}
  if vocab is None:  # made of this data: it encodes every split
    vocab = (
      CharVocab.bytes()
      if data_config.vocab == 'bytes'
      else CharVocab.from_data(list(splits.values()), drop_newlines=True)
    )
  ids = {}
  for name in encode:
    split = splits.pop(name)  # its bytes without newlines (a copy) go once it is encoded
    try:
      ids[name] = vocab.encode(split)
    except ValueError as e:
      source = f' (recorded in {recorded_in})' if recorded_in else ''
      raise ValueError(
        f'{name} split of {data_config.path}: {e}{source}, made by '
        f'config.data.vocab={data_config.vocab!r} from the data the run trained on, and its ids '
        "are the model's: give data within it, or train a new run with "
        "config.data.vocab='bytes' (all 256 byte values)"
      ) from None
  return ids, vocab
