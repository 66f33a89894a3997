"""Translation batches by token count, bucketed by length, as pure functions of the step.

Example i with source ids s (S pieces) and target ids t (T pieces, no BOS/EOS) needs
n_i = max(S, T) + 1 positions per side: `src` = s + EOS, `tgt_in` = BOS + t, `tgt_out` = t + EOS.
It goes to the bucket with the smallest padded length L >= n_i. A bucket's batches have the
fixed shape [rows, L], rows = the largest multiple of `row_multiple` with rows * L <= max_tokens
(or a fixed `rows`), so a jitted step compiles once per bucket. A bucket's last batch is filled
with all-PAD rows, which hold no target tokens and so weigh nothing in the loss.

The padded lengths (`boundaries`) are fitted to the data: at most `num_buckets` of them, the
last always max_length + 1, chosen to minimise the padded tokens over all examples (an exact
dynamic programme over the length histogram). Another set of pairs can reuse them (eval with
`boundaries=train.boundaries`), so it compiles no new shapes.

Epoch e shuffles each bucket's examples and then all the epoch's batches with the seed
(seed, e); step s is batch s % batches_per_epoch of epoch s // batches_per_epoch. Nothing else
is state, so training resumes exactly from a step number.

In a multi-process run each process holds only its shard of the pairs (`relpos.data.shard`)
and builds only its rows of each global batch; the processes agree once, at construction, on
the padded lengths and on every bucket's batches per epoch, and so on the shape of every step.
"""

import dataclasses
import itertools
from collections.abc import Iterator, Sequence

import numpy as np
from absl import logging

from relpos.constants import BOS_ID, EOS_ID, PAD_ID
from relpos.data.shard import ONE_PROCESS, Shard
from relpos.messages import warn


