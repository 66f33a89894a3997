"""relpos.attention.autotune on a CPU: tuning forced on, with injected timers.

Each test installs a fresh tuner (`autotune.tuning`) whose timer returns set times per
candidate, so the mechanism (choice, caches, log line, agreement, use by the kernels under
jit, grad and scan) is checked without timing anything real; one test runs the real timer.
Shapes are tiny: the 'pallas' candidate runs interpreted here.
"""

import importlib
import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos import runtime
from relpos.attention import autotune, shaw_attention, xl_attention
from relpos.config import load_config_file

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


def _times(xla_ms, pallas_ms, calls=None, run=False):
  """A timer returning the given ms per candidate, recording each name in `calls` and running
  the candidate once when `run`."""
  table = {'xla': xla_ms * 1e-3, 'pallas': pallas_ms * 1e-3}

  def timer(name, fn):
    if calls is not None:
      calls.append(name)
    if run:
      jax.block_until_ready(fn())
    return table[name]

  return timer


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
    _signature(kernel='shaw', max_distance=2, tables='kv'),
    _signature(kernel='shaw', max_distance=2, tables='k'),
  ]
  with autotune.tuning(timer=_times(1.0, 2.0, calls), cache_path=path) as tuner:
    for signature in signatures + signatures:
      tuner.choose(signature, NO_RUN)
  assert len(calls) == 2 * len(signatures)  # each timed once
  assert len(json.loads(path.read_text())) == len(signatures)
  assert len({s.text() for s in signatures}) == len(signatures)


@pytest.mark.parametrize('content', ['{not json', '[1, 2]', '{"k": {"choice": "cudnn"}}'])
def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content):
  path = tmp_path / 'autotune.json'
  path.write_text(content)
  with autotune.tuning(timer=_times(1.0, 2.0), cache_path=path) as tuner:
    with caplog.at_level(logging.WARNING, logger='absl'):
      assert tuner.choose(_signature(), NO_RUN) == 'xla'
  assert any('ignoring the unreadable cache' in r.getMessage() for r in caplog.records)
  assert list(json.loads(path.read_text()).values()) == [
    {'choice': 'xla', 'ms': {'xla': 1.0, 'pallas': 2.0}}
  ]


def test_an_unwritable_cache_is_a_warning(tmp_path, caplog):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with autotune.tuning(timer=_times(2.0, 1.0), cache_path=blocker / 'autotune.json') as tuner:
    with caplog.at_level(logging.WARNING, logger='absl'):
      assert tuner.choose(_signature(), NO_RUN) == 'pallas'
  assert any('could not write the cache' in r.getMessage() for r in caplog.records)


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

  def agree(choice):
    agreed.append(choice)
    return 'xla'

  with autotune.tuning(timer=_times(2.0, 1.0), agree=agree) as tuner:
    assert tuner.choose(_signature(), NO_RUN) == 'xla'
  assert agreed == ['pallas']
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  path = tmp_path / 'autotune.json'
  with autotune.tuning(timer=_failing_timer, cache_path=path, agree=lambda c: 'pallas') as tuner:
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
  np.testing.assert_array_equal(causal[0, 0], [[1, 1, 1, 0], [1, 1, 1, 1]])
  assert autotune.dummy_mask(_signature(mask=(2, 1, 1, 4))).all()
  assert autotune.dummy_mask(_signature()) is None


def _shaw_inputs(rng):
  q, k, v = (rng.standard_normal(s, np.float32) for s in [(B, Q, H, D)] + [(B, K, H, D)] * 2)
  tables = rng.standard_normal((2, 5, D), np.float32)
  return q, k, v, tables[0], tables[1]


def _xl_inputs(rng):
  q, k, v = (rng.standard_normal(s, np.float32) for s in [(B, Q, H, D)] + [(B, K, H, D)] * 2)
  rel = rng.standard_normal((K, H, D), np.float32)
  u, w = rng.standard_normal((2, H, D), np.float32)
  return q, k, v, rel, u, w


