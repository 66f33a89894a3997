"""Train and evaluate the encoder-decoder translation model (WMT or any parallel text).

`train_and_evaluate(config, workdir)` and `evaluate(config, workdir)` are what `train.py` and
`eval.py` call. Everything a run needs to resume sits in `workdir`: the resolved config, the
SentencePiece model, orbax checkpoints (parameters, optimizer state, dropout RNG state and the
step, which fixes the data position), metrics.jsonl and TensorBoard events. Evaluation writes
the translations and `eval_results.json` next to them.

Training is data-parallel over every device (`relpos.training.mesh`): config.data.max_tokens
bounds the global batch, whose rows (a multiple of the device count) split across the devices.
Evaluation (perplexity, beam search) runs on one device of each process, every process
computing the same result; process 0 writes the translations and results.
"""

import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from relpos import decode, metrics
from relpos.data.token_batches import TokenBatches
from relpos.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relpos.data.translation import load_eval_data, load_translation_data
from relpos.models.transformer import Transformer, check_config
from relpos.training import mesh as mesh_lib
from relpos.training.checkpoints import Checkpoints
from relpos.training.metrics import MetricWriter
from relpos.training.optim import make_optimizer
from relpos.training.preemption import PreemptedError, PreemptionSignal, train_then_evaluate
from relpos.training.progress import Progress
from relpos.training.run_config import record_config

# Decoding pads sources to a power of two, at least this: each padded length compiles the beam
# search once (tens of seconds on CPU), so few lengths beat tight padding.
_MIN_SOURCE_PADDING = 16


def model_config(config, vocab_size: int) -> ml_collections.ConfigDict:
  """config.model plus the vocabulary size."""
  resolved = ml_collections.ConfigDict(config.model.to_dict())
  resolved.vocab_size = vocab_size
  return resolved


def _build(config, vocab_size: int, mesh):
  """(graphdef, state) of (model, optimizer) as initialised from config.seed; the state is
  replicated over `mesh`."""
  model = Transformer(model_config(config, vocab_size), rngs=nnx.Rngs(config.seed))
  tx = make_optimizer(config.optim, config.train.steps, d_model=config.model.d_model)
  graphdef, state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
  return graphdef, mesh_lib.distribute(state, mesh_lib.replicated(mesh))


def _load_data(config, workdir: Path, mesh):
  """load_translation_data of this process's shard, batch rows a multiple of the devices."""
  return load_translation_data(
    config.data,
    workdir,
    seed=config.seed,
    row_multiple=mesh.size,
    shard=mesh_lib.process_shard(),
  )


def _checkpoint_tree(state) -> dict:
  return {'model': nnx.to_pure_dict(state)}


