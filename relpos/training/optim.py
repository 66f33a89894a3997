"""Optimizers built from a config: optax Adam with warmup, decay and gradient clipping."""

import ml_collections
import optax


def learning_rate_schedule(optim: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then `schedule` ('cosine' to `final_lr`, or 'constant')."""
  if optim.schedule == 'constant':
    decay = optax.constant_schedule(optim.learning_rate)
  elif optim.schedule == 'cosine':
    decay = optax.cosine_decay_schedule(
      optim.learning_rate,
      decay_steps=max(1, total_steps - optim.warmup_steps),
      alpha=optim.final_lr / optim.learning_rate,
    )
  else:
    raise ValueError(f"config.optim.schedule={optim.schedule!r}: expected 'cosine' or 'constant'")
  if optim.warmup_steps <= 0:
    return decay
  warmup = optax.linear_schedule(0.0, optim.learning_rate, optim.warmup_steps)
  return optax.join_schedules([warmup, decay], boundaries=[optim.warmup_steps])


def make_optimizer(optim: ml_collections.ConfigDict, total_steps: int):
  """Adam(b1, b2, eps) on the schedule above, after global-norm clipping (0 disables it)."""
  adam = optax.adam(
    learning_rate_schedule(optim, total_steps), b1=optim.b1, b2=optim.b2, eps=optim.eps
  )
  if optim.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adam)
  return adam
