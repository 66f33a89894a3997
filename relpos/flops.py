"""Model FLOPs of both models, counted analytically, and the devices' peak rates for MFU.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022 appendix B) is the model's FLOPs per
second over the hardware's peak: a rate against what the model must compute, whatever the
kernels actually do (a kernel that does extra work, e.g. Shaw's dense one-hot form, a
rematerialised layer, or masked-out pairs, does not raise it).

The convention of this module:

- A matmul of [m, k] x [k, n] is 2·m·k·n FLOPs (one multiply and one add per term), batched
  matmuls times their batch.
- Counted: every matmul of the model (the query, key, value and output projections, the
  feed-forward layers, the tied output softmax layer, the attention products q·k and p·v and
  each position scheme's own: Shaw's q·w^K and p·w^V on the [2k+1, head_dim] tables, XL's
  (q + v)·W_kR R over every distance and the projection W_kR R), plus each position scheme's own
  elementwise work, so that schemes compare fairly: one add per logit where a position term
  meets the content logits (T5's and ALiBi's bias, XL's position logits, Shaw's a^K term),
  Shaw's per-row sums of the probabilities (one add per pair) that p·w^V needs, XL's u and v
  added to the queries, and RoPE's rotation (3 FLOPs per rotated element: two multiplies and
  an add). The embedding lookup is a gather: 0 FLOPs.
- Not counted: the elementwise work every scheme shares (scaling, masking, softmax, LayerNorm,
  residual adds, biases, activations, dropout, the loss) and the optimizer update.
- Every query-key pair of the attention rectangle is counted, the causally masked ones too:
  this is what XLA's kernels compute, and the convention of PaLM's and Megatron's MFU. The
  masked share is kept apart (`Flops.masked`), so `Flops.forward_visible` gives the count of
  flash-attention papers, which skip the masked half.
- Padding counts: a translation batch's rows are counted at their padded length.
- A training step is forward + backward = `TRAIN_STEP_PASSES` (3) × the forward count: the
  backward pass does two matmuls per forward matmul (the gradients of both operands). This
  slightly over-counts where an operand has no gradient (XL's memory, which is under
  stop_gradient; the fixed sinusoids R of XL), as the 6·N·tokens rule does.
  Rematerialisation (config.model.remat) is not counted: it is extra work, not model work.

Peaks (`device_peak`) are the vendors' data-sheet dense (no sparsity) tensor rates per device,
in bf16 and in float32 as JAX runs it by default (TF32 on NVIDIA GPUs, one bf16 pass on TPUs).
"""

import dataclasses

import ml_collections

from relpos.constants import BIAS_POSITIONS, self_attention_kind

# Forward + backward: the backward pass is two matmuls (both operands' gradients) per forward
# matmul.
TRAIN_STEP_PASSES = 3


@dataclasses.dataclass(frozen=True)
class Flops:
  """The forward FLOPs of one model call, by part.

  Attributes:
    parts: {part name: forward FLOPs}, e.g. 'feed-forward', 'attention q·k'.
    masked: of those, the FLOPs spent on query-key pairs a causal mask hides (they are
      computed, and counted in `forward`).
  """

  parts: dict
  masked: float = 0.0

  @property
  def forward(self) -> float:
    """Forward FLOPs, every pair of the attention rectangle counted."""
    return float(sum(self.parts.values()))

  @property
  def forward_visible(self) -> float:
    """Forward FLOPs with the causally masked pairs left out (flash-attention's count)."""
    return self.forward - self.masked

  def train_step(self, *, visible_only: bool = False) -> float:
    """FLOPs of a training step: TRAIN_STEP_PASSES × the forward count."""
    return TRAIN_STEP_PASSES * (self.forward_visible if visible_only else self.forward)

  def __add__(self, other: 'Flops') -> 'Flops':
    parts = dict(self.parts)
    for name, value in other.parts.items():
      parts[name] = parts.get(name, 0.0) + value
    return Flops(parts, self.masked + other.masked)

  def scaled(self, factor: float) -> 'Flops':
    """Every part times `factor` (e.g. the number of layers)."""
    return Flops({name: factor * value for name, value in self.parts.items()}, factor * self.masked)


