"""A config -> the plan of the run about to start (plan.RunPlan), the one place that happens.

Its budget is resolved once (budget.py: tokens per parameter or FLOPs -> steps, a derived batch,
width-scaled learning rates), a stage table's rows fitted to the world size (stages.fit_rows_to_world),
the result validated for the world size (plan.validate), and the
stage table written into the config with concrete values: the config the run saves. Apart from
plan.py because resolving a budget counts the model's parameters (a meta-device GPT), and the
model's runtime reads plans: plan.py itself builds on nothing in model/.
"""

from __future__ import annotations

from .budget import resolve_budget
from .config import Config
from .plan import RunPlan, validate
from .stages import fit_rows_to_world


def plan_run(cfg: Config, world_size: int = 1) -> RunPlan:
    """The plan of a run of `cfg` on `world_size` ranks (raises ConfigError naming the fix)."""
    cfg, budget_lines = resolve_budget(cfg)
    cfg, fit_lines = fit_rows_to_world(cfg, world_size)
    budget_lines = list(budget_lines) + fit_lines
    table = validate(cfg, world_size)
    return RunPlan.resolved(cfg, world_size, table, tuple(budget_lines))
