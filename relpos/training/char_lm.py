"""Train and evaluate the Transformer-XL character LM (enwik8 or any text file).

`train_and_evaluate(config, workdir)` and `evaluate(config, workdir)` are what `train.py` and
`eval.py` call. Everything a run needs to resume sits in `workdir`: the resolved config, the
vocabulary, orbax checkpoints (parameters, optimizer state, dropout RNG state, the memory, and
the step, which fixes the data position), metrics.jsonl and TensorBoard events.

Training is data-parallel over every device (`relpos.training.mesh`): config.train.batch_size
is the global batch, its rows (and the memory's rows) split across the devices. Evaluation runs
on one device of each process, every process computing the same result; process 0 writes it.
"""

import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from relpos.data.char_corpus import CharVocab, load_char_splits
from relpos.data.ordered import OrderedBatches
from relpos.models.transformer_xl import Memory, TransformerXL, check_config, nats_per_token
from relpos.training import mesh as mesh_lib
from relpos.training.checkpoints import Checkpoints
from relpos.training.metrics import MetricWriter
from relpos.training.optim import make_optimizer
from relpos.training.preemption import PreemptedError, PreemptionSignal, train_then_evaluate
from relpos.training.progress import Progress
from relpos.training.run_config import record_config


def model_config(config, vocab_size: int, *, for_eval: bool) -> ml_collections.ConfigDict:
  """config.model plus the vocabulary size; evaluation swaps in the eval clamp/same_length."""
  resolved = ml_collections.ConfigDict(config.model.to_dict())
  resolved.vocab_size = vocab_size
  if for_eval:
    resolved.clamp_len = config.eval.clamp_len
    resolved.same_length = config.eval.same_length
  return resolved


def _vocab_for_run(config, workdir: Path):
  """Splits and vocabulary; the vocabulary is saved on the first run and must match later.

  Process 0 saves it; the other processes read it after process 0 is done.
  """

  def load():
    splits, vocab = load_char_splits(config.data)
    saved = workdir / 'vocab.json'
    if saved.exists():
      if CharVocab.from_json(saved.read_text()) != vocab:
        raise ValueError(
          f'{saved} was written for other data (config.data.vocab / config.data.path changed); '
          'use a new --workdir'
        )
    else:
      saved.write_text(vocab.to_json())
    return splits, vocab

  return mesh_lib.writer_first(load, 'char_lm vocabulary')


def memory_sharding(mesh) -> Memory:
  """Memory's shardings: hidden [n_layer, batch, mem_len, d_model] split by batch rows."""
  return Memory(mesh_lib.row_sharded(mesh, axis=1), mesh_lib.replicated(mesh))


