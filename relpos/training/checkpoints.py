"""Orbax checkpoints of a training state: named items (pytrees of arrays) plus JSON metadata.

Each item is saved on its own, so a reader restores only the items it needs (evaluation reads
'model' and never the optimizer state).

In a multi-process run every process calls save and restore (orbax writes collectively, each
process its own shards); arrays are restored with the shardings of the `like` tree's arrays.

Saves are atomic (orbax writes to a temporary directory and renames it), so an interrupted save
never shows up as the latest step. A finished checkpoint that cannot be read back (damaged
files, or arrays of other shapes than the config builds) is skipped with a one-line warning by
`restore_latest`, which falls back to the newest readable one; a training run (`writer`) moves
it to workdir/unreadable_checkpoints/, a reader (eval.py, the tools) leaves the workdir as it
is. A damaged checkpoint is an `UnreadableCheckpointError` naming it and the first line of the
real cause (tensorstore's, not orbax's wrapper with its TensorStore spec); orbax's other reads
of that restore fail too, and what they leave (coroutines closed half way, futures whose
error nobody retrieved) is filtered out as a failed save's is. A checkpoint that the run
training in the workdir evicts while a reader reads it fails the same ways, but is not damaged:
after a failed read the checkpoint is looked at again (`Checkpoints._evicted`), and one that
lost files or is no longer listed is a `VanishedCheckpointError`, which the reader answers by
listing the checkpoints again.

Faults of the filesystem (docs/faults.md) end a run with one line
(`relpos.faults.FilesystemFaultError`):
- Orbax commits a save in a background thread; an error there (a full disk, a workdir gone
  read-only) is kept by orbax until someone waits for the commit. `Checkpoints` waits for
  each save's commit before the next save, at `commit` and at `close`, and turns a failure into
  a `FilesystemFaultError` naming the step that was not written and the last good checkpoint; the
  background thread's own ERROR tracebacks are filtered out of the log (`--traceback` shows the
  cause), as are asyncio's "Task/Future exception was never retrieved" of orbax's and the
  "Event loop is closed" of tensorstore writes that finish after orbax gave up on them.
  Saves stay asynchronous: training goes on while a checkpoint is written.
- A save that did not commit leaves `<step>.orbax-checkpoint-tmp*` behind. Orbax never lists
  it as a step, so no run resumes from it; the failed save's directories are removed at once
  (their space is what a full disk needs back), and a training run removes any others it
  finds when it opens the directory (a run killed mid-save), saying so in one line.
"""

import errno
import logging as std_logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from absl import logging

from relpos import signals
from relpos.faults import (
  NO_CHECKPOINT_YET,
  NO_EARLIER_CHECKPOINT,
  FilesystemFaultError,
  bounded,
  exception_chain,
  filesystem_fault,
  first_line,
)
from relpos.messages import warn
from relpos.training import mesh as mesh_lib

CHECKPOINTS = 'checkpoints'  # the workdir's directory of them
TMP_MARKER = '.orbax-checkpoint-tmp'
# Where tensorstore's text of an error turns into its spec: a JSON repr of hundreds of characters.
_TENSORSTORE_SPEC = (' See full TensorStore details', ' [tensorstore_spec')


def _read_cause(error: BaseException) -> str:
  """The first line of the innermost cause (following `__cause__` alone) of a failed restore,
  without tensorstore's spec and at most 300 characters: orbax wraps tensorstore's error
  ('OUT_OF_RANGE: Error reading ... Requested byte range ... is not valid') in an Exception
  whose text is a pybind repr of the whole TensorStore spec, and tensorstore's own text may end
  in the spec's JSON
  ('... does not exist [tensorstore_spec[1]=\'{"base":...')."""
  line = first_line(exception_chain(error, context=False)[-1], limit=sys.maxsize)
  for spec in _TENSORSTORE_SPEC:
    line = line.split(spec)[0]
  return bounded(line, 300)


def _name_last_good(directory: Path, steps, none: str) -> str:
  """A fault's words for the newest of the finished `steps` in `directory`, or `none`."""
  if not steps:
    return none
  newest = max(steps)
  return f'the last good checkpoint is {directory / str(newest)} (step {newest}), intact'


