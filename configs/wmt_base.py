"""Transformer base on WMT14 en-de, as in Shaw et al. 2018 (absolute or relative positions).

    python train.py --config=configs/wmt_base.py:shaw --workdir=runs/wmt_base_shaw
    python eval.py --config=configs/wmt_base.py:shaw --workdir=runs/wmt_base_shaw  # bleu=...

Presets (relpos.constants.TRANSLATE_POSITIONS): shaw | absolute | learned | shaw_absolute |
none | t5 | alibi | rope; Table 3 ablations with --config.model.relative_values=False (or
relative_keys). Data: tensorflow-datasets
`wmt14_translate/de-en`, read without TensorFlow from --config.data.tfds_data_dir=DIR, which
needs once (with internet) `pip install tensorflow tensorflow-datasets && tfds build
wmt14_translate/de-en --data_dir=DIR --file_format=array_record`; evaluation on newstest2014
(the 'test' split). The paper trained 100k steps
on 8 GPUs with about 25k source and 25k target tokens per batch and averaged checkpoints:
set config.data.max_tokens to the per-step budget of your hardware.
"""

from relpos.config import unknown_preset
from relpos.config.translation_defaults import translate_config
from relpos.constants import TRANSLATE_POSITIONS


def get_config(position: str = 'shaw'):
  if position not in TRANSLATE_POSITIONS:
    raise unknown_preset(position, TRANSLATE_POSITIONS)
  config = translate_config()
  config.model.position = position
  config.eval.average_checkpoints = 5
  return config
