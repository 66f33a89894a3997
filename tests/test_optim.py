"""Learning-rate schedules of relpos.training.optim."""

import math

import ml_collections
import pytest

from relpos.training import optim


def _optim(**fields):
  base = dict(schedule='rsqrt', learning_rate=2.0, final_lr=0.0, warmup_steps=100)
  return ml_collections.ConfigDict(base | fields)


def test_rsqrt_is_vaswani_schedule():
  schedule = optim.learning_rate_schedule(_optim(), 1000, d_model=64)
  for step in (1, 50, 100, 101, 400):  # optax counts from 0: count = step - 1
    expected = 2.0 * 64**-0.5 * min(step**-0.5, step * 100**-1.5)
    assert math.isclose(float(schedule(step - 1)), expected, rel_tol=1e-6)
  peak = float(schedule(99))
  assert float(schedule(98)) < peak and float(schedule(100)) < peak


def test_rsqrt_needs_d_model_and_unknown_schedule_is_named():
  with pytest.raises(ValueError, match='d_model'):
    optim.learning_rate_schedule(_optim(), 1000)
  with pytest.raises(ValueError, match="schedule='linear'"):
    optim.learning_rate_schedule(_optim(schedule='linear'), 1000)


def test_cosine_warms_up_then_decays_to_final():
  schedule = optim.learning_rate_schedule(
    _optim(schedule='cosine', learning_rate=1e-3, final_lr=1e-4, warmup_steps=10), 110
  )
  assert float(schedule(0)) == 0.0
  assert math.isclose(float(schedule(10)), 1e-3, rel_tol=1e-6)
  assert math.isclose(float(schedule(110)), 1e-4, rel_tol=1e-5)


@pytest.mark.parametrize('schedule', ['rsqrt', 'cosine', 'constant'])
@pytest.mark.parametrize('warmup_steps', [0, 1, 7, 8, 9])
def test_schedule_warning_iff_the_run_never_reaches_the_peak(schedule, warmup_steps):
  steps = 8
  config = ml_collections.ConfigDict(
    {
      'optim': _optim(
        schedule=schedule, learning_rate=1e-3, final_lr=1e-4, warmup_steps=warmup_steps
      ),
      'train': {'steps': steps},
    }
  )
  rates = optim.learning_rate_schedule(config.optim, steps, d_model=64)
  peak = max(float(rates(count)) for count in range(steps + 20))
  reached = max(float(rates(count)) for count in range(steps))  # the run's counts: 0 .. steps-1
  warning = optim.schedule_warning(config)
  assert (warning is None) == math.isclose(reached, peak, rel_tol=1e-6)
  if warning:
    assert 'config.optim.warmup_steps' in warning and 'config.train.steps=8' in warning