def _build(config, vocab_size: int, mesh, *, for_eval: bool):
  """(model, graphdef, state of (model, optimizer), memory) as built for training / eval.

  The state is replicated over `mesh`; the memory is split by rows for training and
  replicated for evaluation (which may run on a device count that does not divide it).
  """
  model = TransformerXL(
    model_config(config, vocab_size, for_eval=for_eval), rngs=nnx.Rngs(config.seed)
  )
  optimizer = nnx.Optimizer(model, make_optimizer(config.optim, config.train.steps), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  memory = model.init_memory(config.train.batch_size)
  placement = mesh_lib.replicated(mesh) if for_eval else memory_sharding(mesh)
  state = mesh_lib.distribute(state, mesh_lib.replicated(mesh))
  return model, graphdef, state, mesh_lib.distribute(memory, placement)


def _checkpoint_tree(state, memory) -> dict:
  """What a checkpoint holds; orbax cannot save the empty memory array of mem_len = 0."""
  saved_memory = memory._asdict() if memory.hidden.size else {'length': memory.length}
  return {'model': nnx.to_pure_dict(state), 'memory': saved_memory}


def _restore_latest(checkpoints, state, memory):
  """Loads the newest readable checkpoint into `state` (in place); returns (its step or 0,
  the restored memory, or `memory` when there is no checkpoint)."""
  found = checkpoints.restore_latest(_checkpoint_tree(state, memory))
  if found is None:
    return 0, memory
  step, restored, _ = found
  nnx.replace_by_pure_dict(state, restored['model'])
  return step, memory._replace(**restored['memory'])


@functools.partial(jax.jit, static_argnums=0)
def _segment_nats(graphdef, state, memory, inputs, targets):
  """(summed nats of one segment, the next memory); compiled once per model structure and
  segment shape, so periodic validation does not recompile."""
  logits, memory = nnx.merge(graphdef, state)(inputs, memory, deterministic=True)
  return jnp.sum(nats_per_token(logits, targets)), memory


def bits_per_char(model, tokens, *, batch_size, tgt_len, mem_len, max_segments=0) -> dict:
  """Mean nats / ln 2 over a split, walked in order with memory (the whole split by default).

  Returns {'bpc', 'nats', 'tokens'}; `max_segments` > 0 scores only the first segments.
  """
  graphdef, state = nnx.split(model)
  batches = OrderedBatches(tokens, batch_size, tgt_len)
  memory = model.init_memory(batch_size, mem_len=mem_len)
  total_nats, total_tokens = 0.0, 0
  for segment, inputs, targets in batches.iterate():
    if max_segments and segment >= max_segments:
      break
    nats, memory = _segment_nats(graphdef, state, memory, jnp.asarray(inputs), jnp.asarray(targets))
    total_nats += float(nats)
    total_tokens += targets.size
  return {
    'bpc': total_nats / total_tokens / math.log(2),
    'nats': total_nats / total_tokens,
    'tokens': total_tokens,
  }


def train_step_fn(graphdef, mesh):
  """The jitted step (state, memory, inputs, targets) -> (state, memory, loss) of `graphdef`.

  Data-parallel over `mesh`: state and loss replicated, memory, inputs and targets [batch,
  tgt_len] split by rows (`global_batch`). The loss is the mean over the global batch.
  """
  replicated, rows = mesh_lib.replicated(mesh), mesh_lib.row_sharded(mesh)

  @functools.partial(
    jax.jit,
    donate_argnums=(0,),
    in_shardings=(replicated, memory_sharding(mesh), rows, rows),
    out_shardings=(replicated, memory_sharding(mesh), replicated),
  )
  def train_step(state, memory, inputs, targets):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      logits, new_memory = model(inputs, memory, deterministic=False)
      return jnp.mean(nats_per_token(logits, targets)), new_memory

    (loss, new_memory), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), new_memory, loss

  return train_step


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir, *, allow_config_change: bool = False
) -> dict:
  """Trains for config.train.steps (resuming from the latest checkpoint), then evaluates."""
  return train_then_evaluate(
    _train, evaluate, config, workdir, allow_config_change=allow_config_change
  )