def finished_steps(workdir) -> list[int]:
  """The steps of the finished checkpoints in workdir, read from its directory names without
  opening them (orbax names finished steps by their number, unfinished ones with TMP_MARKER)."""
  directory = Path(workdir).resolve() / CHECKPOINTS
  return sorted(int(p.name) for p in directory.glob('*') if p.name.isdigit() and p.is_dir())


def steps_text(steps: list[int]) -> str:
  """Checkpoint steps as a list, shortened to its first two and its last past six."""
  return str(steps) if len(steps) <= 6 else f'[{steps[0]}, {steps[1]}, ..., {steps[-1]}]'


def last_good_in(workdir) -> str:
  """`Checkpoints.last_good` of a workdir that cannot be opened (`finished_steps`)."""
  try:
    steps = finished_steps(workdir)
  except (OSError, RuntimeError):  # a path that cannot be one (too long, a symlink loop)
    return 'no checkpoint could be written there'
  return _name_last_good(Path(workdir).resolve() / CHECKPOINTS, steps, NO_CHECKPOINT_YET)


def _path_names(path) -> tuple[str, ...]:
  """A pytree path as strings (orbax's metadata names a list's or an int-keyed dict's entries
  '0', '1', ...)."""
  return tuple(
    str(getattr(key, 'key', getattr(key, 'idx', getattr(key, 'name', key)))) for key in path
  )


_ORBAX_SOURCE = f'{os.sep}orbax{os.sep}'


class _OrbaxErrors(std_logging.Filter):
  """Drops orbax's ERROR records (with tracebacks) of a failed background save, and asyncio's
  "Task/Future exception was never retrieved" of its tasks (orbax gathers them and
  stops at the first error; on a full disk, or reading a damaged checkpoint, the others fail
  too): `Checkpoints` reports the failure as one line, with the cause chained for
  --traceback. A read's future holds tensorstore's error alone, which names no orbax source
  but the file it read: records naming one of `directories` (those `Checkpoints` opened) go
  too. So do orbax's warnings that a file of one of those checkpoints does not exist (an empty
  or cut checkpoint directory, which the warning of its own names)."""

  def __init__(self):
    super().__init__()
    self.directories = set()

  def filter(self, record):
    if record.levelno == std_logging.WARNING and _ORBAX_SOURCE in record.pathname:
      # "Metadata file does not exist: <checkpoint>/_CHECKPOINT_METADATA": a checkpoint
      # directory left empty or cut, which the unreadable checkpoint's own line names.
      message = record.getMessage()
      return not ('does not exist' in message and any(d in message for d in self.directories))
    if record.levelno != std_logging.ERROR:
      return True
    if record.name == 'asyncio':
      if 'never retrieved' not in str(record.msg):
        return True
      frames = traceback.extract_tb(record.exc_info[2]) if record.exc_info else []
      message = record.getMessage()
      return not (
        'orbax' in message
        or any(_ORBAX_SOURCE in f.filename for f in frames)
        or any(directory in message for directory in self.directories)
      )
    return _ORBAX_SOURCE not in record.pathname


_FILTER = _OrbaxErrors()


def _orbax_leftover(unraisable) -> bool:
  """Whether an unraisable exception is what orbax's abandoned asynchronous work raises when it
  is collected, which a sys.unraisablehook layer drops (`signals.take_unraisable`): "RuntimeError:
  Event loop is closed" (tensorstore finishing the writes of a failed save after orbax closed
  the event loop that awaited them), and the error of an orbax coroutine closed half way
  ("Exception ignored in: <coroutine object _read_array_index_and_device_put>": the other reads
  of a restore that failed, collected as late as the interpreter's exit)."""
  error = unraisable.exc_value
  if isinstance(error, RuntimeError) and str(error) == 'Event loop is closed':
    return True
  code = getattr(unraisable.object, 'cr_code', None)  # a coroutine's
  return code is not None and _ORBAX_SOURCE in code.co_filename


class UnreadableCheckpointError(ValueError):
  """A finished checkpoint whose files cannot be read back (damaged, truncated)."""

  def __init__(self, path: Path, cause: str):
    super().__init__(f'checkpoint {path} is unreadable: {cause}')
    self.cause = cause


