"""The character-LM task: a Transformer-XL LM (enwik8 or any text file) scored in bits-per-char.

Supplies `relpos.training.loop` with the data (ordered segments, the memory carried from one
step to the next), the loss and the periodic validation; the loop does the rest. Everything a
run needs to resume sits in its workdir: the resolved config, the vocabulary, orbax
checkpoints (parameters, optimizer state, dropout RNG state, the memory, and the step, which
fixes the data position), metrics.jsonl and TensorBoard events.

Training is data-parallel over every device (`relpos.training.mesh`): config.train.batch_size
is the global batch, its rows (and the memory's rows) split across the devices. Segment and
memory lengths are config.train.tgt_len / mem_len (clamp_len, same_length) in training and
config.eval.* in evaluation, which runs on one device of each process, every process computing
the same result; process 0 writes it.
"""

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos import flops as flops_lib
from relpos.attention import autotune
from relpos.config import shared
from relpos.config.char_lm_defaults import CharLMConfig
from relpos.data.char_corpus import VOCAB_FILE, CharVocab, load_char_splits
from relpos.data.ordered import OrderedBatches
from relpos.data.text import SPLITS
from relpos.files import write_atomically
from relpos.messages import PassProgress
from relpos.models.transformer_xl import Memory, TransformerXL, TransformerXLConfig, nats_per_token
from relpos.training import checkpoints as checkpoints_lib
from relpos.training import data_record, restore, task_base
from relpos.training import mesh as mesh_lib
from relpos.training import train_step as step_lib
from relpos.training.run_config import has_run, read_config


def model_config(config, vocab_size: int) -> TransformerXLConfig:
  """The model's typed config: config.model, typed by the model section of the task's
  declaration, plus the vocabulary size (validated)."""
  return TASK.declaration.model.from_section(config.model, vocab_size=vocab_size)


def missing_vocabulary(workdir: Path, data_vocab: str) -> FileNotFoundError | None:
  """The error for the run in `workdir` that trained (config.json, or a checkpoint) with a
  config.data.vocab='original' vocabulary (`data_vocab`) but whose vocab.json is gone; None
  where it has one, has not trained, or trained with 'bytes' (all 256 byte values, whatever the
  data: made again, it is the same). An 'original' vocabulary made again from the data given
  holds the symbols of that data: other data (or the same file changed) shifts the ids, and an
  evaluation scored the checkpoint on remapped embeddings (exit 0), a resume trained on them and
  wrote the new vocab.json, another symbol count called the checkpoints unreadable."""
  saved = Path(workdir) / VOCAB_FILE
  if saved.exists() or not (has_run(workdir) or checkpoints_lib.finished_steps(workdir)):
    return None
  try:  # the run's own (an 'original' run given a 'bytes' config is not all 256 bytes)
    data_vocab = read_config(workdir, known_fields=False).data.vocab
  except (OSError, ValueError, AttributeError):  # none recorded (an older run): the one given
    pass
  if data_vocab == 'bytes':
    return None
  return FileNotFoundError(
    f"{saved} is missing: the run in {workdir} trained with the config.data.vocab='original' "
    "vocabulary it held, and one made again from the data could shift the model's ids, so it "
    'is not rebuilt: copy vocab.json back from a backup or from where the run came from'
  )


def read_vocabulary(workdir: Path, data_vocab: str) -> CharVocab:
  """The vocabulary the run in `workdir` trained with (its vocab.json; for a run of 'bytes'
  without one, all 256 byte values, what it held), for the tools that read a finished run
  (`CharLM.run_vocabulary`).

  Raises:
    FileNotFoundError: an 'original' run's vocab.json is gone (`missing_vocabulary`).
    ValueError: it changed since the run trained (`data_record.check_vocabulary`).
  """
  if error := missing_vocabulary(workdir, data_vocab):
    raise error
  saved = Path(workdir) / VOCAB_FILE
  if not saved.exists():
    return CharVocab.bytes()
  vocab = CharVocab.read(saved)  # a damaged one is named as such first
  data_record.check_vocabulary(workdir, {data_record.VOCABULARY: saved})
  return vocab


