"""The translation data of a run, from `config.data` (fields:
relpos/config/translation_defaults.py).

`load_translation_data` reads the train and eval pairs (kind 'text': parallel files; kind
'tfds': a prepared tensorflow-datasets copy), Moses-detokenises them if asked, trains the shared
SentencePiece vocabulary on the training text once (workdir/spm.model, reused by later runs
with the same workdir) and encodes everything with it; a training split of many pairs gets a
line on stdout before each of those phases, and progress lines while it is encoded
(`parallel_text.ANNOUNCED_PAIRS`). In a multi-process run each process
reads and encodes only its shard of the training pairs. `load_eval_data` reads only what
evaluation needs: the saved vocabulary and the eval pairs.
"""

import dataclasses
import pathlib
import time
from collections.abc import Sequence

from absl import logging

from relpos.config import checks
from relpos.data import parallel_text, tatoeba, wmt_tfds
from relpos.data.shard import ONE_PROCESS, Shard
from relpos.data.token_batches import EncodedPairs, Ragged, TokenBatches
from relpos.data.tokenizer import Tokenizer, load_tokenizer, train_or_load
from relpos.messages import PassProgress

KINDS = ('text', 'tfds')
# The rule of config.data.kind: the declaration's (relpos.config.translation_defaults) and
# `check_data_config`'s.
KIND = checks.one_of(*KINDS)
TEXT_FIELDS = ('train_src', 'train_tgt', 'eval_src', 'eval_tgt')
VOCAB_FILE = 'spm.model'
ENCODE_CHUNK = 100_000  # sentences encoded per SentencePiece call


@dataclasses.dataclass(frozen=True)
class TranslationData:
  """Everything a translation run reads.

  Attributes:
    tokenizer: the shared source/target vocabulary.
    train: the training batches (pairs longer than config.data.max_length dropped); None
      from `load_eval_data`.
    eval_sources: eval source sentences, as read (detokenised if config.data.moses_detokenize).
    eval_references: their reference translations, likewise.
    eval_pairs: eval_pairs[i] is (eval_sources[i], eval_references[i]) encoded, none dropped;
      in token batches for an eval loss by `eval_batches`.
  """

  tokenizer: Tokenizer
  train: TokenBatches | None
  eval_sources: list[str]
  eval_references: list[str]
  eval_pairs: EncodedPairs


Pairs = tuple[list[str], list[str]]
SPLITS = ('train', 'eval')


def check_data_config(data_config) -> None:
  """Raises ValueError naming the config.data field unless kind (`KIND`) and its file fields
  are set: the launchers' check before any data is read, and this module's readers' own, for
  callers that start no run (benchmarks, tools)."""
  checks.check(data_config, {'kind': KIND}, prefix='config.data')
  if data_config.kind != 'text':
    return
  for field in TEXT_FIELDS:
    if not data_config[field]:
      raise ValueError(
        f"config.data.kind='text' reads config.data.{field}, which is empty; set it to a file "
        'of one sentence per line (.gz accepted)'
      )


