"""relpos.attention.autotune on a CPU: tuning forced on, with injected timers.

Each test installs a fresh tuner (`autotune.tuning`) whose timer returns set times per
candidate, so the mechanism (choice among 'xla' and the Pallas tilings, caches, log line,
agreement, use by the kernels under jit, grad and scan, the tiles reaching the Pallas kernel)
is checked without timing anything real; one test runs the real timer. Shapes are tiny: the
'pallas' candidates run interpreted here.
"""

import dataclasses
import importlib
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from helpers import REPO, TINY_CHAR_LM_FLAGS

from relpos import runtime
from relpos.attention import autotune, implementations, shaw_attention, xl_attention
from relpos.attention.implementations import parse_choice, tiles_name
from relpos.attention.shaw import xla_form
from relpos.config import load_config_file
from relpos.tools import pretune

B, Q, K, H, D = 2, 8, 12, 2, 16  # batch, q_len, kv_len, heads, head_dim

# Most XLA optimisations off: compiling dominates these tests (conftest).
pytestmark = pytest.mark.usefixtures('attention_test_config')


def _signature(**changes):
  fields = dict(
    kernel='xl',
    batch=B,
    q_len=Q,
    kv_len=K,
    heads=H,
    head_dim=D,
    dtype='float32',
    mask=None,
    max_distance=None,
    tables='',
    dropout=0.0,
  )
  return autotune.Signature(**(fields | changes))


def _times(xla_ms, pallas_ms, calls=None, run=False, tiles_ms=None):
  """A timer returning the given ms per candidate ('pallas@QxK' ones from the dict
  `tiles_ms`), recording each name in `calls` and running the candidate once when `run`."""
  table = {'xla': xla_ms, 'pallas': pallas_ms} | (tiles_ms or {})

  def timer(name, fn):
    if calls is not None:
      calls.append(name)
    if run:
      jax.block_until_ready(fn())
    return table[name] * 1e-3

  return timer


def _tiny_translate_config():
  """translate_tiny (Shaw) shrunk to one 2-head layer a side, 64 tokens a batch, 40 pieces."""
  config = load_config_file(Path(__file__).parent.parent / 'configs/translate_tiny.py', 'shaw')
  config.data.max_tokens, config.data.vocab_size = 64, 40
  config.model.update(encoder_layers=1, decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
  return config


def _unused():
  raise AssertionError('a candidate was run although the decision was cached')


NO_RUN = {'xla': _unused, 'pallas': _unused}


def _failing_timer(name, fn):
  raise AssertionError(f'{name} timed although the decision was cached')


@pytest.mark.parametrize(
  ('xla_ms', 'pallas_ms', 'want'),
  [(2.0, 1.0, 'pallas'), (1.0, 2.0, 'xla'), (1.0, 0.99, 'xla'), (1.0, 0.97, 'pallas')],
)
def test_faster_candidate_wins_and_one_line_names_it_and_both_times(
  xla_ms, pallas_ms, want, caplog
):
  """The faster wins by the injected times; 'pallas' must win by more than TIE_MARGIN (2%):
  a tie goes to 'xla'. One info line names signature, choice and both times."""
  with autotune.tuning(timer=_times(xla_ms, pallas_ms)) as tuner:
    with caplog.at_level(logging.INFO, logger='absl'):
      assert tuner.choose(_signature(), NO_RUN) == want
  lines = [r.getMessage() for r in caplog.records if 'relpos autotune' in r.getMessage()]
  assert lines == [
    f'relpos autotune: {_signature().text()} -> {want} '
    f'(xla {xla_ms:.3f} ms, pallas {pallas_ms:.3f} ms)'
  ]


def test_cache_file_is_written_and_read_by_a_fresh_tuner_without_timing(tmp_path):
  path = tmp_path / 'autotune.json'
  calls = []
  with autotune.tuning(timer=_times(3.0, 1.5, calls), cache_path=path) as tuner:
    assert tuner.choose(_signature(), NO_RUN) == 'pallas'
    assert tuner.choose(_signature(), NO_RUN) == 'pallas'  # memory: not timed again
  assert calls == ['xla', 'pallas']
  entries = json.loads(path.read_text())
  key = autotune.cache_key(_signature())
  assert entries == {key: {'choice': 'pallas', 'ms': {'xla': 3.0, 'pallas': 1.5}}}
  assert jax.devices()[0].device_kind in key and f'jax {jax.__version__}' in key
  # Another XLA_FLAGS (relpos.runtime's GPU flags on or off) is another entry.
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('XLA_FLAGS', '--xla_gpu_dot_merger_threshold_mb=0')
    assert autotune.cache_key(_signature()) != key
  with autotune.tuning(timer=_failing_timer, cache_path=path) as fresh:
    assert fresh.choose(_signature(), NO_RUN) == 'pallas'
  assert [d.source for d in fresh.decisions] == ['disk']


def test_distinct_signatures_get_distinct_entries(tmp_path):
  path = tmp_path / 'autotune.json'
  calls = []
  signatures = [
    _signature(),
    _signature(kv_len=K + 1),
    _signature(dtype='bfloat16'),
    _signature(mask=(1, 1, Q, K)),
    _signature(dropout=0.1),
    _signature(kernel='shaw', max_distance=2, tables='kv', xla_form='dense'),
    _signature(kernel='shaw', max_distance=2, tables='k', xla_form='dense'),
    _signature(kernel='shaw', max_distance=2, tables='k', xla_form='banded'),
    _signature(kernel='shaw', max_distance=2, tables='k', causal=True, xla_form='dense'),
  ]
  assert signatures[-1].text().endswith('k=2 k causal xla=dense dropout=0 fwd+bwd')
  with autotune.tuning(timer=_times(1.0, 2.0, calls), cache_path=path) as tuner:
    for signature in signatures + signatures:
      tuner.choose(signature, NO_RUN)
  assert len(calls) == 2 * len(signatures)  # each timed once
  assert len(json.loads(path.read_text())) == len(signatures)
  assert len({s.text() for s in signatures}) == len(signatures)


@pytest.mark.parametrize('causal', [False, True])
def test_a_causal_shaw_signature_times_causal_candidates(causal):
  """The candidates of a Shaw signature recorded causal are called with causal=True (and the
  others without it, which XL's kernel does not take)."""
  seen = []

  def spy(*args, **kwargs):
    seen.append(kwargs.get('causal', False))
    return args[0]

  signature = _signature(kernel='shaw', max_distance=2, tables='kv', causal=causal)
  candidates = autotune.timed_candidates(spy, signature)
  jax.block_until_ready(candidates['xla']())
  assert seen == [causal]


@pytest.mark.parametrize(
  'content', ['{not json', '[1, 2]', '{"k": {"choice": 3}}', '{"k": {"choice": "xla"}}', '{"k": 1}']
)
def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, capsys, content):
  path = tmp_path / 'autotune.json'
  path.write_text(content)
  with autotune.tuning(timer=_times(1.0, 2.0), cache_path=path) as tuner:
    assert tuner.choose(_signature(), NO_RUN) == 'xla'
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 1 and warnings[0].startswith('warning: ignoring '), warnings
  assert f'the autotune cache {path}' in warnings[0]
  assert list(json.loads(path.read_text()).values()) == [
    {'choice': 'xla', 'ms': {'xla': 1.0, 'pallas': 2.0}}
  ]