def _vocab_for_run(config, workdir: Path, *, training: bool, encode=SPLITS):
  """Splits (those named in `encode`: an evaluation's, the one it scores) and vocabulary. The
  first run that trains makes the vocabulary of its data and saves it (process 0; the others then
  read it), over one that a start which never trained left, perhaps from other data
  (`run_config.has_run`). Later (a resume, an evaluation, other processes) the saved one is read
  and the data encoded with it, since its ids are the model's: other data is encoded too where its
  bytes are in it (the data checks warn that it is other data). A config.data.vocab other than the
  one it was made by is refused, as the model's vocabulary would not be what the config says.
  A trained 'original' run whose vocab.json is gone is refused (`missing_vocabulary`): one made
  again is of the data given, not the run's. Evaluation writes nothing.
  """

  def load():
    if error := missing_vocabulary(workdir, config.data.vocab):
      raise error
    saved = workdir / VOCAB_FILE
    writes = training and mesh_lib.is_writer() and not has_run(workdir)
    if saved.exists() and not writes:
      vocab = CharVocab.read(saved)
      made_by = 'bytes' if vocab == CharVocab.bytes() else 'original'
      if config.data.vocab != made_by:
        remedy = (
          'use a new --workdir'
          if training
          else "give the run's config.data.vocab and config.data.path (its config.json)"
        )
        raise ValueError(
          f'{saved} was written for other data (config.data.vocab={made_by!r}, given '
          f'{config.data.vocab!r}); {remedy}'
        )
      return load_char_splits(config.data, vocab, recorded_in=saved, encode=encode)
    splits, vocab = load_char_splits(config.data, encode=encode)
    if training and mesh_lib.is_writer():
      write_atomically(saved, vocab.to_json())
    return splits, vocab

  return mesh_lib.writer_first(load, 'char_lm vocabulary')


def memory_sharding(mesh) -> dict:
  """The carried memory's shardings: hidden [layers, batch, mem_len, d_model] split by rows."""
  return {'hidden': mesh_lib.row_sharded(mesh, axis=1), 'length': mesh_lib.replicated(mesh)}


def _empty_memory(model, batch_size: int, mem_len: int, mesh) -> dict:
  return mesh_lib.distribute(
    model.init_memory(batch_size, mem_len)._asdict(), memory_sharding(mesh)
  )


def build(config, vocab_size: int, mesh):
  """(model, graphdef, state) for training: model and optimizer replicated over `mesh`, plus
  the empty memory (split by rows) when config.train.mem_len > 0."""
  model = TASK.build_model(config, vocab_size)
  train = config.train
  carry = {'memory': _empty_memory(model, train.batch_size, train.mem_len, mesh)}
  graphdef, state = step_lib.init_state(model, config, mesh, **(carry if train.mem_len else {}))
  return model, graphdef, state


def train_step_fn(config, graphdef, mesh):
  """The jitted step (state, (inputs, targets) [batch, tgt_len]) -> (state, sums).

  The loss is the mean nats per character of the global batch; the memory, when the state
  carries one, is read and replaced (by rows, in micro-batches with config.train
  .grad_accum_steps > 1).
  """
  train = config.train

  def loss_fn(model, batch, carry):
    inputs, targets = batch
    if carry:
      memory = Memory(**carry['memory'])
    else:
      memory = model.init_memory(inputs.shape[0], 0)
    logits, memory = model(
      inputs,
      memory,
      deterministic=False,
      clamp_len=train.clamp_len,
      same_length=train.same_length,
    )
    nats = nats_per_token(logits, targets)
    sums = {'loss': jnp.sum(nats), 'tokens': jnp.asarray(nats.size, jnp.int32)}
    return sums['loss'], (sums, {'memory': memory._asdict()} if carry else {})

  carry_sharding = {'memory': memory_sharding(mesh)} if train.mem_len else None
  return step_lib.train_step_fn(
    graphdef,
    loss_fn,
    mesh,
    carry_sharding=carry_sharding,
    carry_rows={'memory': {'hidden': 1, 'length': None}},
    grad_accum_steps=train.grad_accum_steps,
  )


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def score_segment(graphdef, state, memory, inputs, targets, clamp_len, same_length):
  """(nats of one segment summed over its rows, per position [L]; the next memory); compiled
  once per model structure, segment shape and settings, so periodic validation does not
  recompile."""
  model = nnx.merge(graphdef, state)
  with autotune.forward_only():
    logits, memory = model(
      inputs, memory, deterministic=True, clamp_len=clamp_len, same_length=same_length
    )
  return jnp.sum(nats_per_token(logits, targets), axis=0), memory


def split_batches(config, split: str, tokens, *, rows_of: str, segments_of: str, **kwargs):
  """`OrderedBatches` of the `split` split's `tokens`: config.<rows_of>.batch_size rows,
  segments of config.<segments_of>.tgt_len; its errors name the split, config.data.path and
  those fields. `kwargs` go to `OrderedBatches` (rows=...)."""
  return OrderedBatches(
    tokens,
    config[rows_of].batch_size,
    config[segments_of].tgt_len,
    name=f'the {split} split of {config.data.path} (config.data.path)',
    fields=(f'config.{rows_of}.batch_size', f'config.{segments_of}.tgt_len'),
    **kwargs,
  )


