"""Training and evaluation loops, and what they share: optimizer, checkpoints, metrics."""