def test_a_malformed_entry_is_timed_again_with_one_warning_naming_the_file(tmp_path, capsys):
  """An entry whose 'ms' held a string (valid JSON) was read as it was: pretune's table then
  failed with 'error: Unknown format code 'f' for object of type 'str'', naming no file. Now
  that entry is ignored (its signature timed again), the others kept, and the one warning is
  said once however often the cache is read."""
  signature, other = _signature(), _signature(q_len=2 * Q)
  path = tmp_path / 'autotune.json'
  kept = {'choice': 'pallas', 'ms': {'xla': 2.0, 'pallas': 1.0}}
  path.write_text(
    json.dumps(
      {
        autotune.cache_key(signature): {'choice': 'xla', 'ms': {'xla': '1.0', 'pallas': 2.0}},
        autotune.cache_key(other): kept,
      }
    )
  )
  calls = []
  with autotune.tuning(timer=_times(1.0, 2.0, calls), cache_path=path) as tuner:
    assert tuner.choose(signature, NO_RUN) == 'xla'
    assert tuner.choose(other, NO_RUN) == 'pallas'
  assert calls == ['xla', 'pallas'], 'the malformed entry was not timed again'
  assert [d.ms for d in tuner.decisions] == [{'xla': 1.0, 'pallas': 2.0}, kept['ms']]
  assert capsys.readouterr().err.splitlines() == [
    f'warning: ignoring 1 of the 2 entries of the autotune cache {path}, not of the form '
    '{"choice": name, "ms": {name: milliseconds or null}}: their attention calls are timed '
    'again and the file is rewritten'
  ]
  assert json.loads(path.read_text())[autotune.cache_key(signature)]['ms'] == {
    'xla': 1.0,
    'pallas': 2.0,
  }


def test_an_unwritable_cache_is_one_warning_and_leaves_no_temporary_file(tmp_path, capsys):
  """A directory where the cache file goes: before, an absl log line at every read and write,
  and `<path>.<pid>.tmp` left beside it."""
  path = tmp_path / 'autotune.json'
  path.mkdir()
  with autotune.tuning(timer=_times(2.0, 1.0), cache_path=path) as tuner:
    assert tuner.choose(_signature(), NO_RUN) == 'pallas'
    assert tuner.choose(_signature(q_len=2 * Q), NO_RUN) == 'pallas'
  warnings = capsys.readouterr().err.splitlines()
  assert [w.split(' (')[0] for w in warnings] == [
    f'warning: ignoring the autotune cache {path}, which cannot be read',
    f'warning: cannot write the autotune cache {path}',
  ], warnings
  assert warnings[1].endswith(
    'its choices are timed again in the next run; set RELPOS_AUTOTUNE_CACHE to a file path '
    'that can be written, or to off'
  )
  assert sorted(p.name for p in tmp_path.iterdir()) == ['autotune.json']


def test_a_failing_candidate_is_never_chosen(tmp_path, caplog):
  def timer(name, fn):
    if name == 'pallas':
      raise RuntimeError('out of shared memory')
    return 1.0

  path = tmp_path / 'autotune.json'
  with autotune.tuning(timer=timer, cache_path=path) as tuner:
    with caplog.at_level(logging.WARNING, logger='absl'):
      assert tuner.choose(_signature(), NO_RUN) == 'xla'
  assert tuner.decisions[0].ms == {'xla': 1000.0, 'pallas': None}
  assert not path.exists()  # kept in memory only: the next run tries again
  assert any('pallas failed' in r.getMessage() for r in caplog.records)


def test_processes_use_the_agreed_choice_and_only_process_0_times(tmp_path, monkeypatch):
  """The broadcast's answer wins over the local timing; a process other than 0 neither times
  nor writes the cache and still calls the broadcast once per new signature."""
  agreed = []

  def agree(choice, names):
    agreed.append((choice, names))
    return 'xla'

  with autotune.tuning(timer=_times(2.0, 1.0), agree=agree) as tuner:
    assert tuner.choose(_signature(), NO_RUN) == 'xla'
  assert agreed == [('pallas', ('xla', 'pallas'))]
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  path = tmp_path / 'autotune.json'
  agree_pallas = lambda choice, names: 'pallas'  # noqa: E731
  with autotune.tuning(timer=_failing_timer, cache_path=path, agree=agree_pallas) as tuner:
    assert tuner.choose(_signature(), NO_RUN) == 'pallas'
    assert tuner.choose(_signature(), NO_RUN) == 'pallas'
  assert [d.source for d in tuner.decisions] == ['process 0'] and not path.exists()


def test_auto_is_xla_without_timing_on_a_cpu_and_tuned_on_a_gpu(monkeypatch):
  with autotune.tuning(timer=_failing_timer, force=False) as tuner:
    assert autotune.choose(_signature, _unused) == 'xla'
    monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
    assert tuner.enabled()
    monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
    assert not tuner.enabled()


def test_timed_batch_is_a_devices_share(monkeypatch):
  assert autotune.timed_batch(4) == 4  # one CPU device in tests
  monkeypatch.setattr(jax, 'device_count', lambda: 2)
  assert (autotune.timed_batch(4), autotune.timed_batch(3)) == (2, 3)
  seen = []
  mesh = jax.make_mesh((1,), ('data',))

  def body(x):
    seen.append(autotune.timed_batch(x.shape[0]))
    return x

  spec = jax.sharding.PartitionSpec('data')
  jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))(
    jax.device_put(jnp.zeros(4), jax.NamedSharding(mesh, spec))
  )
  assert seen == [4]  # shard_map's shapes are a device's already


