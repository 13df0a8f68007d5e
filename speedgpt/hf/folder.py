"""A Hugging Face export folder: its files, its tensor names, and how speedgpt reads one back.

Files (`speedgpt export RUN --format hf --out DIR`):
    config.json              transformers' config: model_type "speedgpt", auto_map, the resolved
                             architecture, and under "speedgpt" the run's full config and the export's
                             provenance (source, step, tokens, dtype)
    model.safetensors        the weights under the modeling file's names
    configuration_speedgpt.py, modeling_speedgpt.py    the code transformers runs (trust_remote_code)
    generation_config.json   BOS/EOS = the run's model.bos_id (50256 for GPT-2), the padded vocabulary's
                             ids suppressed
    tokenizer.json and friends (hf/tokenizer_files.py): the run's tokenizer
    README.md                how to load it
    .speedgpt-export.json    the files the export wrote and its source (rundir/export_dir.py)

Names: modeling_speedgpt.py mirrors speedgpt's module tree under `model.` (the transformers
convention: the trunk is `model`, the head `lm_head`), so a speedgpt name maps to `model.<name>`,
except `lm_head.weight`. One tensor is not carried: the tying phase (`embed_untied`). While the
embedding is tied to the head it holds the head's values (speedgpt's optimizers keep it so), so the
embedding is written as it is, and the phase is recorded in the provenance (`embed_tied`) to be put
back when speedgpt loads the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

MODEL_TYPE = "speedgpt"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRUNK = "model."
HEAD = "lm_head.weight"
TYING_PHASE = "embed_untied"  # speedgpt's buffer: True once the embedding is its own table


def hf_name(name: str) -> str:
    return name if name == HEAD else TRUNK + name


def speedgpt_name(name: str) -> str:
    return name if name == HEAD else name.removeprefix(TRUNK)


def hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """speedgpt's model state under the modeling file's names, less the tying phase (a tied embedding
    already holds the head's values: the lookup the model makes)."""
    return {hf_name(k): v for k, v in state.items() if k != TYING_PHASE}


def speedgpt_state(state: dict[str, torch.Tensor], provenance: dict) -> dict[str, torch.Tensor]:
    """The inverse of `hf_state`: speedgpt's names, and the tying phase where the model has one."""
    out = {speedgpt_name(k): v for k, v in state.items()}
    tied = provenance.get("embed_tied")
    if tied is not None:
        out[TYING_PHASE] = torch.tensor(not tied)
    return out


def read_hf_config(root: str | Path) -> dict | None:
    """The parsed config.json of a speedgpt Hugging Face export at `root`; None for anything else
    (no config.json, not JSON, or another format: speedgpt's own export is read elsewhere)."""
    path = Path(root) / CONFIG
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("model_type") != MODEL_TYPE or not isinstance(data.get("speedgpt"), dict):
        return None
    return data
