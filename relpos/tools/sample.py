"""Samples text from a trained character-LM run: its checkpoint, vocabulary and config.

    python -m relpos.tools.sample --workdir=runs/char_tiny --prompt="ROMEO:" --length=300
    python -m relpos.tools.sample --workdir=runs/char_tiny --prompt="To be" --top_k=10
    python -m relpos.tools.sample --workdir=runs/char_tiny --prompt="To be" --top_p=0.9 --seed=1

The model reads the text the way evaluation does (config.eval's tgt_len, mem_len, clamp_len
and same_length): in segments of tgt_len characters, each with the memory of the segments
before it. The segment being written is re-run, padded to tgt_len, for every new character
(causal attention makes the padding invisible, and with same_length each position sees the
window it sees in evaluation's full segments), and moves into the memory once it is full; so
every scheme, `absolute` included, sees its context as in evaluation. Sampling: logits /
temperature, then the top_k most likely characters (0: all) and the smallest set whose
probability reaches top_p (1: all).
A workdir that does not exist, is not a char-LM run or has no checkpoint is one line, exit 1.
"""

import sys

from absl import flags

from relpos import runtime
from relpos.config import checks


def filtered_logits(logits_V, *, temperature: float, top_k: int, top_p: float):
  """Logits after temperature, top-k and top-p: the excluded symbols at -inf."""
  import jax.numpy as jnp

  logits_V = logits_V / temperature
  if top_k:
    kth = jnp.sort(logits_V)[-min(top_k, logits_V.shape[-1])]
    logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
  if top_p < 1.0:
    order = jnp.argsort(-logits_V)
    probs = jnp.exp(logits_V[order] - jnp.max(logits_V))
    probs /= probs.sum()
    # Keep a symbol while the probability before it is below top_p (the first always stays).
    keep_sorted = jnp.cumsum(probs) - probs < top_p
    keep = jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)
    logits_V = jnp.where(keep, logits_V, -jnp.inf)
  return logits_V


def prompt_tokens(vocab, prompt: bytes | None) -> list[int]:
  """The ids of `prompt` in `vocab` (a `CharVocab`); None is a line break where the vocabulary
  has one, else its first symbol (enwik8's 'original' vocabulary drops line breaks).

  Raises:
    ValueError: a byte of the prompt is not in the vocabulary (the message names --prompt).
  """
  from relpos.data.char_corpus import NEWLINE

  if prompt is None:
    prompt = bytes([NEWLINE if NEWLINE in vocab.symbols else vocab.symbols[0]])
  try:
    return [int(i) for i in vocab.encode(prompt)]
  except ValueError as error:
    raise ValueError(
      f"--prompt: {error} of the run's vocab.json; give a prompt of the text it was trained on"
    ) from None


def sample(
  workdir, prompt: bytes | None, length: int, *, temperature=1.0, top_k=0, top_p=1.0, seed=0
):
  """`length` sampled bytes continuing `prompt` (None: a line break, or the vocabulary's first
  symbol where it has no line break), from the run in `workdir`.

  Raises:
    FileNotFoundError: no run or no checkpoint in `workdir`.
    ValueError: not a char-LM run; a sampling setting out of range; a prompt byte outside the
      vocabulary.
  """
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from relpos.attention import autotune
  from relpos.training import char_lm_task as char_lm

  if not temperature > 0:
    raise ValueError(f'--temperature={temperature} must be > 0')
  if not 0 < top_p <= 1:
    raise ValueError(f'--top_p={top_p} must be in (0, 1]')
  if prompt is not None and not prompt:
    raise ValueError('--prompt is empty: give at least one character')
  trained = char_lm.TASK.trained_model(
    workdir, needs="relpos.tools.sample reads runs of task 'char_lm'"
  )
  model, vocab, span = trained.model, trained.vocab, trained.config.eval
  graphdef, state = nnx.split(model)

  @jax.jit
  @autotune.forward_only()
  def run(state, tokens_1T, memory):
    logits, memory = nnx.merge(graphdef, state)(
      tokens_1T,
      memory,
      deterministic=True,
      clamp_len=span.clamp_len,
      same_length=span.same_length,
    )
    return logits[0], memory

  segment_len = span.tgt_len
  memory = model.init_memory(1, span.mem_len)
  tokens = prompt_tokens(vocab, prompt)
  start = 0  # tokens[start:] is the segment being written; those before are in the memory
  key = jax.random.key(seed)
  for _ in range(length):
    while len(tokens) - start > segment_len:  # a full segment moves into the memory
      _, memory = run(state, jnp.asarray([tokens[start : start + segment_len]]), memory)
      start += segment_len
    current = tokens[start:]
    padded = jnp.asarray([current + [0] * (segment_len - len(current))])
    logits_TV, _ = run(state, padded, memory)
    logits_V = filtered_logits(
      logits_TV[len(current) - 1], temperature=temperature, top_k=top_k, top_p=top_p
    )
    key, draw = jax.random.split(key)
    tokens.append(int(jax.random.categorical(draw, logits_V)))
  return vocab.decode(tokens[-length:])


def main(argv):
  del argv  # `run_main` refuses stray arguments
  args = flags.FLAGS
  text = sample(
    args.workdir,
    None if args.prompt is None else args.prompt.encode('utf-8'),
    args.length,
    temperature=args.temperature,
    top_k=args.top_k,
    top_p=args.top_p,
    seed=args.seed,
  )
  sys.stdout.write((args.prompt or '') + text.decode('utf-8', errors='replace') + '\n')


def define_flags():
  """The command-line flags (defined only when run as a program, so importing is free)."""
  flags.DEFINE_string('workdir', None, "The workdir of a run of task 'char_lm'.")
  flags.DEFINE_string(
    'prompt',
    None,
    "Text to continue (bytes of the run's vocabulary; default: a line break, or the "
    "vocabulary's first symbol where it has none).",
  )
  flags.DEFINE_integer('length', 200, 'Characters to sample.', lower_bound=1)
  flags.DEFINE_float('temperature', 1.0, 'Softmax temperature (> 0).')
  flags.DEFINE_integer('top_k', 0, 'Sample among the k most likely (0: all).', lower_bound=0)
  flags.DEFINE_float('top_p', 1.0, 'Nucleus: smallest set of probability >= p.')
  flags.DEFINE_integer(
    'seed', 0, 'Sampling seed (32 bits).', lower_bound=0, upper_bound=checks.SEED_MAX
  )
  flags.mark_flag_as_required('workdir')


if __name__ == '__main__':
  runtime.apply_defaults()
  define_flags()
  from relpos.cli import run_main  # after the defaults: it imports jax

  run_main(main)
