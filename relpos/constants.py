"""Constants shared across the package: the special token ids of every vocabulary and the
position schemes each model offers (`config.model.position`)."""

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