@dataclasses.dataclass(frozen=True)
class Ragged:
  """Int sequences stored flat, far smaller than lists of Python ints at WMT scale.

  Attributes:
    values: int32 [total], the sequences one after another.
    offsets: int64 [n + 1]; sequence i is values[offsets[i]:offsets[i + 1]].
  """

  values: np.ndarray
  offsets: np.ndarray

  @classmethod
  def from_lists(cls, seqs: Sequence[Sequence[int]]) -> 'Ragged':
    """The sequences `seqs` (e.g. lists of ids)."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.fromiter(
      itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1])
    )
    return cls(values, offsets)

  @classmethod
  def concatenate(cls, parts: Sequence['Ragged']) -> 'Ragged':
    """The sequences of `parts`, one part after another."""
    ends = np.cumsum([0] + [len(part.values) for part in parts])
    offsets = [part.offsets[1:] + end for part, end in zip(parts, ends[:-1], strict=True)]
    return cls(
      np.concatenate([np.zeros(0, np.int32)] + [part.values for part in parts]),
      np.concatenate([np.zeros(1, np.int64)] + offsets),
    )

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def __getitem__(self, i: int) -> np.ndarray:
    """Sequence i, int32 [length_i]."""
    return self.values[self.offsets[i] : self.offsets[i + 1]]

  @property
  def lengths(self) -> np.ndarray:
    """int64 [n]: the length of each sequence."""
    return np.diff(self.offsets)


@dataclasses.dataclass(frozen=True)
class EncodedPairs:
  """Encoded (source ids, target ids) pairs; pair i is `(src[i], tgt[i])`."""

  src: Ragged
  tgt: Ragged

  def __post_init__(self):
    if len(self.src) != len(self.tgt):
      raise ValueError(f'{len(self.src)} sources but {len(self.tgt)} targets')

  @classmethod
  def from_pairs(cls, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> 'EncodedPairs':
    """The pairs `pairs` of id sequences."""
    return cls(Ragged.from_lists([s for s, _ in pairs]), Ragged.from_lists([t for _, t in pairs]))

  def __len__(self) -> int:
    return len(self.src)

  def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    return self.src[i], self.tgt[i]


def fit_boundaries(lengths: np.ndarray, num_buckets: int, max_len: int) -> tuple[int, ...]:
  """Padded lengths b_1 < ... < b_k = max_len, k <= num_buckets, minimising sum_i b(lengths_i).

  b(n) is the smallest b_j >= n, the positions example i takes in a batch, so the sum is the
  tokens a token-budget epoch processes, padding included.

  Args:
    lengths: int [N], each in 1..max_len.
    num_buckets: the most padded lengths to use, >= 1.
    max_len: the last padded length.
  """
  return fit_boundaries_to_counts(np.bincount(lengths, minlength=max_len + 1), num_buckets, max_len)


def fit_boundaries_to_counts(counts: np.ndarray, num_buckets: int, max_len: int) -> tuple[int, ...]:
  """`fit_boundaries` of the lengths whose histogram is `counts` (int [max_len + 1])."""
  values = np.append(np.flatnonzero(counts[:max_len]), max_len)  # candidate boundaries
  below = np.cumsum(counts)[values]  # examples of length <= each candidate
  # cost[j]: least cost of the examples <= values[j] with boundaries ending at values[j].
  cost = (values * below).astype(np.float64)
  earlier_JI = np.tril(np.ones((len(values), len(values)), dtype=bool), k=-1)
  parents = []
  for _ in range(min(num_buckets, len(values)) - 1):
    total_JI = cost[None, :] + values[:, None] * (below[:, None] - below[None, :])
    total_JI = np.where(earlier_JI, total_JI, np.inf)
    parents.append(np.argmin(total_JI, axis=1))
    cost = np.min(total_JI, axis=1)
  chosen = [len(values) - 1]
  for parent in reversed(parents):
    chosen.append(int(parent[chosen[-1]]))
  return tuple(int(values[j]) for j in reversed(chosen))


class TokenBatches:
  """Fixed-shape padded batches of encoded translation pairs (see the module docstring).

  Each batch is a dict of int32 arrays: `src`, `tgt_in`, `tgt_out` [rows, L] and `index`
  [rows], the position in `pairs` of each row's example (-1 for padding rows).
  """

  def __init__(
    self,
    pairs: EncodedPairs | Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_length: int,
    max_tokens: int | None = None,
    rows: int | None = None,
    num_buckets: int | None = None,
    boundaries: Sequence[int] | None = None,
    seed: int = 0,
    row_multiple: int = 1,
    shard: Shard = ONE_PROCESS,
    name: str = 'pairs',
  ):
    """Buckets `pairs`, dropping (with a warning naming them `name`) those with a side longer
    than max_length.

    Args:
      pairs: (source ids, target ids) without BOS/EOS, as EncodedPairs or int sequences.
      max_length: longest side kept, in pieces (config.data.max_length).
      max_tokens: positions per batch and side, padding included (config.data.max_tokens).
      rows: instead of max_tokens, this many rows in every batch (e.g. for decoding).
      num_buckets: fit at most this many padded lengths to `pairs` (config.data.length_buckets)
      boundaries: or use these padded lengths, the last max_length + 1 (e.g. from another
        TokenBatches, so no new shapes compile).
      seed: seed of the per-epoch shuffles.
      row_multiple: global rows are a multiple of this (e.g. the number of data-parallel
        devices), itself a multiple of shard.count.
      shard: `pairs` are this process's shard; its batches are its rows of the global batches
        (global rows / shard.count). The processes agree, through shard.all_gather, on the
        padded lengths (fitted to all their pairs) and on each bucket's batches per epoch (the
        most any process needs; the others fill theirs with all-PAD rows).
    Raises:
      ValueError: not exactly one of max_tokens/rows or num_buckets/boundaries, bad
        boundaries, max_tokens too small for row_multiple rows of max_length + 1, row_multiple
        not a multiple of shard.count, or no pair within max_length.
    """
    if (max_tokens is None) == (rows is None):
      raise ValueError(f'give exactly one of max_tokens ({max_tokens}) and rows ({rows})')
    if (num_buckets is None) == (boundaries is None):
      raise ValueError(
        f'give exactly one of num_buckets ({num_buckets}) and boundaries ({boundaries})'
      )
    self.pairs = pairs if isinstance(pairs, EncodedPairs) else EncodedPairs.from_pairs(pairs)
    if row_multiple % shard.count:
      raise ValueError(
        f'row_multiple={row_multiple} (devices) must be a multiple of the {shard.count} '
        'processes, each feeding its own rows'
      )
    self.seed, self.shard = seed, shard
    src_len, tgt_len = self.pairs.src.lengths, self.pairs.tgt.lengths
    fits = (src_len <= max_length) & (tgt_len <= max_length)
    if not fits.any():
      raise ValueError(
        f'none of the {len(fits)} {name} has both sides within config.data.max_length='
        f'{max_length} pieces: raise it'
      )
    if not fits.all():
      warn(
        f'dropped {np.sum(~fits)} of {len(fits)} {name} with a side longer than '
        f'config.data.max_length={max_length} pieces',
        once=True,  # the eval pairs are batched for training's validation and again to score
      )
    self.kept = np.flatnonzero(fits)
    needed = np.maximum(src_len, tgt_len)[self.kept] + 1
    if boundaries is None:
      counts = shard.all_gather(np.bincount(needed, minlength=max_length + 2)).sum(axis=0)
      boundaries = fit_boundaries_to_counts(counts, num_buckets, max_length + 1)
    self.boundaries = check_boundaries(boundaries, max_length)
    self.rows = tuple(
      rows_per_batch(length, max_tokens, rows, row_multiple) // shard.count
      for length in self.boundaries
    )
    self.bucket_of_kept = np.searchsorted(self.boundaries, needed)
    self.bucket_sizes = np.bincount(self.bucket_of_kept, minlength=len(self.boundaries))
    needs = -(-self.bucket_sizes // np.asarray(self.rows))
    self.batches_per_bucket = shard.all_gather(needs).max(axis=0)
    self._plan = (None, None)  # (epoch, its batches), the most recent one computed
    padded = np.sum(self.batches_per_bucket * np.asarray(self.rows) * self.boundaries)
    logging.info(
      'token batches%s: %d pairs, padded lengths %s, rows %s, %d batches per epoch, '
      '%.1f%% of padded positions used by the longer side',
      f' (process {shard.index} of {shard.count})' if shard.count > 1 else '',
      len(self.kept),
      self.boundaries,
      self.rows,
      self.batches_per_epoch,
      100 * np.sum(needed) / padded,
    )

  @property
  def num_examples(self) -> int:
    """Pairs kept (within max_length): each is in one batch per epoch."""
    return len(self.kept)

  @property
  def batches_per_epoch(self) -> int:
    """Batches in one epoch (and in `iterate_once`)."""
    return int(np.sum(self.batches_per_bucket))

  @property
  def plan(self) -> dict:
    """What the order of the batches depends on besides the pairs and the seed, JSON-able: the
    global rows of each bucket's batches (they change with row_multiple, the device count, when
    max_tokens // L is not already a multiple of it), the process count (each process shuffles
    its own shard) and the batches per epoch. Recorded with each checkpoint, so that a resume
    under another plan (another device count) is named, not silent."""
    return {
      'rows': [rows * self.shard.count for rows in self.rows],
      'processes': self.shard.count,
      'batches_per_epoch': self.batches_per_epoch,
    }

  @property
  def shapes(self) -> tuple[tuple[int, int], ...]:
    """(rows, L) of the buckets that have batches: the shapes a jitted step sees."""
    return tuple(
      (r, length)
      for r, length, count in zip(self.rows, self.boundaries, self.batches_per_bucket, strict=True)
      if count
    )

  def batch(self, step: int) -> tuple[int, dict[str, np.ndarray]]:
    """(epoch, batch) of training step `step` >= 0: a pure function of step, seed and shard.

    Every process gets a batch of the same bucket at every step.
    """
    epoch, position = divmod(step, self.batches_per_epoch)
    bucket, index = self._epoch_plan(epoch)[position]
    return epoch, self._make_batch(bucket, index)

  def iterate_once(self) -> Iterator[dict[str, np.ndarray]]:
    """Yields every batch once, unshuffled: bucket by bucket, pairs in `pairs` order."""
    for bucket in range(len(self.boundaries)):
      for index in self._bucket_batches(bucket, self.kept[self.bucket_of_kept == bucket]):
        yield self._make_batch(bucket, index)

  def _bucket_batches(self, bucket: int, members: np.ndarray) -> Iterator[np.ndarray]:
    """`members` (pair indices) in the bucket's batches per epoch, padded with -1."""
    rows = self.rows[bucket]
    padded = np.full(self.batches_per_bucket[bucket] * rows, -1, dtype=np.int64)
    padded[: len(members)] = members
    yield from padded.reshape(-1, rows)

  def _epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """Epoch `epoch`'s batches in order, as (bucket, index int32 [rows]) pairs.

    The members of each bucket are shuffled per process; the order of the buckets' batches,
    which decides the shape of every step, is the same on all processes.
    """
    if self._plan[0] != epoch:
      members_rng = np.random.default_rng([self.seed, epoch, self.shard.index])
      batches = []
      for bucket in range(len(self.boundaries)):
        members = members_rng.permutation(self.kept[self.bucket_of_kept == bucket])
        batches.extend((bucket, index) for index in self._bucket_batches(bucket, members))
      order = np.random.default_rng([self.seed, epoch]).permutation(len(batches))
      self._plan = (epoch, [batches[i] for i in order])
    return self._plan[1]

  def _make_batch(self, bucket: int, index: np.ndarray) -> dict[str, np.ndarray]:
    """The padded arrays of the pairs `index` (int [rows], -1: an all-PAD row)."""
    shape = (len(index), self.boundaries[bucket])
    src, tgt_in, tgt_out = (np.full(shape, PAD_ID, dtype=np.int32) for _ in range(3))
    for row, i in enumerate(index):
      if i < 0:
        continue
      s, t = self.pairs[i]
      src[row, : len(s)] = s
      src[row, len(s)] = EOS_ID
      tgt_in[row, 0] = BOS_ID
      tgt_in[row, 1 : len(t) + 1] = t
      tgt_out[row, : len(t)] = t
      tgt_out[row, len(t)] = EOS_ID
    return {'src': src, 'tgt_in': tgt_in, 'tgt_out': tgt_out, 'index': index.astype(np.int32)}


