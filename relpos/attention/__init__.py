"""Pure functional attention kernels and position schemes.

Kernels: vanilla (with an optional logit bias), Shaw et al. 2018 and Transformer-XL. All take
query [batch, q_len, heads, head_dim] and key/value [batch, kv_len, heads, head_dim], an
optional bool mask broadcastable to [batch, heads, q_len, kv_len] (True = may attend), and
return [batch, q_len, heads, head_dim]. Softmax and matmul sums run in float32 (float64 for
float64 inputs); bf16 inputs stay bf16 in the matmuls. Shaw's and Transformer-XL's kernels take
`implementation='auto' | 'xla' | 'pallas' | 'mosaic'` (XL also 'cudnn'): 'pallas' is a fused,
tiled flash-attention style kernel in Pallas's Triton backend (`pallas_shaw`, `pallas_xl`,
shared parts in `pallas_common`), interpreted on CPU; 'mosaic' a causal one in Pallas Mosaic GPU
(`mosaic_shaw`, `mosaic_xl`; Hopper, bf16/fp16), used where the mask is causal and 'xla' or
'pallas' elsewhere (`mosaic_dispatch`); XL's 'cudnn' is its position term as the bias of
cuDNN's flash attention (`xl.xl_attention_cudnn`: bf16/fp16, no dropout, NVIDIA GPUs); 'auto'
is, on a GPU, whichever of 'xla', 'pallas' at a few tilings, (XL in bf16) 'cudnn' and (opted
in) 'mosaic' ran fastest forward and backward at the shapes of the call, timed on first use
and cached (`autotune`), and 'xla' elsewhere.

Position schemes that feed vanilla attention: T5's bucketed relative bias
(`t5_relative_bias`) and ALiBi's linear bias (`alibi_bias`), both [heads, q_len, kv_len]
logit biases passed as `dot_product_attention(..., bias=...)`, and RoPE (`apply_rope`), which
rotates queries and keys by their absolute positions before the dot product.
"""

from relpos.attention.alibi import alibi_bias, alibi_slopes
from relpos.attention.dot_product import dot_product_attention
from relpos.attention.masking import causal_mask, with_causal
from relpos.attention.rope import apply_rope
from relpos.attention.shaw import (
  relative_buckets,
  shaw_attention,
  shaw_attention_banded,
  shaw_attention_materialized,
)
from relpos.attention.sinusoid import sinusoidal_embedding, xl_relative_encoding
from relpos.attention.t5 import t5_relative_bias, t5_relative_buckets
from relpos.attention.xl import relative_shift, xl_attention

__all__ = [
  'alibi_bias',
  'alibi_slopes',
  'apply_rope',
  'causal_mask',
  'dot_product_attention',
  'relative_buckets',
  'relative_shift',
  'shaw_attention',
  'shaw_attention_banded',
  'shaw_attention_materialized',
  'sinusoidal_embedding',
  't5_relative_bias',
  't5_relative_buckets',
  'xl_attention',
  'xl_relative_encoding',
  'with_causal',
]
