"""Where a model's weights come from: a run directory's checkpoint or an export directory.

- run directory (written by `speedgpt train`): `config.toml` + `checkpoints/step_NNNNNN/model.pt`;
  the latest complete checkpoint is used unless one is named.
- export directory (written by `speedgpt export`): `config.json` + `model.safetensors`.
- Hugging Face export (written by `speedgpt export --format hf`): transformers' `config.json`, which
  carries speedgpt's config, + `model.safetensors` under the modeling file's names (hf/folder.py).

`locate` finds the weights without loading them, `load_config` reads the config saved beside them,
`load_state` the tensors. Either way the model is rebuilt from the saved config (infer/load.py), so
a checkpoint never needs pickled code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from . import CONFIG_FILE, RunDir
from .checkpoint import STEP_PREFIX, CheckpointError, list_checkpoints, read_state, verify_files

EXPORT_WEIGHTS = "model.safetensors"
EXPORT_CONFIG = "config.json"
EXPORT_FORMAT_VERSION = 1
# Prefixes wrappers add to parameter names: torch.compile (`_orig_mod.`) and DDP (`module.`).
# The weights are the same tensors, so they are stripped rather than kept as a second naming.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


class LoadError(RuntimeError):
    """A run or export directory is missing, incomplete or does not match its config; the message says what to do."""


@dataclass
class WeightsSource:
    """Where a model's weights come from, and the training progress they stand for."""
    kind: str  # "run" | "export" | "hf"
    root: Path  # the run or export directory
    weights: Path  # checkpoint directory (run) or model.safetensors (export)
    step: int | None
    tokens: int | None
    train_time_s: float | None


def strip_wrapper_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for prefix in WRAPPER_PREFIXES:
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def shapes_of(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in state.items()}


