"""relpos.flops: the model FLOP counts against figures worked out by hand for tiny models,
against the matmuls JAX traces and XLA's cost analysis of real models, the data-sheet peaks;
and the benchmarks' MFU cells and XLA counts (benchmarks/timing.py) where XLA has none."""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timing  # benchmarks/timing.py, on pytest's pythonpath
from flax import nnx

from relpos import flops
from relpos.config.char_lm_defaults import char_lm_config
from relpos.config.translation_defaults import translate_config
from relpos.constants import (
  BIAS_POSITIONS,
  CHAR_LM_POSITIONS,
  SHAW_POSITIONS,
  TRANSLATE_POSITIONS,
  self_attention_kind,
)
from relpos.models.multihead_attention import RELATIVE_SCHEMES
from relpos.models.transformer import Transformer, TransformerConfig
from relpos.models.transformer_xl import TransformerXL, TransformerXLConfig

ELEMENTWISE = 'position terms (elementwise)'


def _char_model(position, **fields):
  """config.model of a 1-layer character LM: d_model 8, 2 heads of 4, d_ff 16, Shaw k = 2."""
  model = char_lm_config().model
  model.update(
    position=position, num_layers=1, d_model=8, num_heads=2, head_dim=4, d_ff=16, dropout=0.0
  )
  model.update(max_relative_position=2, **fields)
  return model


def _char_flops(position, **fields):
  """batch 3, tgt_len 4, mem_len 2 (6 keys), vocab 5."""
  return flops.char_lm_flops(
    _char_model(position, **fields), batch=3, tgt_len=4, mem_len=2, vocab_size=5
  )


# The parts every 1-layer character LM above has (B = 3, T = 4, K = T + mem = 6, D = 8,
# H = 2, head_dim 4, F = 16, V = 5):
#   projections: queries and output 2·(B·T)·D·(H·4) = 2·12·8·8 = 1536 each, keys and values
#     of [memory; segment] 2·(B·K)·D·8 = 2·18·8·8 = 2304 each: 2·1536 + 2·2304 = 7680
#   q·k and p·v: 2·B·H·T·K·4 = 2·3·2·4·6·4 = 1152 each
#   feed-forward: 2 · 2·(B·T)·D·F = 2·2·12·8·16 = 6144
#   output softmax layer: 2·(B·T)·D·V = 2·12·8·5 = 960
COMMON = {
  'projections': 7680,
  'attention q·k': 1152,
  'attention p·v': 1152,
  'feed-forward': 6144,
  'output softmax layer': 960,
}
PAIRS = 3 * 2 * 4 * 6  # B·H·T·K = 144 logits
# Causal over [memory of 2; segment of 4]: query i sees 2 + i + 1 keys, 3 + 4 + 5 + 6 = 18 of
# the 24 pairs, so a quarter of every per-pair part is masked.
HIDDEN = 6 / 24


def test_visible_pairs():
  assert flops.visible_pairs(4, 6, causal=True) == 3 + 4 + 5 + 6
  assert flops.visible_pairs(3, 3, causal=True) == 1 + 2 + 3
  assert flops.visible_pairs(3, 5, causal=False) == 15


def test_the_counts_and_the_models_classify_positions_alike():
  """One classification (`relpos.constants`): the layer kind the models build, Shaw's
  positions the config reads k for, and the counts' kind ('bias' where the stack adds one)."""
  for position in {*TRANSLATE_POSITIONS, *CHAR_LM_POSITIONS}:
    kind = self_attention_kind(position)
    assert kind in RELATIVE_SCHEMES
    want = 'bias' if position in BIAS_POSITIONS else kind
    assert flops._self_attention_kind(position) == want
    assert (kind == 'shaw') == (position in SHAW_POSITIONS)
  assert TransformerConfig.SHAW_POSITIONS == SHAW_POSITIONS


