"""Constants shared across the package: the largest integer a size may be, the special token
ids of every vocabulary, the position schemes each model offers (`config.model.position`) and
what each does to self-attention (`self_attention_kind`), which the models, their config's
checks and the FLOP counts read."""

# The largest integer a config field or an integer flag may hold unless its rule says otherwise:
# JAX computes in int32 (x64 off), so a larger size, length or count would overflow (an
# OverflowError deep in a jitted call, or a silent wrap: a decode limit of 2**31 - 1 plus a
# length went negative).
INT32_MAX = 2**31 - 1

# SentencePiece ids fixed in every vocabulary relpos trains (relpos.data.tokenizer).
PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3

# Translation (relpos.models.transformer): sinusoids, a learned table, Shaw et al.'s clipped
# relative tables, both (paper section 4.3), none, T5's bucketed bias, ALiBi or RoPE.
TRANSLATE_POSITIONS = (
  'absolute',
  'learned',
  'shaw',
  'shaw_absolute',
  'none',
  't5',
  'alibi',
  'rope',
)
# Character LM (relpos.models.transformer_xl): Transformer-XL's relative encoding, Shaw's
# tables, sinusoids within the segment, none, T5's bucketed bias, ALiBi or RoPE.
CHAR_LM_POSITIONS = ('xl', 'shaw', 'absolute', 'none', 't5', 'alibi', 'rope')
# The positions that read Shaw's k and tables, in either model.
SHAW_POSITIONS = ('shaw', 'shaw_absolute')
# Positions that add a logit bias of the distance, computed once per stack of layers
# (`relpos.models.multihead_attention.RelativeBias`); their attention layers are plain.
BIAS_POSITIONS = ('t5', 'alibi')


def self_attention_kind(position: str) -> str:
  """The relative kind of a self-attention layer under `config.model.position`: 'shaw'
  (SHAW_POSITIONS), 'xl', 'rope', or 'none' (absolute, learned, no positions, and
  BIAS_POSITIONS, whose bias the stack adds)."""
  if position in SHAW_POSITIONS:
    return 'shaw'
  return position if position in ('xl', 'rope') else 'none'