def matmul(m: int, k: int, n: int, batch: int = 1) -> float:
  """FLOPs of `batch` [m, k] x [k, n] matmuls: 2·batch·m·k·n."""
  return 2.0 * batch * m * k * n


def visible_pairs(q_len: int, kv_len: int, *, causal: bool) -> int:
  """Query-key pairs a query may attend to, queries being the last q_len of kv_len positions
  (a memory or a cache first): query i at kv_len - q_len + i sees keys 0 .. itself."""
  if not causal:
    return q_len * kv_len
  offset = kv_len - q_len
  return sum(min(kv_len, offset + i + 1) for i in range(q_len))


def attention_flops(
  kind: str,
  *,
  batch: int,
  heads: int,
  head_dim: int,
  q_len: int,
  kv_len: int,
  causal: bool,
  table_rows: int = 0,
  relative_keys: bool = True,
  relative_values: bool = True,
) -> Flops:
  """Forward FLOPs of one attention layer's kernel, between the projections.

  Args:
    kind: the layer's position work: 'none' (absolute positions, none, encoder-decoder
      attention), 'bias' (T5, ALiBi: a bias added to the logits), 'rope', 'shaw' or 'xl'.
    batch, heads, head_dim, q_len, kv_len: the shapes; queries are the last q_len of kv_len.
    causal: the mask is causal (only decides `Flops.masked`).
    table_rows: 'shaw': the tables' 2k+1 rows.
    relative_keys, relative_values: 'shaw': which tables the layer has.
  Returns:
    Flops by part; XL's projection W_kR R is the caller's (`xl_r_projection_flops`).
  """
  pairs = batch * heads * q_len * kv_len  # every (row, head, query, key), masked or not
  per_pair = {
    'attention q·k': matmul(q_len, head_dim, kv_len, batch * heads),
    'attention p·v': matmul(q_len, kv_len, head_dim, batch * heads),
  }
  per_query = {}
  if kind == 'bias':
    per_pair['position terms (elementwise)'] = pairs  # bias + logit
  elif kind == 'rope':
    per_query['position terms (elementwise)'] = 3.0 * batch * heads * head_dim * (q_len + kv_len)
  elif kind == 'xl':
    # (q + v)·W_kR R_t for every distance t = 0..kv_len-1, then one add per logit.
    per_pair['xl position logits'] = matmul(q_len, head_dim, kv_len, batch * heads)
    per_pair['position terms (elementwise)'] = pairs
    per_query['position terms (elementwise)'] = 2.0 * batch * q_len * heads * head_dim  # + u, + v
  elif kind == 'shaw':
    elementwise = 0.0
    if relative_keys:  # q_i·w^K_r for the 2k+1 rows r, then one add per logit
      per_query['shaw q·w^K'] = matmul(q_len, head_dim, table_rows, batch * heads)
      elementwise += pairs
    if relative_values:  # probabilities summed per row (one add per pair), then · w^V
      per_query['shaw p·w^V'] = matmul(q_len, table_rows, head_dim, batch * heads)
      elementwise += pairs
    per_pair['position terms (elementwise)'] = elementwise
  elif kind != 'none':
    raise ValueError(f"kind must be 'none', 'bias', 'rope', 'shaw' or 'xl', got {kind!r}")
  hidden_pairs = q_len * kv_len - visible_pairs(q_len, kv_len, causal=causal)
  flops = Flops(per_pair, sum(per_pair.values()) * hidden_pairs / (q_len * kv_len))
  return flops + Flops(per_query)


def _self_attention_kind(position: str) -> str:
  """attention_flops's kind of a self-attention layer under config.model.position: the
  layer's (`relpos.constants.self_attention_kind`), or 'bias' where the stack adds one."""
  return 'bias' if position in BIAS_POSITIONS else self_attention_kind(position)


def model_head_dim(model: ml_collections.ConfigDict) -> int:
  """config.model's head_dim (the character LM's own field; translation's d_model / heads)."""
  return model.head_dim if 'head_dim' in model else model.d_model // model.num_heads