def test_char_lm_xl_by_hand():
  counted = _char_flops('xl')
  # + the position logits (q + v)·W_kR R_t over the 6 distances: 2·B·H·T·K·4 = 1152;
  # + W_kR R: 2·K·D·(H·4) = 2·6·8·8 = 768, once (not per row);
  # + elementwise: position logit + content logit, 144 adds; q + u and q + v: 2·B·T·H·4 = 192.
  assert counted.parts == {
    **COMMON,
    'xl position logits': 1152,
    'xl R projection': 768,
    ELEMENTWISE: PAIRS + 192,
  }
  assert counted.forward == 7680 + 3 * 1152 + 768 + 336 + 6144 + 960 == 19344
  # Masked: a quarter of q·k, p·v, the position logits and the 144 logit adds.
  assert counted.masked == pytest.approx(HIDDEN * (3 * 1152 + PAIRS)) == 900
  assert counted.forward_visible == 19344 - 900
  assert counted.train_step() == 3 * 19344
  assert counted.train_step(visible_only=True) == 3 * (19344 - 900)


def test_char_lm_xl_without_memory_has_fewer_keys():
  counted = flops.char_lm_flops(_char_model('xl'), batch=3, tgt_len=4, mem_len=0, vocab_size=5)
  # K = 4: keys and values 2·12·8·8 = 1536 each; q·k, p·v, position logits 2·3·2·4·4·4 = 768;
  # W_kR R 2·4·8·8 = 512; elementwise 96 + 192.
  assert counted.forward == 4 * 1536 + 3 * 768 + 512 + 96 + 192 + 6144 + 960
  assert counted.masked == pytest.approx((6 / 16) * (3 * 768 + 96))  # 10 of 16 pairs seen


def test_char_lm_shaw_by_hand():
  # Tables of 2k + 1 = 5 rows: q·w^K 2·B·H·T·5·4 = 2·3·2·4·5·4 = 960, p·w^V the same;
  # elementwise: the a^K term added to 144 logits, 144 probabilities summed into rows.
  assert _char_flops('shaw').parts == {
    **COMMON,
    'shaw q·w^K': 960,
    'shaw p·w^V': 960,
    ELEMENTWISE: 2 * PAIRS,
  }
  assert _char_flops('shaw').forward == 17088 + 1920 + 288
  assert _char_flops('shaw').masked == pytest.approx(
    HIDDEN * (2 * 1152 + 2 * PAIRS)
  )  # not the tables
  keys_only = _char_flops('shaw', relative_values=False)
  assert keys_only.parts == {**COMMON, 'shaw q·w^K': 960, ELEMENTWISE: PAIRS}


@pytest.mark.parametrize('position', ['none', 'absolute'])
def test_char_lm_without_relative_terms_by_hand(position):
  counted = _char_flops(position)
  assert counted.parts == COMMON  # the sinusoids are added once: elementwise, shared
  assert counted.forward == 7680 + 2 * 1152 + 6144 + 960 == 17088
  assert counted.masked == pytest.approx(HIDDEN * 2 * 1152) == 576


@pytest.mark.parametrize('position', ['t5', 'alibi'])
def test_char_lm_bias_by_hand(position):
  assert _char_flops(position).parts == {**COMMON, ELEMENTWISE: PAIRS}  # one add per logit
  assert _char_flops(position).masked == pytest.approx(HIDDEN * (2 * 1152 + PAIRS))


def test_char_lm_rope_by_hand():
  # 3 FLOPs per rotated element: the 4 queries and the 6 keys of 3 rows, 2 heads of 4.
  assert _char_flops('rope').parts == {**COMMON, ELEMENTWISE: 3 * 3 * 2 * 4 * (4 + 6)}
  assert _char_flops('rope').masked == pytest.approx(HIDDEN * 2 * 1152)  # rotations: per position


def _translation_model(position, **fields):
  """config.model of a 1+1-layer translation model: d_model 8, 2 heads of 4, d_ff 16, k = 1."""
  model = translate_config().model
  model.update(position=position, encoder_layers=1, decoder_layers=1, d_model=8, num_heads=2)
  model.update(d_ff=16, dropout=0.0, max_relative_position=1, max_len=16, **fields)
  return model