def check_boundaries(boundaries: Sequence[int], max_length: int) -> tuple[int, ...]:
  """`boundaries` as a tuple of ints, checked to rise strictly to max_length + 1.

  Raises:
    ValueError: they do not.
  """
  boundaries = tuple(int(b) for b in boundaries)
  if min(boundaries) < 1 or list(boundaries) != sorted(set(boundaries)):
    raise ValueError(f'boundaries must be strictly increasing positive ints; got {boundaries}')
  if boundaries[-1] != max_length + 1:
    raise ValueError(
      f'the last boundary must be max_length + 1 = {max_length + 1}, so that every kept pair '
      f'fits with its EOS; got {boundaries}'
    )
  return boundaries


def rows_per_batch(length: int, max_tokens: int | None, rows: int | None, multiple: int) -> int:
  """Rows of a batch of padded length `length`: `rows`, or the most that fit max_tokens.

  Raises:
    ValueError: rows is not a positive multiple of `multiple`, or max_tokens does not hold
      `multiple` rows of `length`.
  """
  if rows is not None:
    if rows < 1 or rows % multiple:
      raise ValueError(f'rows={rows} must be a positive multiple of row_multiple={multiple}')
    return rows
  fitting = max_tokens // length // multiple * multiple
  if not fitting:
    raise ValueError(
      f'max_tokens={max_tokens} holds no {multiple} row(s) of padded length {length}; '
      'raise config.data.max_tokens or lower config.data.max_length'
    )
  return fitting
