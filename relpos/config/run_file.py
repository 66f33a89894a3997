"""A config file for the config a run recorded: `--config=<this file>:<workdir>` loads the run's
own config.json, its fields filled from their declared defaults as every reader of a run's
config fills them (`relpos.training.run_config.read_config`). eval.py given a --workdir and no
--config evaluates with it (`relpos.training.tasks.with_run_config`), so a run trained with
overrides is scored without repeating them; `--config.eval.<field>` overrides still apply.
"""


def get_config(workdir: str):
  from relpos.training.run_config import read_config  # when loaded, not when imported

  return read_config(workdir)
