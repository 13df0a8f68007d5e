"""Presets and config files: the bundled presets/*.toml, reading a saved config.toml, writing one."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from .errors import ConfigError
from .parse import config_from_dict
from .sections import Config


# The preset `speedgpt train` (and bench) runs when none is named (sweep has its own GPU default, sweep.py): the
# GPU default is the fastest recipe to a target loss that the A/Bs in docs/experiments.md support: speedrun-latest
# since wave 8 (record #28's 300-step loss in 140 s of training against speedrun-124m's 183 s, 2 paired seeds on
# one H100, p = 0.02; it compiles 2-3x longer, issue 33).
GPU_DEFAULT_PRESET = "speedrun-latest"
CPU_DEFAULT_PRESET = "tiny-cpu"


def default_preset(gpu: str = GPU_DEFAULT_PRESET) -> str:
    """The preset for this machine when none is named (reads the device at call time, never at import);
    `gpu`: a command's own GPU default instead of train's."""
    import torch

    return gpu if torch.cuda.is_available() else CPU_DEFAULT_PRESET


def preset_names() -> list[str]:
    root = resources.files("speedgpt") / "presets"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_preset(name: str) -> Config:
    path = resources.files("speedgpt") / "presets" / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown preset '{name}'; available presets: {', '.join(preset_names())}")
    data = tomllib.loads(path.read_text())
    data.setdefault("preset", name)
    return config_from_dict(data)


def load_toml(path: str | Path) -> Config:
    path = Path(path)
    data = _read_toml(path)
    return config_from_dict(data, base=preset_base(path, data))


def load_run_toml(path: str | Path) -> Config:
    """A run's own config.toml (`speedgpt train` wrote it whole: to_toml writes every section). One that lacks a
    section was emptied or cut short (a full disk, a copy that stopped), not written by hand: read as load_toml
    reads a user's short file it took the built-in defaults, or its preset's values, for what it lost, and a resume,
    eval or export went on with another model or schedule than the run's (an empty file's export, a 12-layer
    config beside 4 layers' weights, exited 0)."""
    path = Path(path)
    try:
        data = _read_toml(path)
    except ConfigError as e:
        if not path.is_file():  # a folder or a missing file: its own fix, nothing to restore
            raise
        raise ConfigError(f"{e}; {RESTORE_RUN_CONFIG}") from None  # train writes it whole: a cut, not a typo
    cut = run_config_cut_short(path, data)
    if cut:
        raise ConfigError(cut)
    return config_from_dict(data)


def run_config_cut_short(path: Path, data: dict) -> str | None:
    """What is wrong with a run's config.toml (read as `data`) that lacks a section, naming where its config is kept;
    None when it has every section. `report` reads runs leniently, and warns with this instead of refusing."""
    from .parse import SECTIONS

    missing = [section for section in SECTIONS if section not in data]
    if not missing:
        return None
    lost = "is empty" if not data else f"is cut short (no [{'], ['.join(missing)}] section{'s' * (len(missing) > 1)})"
    return f"{path} {lost}, while a run's config.toml holds every section; {RESTORE_RUN_CONFIG}"


# Where a run's lost config.toml is found again: every checkpoint saves the config it trained with.
RESTORE_RUN_CONFIG = "restore it (each of the run's checkpoints keeps its config, under \"config\" in its state.json)"


def _read_toml(path: Path) -> dict:
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; pass a config file (a run's is {path / 'config.toml'})")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None


def preset_base(path: Path, data: dict) -> Config | None:
    """What a config file's keys apply to: a run's config.toml holds every section and stands alone (its `preset`
    says where it started), but a hand-written file that names a preset and leaves out a section (`preset =
    "tiny-cpu"` and a [train] table) means that preset plus its keys: read on the built-in defaults it once trained
    a 278M-parameter model under the preset's name."""
    from .parse import SECTIONS

    name = data.get("preset")
    if not isinstance(name, str) or not name or all(section in data for section in SECTIONS):
        return None  # no preset named, or a complete file (a run's: every section), whatever its label says
    if name not in preset_names():
        raise ConfigError(f"{path}: preset '{name}' is not a preset (the file leaves sections out, so it starts from "
                          f"the preset it names); available presets: {', '.join(preset_names())}")
    return load_preset(name)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        # A TOML basic string is a JSON string but for DEL, which TOML wants escaped too: a prompt with a
        # newline (run.sample_prompt) once wrote a config.toml that no later command could read
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(cfg: Config) -> str:
    d = cfg.to_dict()
    lines = [f"preset = {_toml_value(d.pop('preset'))}"]
    for section, values in d.items():
        lines.append(f"\n[{section}]")
        tables = {k: v for k, v in values.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if k not in tables]
        for k, rows in tables.items():  # arrays of tables (train.stages) after the section's plain keys
            for row in rows:
                lines.append(f"\n[[{section}.{k}]]")
                lines += [f"{rk} = {_toml_value(rv)}" for rk, rv in row.items()]
    return "\n".join(lines) + "\n"


def save_toml(cfg: Config, path: str | Path) -> None:
    from ..atomic import atomic_write

    atomic_write(path, to_toml(cfg))
