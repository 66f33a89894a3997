"""Optimizers built from a config: optax Adam with warmup, decay and gradient clipping (the
fields of config.optim: `relpos.config.shared.OptimConfig`)."""

import jax.numpy as jnp
import ml_collections
import optax


def rsqrt_schedule(scale: float, d_model: int, warmup_steps: int) -> optax.Schedule:
  """Vaswani et al. 2017: scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step >= 1."""

  def schedule(count):
    step = count + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def check_schedule(config: ml_collections.ConfigDict) -> None:
  """ValueError naming the field for a schedule that would not do what its fields say: a
  cosine 'decay' to a final_lr above the peak climbs instead."""
  optim = config.optim
  if optim.schedule == 'cosine' and optim.final_lr > optim.learning_rate:
    raise ValueError(
      f'config.optim.final_lr={optim.final_lr}: the cosine decay ends there, so it must not '
      f'exceed config.optim.learning_rate={optim.learning_rate} (the peak)'
    )


def schedule_warning(config: ml_collections.ConfigDict) -> str | None:
  """What a run should be told of its schedule before it trains, or None: a warmup as long as
  the run (config.train.steps) never reaches the peak learning rate, which a run cut short for
  a test means and a paper-sized one does not."""
  optim, steps = config.optim, config.train.steps
  peak_step = optim.warmup_steps - 1 if optim.schedule == 'rsqrt' else optim.warmup_steps
  if peak_step < steps:
    return None
  return (
    f'config.optim.warmup_steps={optim.warmup_steps} with config.train.steps={steps}: the '
    f'learning rate never reaches its peak ({optim.schedule!r} schedule); lower the warmup '
    'unless that is what you want'
  )


def learning_rate_schedule(
  optim: ml_collections.ConfigDict, total_steps: int, *, d_model: int | None = None
) -> optax.Schedule:
  """The learning rate by step.

  'cosine' / 'constant': linear warmup to `learning_rate`, then cosine decay to `final_lr` or
  constant. 'rsqrt': the Transformer schedule above with scale `learning_rate` (needs d_model).
  """
  if optim.schedule == 'rsqrt':
    if d_model is None:
      raise ValueError("config.optim.schedule='rsqrt' needs the model's d_model")
    return rsqrt_schedule(optim.learning_rate, d_model, max(1, optim.warmup_steps))
  if optim.schedule == 'constant':
    decay = optax.constant_schedule(optim.learning_rate)
  elif optim.schedule == 'cosine':
    decay = optax.cosine_decay_schedule(
      optim.learning_rate,
      decay_steps=max(1, total_steps - optim.warmup_steps),
      alpha=optim.final_lr / optim.learning_rate,
    )
  else:
    raise ValueError(
      f"config.optim.schedule={optim.schedule!r}: expected 'cosine', 'constant' or 'rsqrt'"
    )
  if optim.warmup_steps <= 0:
    return decay
  warmup = optax.linear_schedule(0.0, optim.learning_rate, optim.warmup_steps)
  return optax.join_schedules([warmup, decay], boundaries=[optim.warmup_steps])


def make_optimizer(
  optim: ml_collections.ConfigDict, total_steps: int, *, d_model: int | None = None
):
  """Adam(b1, b2, eps) on the schedule above, after global-norm clipping (0 disables it)."""
  schedule = learning_rate_schedule(optim, total_steps, d_model=d_model)
  adam = optax.adam(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps)
  if optim.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adam)
  return adam