def _translation_flops(position):
  """2 rows, sources padded to 5, targets to 3, vocab 7."""
  return flops.translation_flops(
    _translation_model(position), rows=2, src_len=5, tgt_len=3, vocab_size=7
  )


# The parts of the 1+1-layer translation model above without position work (R = 2 rows, S = 5,
# T = 3, D = 8, H = 2, head_dim 4, F = 16, V = 7):
#   encoder: projections 4 · 2·(R·S)·D·D = 4·1280 = 5120; q·k, p·v 2·R·H·S·S·4 = 800 each;
#     feed-forward 2 · 2·(R·S)·D·F = 5120
#   decoder self-attention: projections 4 · 2·(R·T)·D·D = 4·768 = 3072; q·k, p·v
#     2·R·H·T·T·4 = 288 each; feed-forward 2 · 2·(R·T)·D·F = 3072
#   encoder-decoder attention: queries and output 2·768, keys and values of the source
#     2·1280: 4096; q·k, p·v 2·R·H·T·S·4 = 480 each
#   softmax layer 2·(R·T)·D·V = 2·6·8·7 = 672
TRANSLATION_COMMON = {
  'projections': 5120 + 3072,
  'attention q·k': 800 + 288,
  'attention p·v': 800 + 288,
  'feed-forward': 5120 + 3072,
  'cross-projections': 4096,
  'cross-attention q·k': 480,
  'cross-attention p·v': 480,
  'output softmax layer': 672,
}
# Only decoder self-attention is causal: 1 + 2 + 3 = 6 of its 9 pairs are seen.
DECODER_HIDDEN = 3 / 9


def test_translation_absolute_by_hand():
  counted = _translation_flops('absolute')
  assert counted.parts == TRANSLATION_COMMON
  assert counted.forward == 5120 + 1600 + 5120 + 3072 + 576 + 3072 + 4096 + 960 + 672 == 24288
  assert counted.masked == pytest.approx(DECODER_HIDDEN * 576) == 192


def test_translation_shaw_by_hand():
  # Self-attention only (encoder-decoder attention sees no positions), tables of 3 rows:
  # encoder q·w^K and p·w^V 2·R·H·S·3·4 = 480 each, decoder 2·R·H·T·3·4 = 288 each;
  # elementwise 2 adds per pair: encoder 2·(R·H·S·S) = 200, decoder 2·(R·H·T·T) = 72.
  counted = _translation_flops('shaw')
  assert counted.parts == {
    **TRANSLATION_COMMON,
    'shaw q·w^K': 480 + 288,
    'shaw p·w^V': 480 + 288,
    ELEMENTWISE: 200 + 72,
  }
  assert counted.forward == 24288 + 2 * 768 + 272 == 26096
  assert counted.masked == pytest.approx(DECODER_HIDDEN * (576 + 72)) == 216  # not the tables
  assert _translation_flops('shaw_absolute').parts == counted.parts


def test_translation_bias_and_rope_by_hand():
  # T5, ALiBi: one add per self-attention logit, R·H·S·S + R·H·T·T = 100 + 36.
  assert _translation_flops('t5').parts == {**TRANSLATION_COMMON, ELEMENTWISE: 136}
  # RoPE: 3 FLOPs per rotated query and key element: 3·R·H·4·(S + S) + 3·R·H·4·(T + T).
  assert _translation_flops('rope').parts == {**TRANSLATION_COMMON, ELEMENTWISE: 480 + 288}


