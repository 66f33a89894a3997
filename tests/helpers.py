"""Shared random inputs, masks, tolerances, a materialised JAX Transformer-XL, and a tiny
character-LM setup for the tests that launch train.py."""

from __future__ import annotations

import functools
import importlib.util
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos import attention
from relpos.config import load_config_file

# float32 kernel vs float64 reference, rtol = atol (outputs are O(1)). Measured on CPU: every
# forward comparison passes at 1e-6; 2x headroom.
FWD_TOL = 2e-6
# float32 vs float32 gradients, atol scaled by the largest entry of that gradient. Measured on
# CPU: every comparison passes at 2e-6; 2x headroom.
GRAD_TOL = 4e-6


def slow_where(values, slow, ids=None, *, unpack=False):
  """`values` for `pytest.mark.parametrize`, those whose id (`ids[i]`, else the value itself)
  is in `slow` marked slow: the cases that repeat a path other cases cover go to the slow tier,
  which keeps the default run under its 10 minutes on 2 cores. `unpack`: each value is the
  tuple of several argnames."""
  import pytest

  ids = [str(v) for v in values] if ids is None else list(ids)
  unknown = set(slow) - set(ids)
  assert not unknown, f'no such cases: {sorted(unknown)}'
  return [
    pytest.param(*(v if unpack else (v,)), marks=[pytest.mark.slow] if i in slow else [], id=i)
    for v, i in zip(values, ids, strict=True)
  ]


def randn(rng, *shape, scale=1.0):
  """Standard-normal float64 array, with no exact zeros."""
  x = rng.standard_normal(shape) * scale
  x[x == 0.0] = 0.5
  return x


def qkv(rng, batch, q_len, kv_len, heads, dim):
  return (
    randn(rng, batch, q_len, heads, dim),
    randn(rng, batch, kv_len, heads, dim),
    randn(rng, batch, kv_len, heads, dim),
  )


def f32(x):
  return None if x is None else jnp.asarray(np.asarray(x, dtype=np.float32))


def f32_np(x):
  """Round to float32 and back to float64, so the reference sees exactly the kernel's inputs."""
  return None if x is None else np.asarray(x, dtype=np.float32).astype(np.float64)


def assert_close(actual, expected, tol=FWD_TOL, err_msg=''):
  actual = np.asarray(actual, dtype=np.float64)
  expected = np.asarray(expected, dtype=np.float64)
  assert actual.shape == expected.shape, (actual.shape, expected.shape)
  assert np.all(np.isfinite(actual)), 'non-finite values in kernel output'
  np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=err_msg)


def assert_grads_close(actual, expected, tol=GRAD_TOL, names=None):
  """Elementwise |a - e| <= tol * (|e| + max|e|), per gradient (scale-aware absolute floor)."""
  for n, (a, e) in enumerate(zip(actual, expected, strict=True)):
    name = names[n] if names else str(n)
    a = np.asarray(a, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    assert a.shape == e.shape, (name, a.shape, e.shape)
    assert np.all(np.isfinite(a)), f'non-finite gradient for {name}'
    scale = max(1.0, float(np.abs(e).max()))
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * scale, err_msg=f'grad {name}')


# --------------------------------------------------------------------------------------------
# Masks, all as NumPy bool arrays (True = may attend), built from the formulas directly.


def causal_np(q_len, kv_len, query_offset=None):
  if query_offset is None:
    query_offset = kv_len - q_len
  i = np.arange(q_len)[:, None]
  j = np.arange(kv_len)[None, :]
  return j <= query_offset + i


def padding_np(lengths, kv_len):
  """[batch, 1, 1, kv_len]: key j valid iff j < length of that batch element."""
  lengths = np.asarray(lengths)
  return (np.arange(kv_len)[None, :] < lengths[:, None])[:, None, None, :]


def random_mask_np(rng, batch, heads, q_len, kv_len, p=0.6):
  """Random [batch, heads, q_len, kv_len] mask; rows are not forced to be non-empty."""
  return rng.random((batch, heads, q_len, kv_len)) < p


def with_dead_rows(rng, mask, batch, heads, q_len, kv_len, n_dead=3):
  """Broadcast `mask` to full shape and switch off a few whole query rows."""
  full = np.array(np.broadcast_to(mask, (batch, heads, q_len, kv_len)))
  for _ in range(n_dead):
    b, h, i = rng.integers(batch), rng.integers(heads), rng.integers(q_len)
    full[b, h, i, :] = False
  # make sure at least one row (0, 0, q_len - 1) is dead and at least one is alive
  full[0, 0, q_len - 1, :] = False
  full[-1, -1, 0, 0] = True
  return full


