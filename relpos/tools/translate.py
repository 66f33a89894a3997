"""Translates text with a trained translation run: its checkpoint, vocabulary and config.

    echo "I like green tea." | python -m relpos.tools.translate --workdir=runs/tiny_shaw
    python -m relpos.tools.translate --workdir=runs/tiny_shaw --text="Where is the station?"
    python -m relpos.tools.translate --workdir=runs/tiny_shaw --beam_size=1 < sentences.txt
    python -m relpos.tools.translate --workdir=runs/tiny_shaw --step=600 --text="Danke."

Reads the run's config.json, spm.model and checkpoint: the one its config.eval names (step,
average_checkpoints, as eval.py reads them), or `--step` and `--average_checkpoints` (the
mean of the last N checkpoints up to that step), then prints one translation per input line, in
order: each `--text`, or else every line of stdin (an empty line gives an empty line; no
sentence at all is refused). A workdir that does not exist, is not a
translation run or has no checkpoint yet is one line, exit 1.
"""

import sys

from absl import app, flags

from relpos import runtime


def translate_lines(
  workdir,
  lines: list[str],
  *,
  beam_size: int | None = None,
  step: int | None = None,
  average_checkpoints: int | None = None,
) -> list[str]:
  """Translations of `lines` by the run in `workdir`, with its config.eval but for those given
  (`beam_size`, the checkpoint `step`, `average_checkpoints`; None: the run's own).

  Raises:
    FileNotFoundError: no run, no vocabulary or no checkpoint in `workdir`.
    ValueError: the run is not a translation run; its spm.model changed since it trained
      (`data_record.check_vocabulary`).
  """
  from relpos.training import translation_task as translate  # after the runtime defaults

  def check_beam(config):  # --beam_size against the run's vocabulary, before its checkpoint
    if beam_size is not None:
      translate.check_beam_size(beam_size, config.data.vocab_size, '--beam_size')
      config.eval.beam_size = beam_size
    check_checkpoints(workdir, step, average_checkpoints)
    if step is not None:
      config.eval.step = step
    if average_checkpoints is not None:
      config.eval.average_checkpoints = average_checkpoints

  trained = translate.TASK.trained_model(
    workdir, needs="relpos.tools.translate reads runs of task 'translate'", prepare=check_beam
  )
  config = trained.config
  return translate.translate_sentences(
    trained.model, trained.vocab, lines, config.eval, max_len=config.model.max_len
  )


def check_checkpoints(workdir, step: int | None, average: int | None) -> None:
  """Refuses `--step` where the run kept no such checkpoint, and `--average_checkpoints` beyond
  those it kept up to the step, as the restore refuses config.eval's fields but naming the
  flags (this tool takes no config.eval flag), before the model is built; a run with no
  checkpoint is left to the restore's 'train first'."""
  from relpos.training.checkpoints import CHECKPOINTS, finished_steps
  from relpos.training.restore import check_step, steps_to_average

  steps = finished_steps(workdir)
  if not steps:
    return
  where = f'{workdir}/{CHECKPOINTS}'
  if step is not None:
    check_step(steps, step, where, '--step')
  if average is not None:
    steps_to_average(steps, step or steps[-1], average, where, '--average_checkpoints')


def read_sentences(texts: list[str] | None, stdin) -> list[str]:
  """The sentences to translate: each of `texts` (--text), else each line of `stdin` (a binary
  file), read as UTF-8 as the data files are (`relpos.data.data_file.decode_utf8`).

  Bytes that are not UTF-8 would reach SentencePiece as surrogates (Python's escape for them
  in argv) and fail there in a C++ cast; they are refused here, naming stdin or --text, the
  line (for --text: which value, in order) and the byte.

  Raises:
    ValueError: the text is not valid UTF-8.
  """
  from relpos.data.data_file import decode_utf8  # imported after the runtime defaults
  from relpos.files import split_lines

  if texts:
    decode_utf8('\n'.join(texts).encode('utf-8', 'surrogateescape'), '--text')
    return texts
  text = decode_utf8(stdin.read(), 'stdin')
  return split_lines(text) if text else []


def main(argv):
  if len(argv) > 1:
    sys.exit(f'error: unexpected arguments {argv[1:]}: pass sentences with --text or stdin')
  from relpos.cli import FAULTS, exit_for_fault, quiet_logging

  quiet_logging()
  args = flags.FLAGS
  try:
    lines = read_sentences(args.text, sys.stdin.buffer)
    if not any(line.strip() for line in lines):
      sys.exit('error: nothing to translate: give sentences with --text or one a line on stdin')
    translations = translate_lines(
      args.workdir,
      lines,
      beam_size=args.beam_size,
      step=args.step,
      average_checkpoints=args.average_checkpoints,
    )
  except (FileNotFoundError, ValueError) as error:
    sys.exit(f'error: {error}')
  except FAULTS as fault:  # a run training there now, before its first checkpoint: exit 75
    exit_for_fault(fault)
  print('\n'.join(translations))


def define_flags():
  """The command-line flags (defined only when run as a program, so importing is free)."""
  flags.DEFINE_string('workdir', None, "The workdir of a run of task 'translate'.")
  flags.DEFINE_multi_string('text', None, 'A sentence to translate (repeatable).')
  flags.DEFINE_integer(
    'beam_size', None, "Beam width (default: the run's config.eval).", lower_bound=1
  )
  flags.DEFINE_integer(
    'step',
    None,
    "The checkpoint's step (default: the run's config.eval, or the newest).",
    lower_bound=1,
  )
  flags.DEFINE_integer(
    'average_checkpoints',
    None,
    "The mean of the last N checkpoints (up to --step) (default: the run's config.eval).",
    lower_bound=1,
  )
  flags.mark_flag_as_required('workdir')


if __name__ == '__main__':
  runtime.apply_defaults()
  define_flags()
  from relpos.config.command_line import parse_flags

  app.run(main, flags_parser=parse_flags)