def bits_per_char(
  model, batches: OrderedBatches, span, *, max_segments: int = 0, what: str = 'bpc'
) -> dict:
  """Mean nats / ln 2 over a split's `batches`, walked in order with memory (the whole split by
  default).

  `span` is the config section (config.train or config.eval) whose tgt_len (that of
  `batches`), mem_len, clamp_len and same_length apply. Returns {'bpc', 'nats', 'tokens',
  'segment_nats', 'segment_tokens', 'position_bpc', 'position_tokens'}: segment_* per segment
  (the items of `relpos.studies.significance`'s paired test), position_* per position within a
  segment (0 to tgt_len - 1, pooled over segments and rows: how the loss falls as the segment
  gives more context of its own; `relpos.studies.breakdown`). `max_segments` > 0 scores only
  the first segments. A pass of more than half a minute prints progress lines headed `what`.
  """
  graphdef, state = nnx.split(model)
  # Placed as the parameters are, as score_segment's next memory is: a fresh memory of
  # another placement (jnp.zeros' uncommitted arrays) compiled the first segment apart. Made
  # in place (jnp.zeros' device=), which a global sharding of several processes takes, where
  # jax.device_put refuses a committed array as its source.
  memory = model.init_memory(
    batches.batch_size, span.mem_len, device=jax.tree.leaves(state)[0].sharding
  )
  segment_position_nats, segment_tokens = [], []  # [L] nats on the device, per segment
  total = min(max_segments or batches.num_segments, batches.num_segments)
  progress = PassProgress(what, total, 'segments')
  for segment, inputs, targets in batches.iterate():
    if max_segments and segment >= max_segments:
      break
    nats, memory = score_segment(
      graphdef,
      state,
      memory,
      jnp.asarray(inputs),
      jnp.asarray(targets),
      span.clamp_len,
      span.same_length,
    )
    segment_position_nats.append(nats)
    segment_tokens.append(targets.size)
    progress.update(segment + 1, pending=nats)
  per_segment = jax.device_get(segment_position_nats)  # [L] per segment (the last may be short)
  # As long as the longest segment scored: span.tgt_len, unless the split is shorter (a
  # tgt_len of 2**31 - 1 allocated 16 GiB here).
  longest = max(map(len, per_segment), default=0)
  position_nats, position_tokens = np.zeros(longest), np.zeros(longest)
  segment_nats = []
  for nats_L, tokens in zip(per_segment, segment_tokens, strict=True):
    position_nats[: len(nats_L)] += nats_L
    position_tokens[: len(nats_L)] += tokens // len(nats_L)
    segment_nats.append(math.fsum(map(float, nats_L)))
  total_nats, total_tokens = math.fsum(segment_nats), sum(segment_tokens)
  return {
    'bpc': total_nats / total_tokens / math.log(2),
    'nats': total_nats / total_tokens,
    'tokens': total_tokens,
    'segment_nats': segment_nats,
    'segment_tokens': segment_tokens,
    'position_bpc': [
      float(nats / tokens / math.log(2)) if tokens else None
      for nats, tokens in zip(position_nats, position_tokens, strict=True)
    ],
    'position_tokens': [int(tokens) for tokens in position_tokens],
  }


def _validate(config, batches: OrderedBatches, model, step: int) -> dict:
  """The validation during training (`task_base.Training.validate`, bound to the config and the
  valid split's batches): bits-per-char with config.train's segments, over the first
  config.eval.max_segments_during_training segments, printed and returned as scalars to log."""
  result = bits_per_char(
    model,
    batches,
    config.train,
    max_segments=config.eval.max_segments_during_training,
    what=f'step {step}: valid bpc',
  )
  print(f'step {step}: valid bpc {result["bpc"]:.4f} ({result["tokens"]} chars)', flush=True)
  return {'valid/bpc': result['bpc']}


