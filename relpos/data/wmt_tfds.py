"""WMT translation pairs from a tensorflow-datasets copy prepared in the array_record format.

Reading needs `tensorflow_datasets` but not TensorFlow: the serialized records come from the
random-access data source (`as_data_source`) and are parsed here as `tf.train.Example` protos
with tfds's own copy of the proto, in one pass per record rather than tfds's per-feature
decoding, which matters for WMT14's 4.5M pairs. Preparing the copy once does need TensorFlow
and internet (PREPARE_HINT). Known names: 'wmt14_translate/de-en' (newstest2014 is its 'test'
split) and 'wmt_t2t_translate/de-en' (tensor2tensor's training data).
"""

from absl import logging

from relpos.data import parallel_text
from relpos.data.shard import ONE_PROCESS, Shard

PREPARE_HINT = (
  'prepare it once, on a machine with internet, with `pip install tensorflow '
  'tensorflow-datasets && tfds build {name} --data_dir={data_dir} --file_format=array_record` '
  '(this project never imports TensorFlow; the prepared directory can be copied)'
)
READ_CHUNK = 10_000  # records decoded per data-source call


def open_split(name: str, split: str, *, data_dir, languages: tuple[str, str]):
  """The serialized records (bytes) of `split` of the prepared dataset `name` under data_dir.

  Args:
    name: 'dataset/config', e.g. 'wmt14_translate/de-en'.
    split: a split name or slice, e.g. 'train', 'test', 'train[:1000]'.
    data_dir: the tfds data directory (None: tfds's default, ~/tensorflow_datasets).
    languages: the language codes the records must hold, e.g. ('en', 'de').
  Raises:
    FileNotFoundError: `name` is not prepared under data_dir.
    ValueError: it was prepared in a format without random access (not array_record), or
      its records lack one of `languages`.
  """
  import tensorflow_datasets as tfds  # only kind='tfds' pays for this import

  hint = PREPARE_HINT.format(name=name, data_dir=data_dir or '~/tensorflow_datasets')
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    builder = None
  if builder is None or not builder.is_prepared():
    raise FileNotFoundError(
      f'{name} is not prepared in config.data.tfds_data_dir={data_dir!r}; {hint}'
    )
  available = tuple(builder.info.features.keys())
  missing = [lang for lang in languages if lang not in available]
  if missing:
    raise ValueError(
      f'{name} has languages {available}, not {missing}; set config.data.source_lang / '
      'config.data.target_lang to languages it has'
    )
  try:
    return builder.as_data_source(
      split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
    )
  except NotImplementedError:
    raise ValueError(
      f'{name} in {data_dir} was prepared as {builder.info.file_format}, which has no random '
      f'access; {hint}'
    ) from None


def parse_pair(record: bytes, source_lang: str, target_lang: str) -> tuple[str, str]:
  """(source, target) text of a serialized translation `tf.train.Example`."""
  from tensorflow_datasets.proto import tf_example_pb2

  feature = tf_example_pb2.Example.FromString(record).features.feature
  return (
    feature[source_lang].bytes_list.value[0].decode('utf-8'),
    feature[target_lang].bytes_list.value[0].decode('utf-8'),
  )


def _records(source, indices: range):
  """Yields the records `indices` of `source` in order, decoding READ_CHUNK at a time."""
  for start in range(0, len(indices), READ_CHUNK):
    yield from source.__getitems__(list(indices[start : start + READ_CHUNK]))


def read_tfds_pairs(
  name: str,
  split: str,
  *,
  data_dir,
  source_lang: str,
  target_lang: str,
  limit: int = 0,
  shard: Shard = ONE_PROCESS,
) -> tuple[list[str], list[str]]:
  """(source sentences, target sentences) of a prepared tfds translation dataset split.

  Only `shard`'s records are read, after a line saying how many where they are many
  (`parallel_text.ANNOUNCED_PAIRS`). Pairs with an empty side are dropped (and counted in the
  log); `limit` > 0 keeps the first `shard.limit(limit)` remaining pairs and reads no further.
  Raises as `open_split`.
  """
  source = open_split(name, split, data_dir=data_dir, languages=(source_lang, target_lang))
  indices = shard.records(len(source))
  logging.info('reading %s %s: %d of %d records', name, split, len(indices), len(source))
  if len(indices) >= parallel_text.ANNOUNCED_PAIRS:  # WMT14's 4.5M: its first long phase
    print(f'reading {len(indices):,} pairs of {name} split {split}', flush=True)
  pairs = (parse_pair(record, source_lang, target_lang) for record in _records(source, indices))
  return parallel_text.keep_nonempty(
    pairs, limit=shard.limit(limit), name=f'{name} {split}', numbers=indices, unit='record'
  )
