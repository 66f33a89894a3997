"""A progress line with throughput and ETA, for people watching a run."""

import time


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{seconds:02d}s'


class Progress:
  """Measures tokens/s between reports, the ETA of the remaining steps and, where the devices'
  peak is known (`relpos.flops.devices_peak`: a GPU's or TPU's data sheet), the model FLOPs
  utilisation of the interval."""

  def __init__(self, total_steps: int, start_step: int = 0, peak_flops: float | None = None):
    self.total_steps, self.peak_flops = total_steps, peak_flops
    self._step, self._time, self._flops = start_step, time.perf_counter(), 0.0
    self._uncounted_tokens = 0  # of a step timed apart (`restart`), in the report's tokens
    self.mfu = None  # of the last report, or None

  def restart(self, step: int, *, uncounted_tokens: int = 0) -> float:
    """Starts the interval again at `step`, after a step that compiled (and tuned 'auto'), and
    returns the seconds since the interval began: that time and the FLOPs counted in it stay
    out of the throughput, MFU and ETA, and `uncounted_tokens`, the tokens of its steps, out of
    the next report's count."""
    now = time.perf_counter()
    seconds = now - self._time
    self._step, self._time, self._flops = step, now, 0.0
    self._uncounted_tokens = uncounted_tokens
    return seconds

  def count(self, flops: float) -> None:
    """Adds a step's model FLOPs to the interval's (only worth calling with a peak)."""
    self._flops += flops

  def report(self, step: int, tokens: int) -> tuple[float, str]:
    """(tokens per second, 'tok/s | MFU | ETA' text) at `step`, `tokens` processed since the
    last report (MFU only where FLOPs were counted and the peak is known)."""
    now = time.perf_counter()
    seconds = now - self._time
    seconds_per_step = seconds / max(1, step - self._step)
    self._step, self._time = step, now
    tokens, self._uncounted_tokens = tokens - self._uncounted_tokens, 0
    tokens_per_second = tokens / seconds
    eta = _duration(seconds_per_step * max(0, self.total_steps - step))
    flops, self._flops = self._flops, 0.0
    self.mfu = flops / seconds / self.peak_flops if flops and self.peak_flops else None
    utilisation = '' if self.mfu is None else f' | MFU {100 * self.mfu:.1f}%'
    return tokens_per_second, f'{tokens_per_second / 1e3:.1f}k tok/s{utilisation} | ETA {eta}'
