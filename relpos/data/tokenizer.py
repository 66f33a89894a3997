"""A shared source/target SentencePiece vocabulary with fixed special ids.

The ids PAD_ID, EOS_ID, BOS_ID and UNK_ID are the same in every vocabulary this module trains,
and a loaded model that disagrees is rejected, so the model and the decoder can use them as
constants. Training asks for exactly `vocab_size` pieces: a corpus too small for that raises a
ValueError naming config.data.vocab_size, rather than quietly training a smaller vocabulary that
would then disagree with the config.
"""

import io
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from relpos.constants import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from relpos.files import write_marked
from relpos.signals import call_taking_signals

_SPECIAL_IDS = {'pad_id': PAD_ID, 'eos_id': EOS_ID, 'bos_id': BOS_ID, 'unk_id': UNK_ID}


class DamagedVocabularyError(ValueError):
  """A file that is no SentencePiece model; `reason` is the first line SentencePiece said."""

  def __init__(self, path, reason: str):
    super().__init__(
      f'{path} is damaged ({reason}); remove it and rerun train.py, which trains it again (the '
      'same data and seed give the same vocabulary)'
    )
    self.reason = reason


class Tokenizer:
  """Text <-> ids with a SentencePiece model whose special ids are the constants above."""

  def __init__(self, path):
    """Loads the SentencePiece model file at `path`.

    Raises:
      FileNotFoundError: `path` is not a file.
      DamagedVocabularyError: the file is no SentencePiece model.
    ValueError: its special ids differ from
        PAD_ID, EOS_ID, BOS_ID, UNK_ID.
    """
    self.path = pathlib.Path(path)
    if not self.path.is_file():
      raise FileNotFoundError(f'no SentencePiece model at {self.path}')
    try:
      self.processor = spm.SentencePieceProcessor(model_file=str(self.path))
    except (RuntimeError, OSError) as error:  # SentencePiece's own: "could not parse ModelProto"
      raise DamagedVocabularyError(self.path, str(error).splitlines()[0]) from None
    ids = {name: getattr(self.processor, name)() for name in _SPECIAL_IDS}
    if ids != _SPECIAL_IDS:
      raise ValueError(
        f'{self.path} has special ids {ids}, expected {_SPECIAL_IDS}; it was not made by '
        'relpos.data.tokenizer.train_or_load: delete it or use a new --workdir'
      )

  @property
  def vocab_size(self) -> int:
    """Number of ids, special ids included."""
    return self.processor.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Piece ids of `text`, without BOS or EOS."""
    return self.processor.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`[encode(t) for t in texts]`, on several threads."""
    return self.processor.encode(list(texts))

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids` up to the first EOS_ID; PAD_ID and BOS_ID are skipped."""
    pieces = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i not in (PAD_ID, BOS_ID):
        pieces.append(i)
    return self.processor.decode(pieces)


def sample_sentences(sentences: Iterable[str], max_sentences: int, seed: int) -> list[str]:
  """Up to `max_sentences` of `sentences` drawn without replacement, in their original order.

  All of them if max_sentences is 0 or at least their number; the draw depends only on seed.
  """
  sentences = list(sentences)
  if not max_sentences or len(sentences) <= max_sentences:
    return sentences
  rng = np.random.default_rng(seed)
  chosen = np.sort(rng.choice(len(sentences), size=max_sentences, replace=False))
  return [sentences[i] for i in chosen]


_MAX_SENTENCE_BYTES = 4192  # SentencePiece's max_sentence_length default


def train_model(sentences: Sequence[str], vocab_size: int) -> bytes:
  """A serialized unigram SentencePiece model of exactly `vocab_size` pieces over `sentences`.

  Raises:
    ValueError: `sentences` cannot support `vocab_size` pieces (too few distinct pieces, or
      fewer pieces asked for than the text has distinct characters), or SentencePiece could
      not train on them at all (every line longer than it takes, say).
  """
  model = io.BytesIO()
  try:
    # In a worker thread (its C++ releases the GIL), so that Ctrl-C or SIGTERM is taken at
    # once: training a large vocabulary takes minutes (`relpos.signals.call_taking_signals`).
    call_taking_signals(
      spm.SentencePieceTrainer.train,
      sentence_iterator=iter(sentences),
      model_writer=model,
      vocab_size=vocab_size,
      model_type='unigram',
      character_coverage=1.0,
      input_sentence_size=0,  # sample_sentences has sampled already
      minloglevel=2,  # errors only: relpos's own lines say what is dropped
      **_SPECIAL_IDS,
    )
  except RuntimeError as e:
    if 'Vocabulary size' in str(e):
      raise ValueError(
        f'cannot train a SentencePiece vocabulary of config.data.vocab_size={vocab_size} on '
        f'{len(sentences)} sentences; change config.data.vocab_size (or train on more text). '
        f'SentencePiece said: {e}'
      ) from None
    longest = max((len(sentence.encode()) for sentence in sentences), default=0)
    hint = (
      f' (the longest line has {longest:,} bytes and SentencePiece skips lines over '
      f'{_MAX_SENTENCE_BYTES:,}: is each file one sentence per line?)'
      if longest > _MAX_SENTENCE_BYTES
      else ''
    )
    raise ValueError(
      f'SentencePiece could not train a vocabulary on the {len(sentences)} training sentences '
      f'of config.data.train_src/train_tgt{hint}; it said: {str(e).splitlines()[0]}'
    ) from None
  return model.getvalue()


def train_or_load(
  model_path, sentences: Iterable[str], vocab_size: int, *, max_sentences: int, seed: int
) -> Tokenizer:
  """The Tokenizer saved at `model_path`, trained there first if the file does not exist. A
  file that exists is never trained over: it may be a vocabulary placed there to share. One
  trained here is marked so (`relpos.files.write_marked`): the training task trains again one
  that a start stopped before its run was recorded left (`TranslationTask.training`).

  Args:
    model_path: str or Path of the `.model` file, e.g. workdir/'spm.model'.
    sentences: training text (source and target sentences); read only when training.
    vocab_size: number of pieces, the 4 special ids included.
    max_sentences: train on a seeded sample of this many sentences (0: all).
    seed: seed of that sample.
  Raises:
    ValueError: an existing model has another vocab_size, or the text is too small for
      vocab_size (see train_model).
  """
  model_path = pathlib.Path(model_path)
  if not model_path.exists():
    model = train_model(sample_sentences(sentences, max_sentences, seed), vocab_size)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    write_marked(model_path, model)
  return load_tokenizer(model_path, vocab_size)


def check_placed(model_path, vocab_size: int) -> None:
  """Refuses a vocabulary placed in a new workdir (no run recorded, not trained there) that
  cannot be the run's, naming the file, what it holds and the two ways out. `load_tokenizer`'s
  own lines speak of a run that made the file (the config it recorded, training it again),
  which a placed file has not.

  Raises:
    ValueError: the file is no SentencePiece model, has special ids of its own, or has another
      number of pieces than `vocab_size`.
  """
  train_one = 'remove it, and the run trains one on config.data.train_src/train_tgt'
  try:
    pieces = Tokenizer(model_path).vocab_size
  except DamagedVocabularyError as error:
    raise ValueError(
      f'{model_path}, placed in the workdir before its first run, is no SentencePiece model '
      f'({error.reason}); copy the vocabulary there again, or {train_one}'
    ) from None
  if pieces != vocab_size:
    raise ValueError(
      f'{model_path}, placed in the workdir before its first run, has {pieces} pieces but '
      f'config.data.vocab_size is {vocab_size}: pass --config.data.vocab_size={pieces} to '
      f'train with it, or {train_one} of {vocab_size} pieces'
    )


def load_tokenizer(model_path, vocab_size: int, *, missing: str = '') -> Tokenizer:
  """The Tokenizer saved at `model_path`, checked to have `vocab_size` pieces.

  Raises:
    FileNotFoundError: there is no such file; the message ends with `missing` (the fix).
    ValueError: the model has another vocab_size.
  """
  model_path = pathlib.Path(model_path)
  if not model_path.exists():
    raise FileNotFoundError(f'no vocabulary at {model_path}' + (f': {missing}' if missing else ''))
  tokenizer = Tokenizer(model_path)
  if tokenizer.vocab_size != vocab_size:
    raise ValueError(
      f'{model_path} has {tokenizer.vocab_size} pieces but config.data.vocab_size is '
      f'{vocab_size}: the workdir was made with config.data.vocab_size='
      f'{tokenizer.vocab_size}; pass that (the config its run recorded), or use a new --workdir'
    )
  return tokenizer
