"""Downloads and prepares a corpus for the configs that read it.

    python -m relpos.data.prepare tatoeba --out=data/                 # fetches deu-eng.zip
    python -m relpos.data.prepare tatoeba --out=data/ --zip=deu-eng.zip   # a copy you have
    python -m relpos.data.prepare enwik8 --out=data/                  # fetches enwik8.zip

`tatoeba` writes `<out>/tatoeba_ende/{train,dev,test}.{en,de}.gz` and `SOURCE.json` (the
export's md5, the pair counts, the licence): see `relpos.data.tatoeba`. configs/translate_tiny.py
reads `data/tatoeba_ende` of the repository, or `$RELPOS_DATA_DIR/tatoeba_ende` where that
variable is set (`relpos.data.data_directory`, also `--out`'s default). `enwik8` writes
`<out>/enwik8.zip`, checked by size and md5 before it is put in place (`relpos.data.enwik8`):
with the default --out, where config.data.path of the char LM (configs/enwik8_*.py) points.
"""

import pathlib
import sys

from absl import app, flags

from relpos.data import data_directory, enwik8, tatoeba
from relpos.data.download import DownloadError

_OUT = flags.DEFINE_string(
  'out', str(data_directory()), 'Directory the corpus directory is written under.'
)
_ZIP = flags.DEFINE_string('zip', None, f'A local deu-eng.zip instead of fetching {tatoeba.URL}.')
CORPORA = ('tatoeba', 'enwik8')


def _tatoeba(out: str) -> None:
  zip_path = _ZIP.value
  if zip_path is None:
    print(f'downloading {tatoeba.URL} ...', flush=True)
    zip_path = tatoeba.download(out)
  directory = tatoeba.prepare(zip_path, out)
  print((directory / 'SOURCE.json').read_text().strip())
  print(f'prepared {directory}')


def _enwik8(out: str) -> None:
  print(f'downloading {enwik8.ENWIK8_URL} ...', flush=True)
  print(f'prepared {enwik8.download_enwik8(out)}')


def _elsewhere(corpus: str, out: str) -> str:
  """Where `corpus` can come from when this machine cannot download it."""
  if corpus == 'tatoeba':
    return 'download it on a machine that can and pass the file as --zip=<deu-eng.zip>'
  return f'download it on a machine that can and put it at {pathlib.Path(out) / enwik8.ARCHIVE}'


def _check_out(out: str) -> list[pathlib.Path]:
  """Makes the --out directory and returns the directories it made, innermost first (what a
  failed prepare removes again, if still empty); exits with one line if it cannot be one."""
  path = pathlib.Path(out)
  if path.exists() and not path.is_dir():
    sys.exit(f'error: --out={out} is a file, not a directory; give a directory (a new one is made)')
  made = [p for p in (path, *path.parents) if not p.exists()]
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as error:
    sys.exit(f'error: cannot make --out={out} ({error.strerror}); give a writable directory')
  return made


def _remove_if_empty(directories: list[pathlib.Path]) -> None:
  """Removes each of `directories` (innermost first) that is empty: a failed prepare leaves no
  directory it made."""
  for directory in directories:
    try:
      directory.rmdir()
    except OSError:
      return


def _corpus_problem(names: list[str]) -> str | None:
  """One line for positional arguments that do not name one corpus of CORPORA (none, an
  unknown one, more than one); None where they do."""
  usage = 'python -m relpos.data.prepare tatoeba --out=DIR'
  known = ' or '.join(CORPORA)
  if not names:
    return f'name the corpus to prepare ({known}): {usage}'
  if len(names) > 1:
    return f'name one corpus to prepare ({known}), not {" ".join(names)}: {usage}'
  if names[0] not in CORPORA:
    return f'unknown corpus {names[0]!r}: this prepares {known} ({usage})'
  return None


def main(argv):
  if problem := _corpus_problem(argv[1:]):
    sys.exit(f'error: {problem}')
  corpus, out = argv[1], _OUT.value
  made = _check_out(out)
  try:
    (_tatoeba if corpus == 'tatoeba' else _enwik8)(out)
  except DownloadError as error:
    _remove_if_empty(made)
    sys.exit(f'error: {error}; check the network, or {_elsewhere(corpus, out)}')
  except (OSError, ValueError) as error:
    _remove_if_empty(made)
    sys.exit(f'error: {error}')


if __name__ == '__main__':
  app.run(main)