def test_timed_mask_is_causal_where_it_has_a_query_axis():
  causal = autotune.dummy_mask(_signature(mask=(1, 1, 2, 4)))
  assert isinstance(causal, np.ndarray) and causal.dtype == bool and causal.shape == (1, 1, 2, 4)
  np.testing.assert_array_equal(causal[0, 0], [[1, 1, 1, 0], [1, 1, 1, 1]])
  keys_only = autotune.dummy_mask(_signature(mask=(2, 1, 1, 4)))
  assert keys_only.dtype == bool and keys_only.shape == (2, 1, 1, 4) and keys_only.all()
  assert autotune.dummy_mask(_signature()) is None


def _shaw_inputs(rng, q_len=Q, kv_len=K):
  shapes = [(B, q_len, H, D)] + [(B, kv_len, H, D)] * 2
  q, k, v = (rng.standard_normal(s, np.float32) for s in shapes)
  tables = rng.standard_normal((2, 5, D), np.float32)
  return q, k, v, tables[0], tables[1]


def _xl_inputs(rng, q_len=Q, kv_len=K):
  shapes = [(B, q_len, H, D)] + [(B, kv_len, H, D)] * 2
  q, k, v = (rng.standard_normal(s, np.float32) for s in shapes)
  rel = rng.standard_normal((kv_len, H, D), np.float32)
  u, w = rng.standard_normal((2, H, D), np.float32)
  return q, k, v, rel, u, w


def _spy_on_pallas(name, monkeypatch) -> list:
  """Replaces `name`'s ('shaw' or 'xl') Pallas kernel with a spy that records each call's
  block_sizes in the returned list and computes with XLA's kernel (an interpreted Pallas
  compile takes a minute on this CPU)."""
  attend = {'shaw': shaw_attention, 'xl': xl_attention}[name]
  calls = []

  def spy(*args, block_sizes=None, **kwargs):
    calls.append(block_sizes)
    return attend(*args, implementation='xla', **kwargs)

  monkeypatch.setattr(
    importlib.import_module(f'relpos.attention.{name}'), f'{name}_attention_pallas', spy
  )
  return calls


@pytest.mark.parametrize('name', ['shaw', 'xl'])
def test_kernels_use_the_choice_under_jit_of_grad(name, monkeypatch):
  """'auto' resolved inside jax.jit(jax.grad(...)) at the call's shapes (with a mask): the
  'xla' candidate's fwd+bwd runs there (outside the trace), the injected times decide, and the
  kernel takes the chosen branch. A spy stands in for the Pallas kernel (it records the call and
  computes with XLA's kernel: an interpreted Pallas compile takes a minute on this CPU)."""
  attend = {'shaw': shaw_attention, 'xl': xl_attention}[name]
  inputs = {'shaw': _shaw_inputs, 'xl': _xl_inputs}[name](np.random.default_rng(0))
  pallas_calls = _spy_on_pallas(name, monkeypatch)
  mask = np.tril(np.ones((Q, K), bool), K - Q)

  def grads(implementation):
    def loss(inputs):
      return jnp.sum(attend(*inputs, mask=mask, implementation=implementation) ** 2)

    return jax.jit(jax.grad(loss))(inputs)

  calls = []

  def timer(name, run):  # runs the 'xla' candidate once, inside the caller's trace
    calls.append(name)
    if name == 'xla':
      assert all(g is None or np.isfinite(g).all() for g in jax.block_until_ready(run())[0])
    return {'xla': 2e-3, 'pallas': 1e-3}[name]

  with autotune.tuning(timer=timer) as tuner:
    auto = grads('auto')
  assert calls == ['xla', 'pallas'] and pallas_calls == [None]
  (decision,) = tuner.decisions
  want_tables = 'k=2 kv xla=dense ' if name == 'shaw' else ''
  assert decision.signature.text() == (
    f'{name} B={B} Q={Q} K={K} H={H} D={D} float32 mask=1x1x{Q}x{K} {want_tables}dropout=0 fwd+bwd'
  )
  for got, want in zip(auto, grads('xla'), strict=True):
    np.testing.assert_array_equal(got, want)
  with autotune.tuning(timer=_times(1.0, 2.0)):
    grads('auto')
  assert pallas_calls == [None]  # 'xla' chosen: the Pallas kernel is not called


def test_auto_resolves_once_inside_a_scan_over_layers():
  """Two layers under lax.scan in jit(grad): one signature, timed once, and 'xla' chosen."""
  q, k, v, rel, u, w = _xl_inputs(np.random.default_rng(2))

  def loss(q):
    def layer(x, _):
      return xl_attention(x, k, v, rel, u, w), None

    return jnp.sum(jax.lax.scan(layer, q, None, length=2)[0])

  calls = []
  with autotune.tuning(timer=_times(1.0, 3.0, calls)) as tuner:
    auto = jax.jit(jax.grad(loss))(q)
  assert calls == ['xla', 'pallas'] and [d.choice for d in tuner.decisions] == ['xla']
  with autotune.tuning(force=False):
    np.testing.assert_array_equal(auto, jax.jit(jax.grad(loss))(q))


@pytest.mark.parametrize('name', ['shaw', 'xl'])
def test_a_call_inside_forward_only_is_tuned_as_a_forward_pass_apart_from_training(name):
  """`forward_only()` around a traced eval call: its signature ends in 'fwd', and its
  candidates run the forward alone (the 'xla' candidate returns the attention output, not
  gradients); the same shapes under jit(grad) are another signature, 'fwd+bwd', tuned apart,
  so the two passes may choose differently."""
  attend = {'shaw': shaw_attention, 'xl': xl_attention}[name]
  inputs = {'shaw': _shaw_inputs, 'xl': _xl_inputs}[name](np.random.default_rng(5))
  outputs = []

  def timer(candidate, run):
    if candidate == 'xla':
      outputs.append(jax.block_until_ready(run()))
    return {'xla': 1e-3, 'pallas': 2e-3}[candidate]

  @jax.jit
  def evaluate(inputs):
    with autotune.forward_only():
      return attend(*inputs)

  def train(inputs):
    return jax.jit(jax.grad(lambda x: jnp.sum(attend(*x) ** 2)))(inputs)

  with autotune.tuning(timer=timer) as tuner:
    evaluate(inputs)
    train(inputs)
    evaluate(inputs)  # the forward's decision from memory
  forward, training = (d.signature for d in tuner.decisions)
  assert forward.text().endswith(' fwd') and training.text().endswith(' fwd+bwd')
  assert forward == dataclasses.replace(training, backward=False)
  assert autotune.cache_key(forward) != autotune.cache_key(training)
  assert [o.shape for o in outputs[:1]] == [(B, Q, H, D)]  # the forward alone
  assert isinstance(outputs[1], tuple)  # the training candidate: gradients of every input
  assert not autotune._FORWARD_ONLY  # the block closed


