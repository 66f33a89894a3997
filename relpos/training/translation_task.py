"""The translation task: an encoder-decoder Transformer (WMT or any parallel text), BLEU.

Supplies `relpos.training.loop` with the data (token batches by step), the label-smoothed loss
and the periodic eval perplexity; the loop does the rest. Everything a run needs to resume sits
in its workdir: the resolved config, the SentencePiece model, orbax checkpoints (parameters,
optimizer state, dropout RNG state and the step, which fixes the data position), metrics.jsonl
and TensorBoard events. Evaluation writes the translations and `eval_results.json` next to them.

Training is data-parallel over every device (`relpos.training.mesh`): config.data.max_tokens
bounds the global batch, whose rows (a multiple of the device count) split across the devices.
Evaluation (perplexity, beam search) runs on one device of each process, every process
computing the same result; process 0 writes the translations and results.
"""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from relpos import decode, scoring
from relpos import flops as flops_lib
from relpos.attention import autotune
from relpos.config import shared
from relpos.config.translation_defaults import TranslationConfig
from relpos.constants import BOS_ID, EOS_ID, PAD_ID
from relpos.data.token_batches import TokenBatches
from relpos.data.tokenizer import check_placed, load_tokenizer
from relpos.data.translation import (
  TEXT_FIELDS,
  VOCAB_FILE,
  check_data_config,
  eval_batches,
  load_eval_data,
  load_translation_data,
)
from relpos.files import made_here, recorded_source
from relpos.messages import PassProgress, warn
from relpos.models.transformer import Transformer, TransformerConfig
from relpos.training import data_record, restore, run_config, task_base
from relpos.training import mesh as mesh_lib
from relpos.training import train_step as step_lib
from relpos.training.run_config import has_run
from relpos.training.workdir_setup import remove_stale_copy

# Decoding pads sources to a power of two, at least this: each padded length compiles the beam
# search once (tens of seconds on CPU), so few lengths beat tight padding.
_MIN_SOURCE_PADDING = 16


def model_config(config, vocab_size: int) -> TransformerConfig:
  """The model's typed config: config.model, typed by the model section of the task's
  declaration, plus the vocabulary size (validated)."""
  return TASK.declaration.model.from_section(config.model, vocab_size=vocab_size)


def build(config, vocab_size: int, mesh):
  """(graphdef, state) of model and optimizer as initialised from config.seed, replicated over
  `mesh`."""
  return step_lib.init_state(TASK.build_model(config, vocab_size), config, mesh)


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


def train_step_fn(config, graphdef, mesh):
  """The jitted step (state, batch) -> (state, {'loss', 'nll', 'tokens'} sums over the batch).

  The batch (src, tgt_in, tgt_out [rows, L]) is split by rows; the loss is the mean smoothed
  cross-entropy over the global batch's target tokens.
  """
  label_smoothing = config.optim.label_smoothing

  def loss_fn(model, batch, carry):
    logits = model(batch['src'], batch['tgt_in'], deterministic=False)
    loss_BT, nll_BT = token_losses(logits, batch['tgt_out'], label_smoothing)
    tokens = jnp.sum(batch['tgt_out'] != PAD_ID)
    sums = {'loss': jnp.sum(loss_BT), 'nll': jnp.sum(nll_BT), 'tokens': tokens}
    return sums['loss'], (sums, carry)

  return step_lib.train_step_fn(
    graphdef, loss_fn, mesh, grad_accum_steps=config.train.grad_accum_steps
  )


@functools.partial(jax.jit, static_argnums=(0,))
def batch_nll(graphdef, state, batch):
  """Summed unsmoothed nats of a batch's real target tokens; compiled once per model structure
  and batch shape, so periodic validation does not compile again (a function jitted inside
  `eval_loss` was a new function, traced and compiled anew, at every validation)."""
  with autotune.forward_only():
    logits = nnx.merge(graphdef, state)(batch['src'], batch['tgt_in'], deterministic=True)
  return jnp.sum(token_losses(logits, batch['tgt_out'], 0.0)[1])


def eval_loss(model, batches: TokenBatches) -> dict:
  """Unsmoothed {'nll' per target token, 'perplexity', 'tokens'} over every batch once."""
  graphdef, state = nnx.split(model)
  total_nll, total_tokens = 0.0, 0
  for batch in batches.iterate_once():
    arrays = {name: jnp.asarray(batch[name]) for name in ('src', 'tgt_in', 'tgt_out')}
    total_nll += float(batch_nll(graphdef, state, arrays))
    total_tokens += int(np.sum(batch['tgt_out'] != PAD_ID))
  nll = total_nll / max(total_tokens, 1)
  return {'nll': nll, 'perplexity': scoring.perplexity(nll), 'tokens': total_tokens}


