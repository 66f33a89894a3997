"""Transformer-XL's ordered LM batches (`LMOrderedIterator`), as pure functions of the step.

The token stream is cut into `batch_size` contiguous rows of `n_step = N // batch_size` tokens
(the tail is dropped): row b is `tokens[b*n_step:(b+1)*n_step]`. Segment s reads positions
`i = s*tgt_len` onwards of every row: inputs `rows[:, i:i+L]`, targets `rows[:, i+1:i+1+L]`,
`L = min(tgt_len, n_step - 1 - i)`. Consecutive segments continue each row, so a recurrence
memory carries across them, and one pass predicts every row position but the first once.

The rows keep the stream's own integer type (a character LM's uint8 ids,
`relpos.data.char_corpus.CharVocab.encode`: a byte per character of the corpus); each segment
is cast to int32 as it is cut, so the batches are the same whatever type the stream has.
"""

import numpy as np


def eval_token_count(tokens, batch_size: int) -> int:
  """Target positions one pass of `OrderedBatches(tokens, batch_size, ...)` scores."""
  return batch_size * (len(tokens) // batch_size - 1)


class OrderedBatches:
  """Segments of `batch_size` parallel rows of a token stream, `tgt_len` targets each.

  Every method is a pure function of its segment or step argument: there is no iterator
  state, so resuming from a step reproduces the batches exactly.
  """

  def __init__(
    self,
    tokens,
    batch_size: int,
    tgt_len: int,
    *,
    rows: slice = slice(None),
    name: str = '',
    fields: tuple[str, str] = ('batch_size', 'tgt_len'),
  ):
    """
    Args:
      tokens: integer ids [N], of any integer type (kept: not widened to int32 here).
      batch_size, tgt_len: positive ints, N >= 2 * batch_size.
      rows: keep only these of the batch_size rows (a data-parallel process's part of the
        global batch); segments then hold only them.
      name: what the tokens are, for messages (e.g. 'the valid split of data/x.txt').
      fields: what set batch_size and tgt_len, for messages (e.g. the config fields); this
        module knows nothing of configs.
    Raises:
      ValueError: the rows would hold fewer than 2 tokens.
    """
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):  # an empty list reads as float64
      tokens = tokens.astype(np.int32)
    if tokens.ndim != 1 or batch_size < 1 or tgt_len < 1:
      raise ValueError(
        'expected tokens [N] and positive batch_size, tgt_len; got tokens '
        f'{tokens.shape}, batch_size {batch_size}, tgt_len {tgt_len}'
      )
    self.n_step = len(tokens) // batch_size
    self.batch_size = batch_size
    self.tgt_len = tgt_len
    self._prefix = f'{name}: ' if name else ''
    self._batch_field, self._tgt_field = fields
    if self.n_step < 2:
      # A smaller batch_size helps only where some batch_size gives rows of 2: not for 1 token.
      remedy = (
        f'use {self._batch_field} <= {len(tokens) // 2} or more data'
        if len(tokens) >= 2
        else 'give more data'
      )
      raise ValueError(
        f'{self._prefix}{len(tokens)} tokens give rows of {self.n_step} for '
        f'{self._batch_field}={batch_size}; each row needs at least 2 tokens (an input and its '
        f'target): {remedy}'
      )
    self.rows_BN = tokens[: batch_size * self.n_step].reshape(batch_size, self.n_step)[rows]

  @property
  def num_segments(self) -> int:
    """Segments in one pass, the last possibly shorter than tgt_len."""
    return -(-(self.n_step - 1) // self.tgt_len)

  @property
  def num_full_segments(self) -> int:
    """Segments of exactly tgt_len targets: one training epoch."""
    return (self.n_step - 1) // self.tgt_len

  def segment(self, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of segment s, both int32 [rows, L], L <= tgt_len (cast from the
    rows' type here, segment by segment)."""
    if not 0 <= s < self.num_segments:
      raise IndexError(f'segment {s} is outside [0, {self.num_segments})')
    i = s * self.tgt_len
    length = min(self.tgt_len, self.n_step - 1 - i)
    segment = self.rows_BN[:, i : i + 1 + length].astype(np.int32)
    return segment[:, :-1], segment[:, 1:]

  def iterate(self, start: int = 0):
    """Yields (s, inputs [B, L], targets [B, L]) for segments start..num_segments-1."""
    for s in range(start, self.num_segments):
      yield (s, *self.segment(s))

  def __iter__(self):
    """`iterate()`: one evaluation pass, last short segment included."""
    return self.iterate()

  def check_training(self) -> None:
    """Raises ValueError unless the rows hold a full segment, as training needs; called by
    `training_batch`, and before a run starts by those who would rather know then."""
    if self.num_full_segments == 0:
      raise ValueError(
        f'{self._prefix}{self.batch_size} rows ({self._batch_field}={self.batch_size}) of '
        f'{self.n_step} tokens hold no full segment of {self._tgt_field}={self.tgt_len} targets; '
        f'use a smaller {self._batch_field} or {self._tgt_field}, or more data'
      )

  def training_batch(self, step: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """(inputs, targets [B, tgt_len], new_epoch) of training step `step`.

    Step t reads full segment `t % num_full_segments`; the short last segment is skipped
    so shapes stay static under jit. new_epoch is True where an epoch starts (segment 0),
    where the caller must reset the memory since the rows start over.

    Raises:
      ValueError: no full segment (`check_training`).
    """
    self.check_training()
    s = step % self.num_full_segments
    return (*self.segment(s), s == 0)

  def training_stream(self, start_step: int = 0):
    """Yields (step, inputs [B, tgt_len], targets [B, tgt_len], new_epoch) forever."""
    step = start_step
    while True:
      yield (step, *self.training_batch(step))
      step += 1