def _layer_flops(
  model, *, batch: int, q_len: int, kv_len: int, kv_inputs: int, kind: str, causal: bool
) -> Flops:
  """One attention sublayer: projections of q_len queries and kv_inputs key/value inputs
  (which attend as kv_len keys), and the kernel."""
  width = model.num_heads * model_head_dim(model)
  projections = 2 * matmul(batch * q_len, model.d_model, width)  # queries and output
  projections += 2 * matmul(batch * kv_inputs, model.d_model, width)  # keys and values
  table_rows = 2 * model.max_relative_position + 1
  kernel = attention_flops(
    kind,
    batch=batch,
    heads=model.num_heads,
    head_dim=model_head_dim(model),
    q_len=q_len,
    kv_len=kv_len,
    causal=causal,
    table_rows=table_rows,
    relative_keys=model.relative_keys,
    relative_values=model.relative_values,
  )
  return Flops({'projections': projections}) + kernel


def _feed_forward_flops(model, rows: int) -> Flops:
  return Flops({'feed-forward': 2 * matmul(rows, model.d_model, model.d_ff)})


def _softmax_layer_flops(model, rows: int, vocab_size: int) -> Flops:
  return Flops({'output softmax layer': matmul(rows, model.d_model, vocab_size)})


def xl_r_projection_flops(model, kv_len: int) -> Flops:
  """XL's W_kR R of one layer: the sinusoids of kv_len distances projected, [kv_len, d_model] x
  [d_model, heads·head_dim], once per call (not per row)."""
  width = model.num_heads * model_head_dim(model)
  return Flops({'xl R projection': matmul(kv_len, model.d_model, width)})


def char_lm_flops(
  model: ml_collections.ConfigDict, *, batch: int, tgt_len: int, mem_len: int, vocab_size: int
) -> Flops:
  """Forward FLOPs of the Transformer-XL character LM on a [batch, tgt_len] segment with a
  mem_len memory (relpos.models.transformer_xl), from config.model.

  Every layer projects keys and values of [memory; segment] (tgt_len + mem_len keys), its
  queries and output of the segment; the mask is causal over the memory and the segment.
  """
  kv_len = tgt_len + mem_len
  layer = _layer_flops(
    model,
    batch=batch,
    q_len=tgt_len,
    kv_len=kv_len,
    kv_inputs=kv_len,
    kind=_self_attention_kind(model.position),
    causal=True,
  )
  layer += _feed_forward_flops(model, batch * tgt_len)
  if model.position == 'xl':
    layer += xl_r_projection_flops(model, kv_len)
  return layer.scaled(model.num_layers) + _softmax_layer_flops(model, batch * tgt_len, vocab_size)


def translation_flops(
  model: ml_collections.ConfigDict, *, rows: int, src_len: int, tgt_len: int, vocab_size: int
) -> Flops:
  """Forward FLOPs of the encoder-decoder Transformer (relpos.models.transformer), teacher
  forced on `rows` pairs padded to src_len and tgt_len, from config.model.

  Encoder layers: self-attention over the source (not causal) and feed-forward. Decoder layers:
  causal self-attention, encoder-decoder attention (no position work; keys and values
  projected from the source) and feed-forward. Then the tied softmax layer over the targets.
  """
  kind = _self_attention_kind(model.position)
  encoder = _layer_flops(
    model, batch=rows, q_len=src_len, kv_len=src_len, kv_inputs=src_len, kind=kind, causal=False
  ) + _feed_forward_flops(model, rows * src_len)
  decoder_self = _layer_flops(
    model, batch=rows, q_len=tgt_len, kv_len=tgt_len, kv_inputs=tgt_len, kind=kind, causal=True
  )
  cross = _layer_flops(
    model, batch=rows, q_len=tgt_len, kv_len=src_len, kv_inputs=src_len, kind='none', causal=False
  )
  cross = Flops({f'cross-{name}': value for name, value in cross.parts.items()}, cross.masked)
  decoder = decoder_self + cross + _feed_forward_flops(model, rows * tgt_len)
  return (
    encoder.scaled(model.encoder_layers)
    + decoder.scaled(model.decoder_layers)
    + _softmax_layer_flops(model, rows * tgt_len, vocab_size)
  )


