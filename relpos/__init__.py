"""relpos: relative position representations in self-attention (JAX/Flax).

The library is `relpos.attention` (kernels), `relpos.models`, `relpos.data`, `relpos.training`
and `relpos.config`; the study tools live in `relpos.studies` and the command-line tools that
read a trained run in `relpos.tools`. Their old top-level names still import and run
(`python -m relpos.sweep ...`), with one warning line giving the new name.
"""

import importlib.abc
import importlib.util
import os
import sys
import warnings

# Old module name -> where it lives now.
MOVED = {
  **{
    f'relpos.{name}': f'relpos.studies.{name}'
    for name in ('sweep', 'breakdown', 'significance', 'shaw_tables', 'plot', 'figures')
  },
  **{f'relpos.{name}': f'relpos.tools.{name}' for name in ('translate', 'sample')},
  'relpos.metrics': 'relpos.scoring',
}
_WARNED = 'RELPOS_MOVED_MODULE_WARNED'


class _MovedModules(importlib.abc.MetaPathFinder):
  """Finds a moved module under its old name: the same source file, loaded as the old name (so
  `python -m` can run it), after a FutureWarning naming the new one."""

  def find_spec(self, name, path=None, target=None):
    if name not in MOVED:
      return None
    # Once per command: relpos.runtime.apply_defaults may re-execute the program, which finds
    # the module again; the mark travels in the environment it passes on.
    if os.environ.get(_WARNED) != name:
      warnings.warn(f'{name} is now {MOVED[name]}', FutureWarning, stacklevel=2)
      os.environ[_WARNED] = name
    return importlib.util.spec_from_file_location(
      name, importlib.util.find_spec(MOVED[name]).origin
    )


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
  sys.meta_path.append(_MovedModules())
