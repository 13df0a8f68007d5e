"""Command-line overrides (`--section.key=value`) and `resolve`: preset or config file, then overrides."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .files import load_preset, load_toml, tomllib
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
            raise ConfigError(f"override '{item}' must look like --section.key=value, e.g. --model.depth=8")
        key, raw = text.split("=", 1)
        section, name = key.split(".", 1)
        nested.setdefault(section, {})[name] = _parse_value(raw)
    return config_from_dict(nested, base=cfg)

def resolve(preset: str | None = None, config_file: str | None = None, overrides: list[str] | None = None) -> Config:
    """Build a Config from a preset or a saved config file, then overrides."""
    if config_file:
        cfg = load_toml(config_file)
    else:
        cfg = load_preset(preset or "tiny-cpu")
    return apply_overrides(cfg, overrides or [])

