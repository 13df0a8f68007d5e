"""The run's plan: what a config will do on a world size, resolved once.

`validate(cfg, world_size)` checks a config whole: its sections (config.check_config), then the
stage table derived from it (stages.check_stages) and the switches that read that table
(config/switch_bases.py), handed the table rather than deriving it again. It returns the table.
"""

from __future__ import annotations

from .config import Config, check_config
from .config.switch_bases import check_switch_bases
from .stages import StagePlan, check_stages, windows_at


def validate(cfg: Config, world_size: int = 1) -> StagePlan:
    """Raise ConfigError for the first inconsistent value (section by section, then the stage
    table, then switches without their base); return the run's stage table."""
    check_config(cfg, world_size)
    stages = check_stages(cfg, world_size)
    check_switch_bases(cfg, stages, lambda step: windows_at(cfg, step, stages))  # last: it reads the table
    return stages