MASK_KINDS = ('none', 'random', 'causal', 'padding', 'dead_rows')


def make_mask(kind, rng, batch, heads, q_len, kv_len, query_offset=None):
  if kind == 'none':
    return None
  if kind == 'random':
    return random_mask_np(rng, batch, heads, q_len, kv_len)
  if kind == 'causal':
    return causal_np(q_len, kv_len, query_offset)  # [q_len, kv_len], broadcast
  if kind == 'padding':
    lengths = [kv_len] + [max(1, kv_len - 3 - 2 * n) for n in range(batch - 1)]
    return padding_np(lengths, kv_len)
  if kind == 'filling':  # keys only: a memory whose first slots are not filled yet (char LM)
    return np.arange(kv_len) >= min(kv_len - 1, kv_len - q_len + 2)
  if kind == 'dead_rows':
    base = random_mask_np(rng, batch, heads, q_len, kv_len, p=0.8)
    return with_dead_rows(rng, base, batch, heads, q_len, kv_len)
  raise ValueError(kind)


def dead_rows(mask, batch, heads, q_len, kv_len):
  """[batch, q_len, heads] bool: True where the query row may attend to nothing."""
  if mask is None:
    return np.zeros((batch, q_len, heads), dtype=bool)
  full = np.broadcast_to(mask, (batch, heads, q_len, kv_len))
  return np.transpose(~full.any(-1), (0, 2, 1))


# --------------------------------------------------------------------------------------------
# Materialised JAX Transformer-XL, written here from the equations (autodiff reference).