def token_losses(logits_BTV, targets_BT, label_smoothing: float):
  """Per-token (smoothed cross-entropy, negative log-likelihood) in nats; PAD targets give 0."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  vocab_size = logits_BTV.shape[-1]
  weights_BT = (targets_BT != PAD_ID).astype(jnp.float32)
  one_hot_BTV = jax.nn.one_hot(targets_BT, vocab_size)
  nll_BT = optax.softmax_cross_entropy(logits_BTV, one_hot_BTV)
  smoothed_BTV = optax.smooth_labels(one_hot_BTV, label_smoothing)
  loss_BT = optax.softmax_cross_entropy(logits_BTV, smoothed_BTV)
  return loss_BT * weights_BT, nll_BT * weights_BT


def train_step_fn(graphdef, label_smoothing: float, mesh):
  """The jitted step (state, batch) -> (state, {'loss', 'nll', 'tokens'} sums over the batch).

  Data-parallel over `mesh`: state and sums replicated, the batch (src, tgt_in, tgt_out [rows,
  L]) split by rows (`global_batch`). The loss is the mean over the global batch's tokens.
  """
  replicated = mesh_lib.replicated(mesh)

  @functools.partial(
    jax.jit,
    donate_argnums=(0,),
    in_shardings=(replicated, mesh_lib.row_sharded(mesh)),
    out_shardings=(replicated, replicated),
  )
  def train_step(state, batch):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      logits = model(batch['src'], batch['tgt_in'], deterministic=False)
      loss_BT, nll_BT = token_losses(logits, batch['tgt_out'], label_smoothing)
      tokens = jnp.sum(batch['tgt_out'] != PAD_ID)
      sums = {'loss': jnp.sum(loss_BT), 'nll': jnp.sum(nll_BT), 'tokens': tokens}
      return sums['loss'] / jnp.maximum(tokens, 1), sums

    (_, sums), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), sums

  return train_step


def eval_loss(model, batches: TokenBatches) -> dict:
  """Unsmoothed {'nll' per target token, 'perplexity', 'tokens'} over every batch once."""
  graphdef, state = nnx.split(model)

  @jax.jit
  def batch_nll(state, batch):
    logits = nnx.merge(graphdef, state)(batch['src'], batch['tgt_in'], deterministic=True)
    return jnp.sum(token_losses(logits, batch['tgt_out'], 0.0)[1])

  total_nll, total_tokens = 0.0, 0
  for batch in batches.iterate_once():
    arrays = {name: jnp.asarray(batch[name]) for name in ('src', 'tgt_in', 'tgt_out')}
    total_nll += float(batch_nll(state, arrays))
    total_tokens += int(np.sum(batch['tgt_out'] != PAD_ID))
  nll = total_nll / max(total_tokens, 1)
  return {'nll': nll, 'perplexity': metrics.perplexity(nll), 'tokens': total_tokens}


def _eval_batches(config, pairs, boundaries=None) -> TokenBatches:
  """Eval pairs in token batches, of the training shapes if `boundaries` (padded lengths) are
  given; pairs longer than config.data.max_length are left out."""
  return TokenBatches(
    pairs,
    max_tokens=config.data.max_tokens,
    max_length=config.data.max_length,
    boundaries=boundaries,
    num_buckets=None if boundaries else config.data.length_buckets,
    seed=config.seed,
  )


def _padded_length(length: int) -> int:
  return max(_MIN_SOURCE_PADDING, 1 << (length - 1).bit_length())


def _source_batches(encoded: list[list[int]], batch_size: int):
  """Yields (indices, src [batch_size, padded_len] int32 with EOS) in order of source length."""
  order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
  for start in range(0, len(order), batch_size):
    indices = order[start : start + batch_size]
    rows = [encoded[i] + [EOS_ID] for i in indices]
    src_BS = np.full((batch_size, _padded_length(max(map(len, rows)))), PAD_ID, np.int32)
    for row, ids in enumerate(rows):
      src_BS[row, : len(ids)] = ids
    yield indices, src_BS


def make_translator(model, eval_config, *, max_len: int):
  """A function src [batch, src_len] int32 -> best hypothesis [batch, decode_len] int32.

  Beam search (beam 1 = greedy) with the GNMT length penalty; each sentence may run to its
  source length + eval_config.max_decode_extra pieces, and never past `max_len`.
  """
  graphdef, state = nnx.split(model)
  beam_size, extra = eval_config.beam_size, eval_config.max_decode_extra

  @functools.partial(jax.jit, static_argnums=(2,))
  def search(state, src_BS, decode_len):
    model = nnx.merge(graphdef, state)
    batch_size = src_BS.shape[0]
    context = model.decode_context(model.encode(src_BS, deterministic=True))
    context_N = jax.tree.map(lambda x: decode.tile_beams(x, beam_size), context)
    src_NS = decode.tile_beams(src_BS, beam_size)

    def step_fn(tokens_N, cache, step):
      return model.decode_step(context_N, src_NS, tokens_N, cache, step)

    source_lengths = jnp.sum(src_BS != PAD_ID, axis=-1)
    tokens, _ = decode.beam_search(
      step_fn,
      model.init_cache(batch_size, decode_len),
      batch_size=batch_size,
      beam_size=beam_size,
      max_len=decode_len,
      bos_id=BOS_ID,
      eos_id=EOS_ID,
      length_penalty=eval_config.length_penalty,
      max_lengths=jnp.minimum(source_lengths + extra, decode_len),
    )
    return tokens[:, 0]

  def translate(src_BS):
    return np.asarray(search(state, jnp.asarray(src_BS), min(src_BS.shape[1] + extra, max_len)))

  return translate


def translate_sentences(model, tokenizer, sources: list[str], eval_config, *, max_len) -> list:
  """Detokenised translations of `sources`, in their order."""
  translate = make_translator(model, eval_config, max_len=max_len)
  encoded = [tokenizer.encode(text)[: max_len - 1] for text in sources]
  translations = [''] * len(sources)
  for indices, src_BS in _source_batches(encoded, eval_config.batch_size):
    for index, ids in zip(indices, translate(src_BS), strict=False):
      translations[index] = tokenizer.decode(ids.tolist())
  return translations


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
  mesh = mesh_lib.data_mesh()
  check_config(config.model)  # before reading data or compiling anything
  if mesh_lib.is_writer():
    record_config(config, workdir, allow_change=allow_config_change)
  data = _load_data(config, workdir, mesh)
  train = config.train
  graphdef, state = _build(config, data.tokenizer.vocab_size, mesh)

  checkpoints = Checkpoints(workdir, keep=train.keep_checkpoints)
  found = checkpoints.restore_latest(_checkpoint_tree(state))
  start_step = 0
  if found:
    start_step, restored, _ = found
    nnx.replace_by_pure_dict(state, restored['model'])
    print(f'resumed from {checkpoints.directory / str(start_step)}', flush=True)

  train_step = train_step_fn(graphdef, config.optim.label_smoothing, mesh)
  eval_batches = _eval_batches(config, data.eval_pairs, data.train.boundaries)
  writer = MetricWriter(workdir)
  progress = Progress(train.steps, start_step)
  print(
    f'{len(data.eval_sources)} eval sentences, vocabulary {data.tokenizer.vocab_size}, '
    f'{data.train.batches_per_epoch} batches per epoch',
    flush=True,
  )
  sums = []

  def validate(step):
    result = eval_loss(nnx.merge(graphdef, mesh_lib.local_copy(state))[0], eval_batches)
    writer.write(step, {'eval/nll': result['nll'], 'eval/perplexity': result['perplexity']})
    print(f'step {step}: eval perplexity {result["perplexity"]:.2f}', flush=True)

  for step in range(start_step, train.steps):
    epoch, batch = data.train.batch(step)
    arrays = {name: batch[name] for name in ('src', 'tgt_in', 'tgt_out')}
    state, step_sums = train_step(state, mesh_lib.global_batch(arrays, mesh))
    sums.append(step_sums)
    done = step + 1
    if done % train.log_every == 0 or done == train.steps:
      totals = jax.tree.map(lambda *xs: float(np.sum(xs)), *jax.device_get(sums))
      sums.clear()
      loss = totals['loss'] / max(totals['tokens'], 1)
      if not math.isfinite(loss):
        raise FloatingPointError(
          f'loss is {loss} at step {done}; the last good checkpoint is kept in '
          f'{checkpoints.directory}'
        )
      tokens_per_second, speed = progress.report(done, int(totals['tokens']))
      nll = totals['nll'] / max(totals['tokens'], 1)
      writer.write(
        done, {'train/loss': loss, 'train/nll': nll, 'train/tok_per_s': tokens_per_second}
      )
      print(
        f'step {done}/{train.steps} (epoch {epoch}) | loss {loss:.4f} | nll {nll:.4f} | '
        f'{speed} (target tokens)',
        flush=True,
      )
    if train.eval_every and done % train.eval_every == 0 and done < train.steps:
      validate(done)
    if train.checkpoint_every and done % train.checkpoint_every == 0:
      checkpoints.save(done, _checkpoint_tree(state), {'step': done})
    if mesh_lib.any_process(preemption.requested):
      if checkpoints.latest_step() != done:
        checkpoints.save(done, _checkpoint_tree(state), {'step': done})
      checkpoints.close()
      writer.close()
      raise PreemptedError.saved(done, checkpoints.directory / str(done))
  if checkpoints.latest_step() != train.steps:
    checkpoints.save(train.steps, _checkpoint_tree(state), {'step': train.steps})
  checkpoints.close()
  writer.close()


def _mean_of_floats(*leaves):
  """The mean of float leaves (parameters, moments); the last of others (RNG keys, counts)."""
  if jnp.issubdtype(leaves[-1].dtype, jnp.floating):
    return sum(leaves) / len(leaves)
  return leaves[-1]


def _restore_model(config, checkpoints: Checkpoints, vocab_size: int):
  """(model on this process's first device, steps averaged): the chosen checkpoint, or the
  mean of the last N checkpoints."""
  graphdef, state = _build(config, vocab_size, mesh_lib.data_mesh())
  like = _checkpoint_tree(state)
  if config.eval.step:
    step = config.eval.step
    if step not in checkpoints.all_steps():
      raise FileNotFoundError(
        f'config.eval.step={step}: no such checkpoint in {checkpoints.directory} '
        f'(have {checkpoints.all_steps()})'
      )
    newest = checkpoints.restore(step, like)[0]['model']
  else:  # the newest readable checkpoint
    step, restored, _ = checkpoints.restore_latest(like)
    newest = restored['model']
  steps = [s for s in checkpoints.all_steps() if s <= step][-config.eval.average_checkpoints :]
  trees = [checkpoints.restore(s, like)[0]['model'] for s in steps[:-1]] + [newest]
  nnx.replace_by_pure_dict(state, jax.tree.map(_mean_of_floats, *trees))
  return nnx.merge(graphdef, mesh_lib.local_copy(state))[0], steps


def evaluate(config: ml_collections.ConfigDict, workdir) -> dict:
  """BLEU of beam-search translations of the eval set; writes translations and results."""
  check_config(config.model)
  workdir = Path(workdir)
  checkpoints = Checkpoints(workdir, keep=config.train.keep_checkpoints)
  if checkpoints.latest_step() is None:
    raise FileNotFoundError(
      f'no checkpoint in {checkpoints.directory}: train first (python train.py '
      f'--config=... --workdir={workdir})'
    )
  data = load_eval_data(config.data, workdir)
  model, steps = _restore_model(config, checkpoints, data.tokenizer.vocab_size)
  checkpoints.close()
  translations = translate_sentences(
    model, data.tokenizer, data.eval_sources, config.eval, max_len=config.model.max_len
  )
  output = workdir / f'translations_step{steps[-1]}.txt'
  bleu = metrics.corpus_bleu(translations, data.eval_references)
  loss = eval_loss(model, _eval_batches(config, data.eval_pairs))
  result = {
    'bleu': bleu.score,
    'signature': bleu.signature,
    'sentences': len(translations),
    'perplexity': loss['perplexity'],
    'step': steps[-1],
    'averaged_steps': steps,
    'checkpoint': str(checkpoints.directory / str(steps[-1])),
    'translations': str(output),
    'eval': config.eval.to_dict(),
  }
  if mesh_lib.is_writer():
    output.write_text(''.join(line + '\n' for line in translations))
    (workdir / 'eval_results.json').write_text(json.dumps(result, indent=2))
  return result


def result_lines(result: dict) -> list[str]:
  """What train.py / eval.py print last; the very last line is `bleu=<float>`."""
  return [
    f'{result["sentences"]} sentences, checkpoint {result["checkpoint"]} '
    f'(averaged steps {result["averaged_steps"]}), translations in {result["translations"]}',
    f'sacreBLEU {result["signature"]}',
    f'bleu={result["bleu"]:.2f}',
  ]