def weights_mismatch(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> str | None:
    """Why weights of shapes `found` do not load into a model whose state has shapes `expected` (names
    missing or unexpected, the first shape that differs), or None when they fit. Eval, sampling and a
    training resume say the same thing for the same problem."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found) if tuple(expected[k]) != tuple(found[k]))
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if unexpected:
        parts.append(f"unexpected {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}")
    if wrong:
        k = wrong[0]
        parts.append(f"shape of {k} is {tuple(found[k])}, config gives {tuple(expected[k])}")
    return "; ".join(parts) or None


def check_weights_fit(source: WeightsSource, expected: dict[str, tuple[int, ...]],
                      state: dict[str, torch.Tensor]) -> None:
    """LoadError unless `state` (the weights `source` holds) loads into a model whose state has shapes `expected`:
    what loading a model and writing an export both check, so neither hands on weights its config cannot take."""
    problem = weights_mismatch(expected, shapes_of(state))
    if problem:
        raise LoadError(f"weights in {source.weights} do not fit the model its config describes ({problem}); "
                        f"the config was edited after training, or the weights come from another run")


def locate(path: str | Path, checkpoint: str | int | None = None) -> WeightsSource:
    """Find the weights `load_model` would use, without loading them."""
    if checkpoint == "latest":  # the commands' --checkpoint help calls the default "the latest": it is a name too
        checkpoint = None
    root = Path(path).expanduser()
    if not root.exists():
        raise LoadError(f"{root} does not exist; pass a run directory (from `speedgpt train`) or an export "
                        f"directory (from `speedgpt export`)")
    if not root.is_dir():
        raise LoadError(f"{root} is a file; pass its directory (a run directory or an export directory)")
    hf = _hf_source(root, checkpoint)
    if hf is not None:
        return hf
    if (root / EXPORT_CONFIG).is_file() or (root / EXPORT_WEIGHTS).is_file():
        if checkpoint is not None:
            raise LoadError(f"{root} is an export (one set of weights); drop --checkpoint={checkpoint}")
        from .export_dir import ExportError, read_manifest

        try:
            manifest = read_manifest(root)
        except ExportError as e:
            raise LoadError(str(e)) from None
        if manifest is not None and not manifest.get("complete"):  # stopped while swapping files
            raise LoadError(f"export {root} is incomplete (an export into it was interrupted); re-run "
                            f"`speedgpt export RUN_DIR --out {root}`")
        for name in (EXPORT_CONFIG, EXPORT_WEIGHTS):
            if not (root / name).is_file():
                raise LoadError(f"export {root} has no {name}; re-run `speedgpt export RUN_DIR --out {root}`")
        meta = _read_export_json(root).get("export", {})
        return WeightsSource("export", root, root / EXPORT_WEIGHTS, meta.get("step"), meta.get("tokens"),
                      meta.get("train_time_s"))
    run = RunDir(root)
    if not run.is_run():
        raise LoadError(f"{root} has neither {CONFIG_FILE} (a run directory) nor {EXPORT_CONFIG} (an export); "
                        f"pass the directory `speedgpt train` wrote")
    ckpt_root = run.checkpoints
    found = list_checkpoints(ckpt_root)
    if not found:
        raise LoadError(f"run {root} has no checkpoint under {ckpt_root}; train it to the end or with "
                        f"--train.checkpoint_every=N")
    if checkpoint is None:
        ckpt = found[-1]
    else:
        text = str(checkpoint)
        name = text if text.startswith(STEP_PREFIX) else f"{STEP_PREFIX}{int(text):06d}" if text.isdigit() else None
        ckpt = Path(text) if name is None else ckpt_root / name
        if not (ckpt / "model.pt").is_file() and not (ckpt / "dcp").is_dir():
            have = ", ".join(p.name.removeprefix(STEP_PREFIX).lstrip("0") or "0" for p in found)
            raise LoadError(f"run {root} has no checkpoint '{checkpoint}'; available steps: {have}")
    try:
        state = read_state(ckpt, fix="name an earlier one with --checkpoint STEP")
    except CheckpointError as e:
        raise LoadError(str(e)) from None
    return WeightsSource("run", root, ckpt, state.get("step"), state.get("tokens"), state.get("train_time_s"))


def _hf_source(root: Path, checkpoint) -> WeightsSource | None:
    """The weights of a Hugging Face export at `root` (None: it is not one)."""
    from ..hf.folder import read_hf_config

    data = read_hf_config(root)
    if data is None:
        return None
    if checkpoint is not None:
        raise LoadError(f"{root} is an export (one set of weights); drop --checkpoint={checkpoint}")
    if not (root / EXPORT_WEIGHTS).is_file():
        raise LoadError(f"export {root} has no {EXPORT_WEIGHTS}; re-run `speedgpt export RUN_DIR --format hf --out {root}`")
    meta = data["speedgpt"].get("export", {})
    return WeightsSource("hf", root, root / EXPORT_WEIGHTS, meta.get("step"), meta.get("tokens"), meta.get("train_time_s"))


def _read_export_json(root: Path) -> dict:
    try:
        data = json.loads((root / EXPORT_CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoadError(f"{root / EXPORT_CONFIG} is not valid JSON ({e}); re-export the run") from None
    if not isinstance(data, dict):  # valid JSON of another shape ([]) was an AttributeError at its first .get
        raise LoadError(f"{root / EXPORT_CONFIG} is a JSON {type(data).__name__}, not an export's object; re-export "
                        f"the run")
    version = data.get("format_version")
    if version != EXPORT_FORMAT_VERSION:
        raise LoadError(f"{root / EXPORT_CONFIG} has format_version={version!r}; this speedgpt reads "
                        f"{EXPORT_FORMAT_VERSION}: re-export with this version")
    return data


def load_config(source: WeightsSource):
    from ..config import ConfigError, config_from_dict

    if source.kind == "run":
        return RunDir(source.root).read_config()
    if source.kind == "hf":
        from ..hf.folder import read_hf_config

        data = read_hf_config(source.root)["speedgpt"].get("config")
        if not isinstance(data, dict):
            raise LoadError(f"{source.root / EXPORT_CONFIG} has no speedgpt.config (the run's config); re-run "
                            f"`speedgpt export RUN_DIR --format hf --out {source.root}`")
    else:
        data = _read_export_json(source.root)
        data = {k: v for k, v in data.items() if k not in ("format_version", "export")}
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise LoadError(f"{source.root / EXPORT_CONFIG}: {e}") from None


def _read_safetensors(source: WeightsSource, device: torch.device) -> dict[str, torch.Tensor]:
    """An export's tensors; a truncated or garbled file is a LoadError naming it and the re-export, not
    safetensors' "SafetensorError: Error while deserializing header" (which names neither)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(source.weights), device=str(device))
    except (SafetensorError, OSError) as e:  # a damaged file; out of memory or a device error say what they are
        fmt = " --format hf" if source.kind == "hf" else ""
        detail = (str(e).splitlines() or [""])[0][:120]
        raise LoadError(f"{source.weights} is unreadable ({type(e).__name__}: {detail}); re-run "
                        f"`speedgpt export RUN_DIR{fmt} --out {source.root}`") from None


def _check_export_sha256(source: WeightsSource, export: dict) -> None:
    """A native export's weights against the SHA-256 its export recorded (exports before 2026-12-06 record none and
    are not checked): a flipped byte inside a tensor loaded, sampled and exported again without a word. (An HF
    folder is left unchecked: HF's own tools may rewrite its weights and keep its config.json.)"""
    from ..atomic import sha256_file

    recorded = export.get("sha256")
    if recorded and source.weights.is_file() and sha256_file(source.weights) != recorded:
        run = export.get("source") or "RUN_DIR"
        raise LoadError(f"{source.weights} is corrupt: its SHA-256 differs from the one its export recorded in "
                        f"{source.root / EXPORT_CONFIG}; re-run `speedgpt export {run} --out {source.root}` (weights "
                        f"changed on purpose: remove export.sha256 from that file)")


def load_state(source: WeightsSource, device: torch.device) -> dict[str, torch.Tensor]:
    if source.kind == "hf":
        from ..hf.folder import read_hf_config, speedgpt_state

        provenance = read_hf_config(source.root)["speedgpt"].get("export", {})
        return speedgpt_state(_read_safetensors(source, device), provenance)
    if source.kind == "export":
        export = _read_export_json(source.root).get("export", {})
        state = _read_safetensors(source, device)  # (a broken header says "unreadable" first)
        _check_export_sha256(source, export)
        # Tensors that shared storage were written once; the others are listed as aliases.
        aliases = export.get("aliases") or {}
        for alias, canonical in aliases.items():
            state[alias] = state[canonical]
        return state
    from .dcp import is_dcp_checkpoint, read_model_state, verify

    if is_dcp_checkpoint(source.weights):  # sharded by DCP: consolidated here, in one process
        try:  # the checksums recorded at save, as below
            verify(source.weights, fix="name another with --checkpoint STEP")
        except CheckpointError as e:
            raise LoadError(str(e)) from None
        try:
            return read_model_state(source.weights, device)
        except Exception as e:
            raise LoadError(f"checkpoint {source.weights}/dcp is unreadable ({type(e).__name__}: {str(e)[:120]}); "
                            f"name another with --checkpoint STEP") from None
    fix = "name another with --checkpoint STEP"
    try:  # the checksum recorded at save: a corrupted file is an error, not wrong weights
        verify_files(source.weights, read_state(source.weights, fix), ("model.pt",), fix=fix)
    except CheckpointError as e:
        raise LoadError(str(e)) from None
    try:
        state = torch.load(source.weights / "model.pt", map_location=device, weights_only=True)
    except FileNotFoundError:
        raise LoadError(f"checkpoint {source.weights} has no model.pt; name another with --checkpoint STEP") from None
    except Exception as e:  # torch raises several types for truncated or garbled files
        raise LoadError(f"checkpoint {source.weights}/model.pt is unreadable ({type(e).__name__}); name another "
                        f"with --checkpoint STEP") from None
    return state