def read_pairs(data_config, split: str, shard: Shard = ONE_PROCESS) -> Pairs:
  """(sources, targets) of split 'train' or 'eval' as config.data names it, Moses-detokenised
  if it asks, with a warning for a side whose Moses tokenisation does not fit that
  (`parallel_text.warn_of_moses_tokenization`) and for references that are not in Unicode NFC
  (`parallel_text.warn_if_not_nfc`); only `shard`'s pairs (see relpos.data.shard).

  Raises:
    ValueError: the split holds no pairs; otherwise as the readers (parallel_text, wmt_tfds).
    FileNotFoundError: a path is not a file, or the tfds dataset is not prepared.
  """
  limit = data_config[f'max_{split}_examples']
  if data_config.kind == 'text':
    paths = data_config[f'{split}_src'], data_config[f'{split}_tgt']
    try:
      sources, targets = parallel_text.read_parallel(
        *paths,
        fields=(f'config.data.{split}_src', f'config.data.{split}_tgt'),
        limit=limit,
        shard=shard,
      )
    except FileNotFoundError as error:  # a corpus that is not prepared yet: say how
      raise FileNotFoundError(f'{error}{tatoeba.missing_hint(paths[0])}') from None
    where = f'{data_config[split + "_src"]} / {data_config[split + "_tgt"]}'
  else:
    sources, targets = wmt_tfds.read_tfds_pairs(
      data_config.tfds_name,
      data_config[f'tfds_{split}_split'],
      data_dir=data_config.tfds_data_dir,
      source_lang=data_config.source_lang,
      target_lang=data_config.target_lang,
      limit=limit,
      shard=shard,
    )
    where = f'{data_config.tfds_name} split {data_config["tfds_" + split + "_split"]}'
  if not sources:
    raise ValueError(
      f'no {split} sentence pairs in {where} (config.data.{split}_src / {split}_tgt or '
      f'config.data.tfds_{split}_split): the data is empty or every line was empty'
    )
  for side, lines in (('src', sources), ('tgt', targets)):
    if data_config.kind == 'text':
      name = f'{data_config[f"{split}_{side}"]} (config.data.{split}_{side})'
    else:
      name = f'{where}, {side} side'
    parallel_text.warn_of_moses_tokenization(lines, name, detokenize=data_config.moses_detokenize)
    if split == 'eval' and side == 'tgt':
      parallel_text.warn_if_not_nfc(lines, name)
  if not data_config.moses_detokenize:
    return sources, targets
  if len(sources) >= parallel_text.ANNOUNCED_PAIRS:
    print(
      f'Moses-detokenising {len(sources):,} {split} pairs (config.data.moses_detokenize)',
      flush=True,
    )
  return (
    parallel_text.moses_detokenize(sources, data_config.source_lang),
    parallel_text.moses_detokenize(targets, data_config.target_lang),
  )


def encode_lines(
  tokenizer: Tokenizer, lines: Sequence[str], progress: PassProgress | None = None, done: int = 0
) -> Ragged:
  """The piece ids of each line, without BOS/EOS, encoded ENCODE_CHUNK lines at a time
  (SentencePiece encodes each line on its own: the ids are those of one call). `progress` is
  updated after each chunk, `done` counting the items encoded before these."""
  chunks = []
  for start in range(0, len(lines), ENCODE_CHUNK):
    chunk = lines[start : start + ENCODE_CHUNK]
    chunks.append(Ragged.from_lists(tokenizer.encode_batch(chunk)))
    if progress is not None:
      progress.update(done + start + len(chunk))
  return Ragged.concatenate(chunks)


def encode_pairs(tokenizer: Tokenizer, sources: list[str], targets: list[str]) -> EncodedPairs:
  """The training pairs encoded, with a line first where they are many
  (`parallel_text.ANNOUNCED_PAIRS`) and progress lines with the rate and an ETA every half
  minute (`PassProgress`), as evaluation prints: 1M short pairs took 7.4 s on 2 idle CPU
  cores (docs/translation.md), and WMT14 has 4.5 times as many, longer ones."""
  if len(sources) >= parallel_text.ANNOUNCED_PAIRS:
    print(f'encoding {len(sources):,} training pairs with {tokenizer.path}', flush=True)
  progress = PassProgress('encoding training pairs', 2 * len(sources), 'sentences')
  progress.update(0)  # its clock starts now: nothing to compile
  return EncodedPairs(
    encode_lines(tokenizer, sources, progress),
    encode_lines(tokenizer, targets, progress, len(sources)),
  )


def _shared_vocabulary(data_config, workdir, sentences: list[str], *, seed: int, shard: Shard):
  """The run's vocabulary: process 0 trains it on its sentences (or finds it) and saves it,
  then the other processes load that file."""
  path = pathlib.Path(workdir) / VOCAB_FILE
  if shard.index == 0:
    if not path.exists() and len(sentences) >= 2 * parallel_text.ANNOUNCED_PAIRS:
      sampled = min(len(sentences), data_config.vocab_train_sentences)
      print(
        f'training a {data_config.vocab_size}-piece SentencePiece vocabulary '
        f'(config.data.vocab_size) on {sampled:,} of the {len(sentences):,} training sentences '
        f'(config.data.vocab_train_sentences) into {path}',
        flush=True,
      )
    tokenizer = train_or_load(
      path,
      sentences,
      data_config.vocab_size,
      max_sentences=data_config.vocab_train_sentences,
      seed=seed,
    )
  shard.wait_for_all()
  if shard.index == 0:
    return tokenizer
  return load_tokenizer(
    path,
    data_config.vocab_size,
    missing=f'process {shard.index} cannot see the vocabulary process 0 saved: the workdir '
    'must be on a filesystem that every process shares',
  )