def test_eval_and_decoding_steps_tune_forward_passes_and_the_train_step_fwd_bwd():
  """The library's eval code enters `forward_only()`: the char LM's bits per char (with its
  memory) and translation's eval loss and beam search tune 'fwd' signatures, while their
  train steps tune 'fwd+bwd' (char_tiny and translate_tiny, shrunk)."""
  from flax import nnx

  from relpos.data.token_batches import TokenBatches
  from relpos.training import char_lm_task, translation_task

  root = Path(__file__).parent.parent
  config = load_config_file(root / 'configs/char_tiny.py')
  config.model.num_layers = 1
  with autotune.tuning(timer=_times(1.0, 2.0)) as tuner:
    pretune.trace_train_step(config)
    model = char_lm_task.TransformerXL(char_lm_task.model_config(config, 256), rngs=nnx.Rngs(0))
    tokens = np.arange(3 * config.eval.tgt_len * 2 + 1, dtype=np.int32) % 256
    batches = char_lm_task.OrderedBatches(tokens, 2, config.eval.tgt_len)
    char_lm_task.bits_per_char(model, batches, config.eval, max_segments=2)
  passes = [d.signature.text().rsplit(' ', 1)[1] for d in tuner.decisions]
  assert passes[0] == 'fwd+bwd' and set(passes[1:]) == {'fwd'} and len(passes) >= 2

  config = _tiny_translate_config()
  with autotune.tuning(timer=_times(1.0, 2.0)) as tuner:
    pretune.trace_train_step(config, [8])
    model = translation_task.Transformer(
      translation_task.model_config(config, 40), rngs=nnx.Rngs(0)
    )
    pairs = [([5, 6, 7], [8, 9]), ([5, 6], [7, 8, 9, 10])]
    batches = TokenBatches(pairs, max_length=7, rows=2, boundaries=[8])
    translation_task.eval_loss(model, batches)
    translate = translation_task.make_translator(model, config.eval, max_len=8)
    translate(np.array([[5, 6, 7, 2]], np.int32))
  passes = [d.signature.text().rsplit(' ', 1)[1] for d in tuner.decisions]
  assert passes[:2] == ['fwd+bwd', 'fwd+bwd'] and set(passes[2:]) == {'fwd'}
  assert len(passes) > 2


# ------------------------------------------------------------------------------------------
# Pallas tilings as candidates.

TQ = TK = 64  # lengths at which both kernels have tilings besides the default


@pytest.fixture
def tilings(monkeypatch):
  """The extra tilings timed too (RELPOS_AUTOTUNE_TILINGS=1; by default only the default's)."""
  monkeypatch.setenv(autotune.TILINGS_OPT_IN, '1')


def test_candidates_are_xla_and_pallas_at_the_tilings_that_fit(monkeypatch):
  """'xla' and the default tiles ('pallas'); with RELPOS_AUTOTUNE_TILINGS=1 then each of
  TILINGS that fits the padded lengths and is not the default's tiles; with given tiles, 'xla'
  and those."""
  names = autotune.candidate_names
  enwik8 = dict(batch=22, q_len=512, kv_len=1024, heads=8, head_dim=64)
  shaw = dict(kernel='shaw', max_distance=16, tables='kv')
  assert names(_signature(**enwik8, **shaw)) == names(_signature(**enwik8)) == ('xla', 'pallas')
  monkeypatch.setenv(autotune.TILINGS_OPT_IN, '1')
  assert names(_signature(**enwik8, **shaw)) == ('xla', 'pallas', 'pallas@128x64', 'pallas@32x32')
  assert names(_signature(**enwik8)) == ('xla', 'pallas', 'pallas@32x64', 'pallas@64x32')
  # Shaw at 64: 128x64 is longer than the queries; at 33 (padded 64) 32x32 stays.
  assert names(_signature(q_len=64, kv_len=64, **shaw)) == ('xla', 'pallas', 'pallas@32x32')
  assert names(_signature(q_len=33, kv_len=33, **shaw)) == ('xla', 'pallas', 'pallas@32x32')
  # Shaw at 32: its default is 32x32 already. XL at 32 queries over 64 keys: no 64x32.
  assert names(_signature(q_len=32, kv_len=32, **shaw)) == ('xla', 'pallas')
  assert names(_signature(q_len=32, kv_len=64)) == ('xla', 'pallas', 'pallas@32x64')
  assert names(_signature()) == ('xla', 'pallas')  # Q=8, K=12: the default 16x16 only
  given = _signature(**enwik8, tiles=(16, 32))
  assert names(given) == ('xla', 'pallas@16x32')
  assert given.text().endswith('dropout=0 tiles=16x32 fwd+bwd')
  assert len({given.text(), _signature(**enwik8).text()}) == 2


def test_candidate_names_parse_back_to_implementation_and_tiles():
  assert parse_choice('xla') == ('xla', None)
  assert parse_choice('pallas') == ('pallas', None)
  assert parse_choice('pallas@128x64') == ('pallas', (128, 64))
  assert parse_choice('cudnn') == ('cudnn', None)
  bad = ['flash', 'cudnn@64x64', 'xla@64x64', 'pallas@64', 'pallas@64x', 'pallas@0x64']
  for name in [*bad, 'pallas@064x64']:
    with pytest.raises(ValueError, match='pallas@QxK'):
      parse_choice(name)


def test_one_table_says_what_each_implementation_serves():
  """`implementations.serves`, which 'auto''s 'cudnn' candidate and 'mosaic''s dispatch read:
  cuDNN is XL's only; both 16-bit kernels take bf16/fp16 and no dropout; the others anything."""
  assert implementations.serves('cudnn', 'xl', 'bfloat16', 0.0)
  assert not implementations.serves('cudnn', 'shaw', 'bfloat16', 0.0)
  assert implementations.serves('mosaic', 'shaw', 'float16', 0.0)
  for implementation in implementations.HALF_PRECISION:
    assert not implementations.serves(implementation, 'xl', 'float32', 0.0)
    assert not implementations.serves(implementation, 'xl', 'bfloat16', 0.1)
  assert implementations.serves('pallas', 'shaw', 'float32', 0.1)