class VanishedCheckpointError(UnreadableCheckpointError):
  """A checkpoint listed that was evicted when it was read: not damaged, but removed in
  between by the run training in the workdir, which keeps only its newest checkpoints (readers
  such as eval.py do not lock the workdir; docs/faults.md). A reader lists the checkpoints
  again (`relpos.training.restore.restore_model`).

  Orbax evicts a local checkpoint by unlinking its files (its top-level ones first, in
  threads), then removing its directories, all in place: no rename and no marker. A read it
  races fails in any of several ways (no such file, a truncated Zstd stream, 'Item "model"
  was not found', tensorstore's missing metadata), so the error itself does not tell eviction
  from damage; `Checkpoints.restore` looks at the checkpoint after the failure instead
  (`_evicted`)."""

  def __init__(self, path: Path):
    ValueError.__init__(
      self,
      f'checkpoint {path} was removed while it was read: the run training in '
      f'{path.parent.parent} removed it, keeping only its newest checkpoints '
      '(config.train.keep_checkpoints)',
    )
    self.cause = 'removed while it was read'


# How long a reader waits after a failed read before it lists the checkpoints again, which
# lets orbax finish an eviction it raced (a small checkpoint's takes milliseconds).
EVICTION_SETTLE_SECONDS = 0.3
# How many times a reader lists the checkpoints of a run that trains now, when one it listed
# vanished as it looked inside (opening them here, reading them in `restore.restore_model`).
VANISHED_CHECKPOINT_TRIES = 3


