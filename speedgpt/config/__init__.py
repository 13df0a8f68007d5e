"""Run configuration as data: dataclasses, TOML presets, command-line overrides, validation.

A run is fully described by one resolved `Config`; `save_toml` writes it into the run
directory and `load_toml` of that file reproduces the run.

The config is the user-facing API, so every public name is importable from `speedgpt.config`
itself; each lives in a module with one job:

- model.py, optim.py, sections.py: the dataclasses (`ModelConfig`, `OptimConfig`, the other
  sections, `Config` and `SECTIONS`);
- parse.py: building a Config from plain dicts, with type checks that name the key;
- files.py: presets and config.toml files; overrides.py: `--section.key=value` (a step count given there
  beats a budget from the file: train.horizon) and `resolve`;
- validate.py (every section), model_checks.py (model section), switch_bases.py (switches that
  would silently do nothing without their base): one-line `ConfigError`s naming the fix. The whole
  run's validation, stage table included, is speedgpt.plan.validate (it builds on this package).
"""

from .errors import ConfigError
from .files import default_preset, load_preset, load_run_toml, load_toml, preset_names, save_toml, to_toml
from .model import ModelConfig
from .optim import OptimConfig
from .overrides import apply_overrides, resolve
from .parse import RENAMED_KEYS, config_from_dict, config_from_plain, flat_config
from .sections import (SECTIONS, Config, DataConfig, ParallelConfig, RunConfig, ScheduleConfig, StageConfig,
                       TrainConfig)
from .validate import check_config, check_cudagraph_strategy, micro_batch_rows

__all__ = [
    "RENAMED_KEYS", "SECTIONS", "Config", "ConfigError", "DataConfig", "ModelConfig", "OptimConfig", "ParallelConfig",
    "RunConfig", "ScheduleConfig", "StageConfig", "TrainConfig", "apply_overrides", "check_config",
    "check_cudagraph_strategy", "config_from_dict", "config_from_plain", "default_preset", "flat_config", "load_preset",
    "load_run_toml", "load_toml",
    "micro_batch_rows", "preset_names", "resolve", "save_toml", "to_toml",
]
