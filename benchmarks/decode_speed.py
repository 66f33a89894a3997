"""Beam-search decoding speed of a finished translation run: sentences/s over its eval set.

    python benchmarks/decode_speed.py --workdir=runs/toy_shaw            # 1000 sentences
    python benchmarks/decode_speed.py --workdir=runs/toy_shaw --sentences=200 --rounds=1

Translates the first `--sentences` of the run's eval set with the run's own eval settings
(beam size, length penalty, decoding batch, max_decode_extra) and its last checkpoint, as
`eval.py` does, and reports sentences/s and target pieces/s. The first pass includes
compilation (one beam search per padded source length; the persistent compilation cache
shortens it on later runs), the following `--rounds` passes are warm and their median is the
figure. Speed depends on the model: a search runs until no hypothesis can still win, so a run
that has learned to stop early decodes faster. Compare code versions on the same workdir.
"""

import statistics
import time

from absl import flags

from relpos import runtime, scoring
from relpos.cli import run_main
from relpos.data.translation import load_eval_data
from relpos.training import translation_task as task

flags.DEFINE_string('workdir', None, 'A finished translation run (train.py workdir).')
flags.DEFINE_integer(
  'sentences', 1000, 'How many eval-set sentences to translate (0: all).', lower_bound=0
)
flags.DEFINE_integer(
  'rounds', 2, 'Warm passes after the first; the median is reported.', lower_bound=1
)
flags.mark_flag_as_required('workdir')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  # As relpos.tools.translate reads a run (`Task.trained_model`), each fault refused as one
  # line by run_main.
  trained = task.TASK.trained_model(
    FLAGS.workdir, needs="benchmarks/decode_speed.py decodes runs of task 'translate'"
  )
  config, model, steps = trained.config, trained.model, trained.steps
  data = load_eval_data(config.data, FLAGS.workdir)
  count = FLAGS.sentences or len(data.eval_sources)
  sources, references = data.eval_sources[:count], data.eval_references[:count]

  def translate():
    start = time.perf_counter()
    translations = task.translate_sentences(
      model, data.tokenizer, sources, config.eval, max_len=config.model.max_len
    )
    return translations, time.perf_counter() - start

  translations, first = translate()
  warm = statistics.median(translate()[1] for _ in range(FLAGS.rounds))
  pieces = sum(len(data.tokenizer.encode(line)) for line in translations)
  bleu = scoring.corpus_bleu(translations, references, target_lang=config.data.target_lang).score
  print(
    f'{FLAGS.workdir} (step {steps[-1]}, position {config.model.position}): {len(sources)} '
    f'sentences, beam {config.eval.beam_size}, batch {config.eval.batch_size}, '
    f'max_decode_extra {config.eval.max_decode_extra}'
  )
  print('| first pass s | warm pass s | sentences/s | target pieces/s | BLEU |')
  print('|---|---|---|---|---|')
  print(
    f'| {first:.1f} | {warm:.1f} | {len(sources) / warm:.1f} | {pieces / warm:.0f} | {bleu:.2f} |'
  )


if __name__ == '__main__':
  runtime.apply_defaults()
  run_main(main)
