"""relpos.files.write_atomically: a reader sees the old file or the new one, never a part."""

import errno
import os

import pytest

from relpos import files


def test_a_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path):
  path = tmp_path / 'config.json'
  files.write_atomically(path, '{"a": 1}')
  files.write_atomically(path, b'{"a": 2}')
  assert path.read_text() == '{"a": 2}' and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_write_that_fails_leaves_the_old_file_and_no_partial(tmp_path, monkeypatch):
  path = tmp_path / 'eval_results.json'
  path.write_text('old')

  def full_disk(*args):
    raise OSError(28, os.strerror(28))

  monkeypatch.setattr(files.os, 'replace', full_disk)
  with pytest.raises(OSError, match='No space left'):
    files.write_atomically(path, 'new')
  assert path.read_text() == 'old' and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_failed_write_names_the_file_and_keeps_its_kind(tmp_path, monkeypatch):
  """A full disk's ENOSPC from the write names no file, and a failed open names the temporary
  one: both name the file written, as the callers' fault lines need (the errno's own
  subclass, PermissionError say, is kept)."""
  path = tmp_path / 'eval_results.json'

  def refuse(errno_):
    def write_text(*args, **kwargs):
      raise OSError(errno_, os.strerror(errno_))

    return write_text

  monkeypatch.setattr(files.Path, 'write_text', refuse(28))
  with pytest.raises(OSError, match='No space left') as caught:
    files.write_atomically(path, 'new')
  assert caught.value.filename == str(path)
  monkeypatch.setattr(files.Path, 'write_text', refuse(13))
  with pytest.raises(PermissionError) as caught:
    files.write_atomically(path, 'new')
  assert caught.value.filename == str(path)


def test_a_write_on_a_read_only_filesystem_names_the_file_not_its_temporary_one(
  tmp_path, monkeypatch
):
  """On a read-only filesystem the temporary file cannot be made, and unlinking it, though it
  is not there, is EROFS as well (the kernel refuses the write before it looks the name up):
  that error, naming `.eval_results.json.partial-<pid>`, replaced the write's, and eval.py's
  line named the temporary file."""
  path = tmp_path / 'eval_results.json'

  def read_only(self, *args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

  monkeypatch.setattr(files.Path, 'write_text', read_only)
  monkeypatch.setattr(files.Path, 'unlink', read_only)
  with pytest.raises(OSError, match='Read-only file system') as caught:
    files.write_atomically(path, 'new')
  assert caught.value.filename == str(path)


def test_a_directory_that_takes_no_files_is_named_itself(tmp_path, monkeypatch):
  """`check_takes_files`: its probe file has a random name, which would mean nothing in an
  error line; the error names the directory. One that takes files is made, and left empty."""
  directory = tmp_path / 'new' / 'scores'
  files.check_takes_files(directory)
  assert directory.is_dir() and not list(directory.iterdir())
  real_open = os.open

  def read_only(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_open(path, flags, *args, **kwargs)

  monkeypatch.setattr(os, 'open', read_only)
  with pytest.raises(OSError, match='Read-only file system') as caught:
    files.check_takes_files(directory)
  assert caught.value.filename == str(directory)


def test_a_dangling_link_given_as_a_data_file_or_config_names_the_link_and_its_target(tmp_path):
  """A symbolic link to nothing (an unmounted volume) given as config.data.path, a
  translation file or --config read as no file at all: 'no text file at', 'is not a file',
  'no enwik8 at', 'does not exist'. Now each names the link and its missing target, as a
  workdir's did (`files.dangling_link`, one check for all)."""
  from relpos.config import command_line
  from relpos.data import enwik8, parallel_text, text

  link = tmp_path / 'corpus.txt'
  link.symlink_to(tmp_path / 'unmounted' / 'corpus.txt')
  problem = (
    f'it is a symbolic link to {tmp_path / "unmounted" / "corpus.txt"}, which does not exist: '
    'mount it or point the link elsewhere'
  )
  for read, field in (
    (text.read_text_bytes, 'config.data.path'),
    (enwik8.resolve_enwik8_path, 'config.data.path'),
    (
      lambda path: parallel_text.read_lines(path, field='config.data.train_src'),
      'config.data.train_src',
    ),
  ):
    with pytest.raises(FileNotFoundError) as caught:
      read(link)
    assert str(caught.value) == f'{field}={link}: {problem}'
  config_link = tmp_path / 'config.py'
  config_link.symlink_to(tmp_path / 'unmounted' / 'corpus.txt')
  line, _ = command_line._config_file_problem(['train.py', f'--config={config_link}:shaw'])
  assert line == f'--config={config_link}:shaw: {problem}'


def test_lines_are_split_on_newline_only(tmp_path):
  """`split_lines`, the one cut of a file of a line per sentence: not str.splitlines(), which
  also splits on U+0085, U+2028, '\\x1c' and the like inside a sentence; CRLF ends a line."""
  text = 'a\x85b\r\nc\u2028d\n\ne\x0cf'
  assert files.split_lines(text) == ['a\x85b', 'c\u2028d', '', 'e\x0cf']
  assert files.split_lines(text + '\n') == files.split_lines(text)
  path = tmp_path / 'translations.txt'
  path.write_bytes(text.encode())
  assert files.read_text_lines(path) == files.split_lines(text)
