"""Evaluate the latest checkpoint of a workdir; the last line printed is the metric.

python eval.py --config=configs/char_tiny.py --workdir=runs/char_tiny   # ... bpc=<float>
"""

from absl import app, flags, logging
from ml_collections import config_flags

from relpos.training import tasks

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory holding the checkpoints.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:  # orbax logs many INFO lines per checkpoint
    logging.set_verbosity(logging.WARNING)
  tasks.print_result(tasks.get(_CONFIG.value).evaluate(_CONFIG.value, _WORKDIR.value))


if __name__ == '__main__':
  app.run(main)