def _validate(batches: TokenBatches, model, step: int) -> dict:
  """The validation during training (`task_base.Training.validate`, bound to the eval batches): the
  eval perplexity, printed and returned as scalars to log."""
  result = eval_loss(model, batches)
  print(f'step {step}: eval perplexity {result["perplexity"]:.2f}', flush=True)
  return {'eval/nll': result['nll'], 'eval/perplexity': result['perplexity']}


def _padded_length(length: int, max_len: int) -> int:
  """A power of two >= `length` (at least _MIN_SOURCE_PADDING), but never past `max_len`: a
  learned position table has no row beyond it."""
  return min(max(_MIN_SOURCE_PADDING, 1 << (length - 1).bit_length()), max_len)


def _source_batches(encoded: list[list[int]], batch_size: int, max_len: int):
  """Yields (indices, src [rows, padded_len] int32 with EOS) in order of source length, rows =
  batch_size, or fewer where there are fewer sources; each source must be shorter than
  `max_len`."""
  order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
  batch_size = min(batch_size, len(order))  # 8 sentences in 2**31 - 1 padded rows: 2 TiB
  for start in range(0, len(order), batch_size):
    indices = order[start : start + batch_size]
    rows = [encoded[i] + [EOS_ID] for i in indices]
    padded_len = _padded_length(max(map(len, rows)), max_len)
    src_BS = np.full((batch_size, padded_len), PAD_ID, np.int32)
    for row, ids in enumerate(rows):
      src_BS[row, : len(ids)] = ids
    yield indices, src_BS


def check_beam_size(beam_size: int, vocab_size: int, name: str) -> None:
  """ValueError naming `name` (a config field or a tool's flag) for a beam wider than the
  vocabulary: the first step alone cannot fill the beams (201 over 200 pieces took minutes)."""
  if beam_size > vocab_size:
    raise ValueError(
      f"{name}={beam_size}: wider than the run's vocabulary (config.data.vocab_size={vocab_size} "
      'pieces), so the first step alone cannot fill the beams; give at most the vocabulary size'
    )


def make_translator(model, eval_config, *, max_len: int):
  """A function src [batch, src_len] int32 -> best hypothesis [batch, decode_len] int32.

  Beam search (beam 1 = greedy) with the GNMT length penalty; each sentence may run to its
  source length + eval_config.max_decode_extra pieces, and never past `max_len`.
  """
  graphdef, state = nnx.split(model)
  # No sentence runs past max_len, so a larger extra changes nothing (and source length +
  # extra must stay within int32: 2**31 - 1, a natural "no limit", wrapped to negative).
  beam_size, extra = eval_config.beam_size, min(eval_config.max_decode_extra, max_len)

  @functools.partial(jax.jit, static_argnums=(2,))
  @autotune.forward_only()
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
  """Detokenised translations of `sources`, in their order (progress lines after half a
  minute).

  A source of no pieces (an empty or blank line) gives an empty translation, not decoded. A
  source of more than `max_len` - 1 pieces (config.model.max_len, less one for EOS) is cut
  to its first `max_len` - 1, so that every source is translated (the model takes no longer
  sequence: a learned position table has `max_len` rows); one warning line says how many
  were cut.
  """
  translate = make_translator(model, eval_config, max_len=max_len)
  encoded = [tokenizer.encode(text) for text in sources]
  longest = max_len - 1
  cut = sum(len(ids) > longest for ids in encoded)
  if cut:
    warn(
      f'{cut} of {len(sources)} sources are longer than {longest} pieces and were cut '
      f'to their first {longest} for decoding (config.model.max_len={max_len}, less one for '
      'EOS; the model takes no longer sequence): their translations miss the rest',
    )
  encoded = [ids[:longest] for ids in encoded]
  translations = [''] * len(sources)  # an empty or blank source is translated as empty
  progress = PassProgress('translating', len(sources), 'sentences')
  kept = [index for index, ids in enumerate(encoded) if ids]
  done = len(sources) - len(kept)
  for batch_indices, src_BS in _source_batches(
    [encoded[index] for index in kept], eval_config.batch_size, max_len
  ):
    indices = [kept[index] for index in batch_indices]
    for index, ids in zip(indices, translate(src_BS), strict=False):
      translations[index] = tokenizer.decode(ids.tolist())
    done += len(indices)
    progress.update(done)
  return translations