def _train(config, workdir, preemption: PreemptionSignal, *, allow_config_change: bool):
  """The training loop of `train_and_evaluate`; `preemption` is the active SIGTERM flag."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  train = config.train
  mesh = mesh_lib.data_mesh()
  check_config(config.model)  # before reading data or compiling anything
  mesh_lib.check_rows(train.batch_size, mesh, 'config.train.batch_size')
  if mesh_lib.is_writer():
    record_config(config, workdir, allow_change=allow_config_change)
  splits, vocab = _vocab_for_run(config, workdir)
  model, graphdef, state, memory = _build(config, vocab.size, mesh, for_eval=False)

  checkpoints = Checkpoints(workdir)
  start_step, memory = _restore_latest(checkpoints, state, memory)
  if start_step:
    print(f'resumed from {checkpoints.directory / str(start_step)}', flush=True)

  train_step = train_step_fn(graphdef, mesh)
  batches = OrderedBatches(  # only the rows this process feeds
    splits['train'],
    train.batch_size,
    config.model.tgt_len,
    rows=mesh_lib.process_rows(train.batch_size, mesh),
  )
  tokens_per_step = train.batch_size * config.model.tgt_len
  writer = MetricWriter(workdir)
  progress = Progress(train.steps, start_step)
  losses = []

  def save(step):
    checkpoints.save(
      step, _checkpoint_tree(state, memory), {'step': step, 'epoch_segments': batches.num_segments}
    )

  def validate(step):
    eval_model = nnx.merge(graphdef, mesh_lib.local_copy(state))[0]
    result = bits_per_char(
      eval_model,
      splits['valid'],
      batch_size=config.eval.batch_size,
      tgt_len=config.model.tgt_len,
      mem_len=config.model.mem_len,
      max_segments=config.eval.max_segments_during_training,
    )
    writer.write(step, {'valid/bpc': result['bpc']})
    print(f'step {step}: valid bpc {result["bpc"]:.4f} ({result["tokens"]} chars)', flush=True)

  step = start_step
  for step, inputs, targets, new_epoch in batches.training_stream(start_step):
    if step >= train.steps:
      break
    if new_epoch:
      memory = mesh_lib.distribute(model.init_memory(train.batch_size), memory_sharding(mesh))
    inputs, targets = mesh_lib.global_batch((inputs, targets), mesh)
    state, memory, loss = train_step(state, memory, inputs, targets)
    losses.append(loss)
    done = step + 1
    if done % train.log_every == 0 or done == train.steps:
      mean_loss = float(np.mean(jax.device_get(losses)))
      tokens = len(losses) * tokens_per_step
      losses.clear()
      if not math.isfinite(mean_loss):
        raise FloatingPointError(
          f'loss is {mean_loss} at step {done}; the last good checkpoint is kept in '
          f'{checkpoints.directory}'
        )
      tokens_per_second, speed = progress.report(done, tokens)
      bpc = mean_loss / math.log(2)
      writer.write(
        done, {'train/loss': mean_loss, 'train/bpc': bpc, 'train/tok_per_s': tokens_per_second}
      )
      print(
        f'step {done}/{train.steps} | loss {mean_loss:.4f} ({bpc:.3f} bpc) | {speed}', flush=True
      )
    if train.eval_every and done % train.eval_every == 0 and done < train.steps:
      validate(done)
    if train.checkpoint_every and done % train.checkpoint_every == 0:
      save(done)
    if mesh_lib.any_process(preemption.requested):
      if checkpoints.latest_step() != done:
        save(done)
      checkpoints.close()
      writer.close()
      raise PreemptedError.saved(done, checkpoints.directory / str(done))
  if step + 1 >= train.steps and checkpoints.latest_step() != train.steps:
    save(train.steps)
  checkpoints.close()
  writer.close()


def evaluate(config: ml_collections.ConfigDict, workdir) -> dict:
  """Bits-per-char on config.eval.split from the latest checkpoint; writes eval_results.json."""
  check_config(config.model)
  workdir = Path(workdir)
  checkpoints = Checkpoints(workdir)
  if checkpoints.latest_step() is None:
    raise FileNotFoundError(
      f'no checkpoint in {checkpoints.directory}: train first (python train.py '
      f'--config=... --workdir={workdir})'
    )
  splits, vocab = _vocab_for_run(config, workdir)
  _, graphdef, state, memory = _build(config, vocab.size, mesh_lib.data_mesh(), for_eval=True)
  step, _ = _restore_latest(checkpoints, state, memory)
  checkpoints.close()
  model = nnx.merge(graphdef, mesh_lib.local_copy(state))[0]
  split = config.eval.split
  result = bits_per_char(
    model,
    splits[split],
    batch_size=config.eval.batch_size,
    tgt_len=config.eval.tgt_len,
    mem_len=config.eval.mem_len,
  )
  result.update(split=split, step=step, checkpoint=str(checkpoints.directory / str(step)))
  result['eval'] = config.eval.to_dict()
  if mesh_lib.is_writer():
    (workdir / 'eval_results.json').write_text(json.dumps(result, indent=2))
  return result


def result_lines(result: dict) -> list[str]:
  """What train.py / eval.py print last; the very last line is `bpc=<float>`."""
  return [
    f'{result["split"]} split, {result["tokens"]} characters, checkpoint {result["checkpoint"]}',
    f'bpc={result["bpc"]:.4f}',
  ]