class CharLM(task_base.Task):
  """Transformer-XL character language modelling; the metric is bits-per-char."""

  metric = 'bpc'
  metrics = ('bpc',)
  declaration = CharLMConfig

  def check_combinations(self, config, mesh):
    model_config(config, vocab_size=1)
    shared.check_eval_fields(config, self.unread_fields(config))
    if not config.data.path:  # read as '.': "is a directory", or enwik8 fetched into '.'
      raise ValueError(
        'config.data.path is empty: set it to the file to read (a text file with '
        "config.data.kind='text'; enwik8, its zip or their directory with 'enwik8')"
      )
    if config.train.clamp_len > 0 and config.model.position != 'xl':
      raise ValueError(
        f'config.train.clamp_len={config.train.clamp_len}: only position xl reads it '
        f'(config.model.position={config.model.position!r}); leave it at -1'
      )
    for phase in ('train', 'eval'):
      if config[phase].same_length and not config[phase].mem_len:
        raise ValueError(
          f'config.{phase}.same_length needs config.{phase}.mem_len > 0: with no memory no '
          'key is visible'
        )
    if mesh is not None:
      mesh_lib.check_rows(
        config.train.batch_size, mesh, 'config.train.batch_size', config.train.grad_accum_steps
      )

  def unread_fields(self, config):
    return model_config(config, vocab_size=1).unread_fields()

  def resume_shapes(self, config):
    if not config.train.mem_len:  # rows without memory: another batch_size resumes
      return (), 'no Transformer-XL memory (config.train.mem_len=0)'
    return (
      ('train.batch_size', 'train.mem_len'),
      f'the Transformer-XL memory of {config.train.batch_size} rows of '
      f'{config.train.mem_len} positions',
    )

  def unread_run_fields(self, config):
    return () if config.model.position == 'xl' else ('train.clamp_len', 'eval.clamp_len')

  def training(self, config, workdir, mesh) -> task_base.Training:
    """The data first (the vocabulary comes from it), then the model, its optimizer and the
    step.

    Every split is batched (or checked) here, before anything is trained: a training split
    with no full segment, or a valid/test split too short for config.eval.batch_size rows,
    is refused now, not after the training it would have ended.
    """
    train = config.train
    rows = mesh_lib.process_rows(train.batch_size, mesh)  # only the rows this process feeds
    splits, vocab = _vocab_for_run(config, workdir, training=True)
    batches = split_batches(
      config, 'train', splits['train'], rows_of='train', segments_of='train', rows=rows
    )
    batches.check_training()
    valid_batches = split_batches(
      config, 'valid', splits['valid'], rows_of='eval', segments_of='train'
    )
    split_batches(config, 'test', splits['test'], rows_of='eval', segments_of='eval')
    model, graphdef, state = build(config, vocab.size, mesh)
    train_step = train_step_fn(config, graphdef, mesh)

    def step(state, batch):
      inputs, targets, new_epoch = batch
      if new_epoch and 'memory' in state:  # the rows start over: the memory would lie
        state['memory'] = _empty_memory(model, train.batch_size, train.mem_len, mesh)
      return train_step(state, (inputs, targets))

    def batch(s):
      inputs, targets, new_epoch = batches.training_batch(s)
      return (*mesh_lib.global_batch((inputs, targets), mesh), new_epoch)

    validate = functools.partial(_validate, config, valid_batches)
    meta = {'epoch_segments': batches.num_segments}
    step_flops = flops_lib.char_lm_flops(
      config.model,
      batch=train.batch_size,
      tgt_len=train.tgt_len,
      mem_len=train.mem_len,
      vocab_size=vocab.size,
    ).train_step()
    return task_base.Training(
      graphdef,
      state,
      step,
      batch,
      validate,
      checkpoint_meta=meta,
      step_flops=lambda batch: step_flops,
    )

  def train_scalars(self, totals):
    return {'train/bpc': totals['loss'] / totals['tokens'] / math.log(2)}

  def data_files(self, config, workdir):
    vocabulary = {data_record.VOCABULARY: Path(workdir) / VOCAB_FILE}
    if config.data.kind != 'text':
      return vocabulary  # enwik8: its size and md5 are checked as it is read (data.enwik8)
    return {'config.data.path': Path(config.data.path), **vocabulary}

  def build_model(self, config, vocab_size):
    return TransformerXL(model_config(config, vocab_size), rngs=nnx.Rngs(config.seed))

  def run_vocabulary(self, config, workdir):
    vocab = read_vocabulary(Path(workdir), config.data.vocab)
    return vocab, vocab.size

  def score(self, config, workdir, output_dir=None) -> dict:
    """Bits-per-char on config.eval.split, with config.eval's segment and memory settings
    (`output_dir` is unused: nothing but eval_results.json is written)."""
    del output_dir
    splits, vocab = _vocab_for_run(config, workdir, training=False, encode=(config.eval.split,))
    model = self.build_model(config, vocab.size)
    model, steps, checkpoint = restore.restore_model(model, config.eval, workdir)
    split = config.eval.split
    batches = split_batches(config, split, splits[split], rows_of='eval', segments_of='eval')
    result = bits_per_char(model, batches, config.eval, what=f'{split} bpc')
    return result | {
      'split': split,
      'step': steps[-1],
      'averaged_steps': steps,
      'checkpoint': str(checkpoint),
    }

  def result_lines(self, result: dict) -> list[str]:
    """The scored count is of bytes: both vocabularies ('bytes', 'original') map byte values
    to ids (`relpos.data.char_corpus`), so a multi-byte UTF-8 character (or an invalid byte)
    counts once per byte, and bpc is bits per byte."""
    return [
      f'{result["split"]} split, {result["tokens"]} bytes scored, '
      + task_base.checkpoint_text(result),
      f'bpc={result["bpc"]:.4f}',
    ]


TASK = CharLM()
