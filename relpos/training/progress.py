"""A progress line with throughput and ETA, for people watching a run."""

import time

from relpos.messages import duration


class Progress:
  """Measures tokens/s between reports, the ETA of the remaining steps and, where the devices'
  peak is known (`relpos.flops.devices_peak`: a GPU's or TPU's data sheet), the model FLOPs
  utilisation of the interval.

  What is not training is kept off the clock: a step that compiles (the first of a process,
  the first of a new batch shape, and on a GPU the timing of 'auto''s kernels with it),
  validation and checkpoint saves. The caller stops the clock with the device idle
  (`stop_clock`), does that work, waits for it, and starts the clock again (`start_clock`,
  which returns the seconds it was stopped); a step done meanwhile is named with
  `exclude_step` so that its tokens stay out of the report's count too. An interval whose every
  step was excluded reports them anyway. A save's commit runs in the background (orbax), so
  where it competes with the steps after it (a few CPU cores) that slows their rate, as it
  slows the training.

  The ETA is the remaining steps at the interval's rate plus, for the saves still to come
  (every `checkpoint_every` steps and the last step's), the mean time of the saves timed so
  far (none before the first). It leaves out validation and compiles still to come, and the
  final evaluation."""

  def __init__(
    self,
    total_steps: int,
    start_step: int = 0,
    peak_flops: float | None = None,
    checkpoint_every: int = 0,
  ):
    self.total_steps, self.peak_flops = total_steps, peak_flops
    self.checkpoint_every = checkpoint_every
    self._saves = [0, 0.0]  # saves timed (`start_clock(saved=True)`) and their seconds
    self._step, self._flops = start_step, 0.0
    self._time = self._stopped = time.perf_counter()  # the timed stretch's start; the stop
    self._seconds = 0.0  # timed in the interval before that stretch
    self._excluded = [0, 0, 0.0]  # steps, tokens and seconds off the clock in the interval
    self.mfu = None  # of the last report, or None

  def stop_clock(self) -> None:
    """Stops timing the interval (call with the device done with the steps before)."""
    now = time.perf_counter()
    self._seconds += now - self._time
    self._time, self._stopped = now, now

  def start_clock(self, saved: bool = False) -> float:
    """Times the interval again (call once the work done meanwhile is finished); returns the
    seconds the clock was stopped. `saved`: that work was a checkpoint save, whose time the
    ETA adds for each save to come."""
    now = time.perf_counter()
    seconds = now - self._stopped
    self._excluded[2] += seconds
    if saved:
      self._saves[0] += 1
      self._saves[1] += seconds
    self._time = now
    return seconds

  def exclude_step(self, tokens: int) -> None:
    """The step done while the clock was stopped, with its tokens (its FLOPs are not counted)."""
    self._excluded[0] += 1
    self._excluded[1] += tokens

  def count(self, flops: float) -> None:
    """Adds a step's model FLOPs to the interval's (only worth calling with a peak)."""
    self._flops += flops

  def report(self, step: int, tokens: int) -> tuple[float, str]:
    """(tokens per second, 'tok/s | MFU | ETA' text) at `step`, `tokens` processed since the
    last report (MFU only where FLOPs were counted and the peak is known)."""
    now = time.perf_counter()
    seconds = self._seconds + now - self._time
    excluded_steps, excluded_tokens, excluded_seconds = self._excluded
    steps = step - self._step - excluded_steps
    if steps > 0:
      tokens -= excluded_tokens
    else:  # every step of the interval was off the clock: their own rate is all there is
      steps, seconds = step - self._step, seconds + excluded_seconds
    self._step, self._time, self._seconds, self._excluded = step, now, 0.0, [0, 0, 0.0]
    tokens_per_second = tokens / seconds
    saves_seconds = (
      self._saves[1] / self._saves[0] * self.saves_after(step) if self._saves[0] else 0
    )
    eta = duration(seconds / max(1, steps) * max(0, self.total_steps - step) + saves_seconds)
    flops, self._flops = self._flops, 0.0
    self.mfu = flops / seconds / self.peak_flops if flops and self.peak_flops else None
    utilisation = '' if self.mfu is None else f' | MFU {100 * self.mfu:.1f}%'
    return tokens_per_second, f'{tokens_per_second / 1e3:.1f}k tok/s{utilisation} | ETA {eta}'

  def saves_after(self, step: int) -> int:
    """The checkpoint saves after `step`: every checkpoint_every steps and at the last step."""
    if step >= self.total_steps:
      return 0
    every = self.checkpoint_every
    periodic = self.total_steps // every - step // every if every else 0
    return periodic + (0 if every and self.total_steps % every == 0 else 1)
