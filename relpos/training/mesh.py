"""Data parallelism: one `data` mesh axis over every device of every process.

The train steps are `jax.jit` over this mesh (the successor of `jax.pmap`), the same code for 1
device, many devices and many hosts: parameters and optimizer state are replicated, batches are
split by rows across the devices, and XLA inserts the all-reduce of the gradients. The batch of
a step is the GLOBAL batch (config.train.batch_size rows for the character LM,
config.data.max_tokens per side for translation); each device gets rows / device-count rows.

In a multi-process run (joined by `relpos.training.distributed`) each process builds only the
rows of its own devices (`process_rows`, or its data shard, `process_shard`) and `global_batch`
assembles the global array from them. Stopping is agreed too (`any_process`): a SIGTERM that
reaches one process stops all of them at the same step, so that they save the same checkpoint
together.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from relpos.data.shard import ONE_PROCESS, Shard

DATA_AXIS = 'data'


def data_mesh(devices=None) -> Mesh:
  """A 1-D mesh with axis `data` over `devices` (default: all devices of all processes).

  The axis is Auto: the model code carries no sharding annotations, and the compiler
  propagates the input shardings through the step.
  """
  devices = jax.devices() if devices is None else devices
  return jax.make_mesh((len(devices),), (DATA_AXIS,), axis_types=(AxisType.Auto,), devices=devices)


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array (parameters, optimizer state, scalars)."""
  return NamedSharding(mesh, P())


def row_sharded(mesh: Mesh, axis: int = 0) -> NamedSharding:
  """Dimension `axis` (the batch rows) is split evenly across the `data` axis."""
  return NamedSharding(mesh, P(*[None] * axis, DATA_AXIS))


def check_rows(rows: int, mesh: Mesh, field: str, micro_batches: int = 1):
  """Raises ValueError naming config `field` unless `rows` splits evenly across the devices
  and, within each, into `micro_batches` (config.train.grad_accum_steps)."""
  multiple = mesh.size * micro_batches
  if rows % multiple:
    accumulation = f' x {micro_batches} micro-batches (config.train.grad_accum_steps)'
    raise ValueError(
      f'{field}={rows} is the global batch of a step, split across {mesh.size} devices'
      f'{accumulation if micro_batches > 1 else ""}: make it a multiple of {multiple}'
    )


def process_rows(rows: int, mesh: Mesh) -> slice:
  """The rows [start, stop) of a `rows`-row global batch that this process's devices hold.

  Raises:
    ValueError: `rows` does not split across the devices, or this process's rows are not
      contiguous (a mesh whose device order interleaves processes).
  """
  check_rows(rows, mesh, 'rows')
  indices = row_sharded(mesh).addressable_devices_indices_map((rows,)).values()
  starts = sorted(index[0].start or 0 for index in indices)
  per_device = rows // mesh.size
  if starts != list(range(starts[0], starts[0] + per_device * len(starts), per_device)):
    raise ValueError(f'process {jax.process_index()} holds non-contiguous rows {starts}')
  return slice(starts[0], starts[0] + per_device * len(starts))


def distribute(tree, sharding):
  """`tree`'s arrays as global arrays placed by `sharding` (one, or a tree of them like `tree`).

  Every process must hold the same values (e.g. initialised from the same seed); each fills
  its own devices' shards from its copy. (jax.device_put refuses committed single-device
  arrays as the source of a multi-process sharding.) Under `jax.eval_shape` (an abstract
  build, benchmarks/compile_report.py) the arrays stay abstract: the jitted step places them.
  """

  def put(x, sharding):
    if isinstance(x, jax.core.Tracer):
      return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # nnx RNG state
      return jax.random.wrap_key_data(
        put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x)
      )
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree.map(lambda x: put(x, sharding), tree)
  return jax.tree.map(put, tree, sharding)


def global_batch(local_rows, mesh: Mesh, axis: int = 0):
  """The global arrays whose rows (dimension `axis`) this process holds as `local_rows`.

  Args:
    local_rows: a pytree of NumPy arrays, each [..., rows of `process_rows`, ...] with the row
      dimension at `axis`; in a single-process run, the whole batch.
  Returns:
    The same pytree of jax.Arrays with the global row count, sharded by `row_sharded`.
  """
  return jax.make_array_from_process_local_data(row_sharded(mesh, axis), local_rows)


def local_copy(tree):
  """A replicated pytree as arrays on this process's first device (for local evaluation)."""
  return jax.tree.map(lambda x: x.addressable_data(0), tree)


def is_writer() -> bool:
  """Whether this process writes shared files (config, vocabulary, results): process 0."""
  return jax.process_index() == 0


def barrier(name: str):
  """Waits until every process gets here (e.g. after process 0 wrote a file the others read)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def writer_first(fn, name: str):
  """fn() on process 0, then, after a barrier, on the other processes; returns its result.

  For a step that writes a file on first use and reads it later (a vocabulary): process 0
  writes it, the others read it. If process 0 raises, the others stop at the barrier until
  jax.distributed notices that process 0 is gone.
  """
  result = fn() if is_writer() else None
  barrier(name)
  return result if is_writer() else fn()


def _all_gather(x: np.ndarray) -> np.ndarray:
  """[process_count, *x.shape]: every process's `x` (a collective)."""
  return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def process_shard() -> Shard:
  """This process's shard of the training data, with the all-gather the processes agree by."""
  if jax.process_count() == 1:
    return ONE_PROCESS
  return Shard(jax.process_index(), jax.process_count(), _all_gather)


def any_process(flag: bool) -> bool:
  """Whether `flag` is True on any process (a collective in a multi-process run)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(_all_gather(np.asarray([flag], np.int32))))
