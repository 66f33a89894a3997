"""Config defaults of each task (every field a run reads), the rules that check them, and
`load_config_file` for config files built on other config files."""

import importlib.util
from pathlib import Path

import ml_collections


def load_config_file(path: Path, preset: str | None = None) -> ml_collections.ConfigDict:
  """The get_config(preset) of a config file, loaded from its path as train.py loads it, so
  configs/wmt_big.py can start from configs/wmt_base.py without configs/ being importable."""
  spec = importlib.util.spec_from_file_location(f'configs.{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if preset is None else module.get_config(preset)