@pytest.mark.parametrize('name', ['shaw', 'xl'])
def test_kernels_use_the_choice_under_jit_of_grad(name, monkeypatch):
  """'auto' resolved inside jax.jit(jax.grad(...)) at the call's shapes (with a mask): the
  'xla' candidate's fwd+bwd runs there (outside the trace), the injected times decide, and the
  kernel takes the chosen branch. A spy stands in for the Pallas kernel (it records the call and
  computes with XLA's kernel: an interpreted Pallas compile takes a minute on this CPU)."""
  attend = {'shaw': shaw_attention, 'xl': xl_attention}[name]
  inputs = {'shaw': _shaw_inputs, 'xl': _xl_inputs}[name](np.random.default_rng(0))
  module = importlib.import_module(f'relpos.attention.{name}')
  pallas_calls = []

  def spy(*args, block_sizes=None, **kwargs):
    pallas_calls.append(block_sizes)
    return attend(*args, implementation='xla', **kwargs)

  monkeypatch.setattr(module, f'{name}_attention_pallas', spy)
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
  want_tables = 'k=2 kv ' if name == 'shaw' else ''
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


def test_measure_times_the_median_of_several_runs():
  runs = []
  seconds = autotune.measure('xla', lambda: runs.append(1) or jnp.zeros(()))
  assert 0.0 < seconds < 1.0 and len(runs) >= 3 + autotune.MIN_REPEATS


def test_cache_path_rules():
  path = runtime.autotune_cache_path
  assert path({'RELPOS_AUTOTUNE_CACHE': 'off'}, '/c') is None
  assert str(path({'RELPOS_AUTOTUNE_CACHE': '/x/t.json'}, '/c')) == '/x/t.json'
  assert str(path({}, '/c')) == '/c/relpos-autotune.json'
  assert path({}, 'gs://bucket/c') == path({}, None) == runtime.DEFAULT_AUTOTUNE_CACHE


@pytest.mark.parametrize('scan_layers', [False, True])
def test_pretuning_a_config_tunes_the_models_own_call_shapes(scan_layers):
  """`trace_train_step` lowers char_tiny's train step: the XL layers' one call shape (queries
  tgt_len, keys mem_len + tgt_len, the causal mask) is tuned once, stacked or scanned."""
  config = load_config_file(Path(__file__).parent.parent / 'configs/char_tiny.py')
  config.model.scan_layers = scan_layers
  calls = []
  with autotune.tuning(timer=_times(1.0, 2.0, calls)) as tuner:
    autotune.trace_train_step(config)
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
    (1, 1, train.tgt_len, train.mem_len + train.tgt_len),
  )
  assert calls == ['xla', 'pallas']
  table = autotune.decision_table(tuner.decisions)
  assert table[2] == f'| {s.text()} | 1.000 | 2.000 | xla | timed |'


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
    got = autotune.shaw_signature(query, query, query[0, 0], None, np.ones((4 * B, 1, 1, Q)), 0.1)
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
    assert set(ms) == {'xla', 'pallas'} and None not in ms.values(), decision
    assert decision.choice == autotune.pick(ms)
  assert len(json.loads((tmp_path / 'autotune.json').read_text())) == 2


def test_pretuning_a_translation_config_tunes_encoder_and_decoder_shapes():
  """translate_tiny at one padded length: the encoder's self-attention (key padding mask) and
  the decoder's (causal mask) are two signatures; cross-attention is not Shaw's."""
  config = load_config_file(Path(__file__).parent.parent / 'configs/translate_tiny.py', 'shaw')
  config.data.max_tokens, config.data.vocab_size = 64, 40
  config.model.update(encoder_layers=1, decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
  with autotune.tuning(timer=_times(1.0, 2.0)) as tuner:
    autotune.trace_train_step(config, [8])
  rows = autotune.timed_batch(8)
  assert [(d.signature.q_len, d.signature.kv_len, d.signature.mask) for d in tuner.decisions] == [
    (8, 8, (rows, 1, 1, 8)),
    (8, 8, (rows, 1, 8, 8)),
  ]