def xl_materialized_jax(query, key, value, rel_key, content_bias, position_bias, mask=None):
  """score_ij = ((q_i+u).k_j + (q_i+v).rel_key[pos_i - j]) / sqrt(d), causal + mask.

  Gathers rel_key[pos_i - j] into [q_len, kv_len, heads, d] (index clipped to 0 where j > pos_i;
  those entries are masked out anyway).
  """
  _, q_len, _, dim = query.shape
  kv_len = key.shape[1]
  pos = kv_len - q_len + jnp.arange(q_len)
  dist = pos[:, None] - jnp.arange(kv_len)[None, :]  # [q, kv]
  causal = dist >= 0
  r = rel_key[jnp.clip(dist, 0, kv_len - 1)]  # [q, kv, heads, d]
  content = jnp.einsum('bqhd,bkhd->bhqk', query + content_bias, key)
  position = jnp.einsum('bqhd,qkhd->bhqk', query + position_bias, r)
  scores = (content + position) / np.sqrt(dim)
  allowed = causal[None, None]
  if mask is not None:
    allowed = allowed & jnp.asarray(mask)
  allowed = jnp.broadcast_to(allowed, scores.shape)
  scores = jnp.where(allowed, scores, jnp.finfo(scores.dtype).min)
  probs = jax.nn.softmax(scores, axis=-1)
  probs = jnp.where(allowed, probs, 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', probs, value)


# --------------------------------------------------------------------------------------------
# Jitted entry points shared by all test modules. XLA compilation dominates the test time on CPU,
# so every kernel call goes through one jitted function per kernel name: cases with the same
# shapes, mask layout and static query_offset reuse a compilation. (Eager execution is covered
# separately in test_properties.py.)

KERNELS = {
  'dot_product': attention.dot_product_attention,
  'shaw': attention.shaw_attention_banded,
  'shaw_dense': attention.shaw_attention_dense,
  'xl': attention.xl_attention,
  'xl_jax_transcription': xl_materialized_jax,
}


def _call(name, args, mask, query_offset):
  kwargs = {}
  if mask is not None:
    kwargs['mask'] = mask
  if query_offset is not None:
    kwargs['query_offset'] = query_offset
  return KERNELS[name](*args, **kwargs)


@functools.partial(jax.jit, static_argnums=0, static_argnames=('query_offset',))
def run(name, *args, mask=None, query_offset=None):
  """KERNELS[name](*args, mask=mask, query_offset=query_offset), with query_offset static."""
  return _call(name, args, mask, query_offset)


@functools.partial(jax.jit, static_argnums=0)
def run_traced_offset(name, *args, mask=None, query_offset):
  """As `run`, but query_offset is a traced int32 scalar inside jit."""
  return _call(name, args, mask, query_offset)


@functools.partial(jax.jit, static_argnums=0, static_argnames=('query_offset',))
def grads(name, cotangent, *args, mask=None, query_offset=None):
  """Gradient of sum(KERNELS[name](*args) * cotangent) w.r.t. every arg (None for None args)."""

  def loss(*xs):
    return jnp.sum(_call(name, xs, mask, query_offset) * cotangent)

  return jax.grad(loss, argnums=tuple(range(len(args))))(*args)


# The smallest character LM the launcher tests train: its sections' fields and train.py flags.
TINY_CHAR_LM = {
  'model': dict(num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=32),
  'train': dict(tgt_len=8, mem_len=8),
}
TINY_CHAR_LM_FLAGS = [
  f'--config.{section}.{name}={value}'
  for section, fields in TINY_CHAR_LM.items()
  for name, value in fields.items()
]
REPO = Path(__file__).resolve().parent.parent


def refusal(commands, *argv, timeout: float = 120) -> str:
  """The one stderr line of the command `python *argv` (run by conftest's `commands`) refusing
  its arguments: exit status 1, a single line starting `error: `, no traceback."""
  return one_error_line(commands.run(argv, timeout=timeout))


def load_config(name: str, preset: str | None = None):
  """configs/<name>.py's get_config(preset), loaded from its file as train.py loads it."""
  return load_config_file(REPO / 'configs' / f'{name}.py', preset)


def load_module(path: Path, name: str) -> types.ModuleType:
  """The Python file `path` imported as module `name` (benchmark scripts, which are files,
  not a package)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def damage_checkpoint(checkpoint_dir: Path):
  """Truncates the data files of a checkpoint's 'model' arrays to 50 bytes (as a failing disk
  might), leaving its metadata readable: orbax starts reading and fails part way."""
  files = [p for p in (checkpoint_dir / 'model').glob('ocdbt.process_*/d/*') if p.is_file()]
  assert files
  for path in files:
    path.write_bytes(path.read_bytes()[:50])


def write_word_corpus(path, *, words=6000, seed=0):
  """Writes `words` random words of a small vocabulary (with newlines) to `path`."""
  rng = np.random.default_rng(seed)
  vocabulary = ['the ', 'cat ', 'sat ', 'on ', 'a ', 'mat.\n', 'dog ', 'ran ']
  path.write_text(''.join(rng.choice(vocabulary, size=words)))
  return path


_WORDS = ['red', 'blue', 'green', 'cat', 'dog', 'bird', 'runs', 'sleeps', 'sings', 'fast']
_GERMAN = ['rot', 'blau', 'grün', 'Katze', 'Hund', 'Vogel', 'läuft', 'schläft', 'singt', 'schnell']


def write_pairs(directory: Path, name: str, count: int, seed: int):
  """`name`.en / `name`.de: a word-for-word 'translation' with a reversal, learnable by a
  tiny model."""
  rng = np.random.default_rng(seed)
  sources, targets = [], []
  for _ in range(count):
    ids = rng.integers(0, len(_WORDS), size=rng.integers(2, 6))
    sources.append(' '.join(_WORDS[i] for i in ids))
    targets.append(' '.join(_GERMAN[i] for i in ids[::-1]))
  (directory / f'{name}.en').write_text('\n'.join(sources) + '\n')
  (directory / f'{name}.de').write_text('\n'.join(targets) + '\n')


def write_pair_corpus(directory: Path, *, train=300, eval=12) -> Path:
  """`directory` (made if needed) with train.{en,de} and eval.{en,de} of `write_pairs`."""
  directory.mkdir(parents=True, exist_ok=True)
  write_pairs(directory, 'train', train, seed=0)
  write_pairs(directory, 'eval', eval, seed=1)
  return directory


def tiny_translate_config(corpus: Path, *, steps: int, position='shaw'):
  """translate_tiny shrunk to a 1+1-layer model on a `write_pair_corpus` directory."""
  config = load_config('translate_tiny', position)
  config.data.update(
    train_src=str(corpus / 'train.en'),
    train_tgt=str(corpus / 'train.de'),
    eval_src=str(corpus / 'eval.en'),
    eval_tgt=str(corpus / 'eval.de'),
    moses_detokenize=False,
    max_eval_examples=0,
    vocab_size=40,
    max_length=16,
    max_tokens=256,
    length_buckets=1,  # one batch shape: one train-step compile per run (2 took two)
  )
  config.model.update(
    encoder_layers=1, decoder_layers=1, d_model=32, num_heads=2, d_ff=64, max_relative_position=3
  )
  config.optim.update(warmup_steps=5)
  config.train.update(steps=steps, log_every=2, eval_every=4, checkpoint_every=4)
  config.eval.update(beam_size=2, batch_size=8, max_decode_extra=4)
  return config


def tiny_char_config(text_path: Path, *, steps: int, preset: str = 'xl'):
  """char_tiny's `preset` shrunk to TINY_CHAR_LM on the text file `text_path`, without
  periodic validation or checkpoints before the end."""
  config = load_config('char_tiny', preset)
  config.data.path = str(text_path)
  for section, fields in TINY_CHAR_LM.items():
    config[section].update(fields)
  config.train.update(batch_size=4, steps=steps, eval_every=0, checkpoint_every=0, log_every=1)
  config.eval.update(batch_size=4, tgt_len=8, mem_len=8)
  return config


def call_absl_main(define, main, argv: list[str], parse=None):
  """A tool's `main` called in this process as `app.run(main, flags_parser=parse)` would call
  it for the command line `argv`: the flags `define()` defines in absl's global FLAGS, parsed
  by `parse` (default FLAGS itself), then main(the remaining arguments). Returns the
  SystemExit code (the `error: ...` text of a refused command) or None when main returned.
  Flags other modules imported in this process defined (a benchmark's --config, say) are set
  aside meanwhile, as the tool's own process would not have them. Afterwards the flags
  `define` added are gone, those set aside are back, FLAGS is unparsed again if it was before,
  and absl's log verbosity (which the tools' mains lower) is back."""
  from absl import flags, logging

  registry = flags.FLAGS
  aside = {
    name: registry[name]
    for name in list(registry)
    if not (registry.find_module_defining_flag(name) or '').startswith('absl')
  }
  for name in aside:
    delattr(registry, name)
  before = set(registry)
  was_parsed = registry.is_parsed()
  verbosity = logging.get_verbosity()
  try:
    define()
    main((parse or registry)(argv))
  except SystemExit as exit:
    return exit.code
  finally:
    for name in set(registry) - before:
      delattr(registry, name)
    for name, flag in aside.items():
      registry[name] = flag
    if not was_parsed:
      registry.unparse_flags()
    logging.set_verbosity(verbosity)
  return None


def run_sweep_main(monkeypatch, *args: str):
  """`python -m relpos.studies.sweep <args>` in this process, from the repository root (as
  the tests' subprocesses run it): `call_absl_main` with the command's own flags and parser.
  The SystemExit code, or None when it finished."""
  import sys

  from relpos.config import command_line
  from relpos.studies import sweep

  monkeypatch.chdir(REPO)
  argv = ['sweep.py', *args]
  monkeypatch.setattr(sys, 'argv', argv)  # main reads --config's text and overrides there
  return call_absl_main(sweep.define_flags, sweep.main, argv, command_line.parse_flags)


def one_error_line(result) -> str:
  """The one `error: ...` line a refused command (a subprocess.CompletedProcess) printed, after
  asserting that it exited 1 without a traceback and said nothing else on stderr (but relpos's
  note on its CPU defaults)."""
  assert result.returncode == 1, result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  said = [line for line in result.stderr.splitlines() if not line.startswith('relpos: CPU')]
  assert len(said) == 1 and said[0].startswith('error: '), result.stderr
  return said[0]


def eval_field_sweep_root(root):
  """The files of an eval-field sweep's root that tell it: sweep.md, trained/seed=0 (the run)
  and mem_len=0/seed=0 (its score only); returns those two directories."""
  import json

  trained, scored = root / 'trained' / 'seed=0', root / 'mem_len=0' / 'seed=0'
  for directory in (trained, scored):
    directory.mkdir(parents=True)
  (trained / 'config.json').write_text('{"task": "char_lm"}')
  (root / 'sweep.md').write_text('| table |\n')
  checkpoint = str(trained / 'checkpoints' / '20')
  (scored / 'eval_results.json').write_text(json.dumps({'bpc': 2.0, 'checkpoint': checkpoint}))
  return trained, scored


def after_training(monkeypatch, task, action) -> None:
  """Makes `task.train_model` call `action()` once it has trained: what happens to a data file
  while a run trains (moved away, rewritten) as train_and_evaluate's final evaluation meets
  it."""
  train_model = task.train_model

  def train_then(*args, **kwargs):
    train_model(*args, **kwargs)
    action()

  monkeypatch.setattr(task, 'train_model', train_then)


# key -> the model `built_once` built for it.
_BUILT_MODELS = {}


def built_once(key, build):
  """A fresh copy of the model `build()` returns, built once per `key` (a seed and a config)
  in the run: the tests' models are built op by op (0.1-0.5 s each) and many tests build the
  same ones. The copy is an `nnx.clone`, with variables of its own (`nnx.merge` would share
  them between the tests that change them)."""
  if key not in _BUILT_MODELS:
    _BUILT_MODELS[key] = build()
  return nnx.clone(_BUILT_MODELS[key])
