"""relpos.messages: warnings on stderr, progress lines for long passes."""

import jax.numpy as jnp

from relpos.messages import PassProgress, warn


def test_a_warning_is_one_line_on_stderr_after_what_stdout_holds(capfd):
  print('result', end='')  # unflushed: the warning must not overtake it in a merged log
  warn('something to know')
  out, err = capfd.readouterr()
  assert (out, err) == ('result', 'warning: something to know\n')


def test_a_long_pass_prints_progress_every_interval_from_the_first_items_end(capsys):
  """`PassProgress`: nothing until `every` seconds after the first item (its compile off the
  rate), then a line per interval with the rate since the first item and the ETA; a pending
  device value is waited for before a line."""
  times = iter([100.0, 110.0, 131.0, 131.0, 140.0, 170.0, 170.0])
  progress = PassProgress('test bpc', 100, 'segments', every=30.0, clock=lambda: next(times))
  progress.update(1)  # 100 s: the clock starts
  progress.update(5)  # 110 s: within the interval
  assert capsys.readouterr().out == ''
  progress.update(22, pending=jnp.zeros(3))  # 131 s: 21 segments in 31 s
  progress.update(30)  # 140 s: within the next interval
  progress.update(71, pending=jnp.zeros(3))  # 170 s: 70 segments in 70 s, 29 left
  assert capsys.readouterr().out.splitlines() == [
    'test bpc: 22/100 segments | 0.7 segments/s | ETA 1m55s',
    'test bpc: 71/100 segments | 1.0 segments/s | ETA 0m29s',
  ]


def test_a_pass_of_unknown_length_prints_its_count_and_rate_without_an_eta(capsys):
  times = iter([0.0, 40.0])
  progress = PassProgress('downloading u', None, 'MiB', clock=lambda: next(times))
  progress.update(1)
  progress.update(81)
  assert capsys.readouterr().out == 'downloading u: 81 MiB | 2.0 MiB/s\n'
