"""Tunes a config's attention calls ahead of a run and prints what `'auto'` chose at each.

    python -m relpos.tools.pretune --config=configs/enwik8_base.py
    python -m relpos.tools.pretune --config=configs/wmt_base.py:shaw --lengths=32,64,128,256
    python -m relpos.tools.pretune --config=configs/char_tiny.py --force   # a CPU: a check

Traces (lowers, never runs) the config's train step at its training shapes and its evaluation
at its eval shapes, which resolves every `attention_implementation='auto'` call in them through
`relpos.attention.autotune` (timed on a GPU, read from its cache where decided before: the
train step's calls forward and backward, the evaluation's forward only), then prints the
device, the decision cache and a table of the decisions: call signature, xla ms, pallas ms
(default tiles), one column per other candidate timed ('pallas@QxK', 'cudnn', 'mosaic'; blank
where it was not a candidate, 'failed' where it failed), choice, and whether it was timed now
or read from the cache. A run started afterwards on the same device reads the decisions
instead of timing them at its first step. Translation configs are traced at one batch per
padded length of `--lengths` (their buckets are fitted to the data); `--force` tunes on a CPU
too (Pallas interpreted: a check of the command), and writes what it timed to the decision cache
like any run: by default the user's machine-wide ~/.cache/relpos/jax/relpos-autotune.json
($XDG_CACHE_HOME/relpos/jax/... where that is set), which every clone and run shares
(`RELPOS_AUTOTUNE_CACHE=<file>` or `=off` keeps a check apart).
Config overrides as train.py takes them (`--config.model.dtype=bfloat16`).
"""

import os

from absl import flags
from ml_collections import config_flags

from relpos import flag_types, runtime


def decision_table(decisions) -> list[str]:
  """Markdown rows: call signature, xla ms, pallas ms (default tiles), a column per other
  candidate any decision timed (in order of appearance), choice, source. A cell is 'failed' for
  a candidate that failed, blank for one not timed at that signature (or timed by process 0)."""
  names = ['xla', 'pallas']
  for d in decisions:
    names += [name for name in d.ms if name not in names]

  def cell(d, name):
    if name not in d.ms:
      return ''
    return 'failed' if d.ms[name] is None else f'{d.ms[name]:.3f}'

  header = ' | '.join(f'{name} ms' for name in names)
  rows = [f'| call | {header} | choice | source |', '|---' * (len(names) + 3) + '|']
  for d in decisions:
    cells = ' | '.join(cell(d, name) for name in names)
    rows.append(f'| {d.signature.text()} | {cells} | {d.choice} | {d.source} |')
  return rows