class Checkpoints:
  """`workdir/checkpoints/<step>/{<item>...,meta}`, keeping the newest `keep` steps."""

  def __init__(self, workdir, *, keep: int = 3, writer: bool = False):
    """`writer`: a training run's, which makes the directory, removes half-written checkpoints
    it finds and sets unreadable ones aside; a reader (eval.py, the tools, possibly on a run in
    progress) changes nothing in the workdir."""
    self.directory = Path(workdir).resolve() / CHECKPOINTS
    for logger in ('absl', 'asyncio'):
      std_logging.getLogger(logger).addFilter(_FILTER)  # once: a logger's filters are a set
    _FILTER.directories.add(str(self.directory))
    signals.take_unraisable('quiet_closed_loops', _orbax_leftover)
    self._pending = None  # the step of a save whose commit nobody has checked yet
    self._writer = writer
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=writer)
    for attempt in range(VANISHED_CHECKPOINT_TRIES):
      try:
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        break
      except FileNotFoundError as error:
        # A reader listing a run that trains now: a checkpoint the trainer evicts between the
        # listing and a look inside it is gone, not the workdir: list again.
        evicted = not writer and self.directory.is_dir()
        if not evicted or attempt == VANISHED_CHECKPOINT_TRIES - 1:
          raise self._open_fault(error, workdir) from error
        time.sleep(EVICTION_SETTLE_SECONDS)
      except OSError as error:
        raise self._open_fault(error, workdir) from error
    if writer:
      self._remove_half_written()

  def _open_fault(self, error: OSError, workdir) -> FilesystemFaultError:
    return filesystem_fault(
      error, f'cannot open the checkpoints at {self.directory}', last_good=last_good_in(workdir)
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def reload(self) -> None:
    """Lists the checkpoints again (orbax keeps the list it read when opened): a reader's view
    of a run training now."""
    self._manager.reload()

  def last_good(self, but: int | None = None) -> str:
    """Names the newest finished checkpoint (other than step `but`), for a fault's message."""
    steps = [
      step
      for step in self.all_steps()
      if step != but and step != self._pending and (self.directory / str(step)).is_dir()
    ]
    return _name_last_good(self.directory, steps, NO_EARLIER_CHECKPOINT)

  def save(self, step: int, items: dict, meta: dict):
    """Writes `items` (name -> pytree of arrays) and `meta` (JSON-able) as `step`, after
    checking that the previous save committed; the commit of this one runs in the background
    (`commit` waits for it).

    Raises:
      FilesystemFaultError: this save or the previous one failed, or the directory is gone.
    """
    self.commit()
    what = f'cannot write checkpoint {step} to {self.directory / str(step)}'
    if not self.directory.is_dir():  # orbax would make it again, in a workdir that is gone
      gone = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.directory))
      raise filesystem_fault(gone, what, last_good='no checkpoint is left there', resume=False)
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    self._pending = step
    try:
      self._manager.save(
        step, args=ocp.args.Composite(**args, meta=ocp.args.JsonSave(meta)), force=True
      )
    except Exception as error:  # noqa: BLE001 (orbax and tensorstore raise many kinds)
      self._fail(step, error)

  def commit(self):
    """Waits for the pending save to commit and checks its result.

    Raises:
      FilesystemFaultError: it did not commit (its half-written directories are removed).
    """
    step, self._pending = self._pending, None
    if step is None:
      return
    try:
      self._manager.wait_until_finished()
      self._manager.check_for_errors()
    except Exception as error:  # noqa: BLE001
      self._fail(step, error)

  def _fail(self, step: int, error: Exception):
    self._pending = None
    self._drain()
    self._remove_half_written(step, quiet=True)
    raise filesystem_fault(
      error,
      f'checkpoint {step} was not written to {self.directory / str(step)}',
      last_good=self.last_good(but=step),
    ) from error

  def _drain(self):
    """Waits for the other writes of a failed save: orbax reports the first error of its
    commit while the rest go on writing into the temporary directory (and would make it again
    after it is removed). Best effort, through orbax's private attributes: without them the
    directory is removed again by `close` and by the next run."""
    checkpointer = getattr(self._manager, '_checkpointer', None)
    futures = getattr(getattr(checkpointer, '_async_manager', None), '_commit_futures', None)
    for commit in futures or ():
      try:
        commit.result(timeout=300)
      except Exception:  # noqa: BLE001, S112 (the first error is the one reported)
        continue

  def _remove_half_written(self, step: int | None = None, *, quiet: bool = False):
    """Removes the `<step>.orbax-checkpoint-tmp*` directories of `step` (None: of every step),
    saves that never committed (process 0 does; best effort)."""
    if not mesh_lib.is_writer():
      return
    pattern = f'{"*" if step is None else step}{TMP_MARKER}*'
    for path in sorted(self.directory.glob(pattern)):
      if not quiet:
        warn(f'removed {path}, a checkpoint whose save did not finish')
      shutil.rmtree(path, ignore_errors=True)

  def restore(self, step: int, like: dict):
    """(the items named in `like`, each shaped like its pytree there, meta) of `step`.

    The arrays' shapes are compared with the checkpoint's metadata first: a checkpoint of
    another model raises a ValueError naming the first array that differs, before orbax starts
    reading (a read it abandons half way leaves coroutines that were never awaited).

    Raises:
      ValueError: the shapes differ.
      VanishedCheckpointError: it was evicted as orbax read it (`_evicted`).
      UnreadableCheckpointError: orbax could not read it otherwise: it is still there, whole.
    """
    entries = self._entries(step)  # what `_evicted` compares with after a failure
    self._check_shapes(step, like)
    args = {
      name: ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, tree))
      for name, tree in like.items()
    }
    try:
      restored = self._manager.restore(
        step, args=ocp.args.Composite(**args, meta=ocp.args.JsonRestore())
      )
    except Exception as error:  # noqa: BLE001 (orbax raises a bare Exception, among others)
      logging.info('checkpoint %s: %s', step, error)  # the whole of it, for --verbosity=0
      if self._evicted(step, entries):
        raise VanishedCheckpointError(self.directory / str(step)) from error
      raise UnreadableCheckpointError(self.directory / str(step), _read_cause(error)) from error
    return {name: restored[name] for name in like}, restored.meta

  def _entries(self, step: int) -> frozenset[str] | None:
    """The names in checkpoint `step`'s directory, or None if it is gone."""
    try:
      return frozenset(os.listdir(self.directory / str(step)))
    except OSError:
      return None

  def _evicted(self, step: int, entries: frozenset[str] | None) -> bool:
    """Whether checkpoint `step`, whose read just failed, was being evicted (`entries`: its
    names before the read): its directory is gone, or lost a name it had (orbax deletes in
    place, files first). A reader also waits EVICTION_SETTLE_SECONDS and lists the
    checkpoints again: a step no longer listed was evicted, whatever the read's error said. A
    writer holds the workdir's lock, so nothing else removes its checkpoints: it does not
    wait."""
    if self._gone(step, entries):
      return True
    if self._writer:
      return False
    time.sleep(EVICTION_SETTLE_SECONDS)
    self.reload()
    return step not in self.all_steps() or self._gone(step, entries)

  def _gone(self, step: int, entries: frozenset[str] | None) -> bool:
    now = self._entries(step)
    return now is None or entries is None or not entries <= now

  def _check_shapes(self, step: int, like: dict) -> None:
    saved = {}
    try:
      handler = ocp.StandardCheckpointHandler()  # reads an item's array metadata, nothing else
      for name in like:
        tree = handler.metadata(self.directory / str(step) / name).tree
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
          if hasattr(leaf, 'shape'):
            saved[(name, *_path_names(path))] = tuple(leaf.shape)
    except Exception:  # noqa: BLE001 (no metadata to compare with: orbax's restore decides)
      return
    for name, tree in like.items():
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key, shape = (name, *_path_names(path)), getattr(leaf, 'shape', None)
        if shape is None or jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
          continue
        if key not in saved:
          raise ValueError(f'{name}{jax.tree_util.keystr(path)} is not in the checkpoint')
        if saved[key] != tuple(shape):
          raise ValueError(
            f'{name}{jax.tree_util.keystr(path)} has shape {list(saved[key])} in the checkpoint, '
            f'{list(shape)} in this config'
          )

  def restore_latest(self, like: dict):
    """(step, items, meta) of the newest readable checkpoint, or None if there is none. Each
    one skipped is a warning line; a writer sets them aside (`_set_aside`).

    Raises:
      ValueError: checkpoints exist but none can be read (damaged, or the config changed the
        model).
      VanishedCheckpointError: a reader's was removed while it was read (by the run training
        there; the reader lists them again), not skipped as unreadable.
    """
    failures, unreadable, damaged = [], [], True
    for step in reversed(self.all_steps()):
      try:
        found = (step, *self.restore(step, like))
      except Exception as error:  # noqa: BLE001 (orbax raises many kinds; each is reported)
        if isinstance(error, VanishedCheckpointError) and not self._writer:
          raise  # a reader lists them again (`relpos.training.restore.restore_model`)
        cause = getattr(error, 'cause', None) or first_line(error)
        damaged = damaged and isinstance(error, UnreadableCheckpointError)
        failures.append(f'step {step}: {cause}')
        unreadable.append(step)
        warn(
          f'checkpoint {self.directory / str(step)} is unreadable ({cause}); trying an older one'
        )
        continue
      if self._writer:
        self._set_aside(unreadable)  # kept for inspection; training can save those steps again
      return found
    if failures:
      todo = (
        'their files are damaged: restore them from a copy, or give a new --workdir'
        if damaged
        else 'if the config changed the model, use its original config or a new --workdir'
      )
      raise ValueError(
        f'no readable checkpoint in {self.directory} ({"; ".join(failures)}): {todo}'
      )
    return None

  def _set_aside(self, steps):
    """Moves checkpoints `steps` to workdir/unreadable_checkpoints/ (process 0 does) and
    forgets them."""
    if not steps:
      return
    if mesh_lib.is_writer():
      aside = self.directory.parent / 'unreadable_checkpoints'
      aside.mkdir(exist_ok=True)
      for step in steps:
        (self.directory / str(step)).rename(aside / f'{step}-{time.strftime("%Y%m%d-%H%M%S")}')
        warn(f'moved unreadable checkpoint {step} to {aside}')
    mesh_lib.barrier('checkpoints set aside')
    self._manager.reload()

  def close(self, *, check: bool = True):
    """Waits for the pending save; `check` False (a run already ending on another error,
    whose line names the last good checkpoint) logs a failed commit at INFO instead of raising
    its FilesystemFaultError."""
    try:
      self.commit()
    except FilesystemFaultError as fault:
      if check:
        raise
      logging.info('%s', fault)
    finally:
      if self._writer:
        self._remove_half_written(quiet=True)  # what a failed save's last writes left
      try:
        self._manager.close()
      except Exception as error:  # noqa: BLE001 (the commit's own error was reported above)
        (logging.warning if check else logging.info)('closing the checkpoints: %s', error)
