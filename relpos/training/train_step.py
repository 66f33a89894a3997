"""The training state and the jitted step every task's `Training` runs over it.

The state is pure dicts of arrays (`init_state`), what a checkpoint holds too. The step
(`train_step_fn`) is data-parallel over the mesh: model and optimizer replicated, the global
batch split by rows, and XLA inserts the gradient all-reduce; the state is donated. A task
gives only its loss (`loss_fn`) and, where it carries state from step to step (the char LM's
memory), how that is sharded and split into rows. config.train.grad_accum_steps runs the step
as micro-batches of the rows in one `lax.scan` (`_accumulate`), so that only one micro-batch's
activations are alive at a time, for the same update.

How the loop (`relpos.training.loop`) dispatches the step is decided here too
(`one_step_in_flight`: on XLA:CPU with several devices, one step at a time), as is the model
it validates (`eval_model`).
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos.training import mesh as mesh_lib
from relpos.training import optim


def init_state(model: nnx.Module, config, mesh, **carry) -> tuple[Any, dict]:
  """(graphdef, state) of `model` and its optimizer (config.optim), replicated over `mesh`;
  `carry` (dicts of arrays, already placed) joins the state.

  state['model'] and state['optimizer'] are pure dicts of arrays (`nnx.to_pure_dict`), which
  is also what a checkpoint holds. The jitted step takes and returns them as they are:
  `nnx.State` leaves would be rebuilt as nnx Variables on the host after every step, host
  work that competes with XLA's threads for the cores (README measures it).
  """
  tx = optim.make_optimizer(config.optim, config.train.steps, d_model=config.model.d_model)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  state = mesh_lib.distribute(nnx.to_pure_dict(state), mesh_lib.replicated(mesh))
  return graphdef, {'model': state[0], 'optimizer': state[1], **carry}


def _split_rows(x, axis: int, parts: int):
  """[.., rows, ..] -> [parts, .., rows / parts, ..]: part a holds rows a, a + parts, ...
  (strided, so a part takes rows from every device of a row-sharded batch)."""
  x = x.reshape(*x.shape[:axis], x.shape[axis] // parts, parts, *x.shape[axis + 1 :])
  return jnp.moveaxis(x, axis + 1, 0)


def _merge_rows(x, axis: int):
  """The inverse of `_split_rows`."""
  x = jnp.moveaxis(x, 0, axis + 1)
  return x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2 :])


def _accumulate(grads_of, model, batch, carry, carry_rows, parts: int):
  """`grads_of(model, batch, carry) -> (grads, sums, carry)` over `parts` micro-batches of the
  rows, one after another (lax.scan), gradients and sums added. Leaves of `carry_rows` give
  each carry leaf's row axis, or None for a leaf shared by all rows (every micro-batch gets
  it; the last one's result is kept). The model's rng counts advance as in `parts` calls."""
  model_graphdef, model_state = nnx.split(model)
  shared = lambda axis: axis is None  # noqa: E731
  micro_batches = jax.tree.map(lambda x: _split_rows(x, 0, parts), batch)
  micro_carries = jax.tree.map(
    lambda axis, x: (
      jnp.broadcast_to(x, (parts, *x.shape)) if axis is None else _split_rows(x, axis, parts)
    ),
    carry_rows,
    carry,
    is_leaf=shared,
  )

  def grads_and_sums(state, micro_batch, micro_carry):
    model = nnx.merge(model_graphdef, state)
    grads, sums, new_carry = grads_of(model, micro_batch, micro_carry)
    return grads, sums, new_carry, nnx.state(model)

  first = jax.tree.map(lambda x: x[0], (micro_batches, micro_carries))
  zeros = jax.tree.map(
    lambda leaf: jnp.zeros(leaf.shape, leaf.dtype),
    jax.eval_shape(lambda *args: grads_and_sums(*args)[:2], model_state, *first),
  )

  def body(totals, micro):
    state, grads_total, sums_total = totals
    grads, sums, new_carry, state = grads_and_sums(state, *micro)
    add = functools.partial(jax.tree.map, jnp.add)
    return (state, add(grads_total, grads), add(sums_total, sums)), new_carry

  (model_state, grads, sums), new_carries = jax.lax.scan(
    body, (model_state, *zeros), (micro_batches, micro_carries)
  )
  nnx.update(model, model_state)
  new_carry = jax.tree.map(
    lambda axis, x: x[-1] if axis is None else _merge_rows(x, axis),
    carry_rows,
    new_carries,
    is_leaf=shared,
  )
  return grads, sums, new_carry


def train_step_fn(
  graphdef, loss_fn, mesh, *, carry_sharding=None, carry_rows=None, grad_accum_steps=1
):
  """The jitted step (state, batch) -> (state, sums) of the `init_state` pair `graphdef`.

  `loss_fn(model, batch, carry) -> (loss_sum, (sums, carry))` gives the loss summed over the
  batch's items (characters, target tokens), the summed scalars to log, among them
  sums['tokens'], the number of those items, and the next carry. The update follows the
  gradient of loss_sum / tokens, the mean over the global batch.

  Data-parallel over `mesh`: model and optimizer replicated, the batch split by rows, the
  carry as `carry_sharding` ({name: sharding}) says; XLA inserts the gradient all-reduce.

  `grad_accum_steps` = A > 1 computes the step as A micro-batches of the rows, one after
  another (`_accumulate`), adding their gradients and sums before the division by the tokens:
  the same update as one batch of all rows (up to float rounding; dropout draws differ), with
  the activations of one micro-batch alive at a time. The batch's rows must be a multiple of
  A times the devices. `carry_rows` ({name: pytree of row axes, None for shared leaves}) says
  how the carry splits into rows. The state is donated.
  """
  replicated = mesh_lib.replicated(mesh)
  state_sharding = {'model': replicated, 'optimizer': replicated, **(carry_sharding or {})}

  def grads_of(model, batch, carry):
    grad_fn = nnx.value_and_grad(lambda model: loss_fn(model, batch, carry), has_aux=True)
    (_, (sums, carry)), grads = grad_fn(model)
    return grads, sums, carry

  def step(state, batch):
    model, optimizer = nnx.merge(graphdef, {0: state['model'], 1: state['optimizer']})
    carry = {name: value for name, value in state.items() if name not in ('model', 'optimizer')}
    if grad_accum_steps == 1:
      grads, sums, carry = grads_of(model, batch, carry)
    else:
      rows = {name: carry_rows[name] for name in carry}
      grads, sums, carry = _accumulate(grads_of, model, batch, carry, rows, grad_accum_steps)
    tokens = jnp.maximum(sums['tokens'], 1).astype(jnp.float32)
    grads = jax.tree.map(lambda grad: grad / tokens, grads)
    optimizer.update(model, grads)
    new_state = nnx.to_pure_dict(nnx.state((model, optimizer)))
    return {'model': new_state[0], 'optimizer': new_state[1], **carry}, sums

  return jax.jit(
    step,
    donate_argnums=(0,),
    in_shardings=(state_sharding, mesh_lib.row_sharded(mesh)),
    out_shardings=(state_sharding, replicated),
  )


def one_step_in_flight(mesh) -> bool:
  """Whether the loop dispatches a step only after the previous one finished: on XLA:CPU with
  several devices (jax 0.10.2).

  There, a step's gradient all-reduce can deadlock when the next step is dispatched early.
  Each device's share of a step is launched on a small pool of threads (two on two cores). In
  the stack of a hung process, one launch thread waited in the all-reduce for the other
  device, the other launch thread waited inside the launch of another execution (read: the
  same device's next step), and no thread ran the other device's share: XLA aborts after 40 s
  ("Termination timeout ... all reduce"). It is a race, seen when other processes compete
  for the cores. Preparing the next batch still overlaps the running step; the dispatch itself
  no longer does. README (Speed on CPU) has how often it deadlocked with and without this, and
  what the wait costs.
  """
  return jax.default_backend() == 'cpu' and mesh.devices.size > 1


def eval_model(graphdef, state: dict) -> nnx.Module:
  """The trained model, on this process's first device (evaluation runs per process)."""
  both = {0: state['model'], 1: state['optimizer']}
  return nnx.merge(graphdef, mesh_lib.local_copy(both))[0]
