"""Metrics to a JSONL file and TensorBoard event files (tensorboardX: no TensorFlow needed)."""

import json
import time
from pathlib import Path

import jax
from tensorboardX import SummaryWriter

TENSORBOARD = 'tensorboard'  # the workdir's directory of event files
METRICS_FILE = 'metrics.jsonl'
TRAINING_LOSS = 'train/loss'  # the scalar of every logged training step


class MetricWriter:
  """Writes scalars to `workdir/metrics.jsonl` and `workdir/tensorboard/`, on process 0 only."""

  def __init__(self, workdir):
    self._active = jax.process_index() == 0
    if self._active:
      path = Path(workdir) / METRICS_FILE
      cut = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b'\n')
      self._jsonl = open(path, 'a')  # noqa: SIM115 (closed in close())
      if cut:  # the last line of a killed run: end it, so the next record stays readable
        self._jsonl.write('\n')
      self._tensorboard = SummaryWriter(str(path.parent / TENSORBOARD))

  def write(self, step: int, scalars: dict):
    if not self._active:
      return
    scalars = {name: float(value) for name, value in scalars.items()}
    self._jsonl.write(json.dumps({'step': step, 'time': time.time(), **scalars}) + '\n')
    self._jsonl.flush()
    for name, value in scalars.items():
      self._tensorboard.add_scalar(name, value, step)
    self._tensorboard.flush()

  def close(self):
    if self._active:
      self._jsonl.close()
      self._tensorboard.close()
