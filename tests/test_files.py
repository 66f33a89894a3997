"""relpos.files.write_atomically: a reader sees the old file or the new one, never a part."""

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
