"""relpos.data.tatoeba and `python -m relpos.data.prepare tatoeba`, on a zip each test builds."""

import gzip
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import load_config

from relpos.data import tatoeba, translation

ROOT = Path(__file__).resolve().parent.parent


def _normalised(sentence):
  return ' '.join(sentence.lower().split())


def _bucket(english):
  return int(hashlib.sha1(_normalised(english).encode()).hexdigest(), 16) % 100


def _export_lines():
  """Tab-separated lines like the export's: several German translations per English sentence,
  an English sentence twice with other spacing and case, a blank line, a third column (newer
  exports carry an attribution there), and German sentences that recur across groups."""
  lines = []
  for i in range(400):
    english = f'Sentence number {i} is here.'
    lines.append(f'{english}\tSatz Nummer {i} ist hier.\tCC-BY 2.0 (France) Attribution')
    if i % 3 == 0:
      lines.append(f'{english}\tDer Satz {i} ist da.')
    if i % 7 == 0:
      lines.append(f'  {english.upper()}  \tEin gemeinsamer Satz.')  # recurs across groups
  lines += ['', 'no tab here', '\tno English', 'No German\t']
  return lines


def _zip(tmp_path, lines, name='deu-eng.zip'):
  path = tmp_path / name
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr(tatoeba.MEMBER, '\n'.join(lines) + '\n')
    archive.writestr('_about.txt', 'about')
  return path


def _read(path):
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return f.read().split('\n')[:-1]


def test_prepare_splits_by_english_group_and_drops_seen_references(tmp_path):
  directory = tatoeba.prepare(_zip(tmp_path, _export_lines()), tmp_path / 'data')
  assert directory == tmp_path / 'data' / 'tatoeba_ende'
  splits = {}
  for name in tatoeba.SPLITS:
    english, german = (_read(p) for p in tatoeba.split_files(directory, name))
    assert len(english) == len(german) > 0
    splits[name] = list(zip(english, german, strict=True))
  # Every pair with both sides is somewhere, in the split its English group hashes to, except
  # dev/test pairs whose German also occurs in train.
  train_german = {_normalised(de) for _, de in splits['train']}
  for english, _ in splits['train']:
    assert _bucket(english) >= 4
  for name, buckets in (('dev', {0, 1}), ('test', {2, 3})):
    for english, german in splits[name]:
      assert _bucket(english) in buckets and _normalised(german) not in train_german
  kept = sum(len(split) for split in splits.values())
  pairs = tatoeba.read_pairs('\n'.join(_export_lines()))
  dropped = [
    (en, de)
    for en, de in pairs
    if _bucket(en) < 4 and _normalised(de) in {_normalised(d) for e, d in pairs if _bucket(e) >= 4}
  ]
  assert kept == len(pairs) - len(dropped) and len(pairs) == 400 + 134 + 58
  assert dropped  # the shared German sentence is dropped from dev/test
  source = json.loads((directory / 'SOURCE.json').read_text())
  assert source['pairs'] == {name: len(split) for name, split in splits.items()}
  assert source['zip_md5'] == hashlib.md5((tmp_path / 'deu-eng.zip').read_bytes()).hexdigest()
  assert not source['reference_export'] and 'CC-BY 2.0' in source['licence']


def test_prepare_is_reproducible_to_the_byte(tmp_path):
  zip_path = _zip(tmp_path, _export_lines())
  first = tatoeba.prepare(zip_path, tmp_path / 'a')
  second = tatoeba.prepare(zip_path, tmp_path / 'b')
  for name in tatoeba.SPLITS:
    for a, b in zip(
      tatoeba.split_files(first, name), tatoeba.split_files(second, name), strict=True
    ):
      assert a.read_bytes() == b.read_bytes()
  # Preparing again replaces the directory whole, leaving no staging directory behind.
  tatoeba.prepare(zip_path, tmp_path / 'a')
  assert sorted(p.name for p in (tmp_path / 'a').iterdir()) == ['tatoeba_ende']


def test_prepare_refuses_what_is_not_an_export(tmp_path):
  with pytest.raises(FileNotFoundError, match='download https://www.manythings.org'):
    tatoeba.prepare(tmp_path / 'absent.zip', tmp_path / 'data')
  (tmp_path / 'text.zip').write_text('not a zip')
  with pytest.raises(ValueError, match='not a Tatoeba export.*; download https:'):
    tatoeba.prepare(tmp_path / 'text.zip', tmp_path / 'data')
  with pytest.raises(ValueError, match='no tab-separated'):
    tatoeba.prepare(_zip(tmp_path, ['no tabs at all'], 'empty.zip'), tmp_path / 'data')
  assert not (tmp_path / 'data' / 'tatoeba_ende').exists()


def test_prepare_refuses_an_export_too_small_for_dev_and_test(tmp_path):
  """Three pairs gave dev 0 and test 0 pairs, and the first training run failed (P5)."""
  lines = ['Hi.\tHallo!', 'Run!\tLauf!', 'Wow!\tPotzdonner!']
  with pytest.raises(
    ValueError, match=r'gives no dev and no test pairs \(train 3, dev 0, test 0\)'
  ):
    tatoeba.prepare(_zip(tmp_path, lines), tmp_path / 'data')
  assert not (tmp_path / 'data' / 'tatoeba_ende').exists()