def _dot_flops(jaxpr) -> float:
  """2·(output size)·(contracted size) of every dot_general JAX traced, nested jaxprs (jit,
  custom_vjp) included; of a `cond`'s branches, of which one runs, the dearest (XL's position
  matmul has one per layout: `lax.platform_dependent`)."""
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'cond':
      total += max(_dot_flops(branch.jaxpr) for branch in eqn.params['branches'])
      continue
    if eqn.primitive.name == 'dot_general':
      (contracted, _), _ = eqn.params['dimension_numbers']
      lhs_shape = eqn.invars[0].aval.shape
      total += (
        2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs_shape[d] for d in contracted)
      )
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          total += _dot_flops(inner)
  return total


def _traced_and_xla(model, call, *args):
  """(the matmul FLOPs JAX traces, XLA's FLOP count) of `call(model, *args)`."""
  graphdef, state = nnx.split(model)

  def forward(state, *args):
    return call(nnx.merge(graphdef, state), *args)

  traced = _dot_flops(jax.make_jaxpr(forward)(state, *args).jaxpr)
  return traced, timing.xla_flops(jax.jit(forward).lower(state, *args).cost_analysis())


# A character LM big enough that matmuls dominate XLA's count: B = 2, T = 16, mem 8 (K = 24),
# d_model 64, 2 heads of 32, d_ff 256, vocab 50, Shaw k = 4 (R = 9 rows), T5's 32 buckets.
XLA_SIZE = dict(num_layers=1, d_model=64, num_heads=2, head_dim=32, d_ff=256, dropout=0.0)


@pytest.mark.parametrize('position', ['xl', 'none', 'rope', 'shaw', 't5'])
def test_char_lm_count_against_the_traced_matmuls_and_xla(position):
  """The matmuls JAX traces for a forward pass are the count's matmuls exactly, or differ by
  the kernel's own extra matmuls, written out; XLA's count adds the elementwise work the count
  leaves out (softmax, LayerNorm, the loss-free forward's ReLU, ...): within 5% at this size."""
  model_config = char_lm_config().model
  model_config.update(position=position, max_relative_position=4, **XLA_SIZE)
  model_config.attention_implementation = 'xla'
  typed = TransformerXLConfig.from_section(model_config, vocab_size=50)
  model = TransformerXL(typed, rngs=nnx.Rngs(0))
  tokens, memory = jnp.zeros((2, 16), jnp.int32), model.init_memory(2, 8)
  traced, xla = _traced_and_xla(
    model, lambda m, t, mem: m(t, mem, deterministic=True)[0], tokens, memory
  )
  counted = flops.char_lm_flops(model_config, batch=2, tgt_len=16, mem_len=8, vocab_size=50)
  matmuls = counted.forward - counted.parts.get(ELEMENTWISE, 0)
  extra = {
    'xl': 0,
    'none': 0,
    'rope': 0,
    # Shaw's dense form at 24 keys (relpos.attention.shaw, at most DENSE_MAX_KV_LEN keys):
    # one-hot matmuls spread q·w^K over the keys (2·B·H·T·R·K), build a^V = one_hot·w^V
    # (2·T·K·R·head_dim) and take p·a^V (2·B·H·T·K·head_dim) instead of p·w^V (2·B·H·T·R·hd).
    'shaw': 2 * 2 * 2 * 16 * 9 * 24
    + 2 * 16 * 24 * 9 * 32
    + 2 * 2 * 2 * 16 * 24 * 32
    - 2 * 2 * 2 * 16 * 9 * 32,
    # T5's table is read by a one-hot matmul over its 32 buckets: 2·T·K·buckets·H, once.
    't5': 2 * 16 * 24 * 32 * 2,
  }[position]
  assert traced == matmuls + extra
  assert counted.forward <= xla <= 1.05 * (counted.forward + extra)


def test_translation_count_against_the_traced_matmuls_and_xla():
  model_config = translate_config().model
  model_config.update(
    position='absolute', encoder_layers=1, decoder_layers=1, d_model=64, num_heads=2, d_ff=256
  )
  model_config.update(dropout=0.0, max_len=32)
  model = Transformer(TransformerConfig.from_section(model_config, vocab_size=50), rngs=nnx.Rngs(0))
  src, tgt = jnp.ones((3, 12), jnp.int32), jnp.ones((3, 10), jnp.int32)
  traced, xla = _traced_and_xla(model, lambda m, s, t: m(s, t, deterministic=True), src, tgt)
  counted = flops.translation_flops(model_config, rows=3, src_len=12, tgt_len=10, vocab_size=50)
  assert traced == counted.forward
  assert counted.forward <= xla <= 1.05 * counted.forward


