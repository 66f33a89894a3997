"""Train a model from a config file.

    python train.py --config=configs/<name>.py --workdir=/tmp/run [--config.key=value ...]

No model has landed yet (see README): this parses its flags and says so.
"""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  raise SystemExit(
    'train.py: not yet: no model has landed (translation and Transformer-XL '
    'training are open issues). The kernels and their benchmark work today: '
    'python benchmarks/attention.py --config=configs/attention_benchmark.py:quick'
  )


if __name__ == '__main__':
  app.run(main)
