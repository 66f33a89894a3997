"""Orbax checkpoints of a training state: named items (pytrees of arrays) plus JSON metadata.

Each item is saved on its own, so a reader restores only the items it needs (evaluation reads
'model' and never the optimizer state).

In a multi-process run every process calls save and restore (orbax writes collectively, each
process its own shards); arrays are restored with the shardings of the `like` tree's arrays.

Saves are atomic (orbax writes to a temporary directory and renames it), so an interrupted save
never shows up as the latest step. A finished checkpoint that cannot be read back (damaged
files, or arrays of other shapes than the config builds) is skipped with a warning by
`restore_latest`, which falls back to the newest readable one.
"""

import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from absl import logging

from relpos.training import mesh as mesh_lib


class Checkpoints:
  """`workdir/checkpoints/<step>/{<item>...,meta}`, keeping the newest `keep` steps."""

  def __init__(self, workdir, *, keep: int = 3):
    self.directory = Path(workdir).resolve() / 'checkpoints'
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, items: dict, meta: dict):
    """Writes `items` (name -> pytree of arrays) and `meta` (JSON-able) as `step`."""
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    self._manager.save(
      step, args=ocp.args.Composite(**args, meta=ocp.args.JsonSave(meta)), force=True
    )

  def restore(self, step: int, like: dict):
    """(the items named in `like`, each shaped like its pytree there, meta) of `step`."""
    args = {
      name: ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, tree))
      for name, tree in like.items()
    }
    restored = self._manager.restore(
      step, args=ocp.args.Composite(**args, meta=ocp.args.JsonRestore())
    )
    return {name: restored[name] for name in like}, restored.meta

  def restore_latest(self, like: dict):
    """(step, items, meta) of the newest readable checkpoint, or None if there is none.

    Raises:
      ValueError: checkpoints exist but none can be read (e.g. the config changed the model).
    """
    failures, unreadable = [], []
    for step in reversed(self.all_steps()):
      try:
        found = (step, *self.restore(step, like))
      except Exception as error:  # noqa: BLE001 (orbax raises many kinds; each is reported)
        first_line = (str(error).strip().splitlines() or [''])[0][:200]
        failures.append(f'step {step}: {type(error).__name__}: {first_line}')
        unreadable.append(step)
        logging.warning('checkpoint %s is unreadable, trying an older one: %s', step, error)
        print(
          f'warning: checkpoint {self.directory / str(step)} is unreadable; trying an older one'
        )
        continue
      self._set_aside(unreadable)  # kept for inspection; training can save those steps again
      return found
    if failures:
      raise ValueError(
        f'no readable checkpoint in {self.directory} ({"; ".join(failures)}). If the config '
        'changed the model, use its original config or a new --workdir'
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
        print(f'warning: moved unreadable checkpoint {step} to {aside}')
    mesh_lib.barrier('checkpoints set aside')
    self._manager.reload()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()