@pytest.mark.parametrize(
  ('device_kind', 'dtype', 'tflops'),
  [
    ('NVIDIA H100 80GB HBM3', 'bfloat16', 989.4),
    ('NVIDIA H100 80GB HBM3', 'float32', 494.7),  # TF32
    ('NVIDIA H100 PCIe', 'bfloat16', 756.0),
    ('NVIDIA H200', 'bfloat16', 989.4),
    ('NVIDIA H200', 'float32', 494.7),
    ('NVIDIA A100-SXM4-80GB', 'bfloat16', 312.0),
    ('NVIDIA A100-SXM4-40GB', 'float32', 156.0),
    ('TPU v4', 'bfloat16', 275.0),
    ('TPU v5 lite', 'bfloat16', 197.0),
    ('TPU v5', 'bfloat16', 459.0),
    ('TPU v5p', 'float32', 459.0),  # one bf16 pass under JAX's default precision
    ('TPU v6 lite', 'bfloat16', 918.0),
  ],
)
def test_device_peak(device_kind, dtype, tflops):
  assert flops.device_peak(device_kind, dtype).tflops == tflops


@pytest.mark.parametrize(
  ('device_kind', 'dtype'),
  [('NVIDIA H200 NVL', 'bfloat16'), ('NVIDIA GH200 480GB', 'bfloat16'), ('cpu', 'float32')],
)
def test_device_peak_unknown(device_kind, dtype):
  assert flops.device_peak(device_kind, dtype) is None
  assert flops.device_peak('NVIDIA H200', 'float16') is None  # not a relpos compute dtype


def test_devices_peak_adds_the_devices():
  h200, cpu = (types.SimpleNamespace(device_kind=kind) for kind in ('NVIDIA H200', 'cpu'))
  assert flops.devices_peak([h200, h200], 'bfloat16') == 2 * 989.4e12
  assert flops.devices_peak([h200, cpu], 'bfloat16') is None
  assert flops.devices_peak(jax.devices(), 'float32') is None  # this CPU


class _Mesh:
  """What `timing.peak_rate` reads of a mesh, on a device that is not here."""

  def __init__(self, platform, device_kind, size):
    device = types.SimpleNamespace(platform=platform, device_kind=device_kind)
    self.devices = np.array([device] * size, dtype=object)
    self.size = size


def test_mfu_on_a_fake_device():
  peak, line = timing.peak_rate(_Mesh('gpu', 'NVIDIA H200', 2), 'bfloat16', [])
  assert peak == 2 * 989.4e12
  assert line.startswith('peak: H200 SXM data-sheet dense bf16 peak, 989.4 TFLOP/s per device')
  counted = _char_flops('xl')  # 19344 forward, 900 of it masked
  seconds = 3 * 19344 / (0.25 * peak)  # a step at a quarter of the peak
  cells = [cell.strip() for cell in timing.step_cells(counted, None, seconds, peak).split('|')]
  assert cells[1] == 'n/a'  # XLA's count
  assert float(cells[3]) == 0.25
  assert float(cells[4]) == pytest.approx(0.25 * (19344 - 900) / 19344, rel=5e-3)
  assert flops.mfu(3 * 19344, seconds, peak) == pytest.approx(0.25)