def _with_eval_data(data_config, tokenizer: Tokenizer, train, eval_text=None) -> TranslationData:
  """`train` with the eval pairs encoded by `tokenizer`: `eval_text` (sources, references)
  where the caller has read them, else read here."""
  start = time.perf_counter()
  eval_src, eval_tgt = eval_text or read_pairs(data_config, 'eval')
  eval_pairs = EncodedPairs(encode_lines(tokenizer, eval_src), encode_lines(tokenizer, eval_tgt))
  logging.info('%d eval pairs ready in %.1fs', len(eval_src), time.perf_counter() - start)
  return TranslationData(tokenizer, train, eval_src, eval_tgt, eval_pairs)


def load_translation_data(
  data_config,
  workdir,
  *,
  seed: int = 0,
  row_multiple: int = 1,
  shard: Shard = ONE_PROCESS,
) -> TranslationData:
  """Reads, tokenises and batches the data config.data names (see the module docstring).

  Args:
    data_config: config.data of a translate config.
    workdir: the run's directory; the vocabulary is workdir/spm.model.
    seed: seed of the vocabulary's sentence sample and of the training batch order.
    row_multiple: global training batch rows are a multiple of this (data-parallel devices).
    shard: this process's part of the training pairs; in a multi-process run process 0 trains
      the vocabulary on its part. Every process reads all eval pairs.
  Raises:
    ValueError, FileNotFoundError: messages name the config.data field to fix.
  """
  check_data_config(data_config)
  start = time.perf_counter()
  train_src, train_tgt = read_pairs(data_config, 'train', shard)
  logging.info('read %d train pairs in %.1fs', len(train_src), time.perf_counter() - start)
  # Before the vocabulary trains: a fault of the eval files (their line counts differ, say)
  # is told in seconds, not after minutes of SentencePiece on a WMT-sized corpus.
  eval_text = read_pairs(data_config, 'eval')
  tokenizer = _shared_vocabulary(
    data_config, workdir, train_src + train_tgt, seed=seed, shard=shard
  )
  train = TokenBatches(
    encode_pairs(tokenizer, train_src, train_tgt),
    max_length=data_config.max_length,
    max_tokens=data_config.max_tokens,
    num_buckets=data_config.length_buckets,
    seed=seed,
    row_multiple=row_multiple,
    shard=shard,
    name='training pairs',
  )
  logging.info('training data ready in %.1fs', time.perf_counter() - start)
  return _with_eval_data(data_config, tokenizer, train, eval_text)


def eval_batches(data_config, data: TranslationData, *, seed: int) -> TokenBatches:
  """The eval pairs in token batches for an eval loss: of the training batches' padded lengths
  when `data` has them (so evaluation during training compiles no new shapes), else bucketed
  as config.data.length_buckets says; pairs longer than config.data.max_length are left out.

  Raises:
    ValueError: no eval pair is within config.data.max_length.
  """
  boundaries = None if data.train is None else data.train.boundaries
  return TokenBatches(
    data.eval_pairs,
    max_tokens=data_config.max_tokens,
    max_length=data_config.max_length,
    boundaries=boundaries,
    num_buckets=None if boundaries else data_config.length_buckets,
    seed=seed,
    name='evaluation pairs of the loss (BLEU scores every one)',
  )


def load_eval_data(data_config, workdir) -> TranslationData:
  """The vocabulary a training run saved in workdir and the eval pairs; `train` is None.

  Raises:
    FileNotFoundError: workdir holds no vocabulary.
    ValueError: as load_translation_data.
  """
  check_data_config(data_config)
  tokenizer = load_tokenizer(
    pathlib.Path(workdir) / VOCAB_FILE,
    data_config.vocab_size,
    missing='train.py writes it on its first run with this --workdir',
  )
  return _with_eval_data(data_config, tokenizer, None)