FOUR = {name: _unused for name in ('xla', 'pallas', 'pallas@128x64', 'pallas@32x32')}


@pytest.mark.parametrize(
  ('times', 'want'),
  [
    ((1.0, 0.99, 0.99, 0.99), 'xla'),  # every variant within the margin: a tie
    ((1.0, 1.5, 0.99, 1.2), 'xla'),
    ((1.0, 0.99, 0.97, 0.99), 'pallas@128x64'),
    ((1.0, 0.97, 0.969, 2.0), 'pallas@128x64'),  # between variants the fastest, by any margin
    ((1.0, 0.9, 0.9, 0.9), 'pallas'),  # an exact tie: the earlier listed, the default tiles
    ((1.0, 2.0, 3.0, 0.5), 'pallas@32x32'),
  ],
)
def test_xla_wins_ties_against_every_pallas_variant_and_the_fastest_variant_wins(
  times, want, caplog
):
  """A Pallas variant must beat 'xla' by more than TIE_MARGIN; among the variants the fastest
  wins. The one log line names the choice and every candidate's time."""
  tiles_ms = dict(zip(['pallas@128x64', 'pallas@32x32'], times[2:], strict=True))
  timer = _times(*times[:2], tiles_ms=tiles_ms)
  with autotune.tuning(timer=timer) as tuner, caplog.at_level(logging.INFO, logger='absl'):
    assert tuner.choose(_signature(), FOUR) == want
  ms = ', '.join(f'{name} {t:.3f} ms' for name, t in zip(FOUR, times, strict=True))
  lines = [r.getMessage() for r in caplog.records if 'relpos autotune' in r.getMessage()]
  assert lines == [f'relpos autotune: {_signature().text()} -> {want} ({ms})']