def test_mfu_is_na_on_an_unknown_device():
  peak, line = timing.peak_rate(_Mesh('gpu', 'NVIDIA GH200 480GB', 1), 'float32', [])
  assert peak is None
  assert line == (
    "MFU n/a: relpos.flops.PEAKS has no data-sheet peak for device kind 'NVIDIA GH200 480GB' "
    'in float32'
  )
  cells = [cell.strip() for cell in timing.step_cells(_char_flops('xl'), 2e9, 1.0, None).split('|')]
  # model GFLOP (3 · 19344), XLA GFLOP, model GFLOP/s, both MFUs
  assert cells[:5] == ['5.8e-05', '2', '5.8e-05', 'n/a', 'n/a']
  assert flops.mfu(1.0, 1.0, None) is None


class _Jitted:
  """A jitted function's stand-in whose lowered and compiled modules report `lowered` and
  `compiled` as their cost analysis."""

  def __init__(self, lowered, compiled):
    self.compiled_reads = 0

    def compile_():
      self.compiled_reads += 1
      return types.SimpleNamespace(cost_analysis=lambda: compiled)

    self.lowered = types.SimpleNamespace(cost_analysis=lambda: lowered, compile=compile_)

  def lower(self, *args):
    return self.lowered


@pytest.mark.parametrize(
  ('lowered', 'compiled', 'expected'),
  [
    ({'flops': 128.0, 'bytes accessed': 224.0}, None, 128.0),  # jax 0.10: a dict
    ([{'flops': 64.0}], None, 64.0),  # older versions: a list of one dict per program
    (None, {'flops': 10.0}, 20.0),  # a GPU: the compiled, per-device module, times 2 devices
    (None, [{'flops': 10.0}], 20.0),
    (None, None, None),  # neither: n/a, never a TypeError
    ([], {}, None),
    ({'flops': -1.0}, None, None),  # a count XLA could not make
  ],
)
def test_step_flops_reads_any_cost_analysis(lowered, compiled, expected):
  jitted = _Jitted(lowered, compiled)
  assert timing.step_flops(jitted, 'args', devices=2) == expected
  assert jitted.compiled_reads == (timing.xla_flops(lowered) is None)


def test_the_tasks_hand_the_loop_the_model_flops_of_each_batch(tmp_path):
  """What the training loop's MFU counts: each task's `Training.step_flops` is relpos.flops'
  training-step count of the batch the loop feeds (its shapes, the data's vocabulary)."""
  from helpers import tiny_char_config, tiny_translate_config, write_pair_corpus

  from relpos.training import char_lm_task, translation_task
  from relpos.training.mesh import data_mesh

  mesh = data_mesh()
  text = tmp_path / 'text.txt'
  text.write_text('the quick brown fox jumps over the lazy dog. ' * 200)
  config = tiny_char_config(text, steps=1)
  (tmp_path / 'char').mkdir()  # train.py makes the workdir before the task writes into it
  run = char_lm_task.TASK.training(config, tmp_path / 'char', mesh)
  inputs, _, _ = run.batch(0)
  vocab_size = run.state['model']['embed']['embedding'].shape[0]
  want = flops.char_lm_flops(
    config.model,
    batch=inputs.shape[0],
    tgt_len=inputs.shape[1],
    mem_len=config.train.mem_len,
    vocab_size=vocab_size,
  ).train_step()
  assert run.step_flops(run.batch(0)) == want > 0

  config = tiny_translate_config(write_pair_corpus(tmp_path / 'corpus', train=60, eval=4), steps=1)
  config.data.length_buckets = 2  # batches of two shapes
  (tmp_path / 'translate').mkdir()
  run = translation_task.TASK.training(config, tmp_path / 'translate', mesh)
  vocab_size = run.state['model']['embed']['embedding'].shape[0]
  counts = set()
  for step in range(4):
    batch = run.batch(step)
    want = flops.translation_flops(
      config.model,
      rows=batch['src'].shape[0],
      src_len=batch['src'].shape[1],
      tgt_len=batch['tgt_in'].shape[1],
      vocab_size=vocab_size,
    ).train_step()
    assert run.step_flops(batch) == want > 0
    counts.add(want)
  assert len(counts) > 1  # the batches' shapes differ, and so do their counts