class Translate(task_base.Task):
  """Translation with an encoder-decoder Transformer; the metric is sacreBLEU."""

  metric = 'bleu'
  metrics = ('bleu', 'perplexity')
  result_files = ('translations',)
  declaration = TranslationConfig
  # The vocabulary is the workdir's spm.model, so what made it is training's too.
  training_only_data = (
    'train_src',
    'train_tgt',
    'tfds_train_split',
    'max_train_examples',
    'vocab_train_sentences',
    'max_tokens',
    'length_buckets',
  )
  # Its text files are read as lines (`relpos.data.parallel_text`), CRLF endings or not.
  data_read_as_lines = TEXT_FIELDS
  # The config.data fields its SentencePiece vocabulary never reads (it is trained on the
  # training pairs alone: `relpos.data.translation`); every other field counts in
  # `vocabulary_changes`, one added later too until it is listed here.
  vocabulary_free_data = (
    'eval_src',
    'eval_tgt',
    'tfds_eval_split',
    'max_eval_examples',
    'max_length',
    'max_tokens',
    'length_buckets',
  )

  def check_combinations(self, config, mesh):
    model_config(config, vocab_size=config.data.vocab_size)
    check_data_config(config.data)
    scoring.check_bleu_tokenizer(config.data.target_lang)
    shared.check_eval_fields(config, self.unread_fields(config))
    longest = config.data.max_length + 1  # pieces plus EOS (BOS on the decoder input)
    if longest > config.model.max_len:
      raise ValueError(
        f'config.data.max_length={config.data.max_length} needs config.model.max_len >= '
        f'{longest} (the longest sequence the model takes), got {config.model.max_len}'
      )
    check_beam_size(config.eval.beam_size, config.data.vocab_size, 'config.eval.beam_size')
    decode.check_length_penalty(
      config.eval.length_penalty, config.model.max_len, 'config.eval.length_penalty'
    )
    devices = 1 if mesh is None else mesh.size
    rows = devices * config.train.grad_accum_steps  # the fewest rows of a batch
    if config.data.max_tokens < rows * longest:
      raise ValueError(
        f'config.data.max_tokens={config.data.max_tokens} must hold one row of '
        f'config.data.max_length + 1 = {longest} pieces per device ({devices}) and '
        f'micro-batch (config.train.grad_accum_steps={config.train.grad_accum_steps}): at '
        f'least {rows * longest}'
      )

  def unread_fields(self, config):
    return model_config(config, vocab_size=1).unread_fields()

  def data_files(self, config, workdir):
    vocabulary = {data_record.VOCABULARY: Path(workdir) / VOCAB_FILE}
    if config.data.kind != 'text':
      return vocabulary  # tensorflow-datasets: prepared and versioned by tfds
    return {
      **{f'config.data.{name}': Path(config.data[name]) for name in TEXT_FIELDS},
      **vocabulary,
    }

  def vocabulary_changes(self, config, workdir):
    """What the vocabulary is trained on, compared with the run in `workdir` (`Task.
    vocabulary_changes`): config.data's fields but `vocabulary_free_data` (vocab_size and
    vocab_train_sentences among them; a path that names the run's data is the same,
    `run_config.data_changes`), the training files' data and the run's vocabulary as it
    recorded them (`data_record.changes`), and config.seed where the vocabulary trains on a
    seeded draw of the sentences: where the recorded training files hold more than
    config.data.vocab_train_sentences sentences, or the count is not recorded (tfds). Training
    is deterministic: the same sentences and fields give the same bytes (docs/translation.md).
    The run must be trained by one process, as a sweep's are: with several, process 0 trains
    on its shard alone."""
    workdir = Path(workdir)
    if not has_run(workdir):
      return [f'{workdir} records no run']
    files = self.data_files(config, workdir)
    changes = run_config.data_changes(workdir, config, files, free=self.vocabulary_free_data)
    read = [data_record.VOCABULARY, 'config.data.train_src', 'config.data.train_tgt']
    changes += data_record.changes(workdir, {name: files[name] for name in read if name in files})
    trained_seed = run_config.read_config(workdir, known_fields=False).get('seed')
    lines = data_record.recorded_lines(workdir, 'config.data.train_src')
    drawn = lines is None or 2 * lines > config.data.vocab_train_sentences
    if trained_seed != config.seed and drawn:
      changes.append(
        f'seed: trained {trained_seed}, given {config.seed} (the vocabulary trains on a draw '
        f'of config.data.vocab_train_sentences={config.data.vocab_train_sentences} sentences '
        'it seeds)'
      )
    return changes

  def training(self, config, workdir, mesh) -> task_base.Training:
    """The model and its optimizer first (they need the config alone: the vocabulary has
    config.data.vocab_size pieces, which the data checks), then the data, then the functions
    the loop calls: the batch of a step, the validation and the jitted step."""
    graphdef, state = build(config, config.data.vocab_size, mesh)
    placed = Path(workdir) / VOCAB_FILE
    if not has_run(workdir) and placed.exists() and mesh_lib.is_writer():
      if made_here(placed):
        # A start of this workdir trained it and was killed before its run was recorded (one
        # that failed removes its own: loop.train); its data may have changed: trained again.
        placed.unlink()
      elif not remove_stale_copy(self, config, workdir):  # removed: trained again
        # Placed to share a vocabulary (by hand, or a sweep's copy still its donor's): used as
        # it is, and recorded as the run's.
        check_placed(placed, config.data.vocab_size)
        if recorded_source(placed) is None:  # not a sweep's copy, which it said it placed
          warn(
            f'{placed} was there before this run: it trains with that vocabulary (the run '
            'records it as its own); remove it to train one on config.data.train_src/train_tgt '
            'instead'
          )
    data = load_translation_data(
      config.data,
      workdir,
      seed=config.seed,
      row_multiple=mesh.size * config.train.grad_accum_steps,
      shard=mesh_lib.process_shard(),
    )
    validation = eval_batches(config.data, data, seed=config.seed)
    print(
      f'{len(data.eval_sources)} eval sentences, vocabulary {data.tokenizer.vocab_size}, '
      f'{data.train.batches_per_epoch} batches per epoch',
      flush=True,
    )

    def batch(step):
      _, batch = data.train.batch(step)
      arrays = {name: batch[name] for name in ('src', 'tgt_in', 'tgt_out')}
      return mesh_lib.global_batch(arrays, mesh)

    validate = functools.partial(_validate, validation)

    def step_flops(batch):
      rows, src_len = batch['src'].shape
      return flops_lib.translation_flops(
        config.model,
        rows=rows,
        src_len=src_len,
        tgt_len=batch['tgt_in'].shape[1],
        vocab_size=data.tokenizer.vocab_size,
      ).train_step()

    return task_base.Training(
      graphdef,
      state,
      train_step_fn(config, graphdef, mesh),
      batch,
      validate,
      checkpoint_meta={'devices': mesh.size, 'batch_plan': data.train.plan},
      step_flops=step_flops,
    )

  def train_scalars(self, totals):
    return {'train/nll': totals['nll'] / max(totals['tokens'], 1)}

  def build_model(self, config, vocab_size):
    return Transformer(model_config(config, vocab_size), rngs=nnx.Rngs(config.seed))

  def run_vocabulary(self, config, workdir):
    tokenizer = load_tokenizer(Path(workdir) / VOCAB_FILE, config.data.vocab_size)
    return tokenizer, tokenizer.vocab_size

  def score(self, config, workdir, output_dir=None) -> dict:
    """BLEU of beam-search translations of the eval set (written to `output_dir`, by default
    next to the checkpoints, with eval_results.json: `result_files`) and the perplexity of its
    references."""
    data = load_eval_data(config.data, workdir)
    model = self.build_model(config, data.tokenizer.vocab_size)
    model, steps, checkpoint = restore.restore_model(model, config.eval, workdir)
    loss_batches = eval_batches(config.data, data, seed=config.seed)  # its faults first
    translations = translate_sentences(
      model, data.tokenizer, data.eval_sources, config.eval, max_len=config.model.max_len
    )
    output = Path(output_dir or workdir).resolve() / f'translations_step{steps[-1]}.txt'
    bleu = scoring.corpus_bleu(
      translations, data.eval_references, target_lang=config.data.target_lang
    )
    loss = eval_loss(model, loss_batches)
    return {
      'bleu': bleu.score,
      'signature': bleu.signature,
      'sentences': len(translations),
      'perplexity': loss['perplexity'],
      'step': steps[-1],
      'averaged_steps': steps,
      'checkpoint': str(checkpoint),
      'translations': str(output),
      # Written by `evaluate` with eval_results.json (`Task._score_into`), not here.
      task_base.FILE_TEXTS: {'translations': ''.join(line + '\n' for line in translations)},
    }

  def result_lines(self, result: dict) -> list[str]:
    return [
      f'{result["sentences"]} sentences, {task_base.checkpoint_text(result)}, translations in '
      f'{result["translations"]}',
      f'sacreBLEU {result["signature"]}',
      f'bleu={result["bleu"]:.2f}',
    ]


TASK = Translate()
