"""The one way relpos prints a warning: a line `warning: ...` on standard error.

Warnings go where errors go (`error: ...`, relpos.training.tasks), so that standard output
holds a command's results and progress alone (a `| tee`, a `> results.txt`, a script reading
eval.py's last line), and a warning still shows on the terminal. Standard output is flushed
first, so that in a log that merges the two (`2>&1`) each warning stands where it happened.
"""

import sys


def warn(message: str) -> None:
  """Prints `warning: <message>` on standard error, after what standard output holds."""
  sys.stdout.flush()
  print(f'warning: {message}', file=sys.stderr, flush=True)
