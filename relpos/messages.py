"""What relpos says to the person running it, besides results: warnings and progress lines.

A warning is a line `warning: ...` on standard error, where errors go (`error: ...`,
relpos.cli), so that standard output holds a command's results and progress alone
(a `| tee`, a `> results.txt`, a script reading eval.py's last line), and a warning still shows
on the terminal. Standard output is flushed first, so that in a log that merges the two
(`2>&1`) each warning stands where it happened. Progress lines go to standard output: the
training loop's (relpos.training.progress) and `PassProgress`'s, for any other long pass.
"""

import sys
import time

_SAID_ONCE = set()  # the messages of `warn(..., once=True)` printed by this process


def warn(message: str, *, once: bool = False) -> None:
  """Prints `warning: <message>` on standard error, after what standard output holds.

  `once`: not again if this process printed the same message before: for what one command
  finds more than once in the same data (train.py's evaluation at the end reads the eval pairs
  its training read; a sweep's runs read the same files), where the repeat says nothing new."""
  if once:
    if message in _SAID_ONCE:
      return
    _SAID_ONCE.add(message)
  sys.stdout.flush()
  print(f'warning: {message}', file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
  """`seconds` as 1h02m or 3m07s."""
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{seconds:02d}s'


class PassProgress:
  """A progress line every `every` seconds of a long pass over a known number of items (an
  evaluation's segments, the sentences a beam search translates, a download's MiB): the items
  done, their rate and an ETA (no ETA where the total is not known, None). A pass that ends
  within `every` seconds prints nothing (validation during training, a small test set).

  The clock starts when the first item has been handed over (`update(1, ...)`): jax compiles
  a function at its first call, so that item's compile is off the rate. `pending` (a device
  array of the latest item, for work dispatched asynchronously) is waited for before a line is
  printed, so that the count is what the device has done, not what the host queued.
  """

  def __init__(self, what: str, total: int | None, unit: str, *, every: float = 30.0, clock=None):
    self.what, self.total, self.unit, self.every = what, total, unit, every
    self._clock = clock or time.perf_counter
    self._start = None  # (items, time) when the clock started
    self._last = None  # when the last line was printed (or the clock started)

  def update(self, done: int, pending=None) -> None:
    """`done` items of `total` handed over; prints a line if `every` seconds have passed."""
    now = self._clock()
    if self._start is None:
      self._start, self._last = (done, now), now
      return
    if now - self._last < self.every:
      return
    if pending is not None:
      import jax  # noqa: PLC0415 (only here: the rest of the module needs no JAX)

      jax.block_until_ready(pending)
      now = self._clock()
    self._last = now
    items, since = self._start
    rate = (done - items) / max(now - since, 1e-9)
    if self.total is None:  # a size not known ahead (a download without a length)
      print(f'{self.what}: {done} {self.unit} | {rate:.1f} {self.unit}/s', flush=True)
      return
    eta = duration((self.total - done) / rate) if rate > 0 else '?'
    print(
      f'{self.what}: {done}/{self.total} {self.unit} | {rate:.1f} {self.unit}/s | ETA {eta}',
      flush=True,
    )
