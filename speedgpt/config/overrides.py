"""Command-line overrides (`--section.key=value`) and `resolve`: preset or config file, then overrides.
What the command line says about the horizon (steps or a budget) beats what the file says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError
from .files import load_preset, load_toml, preset_names, tomllib
from .parse import config_from_dict
from .sections import Config


def _parse_value(text: str) -> Any:
    """Parse an override's value as a TOML value; bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.key=value` overrides (leading dashes optional), e.g. `--model.depth=8`."""
    nested: dict[str, dict[str, Any]] = {}
    for item in overrides:
        text = item.lstrip("-")
        if "=" not in text or "." not in text.split("=", 1)[0]:
            raise ConfigError(flag_hint(item) or f"override '{item}' must look like --section.key=value, e.g. "
                                                  f"--model.depth=8")
        key, raw = text.split("=", 1)
        section, name = key.split(".", 1)
        nested.setdefault(section, {})[name] = _parse_value(raw)
    return _horizon_of_overrides(config_from_dict(nested, base=cfg), nested.get("train", {}))


def flag_hint(item: str) -> str | None:
    """What an argument without its flag is and the flag it needs, e.g. `speedgpt config runs/x` (a run directory
    given positionally, which read as a malformed override); None for anything else."""
    if item.startswith("-"):
        return None
    path = Path(item)
    if path.is_dir() and (path / "config.toml").is_file():
        return f"{item} is a run directory, not an override: give --config {path / 'config.toml'}"
    if path.is_file():
        return f"{item} is a file, not an override: give a config file as --config {item}"
    if item in preset_names():
        return f"{item} is a preset, not an override: give --preset {item}"
    return None


BUDGET_KEYS = ("tokens_per_param", "flops_budget")


def _horizon_of_overrides(cfg: Config, named: dict[str, Any]) -> Config:
    """The horizon the user asked for on the command line beats the one the preset or config file set
    (nanochat's precedence: an explicit step count over a FLOPs target over a tokens:params ratio).
    `--train.steps=N` over a budget makes train.steps the horizon (the budget then derives only a batch
    of 0: `d12 --train.steps=3` is 3 steps of d12's own batch); a budget override over a file's steps
    sets the horizon again. Both at once is ambiguous; `--train.horizon` itself is taken as given."""
    if "horizon" in named:
        return cfg
    t = cfg.train
    budgets = [f"--train.{k}={getattr(t, k):g}" for k in BUDGET_KEYS if k in named and getattr(t, k)]
    if "steps" in named and budgets:
        raise ConfigError(f"--train.steps={t.steps} and {' and '.join(budgets)} both set the horizon; give one of "
                          f"them, or add --train.horizon=steps to train {t.steps} steps "
                          f"of the batch the budget derives")
    if "steps" in named and (t.tokens_per_param or t.flops_budget):
        t.horizon = "steps"
    elif budgets:
        t.horizon = "auto"
    return cfg

def resolve(preset: str | None = None, config_file: str | None = None, overrides: list[str] | None = None) -> Config:
    """Build a Config from a preset or a saved config file, then overrides."""
    if preset and config_file:
        raise ConfigError(f"give --preset or --config, not both: a config file holds its own settings (one that "
                          f"leaves sections out starts from the preset its `preset = ...` line names)")
    if config_file:
        cfg = load_toml(config_file)
    else:
        cfg = load_preset(preset or "tiny-cpu")
    return apply_overrides(cfg, overrides or [])

