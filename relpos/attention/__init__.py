"""Pure functional attention kernels: vanilla, Shaw et al. 2018 and Transformer-XL.

All take query [batch, q_len, heads, head_dim] and key/value [batch, kv_len, heads, head_dim],
an optional bool mask broadcastable to [batch, heads, q_len, kv_len] (True = may attend), and
return [batch, q_len, heads, head_dim]. Softmax and matmul sums run in float32 (float64 for
float64 inputs); bf16 inputs stay bf16 in the matmuls.
"""

from relpos.attention.dot_product import dot_product_attention
from relpos.attention.masking import causal_mask
from relpos.attention.shaw import relative_buckets, shaw_attention, shaw_attention_materialized
from relpos.attention.sinusoid import sinusoidal_embedding, xl_relative_encoding
from relpos.attention.xl import relative_shift, xl_attention

__all__ = [
  'causal_mask',
  'dot_product_attention',
  'relative_buckets',
  'relative_shift',
  'shaw_attention',
  'shaw_attention_materialized',
  'sinusoidal_embedding',
  'xl_attention',
  'xl_relative_encoding',
]
