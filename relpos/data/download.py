"""Fetching a public file into a data directory, never leaving a partial or unchecked copy."""

import os
import pathlib
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable

from relpos.messages import PassProgress

_MIB = 1 << 20


class DownloadError(OSError):
  """A download that did not arrive (no network, a refused connection, an HTTP error); the
  message names the URL. Callers add where else the file can come from."""


def _copy_with_progress(response, out, url: str) -> None:
  """Copies the response body to `out`, MiB by MiB, with a progress line every half minute (a
  slow network, a large corpus): MiB done of the Content-Length, rate and ETA."""
  length = response.headers.get('Content-Length')
  total = -(-int(length) // _MIB) if length and length.isdigit() else None
  progress = PassProgress(f'downloading {url}', total, 'MiB')
  done = 0
  while chunk := response.read(_MIB):
    out.write(chunk)
    done += len(chunk)
    progress.update(done // _MIB)


def fetch(url: str, target, *, check: Callable[[pathlib.Path], object] | None = None):
  """Downloads `url` to the file `target` and returns its path.

  The bytes go to a temporary file beside `target`; `check(path)` (if given) reads that file
  and raises ValueError if it is not what was expected; only then is it renamed to `target`.

  Raises:
    DownloadError: the download failed (`target` is left as it was).
    ValueError: `check` refused the download (`target` is left as it was).
  """
  target = pathlib.Path(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=target.parent, suffix='.partial', delete=False) as tmp:
    partial = pathlib.Path(tmp.name)
  try:
    request = urllib.request.Request(url, headers={'User-Agent': 'relpos'})
    try:
      with urllib.request.urlopen(request, timeout=60) as response, partial.open('wb') as out:
        _copy_with_progress(response, out, url)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
      reason = getattr(error, 'reason', error)
      raise DownloadError(f'cannot download {url} ({reason})') from None
    if check is not None:
      try:
        check(partial)
      except ValueError as error:
        raise ValueError(f'the download of {url} failed its check: {error}') from None
    os.replace(partial, target)
  finally:
    partial.unlink(missing_ok=True)
  return target