def trace_train_step(config, lengths=()) -> list:
  """Traces (lowers, never runs) the train step of `config` at its training shapes, which
  resolves every 'auto' attention call in it, and returns the lowered steps (`jax.stages.
  Lowered`). Char LM: one, [batch_size, tgt_len] (and its memory); translation: one batch of
  rows = max_tokens // L per padded length L of `lengths`."""
  import jax.numpy as jnp

  from relpos.training import char_lm_task, tasks, translation_task
  from relpos.training.mesh import data_mesh

  mesh = data_mesh()
  if config.task == 'char_lm':
    _, graphdef, state = char_lm_task.build(config, 256, mesh)
    step = char_lm_task.train_step_fn(config, graphdef, mesh)
    shape = (config.train.batch_size, config.train.tgt_len)
    tokens = jnp.zeros(shape, jnp.int32)
    return [step.lower(state, (tokens, tokens))]
  tasks.get(config)  # validates config.task
  vocab_size = config.data.vocab_size
  graphdef, state = translation_task.build(config, vocab_size, mesh)
  step = translation_task.train_step_fn(config, graphdef, mesh)
  lowered = []
  for length in lengths:
    rows = max(mesh.size, config.data.max_tokens // length // mesh.size * mesh.size)
    tokens = jnp.ones((rows, length), jnp.int32)
    lowered.append(step.lower(state, {'src': tokens, 'tgt_in': tokens, 'tgt_out': tokens}))
  return lowered


def trace_eval_step(config, lengths=()) -> list:
  """Traces (lowers, never runs) the evaluation of `config` at its eval shapes, which resolves
  its 'auto' calls as forward passes ('fwd' signatures: `autotune.forward_only`), and returns
  the lowered functions. Char LM: one segment of [eval.batch_size, eval.tgt_len] over
  eval.mem_len of memory (`char_lm_task.score_segment`, bits per char); translation: the eval
  loss (`translation_task.batch_nll`) at one batch of max_tokens // L rows per padded length L
  of `lengths`. (Beam search, whose calls grow a step at a time, is not traced.)"""
  import jax.numpy as jnp
  from flax import nnx

  from relpos.training import char_lm_task, tasks, translation_task

  if config.task == 'char_lm':
    model = char_lm_task.TransformerXL(
      char_lm_task.model_config(config, 256), rngs=nnx.Rngs(config.seed)
    )
    graphdef, state = nnx.split(model)
    span = config.eval
    memory = model.init_memory(span.batch_size, span.mem_len)
    tokens = jnp.zeros((span.batch_size, span.tgt_len), jnp.int32)
    args = (memory, tokens, tokens, span.clamp_len, span.same_length)
    return [char_lm_task.score_segment.lower(graphdef, state, *args)]
  tasks.get(config)  # validates config.task
  model = translation_task.Transformer(
    translation_task.model_config(config, config.data.vocab_size), rngs=nnx.Rngs(config.seed)
  )
  graphdef, state = nnx.split(model)
  lowered = []
  for length in lengths:
    tokens = jnp.ones((max(1, config.data.max_tokens // length), length), jnp.int32)
    batch = {'src': tokens, 'tgt_in': tokens, 'tgt_out': tokens}
    lowered.append(translation_task.batch_nll.lower(graphdef, state, batch))
  return lowered


def define_flags(flag_values=flags.FLAGS) -> None:
  """The command line's flags: defined when it runs, not on import (tests import this module
  beside others that define a --config), in `flag_values` (a test's own registry)."""
  config_flags.DEFINE_config_file(
    'config', None, 'A char_lm or translate config.', flag_values=flag_values
  )
  flag_types.define_int_list(
    'lengths',
    '32,64,128,256',
    'Translation only: padded sentence lengths to tune (one batch of max_tokens // L rows each).',
    minimum=1,
    flag_values=flag_values,
  )
  flags.DEFINE_bool(
    'force',
    False,
    "Tune where 'auto' is 'xla' untimed (a CPU: Pallas interpreted), to check. It writes what "
    "it times to the decision cache (the 'cache:' line): by default "
    '~/.cache/relpos/jax/relpos-autotune.json, machine-wide, shared by every clone and run '
    '($XDG_CACHE_HOME/relpos/jax/... where that is set; RELPOS_AUTOTUNE_CACHE=<file> or =off '
    'keeps a check apart).',
    flag_values=flag_values,
  )
  flags.mark_flags_as_required(['config'], flag_values=flag_values)


def main(argv) -> None:
  del argv  # none: `run_main` refuses positional arguments
  import jax

  from relpos.attention import autotune
  from relpos.training import tasks
  from relpos.training.mesh import data_mesh

  options = flags.FLAGS
  tasks.get(options.config).check_config(options.config, data_mesh())
  if os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
  current = autotune.tuner()
  current.path, current.force = autotune.default_cache_path(), options.force
  lengths = options.lengths if options.config.task == 'translate' else []
  trace_train_step(options.config, lengths)
  trace_eval_step(options.config, lengths)
  print(f'device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}')
  print(cache_line(current.path))
  if not current.enabled():
    print("tuning is off on this backend: 'auto' is 'xla' here")
  for row in decision_table(current.decisions):
    print(row)


def cache_line(path) -> str:
  """The 'cache:' line: the decision cache's file, or that RELPOS_AUTOTUNE_CACHE=off keeps the
  decisions in memory only (`runtime.autotune_cache_path`'s None; it printed 'cache: None')."""
  return f'cache: {path}' if path else 'cache: none (RELPOS_AUTOTUNE_CACHE=off: kept in memory)'


if __name__ == '__main__':
  runtime.apply_defaults()
  define_flags()
  from relpos.cli import run_main  # after the defaults: it imports jax

  run_main(main)
