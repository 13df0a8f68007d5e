"""Building a Config from plain dicts (TOML tables, overrides, another process's copy), with type
checks that name the key."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any

from .errors import ConfigError
from .sections import SECTIONS, Config


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check `value` against the field type; accept ints for floats. Raise ConfigError naming key."""
    origin = typing.get_origin(typ)
    if dataclasses.is_dataclass(typ):  # a table of keys (a row of train.stages)
        if isinstance(value, typ):
            value = dataclasses.asdict(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table of keys ({', '.join(_field_types(typ))}), got {value!r}")
        types_ = _field_types(typ)
        unknown = [k for k in value if k not in types_]
        if unknown:
            raise ConfigError(f"unknown config key '{key}.{unknown[0]}'; known keys: {', '.join(types_)}")
        return typ(**{k: _coerce(f"{key}.{k}", v, types_[k]) for k, v in value.items()})
    if origin is list:
        (item_t,) = typing.get_args(typ)
        if not isinstance(value, list):
            example = "[{share=0.5}, {share=0.5}]" if dataclasses.is_dataclass(item_t) else "[1,2]"
            raise ConfigError(f"{key}: expected a list of {item_t.__name__}, got {value!r}; write e.g. {key}={example}")
        return [_coerce(f"{key}[{i}]", v, item_t) for i, v in enumerate(value)]
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
    name = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{key}: expected {name}, got {value!r} ({type(value).__name__}); fix the value of {key}")


# Keys renamed since runs were first saved: old config.toml files (and overrides) still load.
RENAMED_KEYS = {"model.fp8_mlp_scaling": "model.fp8_scaling"}


def config_from_dict(data: dict[str, Any], base: Config | None = None) -> Config:
    cfg = copy.deepcopy(base) if base is not None else Config()
    for section, values in data.items():
        if section == "preset":
            cfg.preset = str(values)
            continue
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section '{section}'; known sections: {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"'{section}' must be a table of keys, got {values!r}")
        obj = getattr(cfg, section)
        types_ = _field_types(type(obj))
        for key, value in values.items():
            full = RENAMED_KEYS.get(f"{section}.{key}", f"{section}.{key}")
            key = full.split(".", 1)[1]
            if key not in types_:
                close = ", ".join(k for k in types_ if k[:3] == key[:3]) or ", ".join(types_)
                raise ConfigError(f"unknown config key '{full}'; did you mean one of: {close}")
            setattr(obj, key, _coerce(full, value, types_[key]))
    return cfg


def config_from_plain(d: dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (e.g. one sent to another process)."""
    out = Config(preset=d.get("preset", ""))
    for section, cls in SECTIONS.items():
        types_ = _field_types(cls)
        setattr(out, section, cls(**{k: (_coerce(f"{section}.{k}", v, types_[k]) if isinstance(v, list) else v)
                                     for k, v in d.get(section, {}).items()}))
    return out


def flat_config(data: dict[str, Any]) -> dict[str, Any]:
    """``{"section.key": value}`` of a config as a dict (``Config.to_dict()`` or a file's tables);
    top-level keys (``preset``) as themselves."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat
