"""relpos.training.data_record: the data files a run trained on, and a resume or evaluation on
files changed since."""

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import tiny_char_config, write_word_corpus

from relpos.training import char_lm_task as char_lm
from relpos.training import data_record


def test_a_change_is_named_by_size_or_content_and_a_touch_is_not_one(tmp_path):
  text = tmp_path / 'a.txt'
  text.write_text('abcdef')
  files = {'config.data.path': text}
  assert data_record.changes(tmp_path, files) == []  # nothing recorded: an older run
  data_record.record(tmp_path, files)
  entry = json.loads((tmp_path / data_record.DATA_FILES).read_text())['config.data.path']
  assert (entry['path'], entry['bytes']) == (str(text), 6) and len(entry['sha256']) == 64
  assert data_record.changes(tmp_path, files) == []
  os.utime(text, ns=(1, 1))  # touched, or copied back: same bytes, other time
  assert data_record.changes(tmp_path, files) == []
  text.write_text('abcxyz')
  assert data_record.changes(tmp_path, files) == [
    f'config.data.path: {text} changed since the run trained on it (same size, other content)'
  ]
  text.write_text('abcdefgh')
  assert data_record.changes(tmp_path, files) == [
    f'config.data.path: {text} changed since the run trained on it (6 bytes then, 8 now)'
  ]
  # Another path for the field is a config change (config.json says so), and a file that is
  # gone is the data reader's to name: neither is compared here.
  assert data_record.changes(tmp_path, {'config.data.path': tmp_path / 'b.txt'}) == []
  text.unlink()
  assert data_record.changes(tmp_path, files) == []


def test_a_relative_path_resolving_to_another_file_is_named_as_one(tmp_path, monkeypatch):
  """A run trained in directory a on `data.txt`, checked from directory b: the file there is
  another one, and was said to have 'changed since the run trained on it (same size, other
  content)'. The record keeps the resolved path beside the one given (config.json keeps what
  was given), and the line names both files."""
  (tmp_path / 'a').mkdir()
  (tmp_path / 'b').mkdir()
  (tmp_path / 'a' / 'data.txt').write_text('abcdef')
  (tmp_path / 'b' / 'data.txt').write_text('uvwxyz')
  workdir = tmp_path / 'run'
  workdir.mkdir()
  files = {'config.data.path': Path('data.txt')}
  monkeypatch.chdir(tmp_path / 'a')
  data_record.record(workdir, files)
  entry = json.loads((workdir / data_record.DATA_FILES).read_text())['config.data.path']
  run_file = str(tmp_path.resolve() / 'a' / 'data.txt')
  assert (entry['path'], entry['resolved']) == ('data.txt', run_file)
  monkeypatch.chdir(tmp_path / 'b')
  assert data_record.changes(workdir, files) == [
    f"config.data.path: data.txt names another file than the run's (here "
    f'{tmp_path.resolve() / "b" / "data.txt"}; the run read {run_file}, resolved from where it '
    f'was started): run from the directory the run was started in, or give {run_file}'
  ]
  # The run's file by another path is compared as the run's file; a copy of it is its data.
  assert data_record.changes(workdir, {'config.data.path': Path(run_file)}) == []
  (tmp_path / 'b' / 'data.txt').write_text('abcdef')
  assert data_record.changes(workdir, files) == []
  # A record from before the resolved path was kept is matched by the path given, as then.
  entry.pop('resolved')
  (workdir / data_record.DATA_FILES).write_text(json.dumps({'config.data.path': entry}))
  (tmp_path / 'b' / 'data.txt').write_text('uvwxyz')
  assert data_record.changes(workdir, files) == [
    'config.data.path: data.txt changed since the run trained on it (same size, other content)'
  ]


def test_a_relative_link_pointed_elsewhere_names_the_link_and_both_files(tmp_path, monkeypatch):
  """`data.txt`, a symbolic link to a.txt when the run trained, pointed at b.txt since: the line
  said 'names another file ... run from the directory the run was started in', to a command run
  from that very directory. Now it names the link and both files; a link in a directory above
  the file is named as that link, and a file of its own in the link's place as such."""
  (tmp_path / 'a.txt').write_text('abcdef')
  (tmp_path / 'b.txt').write_text('uvwxyz')
  link = tmp_path / 'data.txt'
  link.symlink_to('a.txt')
  workdir = tmp_path / 'run'
  workdir.mkdir()
  files = {'config.data.path': Path('data.txt')}
  monkeypatch.chdir(tmp_path)
  data_record.record(workdir, files)
  then, now = tmp_path.resolve() / 'a.txt', tmp_path.resolve() / 'b.txt'
  link.unlink()
  link.symlink_to('b.txt')
  assert data_record.changes(workdir, files) == [
    f'config.data.path: data.txt reads {now} now: the symbolic link {tmp_path / "data.txt"} on '
    f'it points elsewhere since the run trained, when it led to {then}: point it back, or give '
    f'{then}'
  ]
  link.unlink()
  link.write_text('uvwxyz')
  assert data_record.changes(workdir, files) == [
    'config.data.path: data.txt is a file of its own now; when the run trained on it, it was a '
    f'symbolic link to {then}: give {then}, or make data.txt that link again'
  ]
  # A directory on the path that is a link, pointed at another directory since.
  for name in ('one', 'two'):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'd.txt').write_text(name)
  (tmp_path / 'corpus').symlink_to('one')
  files = {'config.data.path': Path('corpus/d.txt')}
  data_record.record(workdir, files)
  (tmp_path / 'corpus').unlink()
  (tmp_path / 'corpus').symlink_to('two')
  assert data_record.changes(workdir, files) == [
    f'config.data.path: corpus/d.txt reads {tmp_path.resolve() / "two" / "d.txt"} now: the '
    f'symbolic link {tmp_path / "corpus"} on it points elsewhere since the run trained, when it '
    f'led to {tmp_path.resolve() / "one" / "d.txt"}: point it back, or give '
    f'{tmp_path.resolve() / "one" / "d.txt"}'
  ]


def test_a_compressed_file_is_compared_by_the_text_it_reads_as(tmp_path):
  """A .gz compressed again (the same text, another header time) was 'changed since the run
  trained on it (same size, other content)' to a resume and to eval.py, and the plain file of
  the same text was other data: what the run reads, the decompressed text, is now recorded and
  compared too. A record made before it was (bytes only) still works."""
  plain = tmp_path / 'text8'
  plain.write_bytes(b'anarchism originated as a term of abuse ' * 50)
  packed = tmp_path / 'text8.gz'
  packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=1))
  files = {'config.data.path': packed}
  data_record.record(tmp_path, files)
  entry = json.loads((tmp_path / data_record.DATA_FILES).read_text())['config.data.path']
  assert entry['text_bytes'] == 2000 and len(entry['text_sha256']) == 64
  packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=2))  # same size, other bytes
  assert data_record.changes(tmp_path, files) == []
  packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1, mtime=3))
  assert data_record.changes(tmp_path, files) == []
  assert data_record.same_data(tmp_path, {'config.data.path': plain}) == {'config.data.path'}
  packed.write_bytes(gzip.compress(plain.read_bytes() + b'x', mtime=1))
  assert data_record.changes(tmp_path, files) == [
    f'config.data.path: {packed} changed since the run trained on it ('
    f'{entry["bytes"]:,} bytes then, {packed.stat().st_size:,} now)'
  ]
  # The plain file recorded, the same text compressed given: the same data both ways.
  record = tmp_path / 'plain_run'
  record.mkdir()
  data_record.record(record, {'config.data.path': plain})
  packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=4))
  assert data_record.same_data(record, files) == {'config.data.path'}
  # A record made before the text was (bytes only) matches its own bytes, as it did.
  del entry['text_bytes'], entry['text_sha256']
  packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=1))
  os.utime(packed, ns=(entry['mtime_ns'], entry['mtime_ns']))
  (tmp_path / data_record.DATA_FILES).write_text(json.dumps({'config.data.path': entry}))
  assert data_record.changes(tmp_path, files) == []


def test_a_file_read_as_lines_converted_to_crlf_is_the_same_data(tmp_path):
  """References converted to CRLF line endings (or back) read as the very same sentences to
  the translation reader, which its task says (`read_as_lines`), yet were 'changed since the
  run trained on it': eval.py refused to score the run into its workdir and a resume refused
  to go on. Such a file is recorded by its lines too; other lines are still a change, a file
  read as bytes (the character LM's) converted to CRLF is still one, and a record made before
  the lines were is compared by bytes, as it was, until a resume records them."""
  references = tmp_path / 'eval.de'
  references.write_bytes(b'rot Katze\nblau Hund\n')
  field = 'config.data.eval_tgt'
  files = {field: references}
  data_record.record(tmp_path, files, read_as_lines=[field])
  entry = json.loads((tmp_path / data_record.DATA_FILES).read_text())[field]
  assert entry['lines'] == 2 and len(entry['lines_sha256']) == 64
  references.write_bytes(b'rot Katze\r\nblau Hund\r\n')
  assert data_record.changes(tmp_path, files) == []
  crlf_copy = tmp_path / 'copy.de'
  crlf_copy.write_bytes(gzip.compress(references.read_bytes()))  # compressed, CRLF: its lines
  assert data_record.same_data(tmp_path, {field: crlf_copy}) == {field}
  references.write_bytes(b'rot Katze\nblau Hahn\n')
  assert data_record.changes(tmp_path, files) == [
    f'{field}: {references} changed since the run trained on it (same size, other content)'
  ]
  # A file its task reads as bytes: CRLF is other data.
  as_bytes = tmp_path / 'bytes_run'
  as_bytes.mkdir()
  references.write_bytes(b'rot Katze\nblau Hund\n')
  data_record.record(as_bytes, files)
  assert 'lines_sha256' not in json.loads((as_bytes / data_record.DATA_FILES).read_text())[field]
  references.write_bytes(b'rot Katze\r\nblau Hund\r\n')
  assert data_record.changes(as_bytes, files) == [
    f'{field}: {references} changed since the run trained on it (20 bytes then, 22 now)'
  ]
  # A record made before the lines were: compared by bytes; recorded again (a resume), with
  # its file as recorded, it gains them.
  references.write_bytes(b'rot Katze\nblau Hund\n')
  data_record.record(as_bytes, files, read_as_lines=[field])
  assert json.loads((as_bytes / data_record.DATA_FILES).read_text())[field]['lines'] == 2
  references.write_bytes(b'rot Katze\r\nblau Hund\r\n')
  assert data_record.changes(as_bytes, files) == []


def test_recording_again_hashes_only_what_does_not_match(tmp_path, monkeypatch):
  text = tmp_path / 'a.txt'
  text.write_text('abcdef')
  data_record.record(tmp_path, {'config.data.path': text})
  monkeypatch.setattr(data_record, '_sha256', lambda path: pytest.fail(f'hashed {path}'))
  data_record.record(tmp_path, {'config.data.path': text})  # size and time as recorded
  assert data_record.changes(tmp_path, {'config.data.path': text}) == []


def test_a_touched_file_is_read_once_by_the_check_and_the_record_after_it(tmp_path, monkeypatch):
  text = tmp_path / 'a.txt'
  text.write_text('abcdef')
  files = {'config.data.path': text}
  data_record.record(tmp_path, files)
  os.utime(text, ns=(1, 1))  # same bytes, other time: the check hashes it
  opened = []
  real_open = open
  monkeypatch.setattr(
    'builtins.open', lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k)
  )
  assert data_record.changes(tmp_path, files) == []
  data_record.record(tmp_path, files)
  monkeypatch.undo()
  assert opened.count(str(text)) == 1
  entry = json.loads((tmp_path / data_record.DATA_FILES).read_text())['config.data.path']
  assert entry['mtime_ns'] == 1  # recorded with its new time: the next check only stats it


def test_a_resume_on_changed_data_is_refused_unless_allowed_and_eval_warns(tmp_path, capsys):
  text = write_word_corpus(tmp_path / 'corpus.txt', words=3000)
  config = tiny_char_config(text, steps=2)
  workdir = tmp_path / 'run'
  char_lm.TASK.train_model(config, workdir)
  assert set(json.loads((workdir / data_record.DATA_FILES).read_text())) == {
    'config.data.path',
    'the vocabulary',
  }
  # The character LM reads bytes: its file converted to CRLF line endings is other text.
  original = text.read_bytes()
  text.write_bytes(original.replace(b'\n', b'\r\n'))
  with pytest.raises(
    ValueError, match=r'scores other data .*\(config\.data\.path: .* changed'
  ) as own:
    char_lm.TASK.evaluate(config, workdir)
  # The path is the run's: the way out is the file as it was, not a field (recheck15-6).
  assert str(own.value).endswith(
    'to score it there, or restore the data file as the run trained on it'
  ), own.value
  text.write_bytes(original)
  with open(text, 'a') as file:
    file.write('the data regenerated, longer\n')
  with pytest.raises(
    ValueError, match=r'holds a run trained on other data \(config\.data\.path'
  ) as refused:
    char_lm.TASK.train_model(config, workdir, allow_config_change=False)
  # The run is finished (step 2 of 2): nothing would resume; it would be scored on this data.
  assert str(refused.value).endswith(
    'finished at step 2 (config.train.steps): it trains no further, and would be scored on '
    'the data as it is now; pass --allow_config_change for that, score it with eval.py '
    '--output_dir=<another directory> (which warns of the data), or use a new --workdir to '
    'train on this data'
  ), refused.value
  # Without its checkpoint the run is not finished: resumed, it would read other text.
  shutil.move(workdir / 'checkpoints' / '2', tmp_path / 'checkpoint_2')
  with pytest.raises(ValueError, match=r'other data \(config\.data\.path.*\): resumed, it would'):
    char_lm.TASK.train_model(config, workdir, allow_config_change=False)
  shutil.move(tmp_path / 'checkpoint_2', workdir / 'checkpoints' / '2')
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['2']
  capsys.readouterr()
  char_lm.TASK.evaluate(config, workdir, output_dir=tmp_path / 'eval')
  assert 'warning: scoring other data than the run trained with (config.data.path: ' in (
    capsys.readouterr().err
  )
  char_lm.TASK.train_model(config, workdir, allow_config_change=True)
  assert 'warning: continuing on other data than the run trained with' in capsys.readouterr().err
  assert (
    data_record.changes(workdir, char_lm.TASK.data_files(config, workdir)) == []
  )  # recorded anew


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(config, workdir) of a 2-step run of `tiny_char_config` on a corpus of its own, trained
  once for the tests that change only a copy of its workdir (not its data)."""
  root = tmp_path_factory.mktemp('trained')
  config = tiny_char_config(write_word_corpus(root / 'corpus.txt', words=3000), steps=2)
  char_lm.TASK.train_model(config, root / 'run')
  return config, root / 'run'


def test_a_vocabulary_replaced_since_training_is_named(trained, tmp_path):
  """Another run's spm.model (or vocab.json) copied over the run's, same size of vocabulary:
  resumed or evaluated, the run read other ids with nothing said."""
  config, workdir = trained[0], tmp_path / 'run'
  shutil.copytree(trained[1], workdir)
  vocabulary = workdir / 'vocab.json'
  symbols = json.loads(vocabulary.read_text())['symbols']
  vocabulary.write_text(json.dumps({'symbols': symbols[::-1]}))
  for allow in (False, True):  # not even with --allow_config_change: its ids are other pieces
    with pytest.raises(
      ValueError, match=r'^the vocabulary: \S*vocab\.json changed since .*restore'
    ):
      char_lm.TASK.train_model(config, workdir, allow_config_change=allow)
  # Not other data to score elsewhere: the model's ids are its vocabulary's (with
  # --output_dir, eval.py scored a swapped spm.model with a warning, exit 0).
  for output_dir in (None, tmp_path / 'eval'):
    with pytest.raises(
      ValueError, match=r'^the vocabulary: \S*vocab\.json changed since .*restore'
    ):
      char_lm.TASK.evaluate(config, workdir, output_dir=output_dir)
  assert not (tmp_path / 'eval').exists()


def test_a_moved_or_copied_workdir_s_vocabulary_is_compared_with_the_record(tmp_path, monkeypatch):
  """The record named the vocabulary by the run's old path, so a copied or moved workdir's
  own spm.model was "another file", never compared: eval.py scored a swapped vocabulary with
  no warning (bleu=0.00), a resume blamed the batch plan. Its place in the workdir is the
  run's file now, wherever the workdir is: the same bytes just work, others are one line."""
  old = tmp_path / 'old'
  old.mkdir()
  (old / 'spm.model').write_bytes(b'the vocabulary')

  def files(workdir):
    return {'the vocabulary': workdir / 'spm.model'}

  data_record.record(old, files(old))
  assert (
    json.loads((old / data_record.DATA_FILES).read_text())['the vocabulary']['in_workdir']
    == 'spm.model'
  )
  moved = tmp_path / 'moved'
  old.rename(moved)
  assert data_record.changes(moved, files(moved)) == []
  copied = tmp_path / 'copied'
  shutil.copytree(moved, copied, copy_function=shutil.copy)  # new times: compared by hash
  assert data_record.changes(copied, files(copied)) == []
  (copied / 'spm.model').write_bytes(b'another vocabulary')
  assert data_record.changes(copied, files(copied)) == [
    f'the vocabulary: {copied}/spm.model changed since the run trained on it (14 bytes then, '
    '18 now)'
  ]
  # A relative --workdir given from elsewhere is the same workdir.
  monkeypatch.chdir(tmp_path)
  assert data_record.changes(Path('moved'), files(Path('moved'))) == []


def test_a_resume_of_a_moved_workdir_with_a_swapped_vocabulary_is_refused(trained, tmp_path):
  """End to end, a run's workdir moved and its vocabulary swapped: refused on resume naming the
  file (it resumed, warning of a batch plan 'then 2 device(s); now 2 device(s)')."""
  config = trained[0]
  shutil.copytree(trained[1], tmp_path / 'run')
  workdir = (tmp_path / 'run').rename(tmp_path / 'moved')
  vocabulary = workdir / 'vocab.json'
  symbols = json.loads(vocabulary.read_text())['symbols']
  vocabulary.write_text(json.dumps({'symbols': symbols[::-1]}))
  with pytest.raises(ValueError, match=r'^the vocabulary: \S*moved/vocab\.json changed since'):
    char_lm.TASK.train_model(config, workdir)


def test_another_spelling_of_the_run_s_file_or_its_bytes_is_the_same_data(tmp_path, monkeypatch):
  """`same_data`, the rule both config checks follow: a path given otherwise than recorded
  that resolves to the run's file, or names a file with its size and SHA-256, is the run's
  data; another file with other bytes is not, and one that cannot be read is not (no crash:
  the data readers name it)."""
  home = tmp_path / 'home'
  (home / 'x').mkdir(parents=True)
  text = home / 'x' / 'a.txt'
  text.write_text('the run trained on these words\n')
  monkeypatch.chdir(home / 'x')
  workdir = tmp_path / 'run'
  workdir.mkdir()
  data_record.record(workdir, {'config.data.path': Path('a.txt')})
  field = 'config.data.path'

  def same(path) -> bool:
    return data_record.same_data(workdir, {field: Path(path)}) == {field}

  assert data_record.same_data(workdir, {field: Path('a.txt')}) == set()  # as recorded
  assert same(text)  # its absolute path
  assert same(home / 'x' / '..' / 'x' / 'a.txt')
  copy = tmp_path / 'clone' / 'a.txt'
  copy.parent.mkdir()
  copy.write_bytes(text.read_bytes())  # another clone's bundled corpus: the same bytes
  assert same(copy)
  copy.write_text('the run trained on these wordz\n')  # same size, other bytes
  assert not same(copy)
  assert not same(tmp_path / 'missing.txt')

  def unreadable(path):
    raise PermissionError(13, 'Permission denied', str(path))

  monkeypatch.setattr(data_record, '_sha256', unreadable)
  assert not same(copy)
  os.utime(text, ns=(1, 1))  # looks touched: the check would hash it
  assert data_record.changes(workdir, {field: text}) == []  # left to the data readers


def test_the_run_s_data_spelled_otherwise_is_neither_a_warning_nor_a_config_change(
  tmp_path, monkeypatch, capsys
):
  """A run trained on `data.txt` (relative): evaluated or resumed with that file's absolute
  path, or evaluated on a copy (another clone's corpus), was told 'data.path: trained
  'data.txt', given ...' (eval) and refused as a config change (resume); a copy with other
  bytes still is."""
  started_in = tmp_path / 'cwdA'
  started_in.mkdir()
  write_word_corpus(started_in / 'data.txt', words=3000)
  monkeypatch.chdir(started_in)
  workdir = tmp_path / 'run'
  char_lm.TASK.train_model(tiny_char_config(Path('data.txt'), steps=2), workdir)
  absolute = tiny_char_config(started_in / 'data.txt', steps=2)
  capsys.readouterr()
  char_lm.TASK.evaluate(absolute, workdir, output_dir=tmp_path / 'eval')
  assert 'warning' not in capsys.readouterr().err
  char_lm.TASK.train_model(absolute, workdir, allow_config_change=False)  # resumed, not refused
  assert 'warning' not in capsys.readouterr().err

  clone = tmp_path / 'clone' / 'data.txt'
  clone.parent.mkdir()
  clone.write_bytes((started_in / 'data.txt').read_bytes())
  char_lm.TASK.evaluate(tiny_char_config(clone, steps=2), workdir, output_dir=tmp_path / 'eval')
  assert 'warning' not in capsys.readouterr().err
  with open(clone, 'a') as file:
    file.write('other words\n')
  char_lm.TASK.evaluate(tiny_char_config(clone, steps=2), workdir, output_dir=tmp_path / 'eval')
  assert f"data.path: trained '{started_in / 'data.txt'}', given '{clone}'" in (
    capsys.readouterr().err
  )
  with pytest.raises(ValueError, match=r'holds a run with another config \(config\.data\.path'):
    char_lm.TASK.train_model(tiny_char_config(clone, steps=2), workdir, allow_config_change=False)