def _pallas_grids(jaxpr) -> set:
  """The grids of every pallas_call in `jaxpr` and the jaxprs inside it."""
  grids = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'pallas_call':
      grids.add(tuple(eqn.params['grid_mapping'].grid))
    for value in eqn.params.values():
      for sub in value if isinstance(value, tuple | list) else (value,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          grids |= _pallas_grids(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          grids |= _pallas_grids(sub)
  return grids


@pytest.mark.usefixtures('tilings')
@pytest.mark.parametrize(('name', 'tiles'), [('shaw', (32, 32)), ('xl', (64, 32))])
def test_a_winning_tiling_reaches_the_pallas_kernel_with_its_block_sizes(name, tiles):
  """'auto' resolved to 'pallas@QxK' traces the Pallas kernels (forward and backward) with
  exactly the grids of `implementation='pallas', block_sizes=(Q, K)`, not the default's."""
  attend = {'shaw': shaw_attention, 'xl': xl_attention}[name]
  inputs = {'shaw': _shaw_inputs, 'xl': _xl_inputs}[name](np.random.default_rng(5), TQ, TK)

  def grids(**kwargs):
    loss = lambda x: jnp.sum(attend(*x, **kwargs))  # noqa: E731
    return _pallas_grids(jax.make_jaxpr(jax.grad(loss))(inputs).jaxpr)

  winner = tiles_name(tiles)
  calls = []
  tiles_ms = {'pallas@128x64': 1.8, 'pallas@32x32': 1.9, 'pallas@32x64': 1.7} | {winner: 1.0}
  with autotune.tuning(timer=_times(2.0, 1.5, calls, tiles_ms=tiles_ms)) as tuner:
    auto = grids(implementation='auto')
  assert [d.choice for d in tuner.decisions] == [winner]
  assert calls == list(autotune.candidate_names(tuner.decisions[0].signature))
  assert auto == grids(implementation='pallas', block_sizes=tiles)
  assert auto != grids(implementation='pallas')
  assert grids(implementation='xla') == set()


@pytest.mark.usefixtures('tilings')
@pytest.mark.parametrize('name', ['shaw', 'xl'])
@pytest.mark.parametrize('given', [None, (16, 32)])
def test_the_kernel_is_called_with_the_tuned_or_given_tiles_under_jit_of_grad(
  name, given, monkeypatch
):
  """Under jit(grad), 'auto' calls the Pallas kernel (a spy computing with XLA's kernel) with
  the winning tiling's block_sizes; a caller's block_sizes are kept, only 'xla' against
  'pallas' at them is tuned."""
  attend = {'shaw': shaw_attention, 'xl': xl_attention}[name]
  inputs = {'shaw': _shaw_inputs, 'xl': _xl_inputs}[name](np.random.default_rng(6), TQ, TK)
  pallas_calls = _spy_on_pallas(name, monkeypatch)
  loss = lambda x: jnp.sum(attend(*x, block_sizes=given) ** 2)  # noqa: E731
  calls = []
  tiles_ms = {'pallas@32x32': 1.0, 'pallas@32x64': 1.2, 'pallas@64x32': 1.1, 'pallas@16x32': 1.0}
  with autotune.tuning(timer=_times(2.0, 1.5, calls, tiles_ms=tiles_ms)) as tuner:
    jax.jit(jax.grad(loss))(inputs)
  (decision,) = tuner.decisions
  assert calls == list(autotune.candidate_names(decision.signature))
  if given is not None:
    assert calls == ['xla', 'pallas@16x32']
  want = given or {'shaw': (32, 32), 'xl': (64, 32)}[name]
  assert decision.choice == tiles_name(want) and pallas_calls == [want]


def _old_or_odd_cache(tmp_path, signature, choice):
  path = tmp_path / 'autotune.json'
  entry = {'choice': choice, 'ms': {'xla': 2.0, 'pallas': 1.0}}  # written before tilings
  path.write_text(json.dumps({autotune.cache_key(signature): entry}))
  return path


def test_an_old_cache_entry_pallas_means_the_default_tiles(tmp_path, monkeypatch):
  """A cache written when the candidates were 'xla' and 'pallas' still decides: 'pallas' is the
  Pallas kernel at its default tiles (block_sizes None), and nothing is timed."""
  q, k, v, rel_key, rel_value = _shaw_inputs(np.random.default_rng(7), TQ, TK)
  signature = autotune.shaw_signature(q, k, rel_key, rel_value, None, 0.0, xla_form=xla_form(TK))
  path = _old_or_odd_cache(tmp_path, signature, 'pallas')
  pallas_calls = _spy_on_pallas('shaw', monkeypatch)
  with autotune.tuning(timer=_failing_timer, cache_path=path) as tuner:
    jax.jit(shaw_attention)(q, k, v, rel_key, rel_value)
  assert [(d.choice, d.source) for d in tuner.decisions] == [('pallas', 'disk')]
  assert pallas_calls == [None]


@pytest.mark.usefixtures('tilings')
@pytest.mark.parametrize('choice', ['cudnn', 'pallas@256x256', 'pallas@16x32'])
def test_a_cached_choice_that_is_not_a_candidate_is_ignored_and_timed_again(
  tmp_path, capsys, choice
):
  """An entry naming no candidate of its signature (an unknown name, a tiling not timed at
  these shapes) is ignored with a warning, timed again and overwritten."""
  signature = _signature(kernel='shaw', max_distance=2, tables='kv', q_len=TQ, kv_len=TK)
  path = _old_or_odd_cache(tmp_path, signature, choice)
  candidates = {name: _unused for name in autotune.candidate_names(signature)}
  calls = []
  timer = _times(2.0, 1.5, calls, tiles_ms={'pallas@32x32': 1.0})
  with autotune.tuning(timer=timer, cache_path=path) as tuner:
    assert tuner.choose(signature, candidates) == 'pallas@32x32'
  assert calls == ['xla', 'pallas', 'pallas@32x32']
  assert f'warning: ignoring the choice {choice!r} the autotune cache {path}' in (
    capsys.readouterr().err
  )
  assert json.loads(path.read_text())[autotune.cache_key(signature)]['choice'] == 'pallas@32x32'


def test_a_failing_extra_tiling_is_written_as_failed(tmp_path, caplog):
  """A tiling over the shared memory fails the same way every time: the decision is written,
  with None for it, and a fresh tuner reads it without timing."""

  def timer(name, fn):
    if name == 'pallas@128x64':
      raise RuntimeError('out of shared memory')
    return {'xla': 2.0, 'pallas': 1.5, 'pallas@32x32': 1.0}[name] * 1e-3

  path = tmp_path / 'autotune.json'
  with autotune.tuning(timer=timer, cache_path=path) as tuner:
    with caplog.at_level(logging.WARNING, logger='absl'):
      assert tuner.choose(_signature(), FOUR) == 'pallas@32x32'
  assert any('pallas@128x64 failed' in r.getMessage() for r in caplog.records)
  ms = {'xla': 2.0, 'pallas': 1.5, 'pallas@128x64': None, 'pallas@32x32': 1.0}
  assert tuner.decisions[0].ms == ms
  assert json.loads(path.read_text()) == {
    autotune.cache_key(_signature()): {'choice': 'pallas@32x32', 'ms': ms}
  }
  with autotune.tuning(timer=_failing_timer, cache_path=path) as fresh:
    assert fresh.choose(_signature(), FOUR) == 'pallas@32x32'


def test_processes_agree_on_an_index_into_the_signatures_candidates(monkeypatch):
  """With several processes the choice travels as its index in the candidate list (not in a
  fixed list of names), and comes back as the name at process 0's index."""
  from jax.experimental import multihost_utils

  sent = []

  def broadcast(value):
    sent.append(int(value))
    return np.int32(1)  # process 0's index

  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(multihost_utils, 'broadcast_one_to_all', broadcast)
  names = tuple(FOUR)
  assert autotune.agree_across_processes('pallas@32x32', names) == 'pallas'
  assert autotune.agree_across_processes('xla', ('xla', 'pallas@16x32')) == 'pallas@16x32'
  assert sent == [3, 0]


def test_decision_table_shows_the_variants():
  """A column per Pallas variant any decision timed; blank where it was not a candidate,
  'failed' where it failed."""
  shaw = _signature(kernel='shaw', max_distance=2, tables='kv')
  decisions = [
    autotune.Decision(
      shaw,
      'pallas@128x64',
      {'xla': 2.0, 'pallas': 1.5, 'pallas@128x64': 1.0, 'pallas@32x32': None},
      'timed',
    ),
    autotune.Decision(
      _signature(), 'xla', {'xla': 1.0, 'pallas': 3.0, 'pallas@32x64': 2.5}, 'disk'
    ),
    autotune.Decision(_signature(q_len=4), 'pallas@32x64', {}, 'process 0'),
  ]
  assert pretune.decision_table(decisions) == [
    '| call | xla ms | pallas ms | pallas@128x64 ms | pallas@32x32 ms | pallas@32x64 ms | choice '
    '| source |',
    '|---|---|---|---|---|---|---|---|',
    f'| {shaw.text()} | 2.000 | 1.500 | 1.000 | failed |  | pallas@128x64 | timed |',
    f'| {_signature().text()} | 1.000 | 3.000 |  |  | 2.500 | xla | disk |',
    f'| {_signature(q_len=4).text()} |  |  |  |  |  | pallas@32x64 | process 0 |',
  ]


def test_measure_times_the_median_of_several_runs():
  runs = []
  seconds = autotune.measure('xla', lambda: runs.append(1) or jnp.zeros(()))
  assert 0.0 < seconds < 1.0 and len(runs) >= 3 + autotune.MIN_REPEATS


def test_cache_path_rules():
  path = runtime.autotune_cache_path
  assert path({'RELPOS_AUTOTUNE_CACHE': 'off'}, '/c') is None
  assert str(path({'RELPOS_AUTOTUNE_CACHE': '/x/t.json'}, '/c')) == '/x/t.json'
  assert str(path({}, '/c')) == '/c/relpos-autotune.json'
  home_cache = Path.home() / '.cache' / 'relpos' / 'autotune.json'
  assert path({}, 'gs://bucket/c') == path({}, None) == home_cache


@pytest.mark.parametrize('scan_layers', [False, True])
def test_pretuning_a_config_tunes_the_models_own_call_shapes(scan_layers):
  """`trace_train_step` lowers char_tiny's train step: the XL layers' one call shape (queries
  tgt_len, keys mem_len + tgt_len, the memory's one-row key mask) is tuned once, stacked or
  scanned."""
  config = load_config_file(Path(__file__).parent.parent / 'configs/char_tiny.py')
  config.model.scan_layers = scan_layers
  calls = []
  with autotune.tuning(timer=_times(1.0, 2.0, calls)) as tuner:
    pretune.trace_train_step(config)
  train, model = config.train, config.model
  (decision,) = tuner.decisions
  s = decision.signature
  assert (s.kernel, s.batch, s.q_len, s.kv_len) == (
    'xl',
    autotune.timed_batch(train.batch_size),
    train.tgt_len,
    train.mem_len + train.tgt_len,
  )
  assert (s.heads, s.head_dim, s.mask) == (
    model.num_heads,
    model.head_dim,
    (1, 1, 1, train.mem_len + train.tgt_len),  # keys only: XL adds the causal mask itself
  )
  assert calls == ['xla', 'pallas']  # the default tiles only (RELPOS_AUTOTUNE_TILINGS unset)
  table = pretune.decision_table(tuner.decisions)
  assert table[0] == '| call | xla ms | pallas ms | choice | source |'
  assert table[2] == f'| {s.text()} | 1.000 | 2.000 | xla | timed |'


def test_a_step_whose_calls_all_chose_one_kernel_is_the_step_naming_it():
  """`recorded_choices` lists what each traced 'auto' call resolved to. Where every call chose
  one name, the step is, text for text, the step with that name given: the premise on which
  the step benchmarks time such a variant once, as 'auto' (benchmarks/char_lm_step.py). (Both
  winners in one test, so that the untuned step, the same for both, is traced once.)"""
  config = load_config_file(Path(__file__).parent.parent / 'configs/char_tiny.py')
  config.model.num_layers = 2
  for winner in ('xla', 'pallas'):
    xla_ms, pallas_ms = (1.0, 2.0) if winner == 'xla' else (2.0, 1.0)
    config.model.attention_implementation = 'auto'
    with autotune.tuning(timer=_times(xla_ms, pallas_ms)):
      with autotune.recorded_choices() as choices:
        (auto,) = pretune.trace_train_step(config)
    assert choices == [winner] * config.model.num_layers  # one per layer; the second from memory
    config.model.attention_implementation = winner
    (named,) = pretune.trace_train_step(config)
    assert auto.as_text() == named.as_text(), winner
  with autotune.recorded_choices() as untuned:  # tuning off (a CPU): 'auto' is 'xla'
    config.model.attention_implementation = 'auto'
    pretune.trace_train_step(config)
  assert set(untuned) == {'xla'}


def test_timed_inputs_follow_the_signature():
  """Shaw keys-only in bf16 with dropout: bf16 q, k, v and w^K, no w^V, a dropout key, and
  the mask's batch axis at the timed batch."""
  signature = _signature(
    kernel='shaw', max_distance=2, tables='k', dtype='bfloat16', dropout=0.1, mask=(B, 1, 1, K)
  )
  floats, mask, dropout_rng, cotangent = autotune._dummy_inputs(signature)
  assert [None if f is None else (f.shape, f.dtype) for f in floats] == [
    ((B, Q, H, D), jnp.bfloat16),
    ((B, K, H, D), jnp.bfloat16),
    ((B, K, H, D), jnp.bfloat16),
    ((5, D), jnp.bfloat16),
    None,
  ]
  assert mask.shape == (B, 1, 1, K) and dropout_rng is not None
  assert cotangent.shape == (B, Q, H, D)
  query = jnp.zeros((4 * B, Q, H, D))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jax, 'device_count', lambda: 4)
    mask = np.ones((4 * B, 1, 1, Q))
    got = autotune.shaw_signature(query, query, query[0, 0], None, mask, 0.1, xla_form='dense')
  assert (got.batch, got.mask, got.tables) == (B, (B, 1, 1, Q), 'k')


def test_auto_line_compares_auto_with_the_faster_kernel():
  line = autotune.auto_line('xl', 0.0603, {'xla': 0.0597, 'pallas': 0.1194})
  assert line == (
    'auto check xl: auto 60.3 ms, xla 59.7 ms, pallas 119.4 ms; auto / faster 1.010 '
    '(within 3%: yes)'
  )
  assert autotune.auto_line('shaw', 0.06, {'xla': 0.05, 'pallas': 0.057}).endswith(
    '(within 3%: NO)'
  )


@pytest.mark.skipif(jax.default_backend() != 'gpu', reason="tunes only on a GPU ('auto' is 'xla')")
def test_native_auto_times_both_kernels_and_keeps_the_faster(tmp_path):
  """On a GPU, with the real timer: 'auto' inside jit(grad) times both kernels (Triton for
  'pallas') at each call's shapes, writes the decisions, and keeps the faster."""
  mask = np.tril(np.ones((Q, K), bool), K - Q)
  rng = np.random.default_rng(3)
  with autotune.tuning(cache_path=tmp_path / 'autotune.json', force=False) as tuner:
    for attend, inputs in ((shaw_attention, _shaw_inputs(rng)), (xl_attention, _xl_inputs(rng))):
      jax.jit(jax.grad(lambda x, attend=attend: jnp.sum(attend(*x, mask=mask) ** 2)))(inputs)
  assert [d.signature.kernel for d in tuner.decisions] == ['shaw', 'xl']
  for decision in tuner.decisions:
    ms = decision.ms
    assert tuple(ms) == autotune.candidate_names(decision.signature), decision
    assert None not in ms.values(), decision
    assert decision.choice == autotune.pick(ms)
  assert len(json.loads((tmp_path / 'autotune.json').read_text())) == 2


def test_pretuning_a_translation_config_tunes_encoder_and_decoder_shapes():
  """translate_tiny at one padded length: the encoder's self-attention (key padding mask) and
  the decoder's (key padding mask, causal) are two signatures; cross-attention is not
  Shaw's."""
  config = _tiny_translate_config()
  with autotune.tuning(timer=_times(1.0, 2.0)) as tuner:
    pretune.trace_train_step(config, [8])
  rows = autotune.timed_batch(8)
  signatures = [d.signature for d in tuner.decisions]
  assert [(s.q_len, s.kv_len, s.mask, s.causal) for s in signatures] == [
    (8, 8, (rows, 1, 1, 8), False),
    (8, 8, (rows, 1, 1, 8), True),
  ]


# ------------------------------------------------------------------------------------------
# Compiling a signature's candidates at once, before timing them.


class _Compiling:
  """A candidate that records its compile and its runs; its compile waits at `barrier` (so
  two of them finish compiling only if they compile at the same time) or fails."""

  def __init__(self, name, events, barrier=None, fail=False):
    self.name, self.events, self.barrier, self.fail = name, events, barrier, fail

  def compile(self):
    self.events.append(('compile', self.name))
    if self.fail:
      raise RuntimeError(f'{self.name} does not compile')
    self.barrier.wait()

  def __call__(self):
    self.events.append(('run', self.name))
    return jnp.zeros(())


def test_candidates_compile_at_once_then_are_timed_and_a_failed_compile_is_never_timed(caplog):
  """With compile_ahead (the default tuner's), every candidate with a compile() compiles in a
  thread of its own before any is timed: the two here pass their barrier only if their
  compiles overlap. One whose compile failed is logged, timed as failed and never run."""
  events, calls = [], []
  barrier = threading.Barrier(2, timeout=30)
  candidates = {
    'xla': _Compiling('xla', events, barrier),
    'pallas': _Compiling('pallas', events, barrier),
    'cudnn': _Compiling('cudnn', events, fail=True),
  }
  timer = _times(2.0, 1.0, calls, run=True)
  with autotune.tuning(timer=timer, compile_ahead=True) as tuner:
    with caplog.at_level(logging.WARNING, logger='absl'):
      assert tuner.choose(_signature(), candidates) == 'pallas'
  assert not barrier.broken
  assert sorted(events[:3]) == [('compile', 'cudnn'), ('compile', 'pallas'), ('compile', 'xla')]
  assert events[3:] == [('run', 'xla'), ('run', 'pallas')] and calls == ['xla', 'pallas']
  assert tuner.decisions[0].ms == {'xla': 2.0, 'pallas': 1.0, 'cudnn': None}
  assert any('cudnn failed' in r.getMessage() for r in caplog.records)


def test_a_real_candidate_compiled_ahead_gives_the_gradients_of_one_jitted_call():
  """`timed_candidates`' candidates compile ahead (`Candidate.compile`) and then run that
  executable: the same gradients as calling before compiling."""
  signature = _signature(kernel='shaw', max_distance=2, tables='kv')
  first = autotune.timed_candidates(shaw_attention, signature)['xla']
  ahead = autotune.timed_candidates(shaw_attention, signature)['xla']
  assert autotune.compile_concurrently({'xla': ahead}) == {}
  for got, want in zip(jax.tree.leaves(ahead()), jax.tree.leaves(first()), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_pretune_command_prints_the_device_the_cache_and_a_table(tmp_path):
  """`python -m relpos.tools.pretune --config=...` on a CPU: tuning is off, so 'auto' is 'xla'
  and the table is empty; the command's flags are its own (defined when it runs)."""
  env = {**os.environ, 'RELPOS_AUTOTUNE_CACHE': str(tmp_path / 'autotune.json')}
  command = [sys.executable, '-m', 'relpos.tools.pretune', '--config=configs/char_tiny.py']
  command += TINY_CHAR_LM_FLAGS  # what it prints does not depend on the model's size
  result = subprocess.run(
    command, capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False
  )
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert lines[0].startswith('device: ') and lines[1] == f'cache: {tmp_path / "autotune.json"}'
  assert "tuning is off on this backend: 'auto' is 'xla' here" in lines
  assert lines[-2:] == ['| call | xla ms | pallas ms | choice | source |', '|---|---|---|---|---|']


def test_pretune_names_a_cache_turned_off():
  assert pretune.cache_line(None) == 'cache: none (RELPOS_AUTOTUNE_CACHE=off: kept in memory)'
  assert pretune.cache_line(Path('/c/t.json')) == 'cache: /c/t.json'


def test_pretune_force_says_it_writes_the_machine_wide_cache():
  """`--force` on a CPU writes its timings to the cache every clone and run of the user reads,
  and its help did not say so."""
  registry = flags.FlagValues()
  pretune.define_flags(registry)
  help_text = registry['force'].help
  assert (
    '~/.cache/relpos/jax/relpos-autotune.json, machine-wide, shared by every clone' in help_text
  )
  assert runtime.default_cache_dir({}).parts[-3:] == ('.cache', 'relpos', 'jax')
  assert runtime.AUTOTUNE_CACHE_NAME == 'relpos-autotune.json'  # the path the help names
  owned = {flag.name for flag in registry.get_key_flags_for_module(pretune.__name__)}
  assert owned == {'config', 'lengths', 'force'}  # all in its --help


def test_pretuning_traces_the_evaluation_at_its_shapes_as_forward_passes():
  """`trace_eval_step`: the char LM's bits-per-char segment at config.eval's batch, tgt_len and
  mem_len, and translation's eval loss per padded length, tuned as forward passes ('fwd')."""
  root = Path(__file__).parent.parent
  config = load_config_file(root / 'configs/char_tiny.py')
  config.model.num_layers = 1
  with autotune.tuning(timer=_times(1.0, 2.0)) as tuner:
    pretune.trace_eval_step(config)
  (decision,) = tuner.decisions
  s, span = decision.signature, config.eval
  assert (s.batch, s.q_len, s.kv_len, s.backward) == (
    autotune.timed_batch(span.batch_size),
    span.tgt_len,
    span.mem_len + span.tgt_len,
    False,
  )
  config = _tiny_translate_config()
  with autotune.tuning(timer=_times(1.0, 2.0)) as tuner:
    pretune.trace_eval_step(config, [8])
  signatures = [d.signature for d in tuner.decisions]
  assert [(s.q_len, s.causal, s.backward) for s in signatures] == [
    (8, False, False),
    (8, True, False),
  ]


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (['--config=configs/translate_tiny.py', '--lengths=abc'], '--lengths=abc: give integers'),
    (['--config=configs/translate_tiny.py', '--lengths=0'], '--lengths=0: each must be at least 1'),
    (['--config=configs/char_tiny.py', '--config.model.position=bogus'], 'config.model.position'),
    (['--config=configs/char_tiny.py', '--config.train.batch_size=3'], 'a multiple of 2'),
    (['--config=configs/attention_benchmark.py'], "is no task's config"),
    (['--config=configs/char_tiny.py', '--config.model.postion=xl'], 'no field model.postion'),
    (['--config=configs/char_tiny.py', 'extra'], "unexpected arguments ['extra']"),
  ],
)
def test_pretune_command_line_errors_are_one_line(commands, args, message):
  """`python -m relpos.tools.pretune` with a bad flag, config or argument: one error line,
  exit 1, before anything is traced (`relpos.cli.run_main`)."""
  result = commands.run(['-m', 'relpos.tools.pretune', *args])
  said = [line for line in result.stderr.splitlines() if not line.startswith('relpos: CPU')]
  assert result.returncode == 1 and len(said) == 1, result.stderr
  assert said[0].startswith('error: ') and message in said[0], result.stderr