def test_prepare_reads_bom_and_crlf_and_names_a_file_not_utf8(tmp_path):
  """A BOM was kept in the first English sentence (P6); Latin-1 gave Python's codec message
  with no file named (P4)."""
  lines = _export_lines()
  path = tmp_path / 'deu-eng.zip'
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr(tatoeba.MEMBER, ('\ufeff' + '\r\n'.join(lines) + '\r\n').encode())
  directory = tatoeba.prepare(path, tmp_path / 'data')
  kept = [line for name in tatoeba.SPLITS for line in _read(directory / f'{name}.en.gz')]
  kept += [line for name in tatoeba.SPLITS for line in _read(directory / f'{name}.de.gz')]
  assert 'Sentence number 0 is here.' in kept
  assert not [line for line in kept if '\ufeff' in line or '\r' in line]
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr(tatoeba.MEMBER, 'Hello.\tHallo.\nGood.\tGr\u00fc\u00dfe.\n'.encode('latin-1'))
  with pytest.raises(ValueError, match=r'deu\.txt in \S*deu-eng\.zip line 2 is not valid UTF-8'):
    tatoeba.prepare(path, tmp_path / 'data')


def test_the_prepared_directory_follows_the_umask(tmp_path):
  """tempfile.mkdtemp's 0700 stayed on the prepared directory: others on a shared data
  directory could not read it."""
  old = os.umask(0o022)
  try:
    directory = tatoeba.prepare(_zip(tmp_path, _export_lines()), tmp_path / 'data')
  finally:
    os.umask(old)
  assert stat.S_IMODE(directory.stat().st_mode) == 0o755


def test_prepare_command_line(tmp_path):
  zip_path = _zip(tmp_path, _export_lines())
  command = [sys.executable, '-m', 'relpos.data.prepare', 'tatoeba', f'--out={tmp_path / "d"}']
  done = subprocess.run(
    [*command, f'--zip={zip_path}'], capture_output=True, text=True, cwd=ROOT, timeout=60
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip().endswith(f'prepared {tmp_path / "d" / "tatoeba_ende"}')
  failed = subprocess.run(
    [*command, f'--zip={tmp_path / "absent.zip"}'], capture_output=True, text=True, cwd=ROOT
  )
  assert failed.returncode == 1 and failed.stderr.strip().startswith('error: --zip=')
  assert 'Traceback' not in failed.stderr
  # A failed prepare into new directories leaves none of them; an existing --out stays.
  new_out = tmp_path / 'new' / 'nested'
  failed = subprocess.run(
    [*command[:-1], f'--out={new_out}', f'--zip={tmp_path / "absent.zip"}'],
    capture_output=True,
    text=True,
    cwd=ROOT,
  )
  assert failed.returncode == 1 and not (tmp_path / 'new').exists()
  assert (tmp_path / 'd' / 'tatoeba_ende').is_dir()


def test_prepare_command_line_names_out_and_the_url(tmp_path):
  """--out naming a file gave `[Errno 17] File exists` (P7); no network gave urllib's
  `<urlopen error ...>` with no URL and no other way (P8). The download is refused here by a
  proxy that is not there."""
  (tmp_path / 'afile').write_text('')
  command = [sys.executable, '-m', 'relpos.data.prepare', 'tatoeba']
  env = {**os.environ, 'https_proxy': 'http://127.0.0.1:9', 'no_proxy': ''}
  lines = {}
  for name, out in (('file', tmp_path / 'afile'), ('offline', tmp_path / 'd')):
    done = subprocess.run(
      [*command, f'--out={out}'], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert done.returncode == 1 and 'Traceback' not in done.stderr
    lines[name] = done.stderr.strip().splitlines()[-1]
  assert lines['file'] == f'error: --out={tmp_path / "afile"} is a file, not a directory; ' + (
    'give a directory (a new one is made)'
  )
  assert lines['offline'].startswith(f'error: cannot download {tatoeba.URL} (')
  assert lines['offline'].endswith('pass the file as --zip=<deu-eng.zip>')
  assert not (tmp_path / 'd').exists()  # the failed prepare removed the --out it made


def test_a_config_without_the_prepared_corpus_names_the_prepare_command(tmp_path):
  config = load_config('translate_tiny', 'shaw')
  train_src, train_tgt = tatoeba.split_files(tmp_path / 'tatoeba_ende', 'train')
  config.data.update(train_src=str(train_src), train_tgt=str(train_tgt))
  with pytest.raises(FileNotFoundError, match=r'python -m relpos\.data\.prepare tatoeba'):
    translation.read_pairs(config.data, 'train')


def test_the_overfit_config_memorises_toy_ende_not_translate_tiny_s_tatoeba():
  """It once followed translate_tiny's data to Tatoeba, whose first 200 pairs are too short
  for its 1000-piece vocabulary (SentencePiece refused)."""
  data = load_config('translate_overfit', 'shaw').data
  assert Path(data.train_src).parent.name == 'toy_ende'
  assert (data.eval_src, data.eval_tgt) == (data.train_src, data.train_tgt)
  assert Path(load_config('translate_tiny', 'shaw').data.train_src).parent.name != 'toy_ende'
