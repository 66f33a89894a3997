"""Which part of the training data one process of a data-parallel run reads.

Process `index` of `count` takes records i with i % count == index (lines of a text file,
records of a tfds split), so no process reads, detokenises or encodes another's examples.
Where the processes must agree (the padded lengths and the number of batches of an epoch, so
that every step has one global shape), they exchange small arrays through `all_gather`, a
collective that the training code supplies (`relpos.training.mesh.process_shard`); the data
code itself never imports jax.
"""

import dataclasses
from collections.abc import Callable

import numpy as np


def _only_process(x: np.ndarray) -> np.ndarray:
  return np.asarray(x)[None]


@dataclasses.dataclass(frozen=True)
class Shard:
  """Process `index` of `count`.

  Attributes:
    index, count: this process and the number of processes.
    all_gather: x -> [count, *x.shape], every process's x in process order; a collective: each
      process must call it the same number of times, and each call waits for all of them.
  """

  index: int = 0
  count: int = 1
  all_gather: Callable[[np.ndarray], np.ndarray] = _only_process

  def __post_init__(self):
    if not 0 <= self.index < self.count:
      raise ValueError(f'shard index {self.index} is outside 0..{self.count - 1}')

  def records(self, total: int) -> range:
    """The indices of this process's records among `total`."""
    return range(self.index, total, self.count)

  def limit(self, limit: int) -> int:
    """This process's part of a limit on the number of examples (0: no limit)."""
    return -(-limit // self.count)

  def wait_for_all(self) -> None:
    """Returns once every process has called it (e.g. after process 0 wrote a shared file)."""
    if self.count > 1:
      self.all_gather(np.zeros(1, np.int32))


ONE_PROCESS = Shard()  # all the data: a single-process run
