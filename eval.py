"""Evaluate a trained model from its workdir.

    python eval.py --config=configs/<name>.py --workdir=/tmp/run [--config.key=value ...]

No model has landed yet (see README): this parses its flags and says so.
"""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory holding the checkpoints.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  raise SystemExit(
    'eval.py: not yet: no model has landed (BLEU and bits-per-char evaluation are open issues).'
  )


if __name__ == '__main__':
  app.run(main)