# Data-sheet dense peaks per device, TFLOP/s: (the device, bf16, float32 as JAX runs float32
# matmuls by default there). Sparsity figures (2x) are not used.
# - NVIDIA H100 Tensor Core GPU data sheet: H100 SXM bf16 1,979 / TF32 989 TFLOP/s "with
#   sparsity", i.e. 989.4 / 494.7 dense; H100 PCIe 1,513 / 756 with sparsity: 756 / 378 dense.
# - NVIDIA H200 Tensor Core GPU data sheet: H200 SXM the same tensor rates as H100 SXM (bf16
#   1,979, TF32 989 with sparsity): 989.4 / 494.7 dense.
# - NVIDIA A100 Tensor Core GPU data sheet: bf16 312, TF32 156 TFLOP/s dense (every A100 SXM4
#   and PCIe model, 40 and 80 GB).
# - Google Cloud TPU system architecture pages: v4 275, v5e 197, v5p 459, v6e (Trillium) 918
#   bf16 TFLOP/s per chip (one JAX device). TPUs have no TF32: JAX's default precision runs a
#   float32 matmul as one bf16 pass, so float32 gets the bf16 peak.
# Matched in order against jax's device_kind (e.g. 'NVIDIA H100 80GB HBM3', 'NVIDIA H200',
# 'NVIDIA A100-SXM4-80GB', 'TPU v4', 'TPU v5 lite', 'TPU v5', 'TPU v6 lite'): the first entry
# whose every word is in the (lowercased) device_kind and none of whose excluded words are.
PEAKS = (
  # (words, excluded words, the device, bf16, float32)
  (('h100', 'pcie'), (), 'H100 PCIe', 756.0, 378.0),
  (('h100',), ('nvl', 'pcie'), 'H100 SXM', 989.4, 494.7),
  (('h200',), ('nvl',), 'H200 SXM', 989.4, 494.7),
  (('a100',), (), 'A100', 312.0, 156.0),
  (('tpu', 'v4'), ('lite',), 'TPU v4', 275.0, 275.0),
  (('tpu', 'v5', 'lite'), (), 'TPU v5e', 197.0, 197.0),
  (('tpu', 'v5e'), (), 'TPU v5e', 197.0, 197.0),
  (('tpu', 'v5p'), (), 'TPU v5p', 459.0, 459.0),
  (('tpu', 'v5'), ('lite',), 'TPU v5p', 459.0, 459.0),
  (('tpu', 'v6', 'lite'), (), 'TPU v6e', 918.0, 918.0),
  (('tpu', 'v6e'), (), 'TPU v6e', 918.0, 918.0),
)
PEAK_DTYPES = ('bfloat16', 'float32')


@dataclasses.dataclass(frozen=True)
class Peak:
  """A device's data-sheet peak in one compute dtype: TFLOP/s per device, and what it is."""

  tflops: float
  description: str


def device_peak(device_kind: str, dtype: str) -> Peak | None:
  """The data-sheet dense peak of one device of `device_kind` computing in `dtype`
  ('bfloat16' or 'float32', config.model.dtype), or None where PEAKS has none."""
  if dtype not in PEAK_DTYPES:
    return None
  words = device_kind.lower().replace('-', ' ').split()
  for wanted, excluded, name, bf16, float32 in PEAKS:
    if all(word in words for word in wanted) and not any(word in words for word in excluded):
      kind = 'bf16' if dtype == 'bfloat16' else ('TF32' if 'TPU' not in name else 'fp32 as bf16')
      tflops = bf16 if dtype == 'bfloat16' else float32
      return Peak(tflops, f'{name} data-sheet dense {kind} peak, {tflops:g} TFLOP/s per device')
  return None


def devices_peak(devices, dtype: str) -> float | None:
  """The data-sheet peak FLOP/s of `devices` (jax devices, e.g. a mesh's) together in `dtype`,
  or None where one of them has no entry in PEAKS (a CPU among them: its peak is measured,
  `benchmarks/timing.py`'s MatmulRate)."""
  peaks = [device_peak(device.device_kind, dtype) for device in devices]
  if not peaks or None in peaks:
    return None
  return sum(peak.tflops for peak in peaks) * 1e12


def mfu(flops: float, seconds: float, peak_flops_per_second: float | None) -> float | None:
  """Model FLOPs utilisation: flops / seconds / peak; None without a peak."""
  if not peak_flops_per_second:
    return None
  return flops / seconds / peak_flops_per_second
