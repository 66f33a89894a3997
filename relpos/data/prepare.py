"""Downloads and prepares a corpus for the configs that read it.

    python -m relpos.data.prepare tatoeba --out=data/                 # fetches deu-eng.zip
    python -m relpos.data.prepare tatoeba --out=data/ --zip=deu-eng.zip   # a copy you have

`tatoeba` writes `<out>/tatoeba_ende/{train,dev,test}.{en,de}.gz` and `SOURCE.json` (the
export's md5, the pair counts, the licence): see `relpos.data.tatoeba`. configs/translate_tiny.py
reads `data/tatoeba_ende` of the repository (or the copy in ../shared/data when it exists).
"""

import sys

from absl import app, flags

from relpos.data import tatoeba

_OUT = flags.DEFINE_string('out', 'data', 'Directory the corpus directory is written under.')
_ZIP = flags.DEFINE_string('zip', None, f'A local deu-eng.zip instead of fetching {tatoeba.URL}.')


def main(argv):
  if len(argv) != 2 or argv[1] != 'tatoeba':
    sys.exit('error: name the corpus to prepare: python -m relpos.data.prepare tatoeba --out=DIR')
  zip_path = _ZIP.value
  try:
    if zip_path is None:
      print(f'downloading {tatoeba.URL} ...', flush=True)
      zip_path = tatoeba.download(_OUT.value)
    directory = tatoeba.prepare(zip_path, _OUT.value)
  except (OSError, ValueError) as error:
    sys.exit(f'error: {error}')
  print((directory / 'SOURCE.json').read_text().strip())
  print(f'prepared {directory}')


if __name__ == '__main__':
  app.run(main)
