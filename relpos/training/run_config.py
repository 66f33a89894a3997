"""The config a finished run recorded in its workdir, read back for the tools that start from it.

Recording it, and the check that a rerun matches it, is `relpos.config.recorded`.
"""

from pathlib import Path

import ml_collections

from relpos.config.recorded import CONFIG_FILE, read_recorded


def read_config(workdir, flag: str | None = '--workdir') -> ml_collections.ConfigDict:
  """The config a run recorded in workdir/config.json (what the tools that read a finished run
  start from). `flag` names the command-line flag that gave workdir, for the error (None: a
  positional argument).

  Raises:
    FileNotFoundError: no such directory, or no config.json in it.
  """
  workdir = Path(workdir)
  if not workdir.is_dir():
    given = f'{flag}={workdir}' if flag else str(workdir)
    raise FileNotFoundError(f'{given} is not a directory: give the workdir of a run')
  path = workdir / CONFIG_FILE
  if not path.is_file():
    raise FileNotFoundError(f'{path} does not exist: {workdir} holds no relpos run (train first)')
  return ml_collections.ConfigDict(read_recorded(path))
