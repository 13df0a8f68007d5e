"""Export a trained model as `model.safetensors` + `config.json` (+ `tokenizer/` when the run trained
its own tokenizer), readable without speedgpt's pickles.

The export holds only the model weights (no optimizer state) under their plain parameter names
(wrapper prefixes such as torch.compile's `_orig_mod.` stripped). `config.json` is the full resolved
run config, the same data as the run's `config.toml`, plus `format_version` and an `export` table
(source step, tokens, dtype, aliases). `speedgpt.infer.load.load_model(EXPORT_DIR)` reads it back.

The directory is written through rundir/export_dir.py: a manifest lists the files this export wrote,
so exporting again replaces exactly those, a user's own files beside them stay, and a folder that no
export wrote is refused.

bf16 exports halve the file; the scalar parameters (skip weights, residual and value lambdas) and
the MoE routers stay fp32, being few numbers whose precision matters more than their size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .rundir import RunDir
from .rundir.export_dir import ExportError, check_export_dir, export_files

__all__ = ["DTYPES", "ExportError", "export_model"]

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
FORMAT = "speedgpt"  # this exporter's name in the export manifest


def dedupe_shared(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """safetensors refuses tensors that share memory (e.g. tied weights). Keep the first name of
    each identical view and return the others as `{alias: kept_name}`; a view of another tensor's
    storage that is not identical to it is copied instead, so no data is lost."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_view: dict[tuple, str] = {}
    storages: set[tuple] = set()
    for name in sorted(state):
        t = state[name]
        storage = (t.device.type, t.untyped_storage().data_ptr())
        view = (*storage, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if view in by_view:
            aliases[name] = by_view[view]
            continue
        if storage in storages:
            t = t.clone()  # partial overlap with a tensor already kept: store its own copy
        else:
            storages.add(storage)
        by_view[view] = name
        kept[name] = t.contiguous()
    return kept, aliases


def scalar_param_names(cfg) -> set[str]:
    """Names of the model's scalar parameters and MoE routers (its optimizer's "scalar" and "router"
    groups), found on the meta device."""
    from .model.build import model_from_config

    model = model_from_config(cfg, "meta")
    groups = model.param_groups()
    ids = {id(p) for p in groups["scalar"] + groups["router"]}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def export_source(source: str | Path, out: str | Path | None, *, dtype: str, checkpoint: str | int | None,
                  default_out: str = "default_export"):
    """What every export format starts from: (src, cfg, out, tokenizer) of `source`'s latest (or named)
    checkpoint. `out` defaults to the run directory's `default_out` attribute (RunDir). Refused with
    ExportError before anything heavy is read: an unknown dtype, `out` being the source itself, an
    `out` that holds files no export wrote or another source's export, a run whose tokenizer is missing
    or does not fit."""
    from .rundir.weights import load_config, locate
    from .tokenizer.folder import TokenizerError, run_tokenizer

    if dtype not in DTYPES:
        raise ExportError(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    src = locate(source, checkpoint)
    cfg = load_config(src)
    default = getattr(RunDir(src.root), default_out)
    out = Path(out) if out is not None else default
    if out.resolve() == src.root.resolve():
        raise ExportError(f"--out {out} is the source directory itself; choose another, e.g. {default}")
    check_export_dir(out, src.root)  # a foreign folder, or another run's export, is refused at once
    try:
        tok = run_tokenizer(src.root, cfg)
    except TokenizerError as e:
        raise ExportError(str(e)) from None
    return src, cfg, out, tok


def export_model(source: str | Path, out: str | Path | None = None, *, dtype: str = "bf16",
                 checkpoint: str | int | None = None) -> Path:
    """Write `out` (default SOURCE/export) from a run directory's latest (or named) checkpoint.

    The files are written next to `out` and renamed into place (rundir/export_dir.py): a previous
    export's files at `out` are replaced and the user's own files there kept; a non-empty directory
    that holds no speedgpt export is refused (ExportError) and left as it was.
    """
    from safetensors.torch import save_file

    from . import __version__
    from .atomic import sha256_file
    from .model.build import model_from_config
    from .rundir.weights import (EXPORT_CONFIG, EXPORT_FORMAT_VERSION, EXPORT_WEIGHTS, check_weights_fit, load_state,
                                 shapes_of, strip_wrapper_prefixes)
    from .tokenizer.folder import RUN_SUBDIR, copy_folder

    src, cfg, out, tok = export_source(source, out, dtype=dtype, checkpoint=checkpoint)
    state = strip_wrapper_prefixes(load_state(src, torch.device("cpu")))
    # an export whose config.json cannot take its weights was written, and exited 0, for a config edited after
    # training (the HF export builds the model and refused it); every load of it then failed
    check_weights_fit(src, shapes_of(model_from_config(cfg, "meta").state_dict()), state)
    target = DTYPES[dtype]
    keep_fp32 = scalar_param_names(cfg)
    state = {k: (v.to(target) if v.is_floating_point() and k not in keep_fp32 else v) for k, v in state.items()}
    tensors, aliases = dedupe_shared(state)
    meta = {"format_version": EXPORT_FORMAT_VERSION, **cfg.to_dict(),
            "export": {"source": str(src.root), "checkpoint": src.weights.name if src.kind == "run" else None,
                       "step": src.step, "tokens": src.tokens, "train_time_s": src.train_time_s,
                       "dtype": dtype, "speedgpt_version": __version__,
                       "aliases": aliases}}

    with export_files(out, FORMAT, src.root) as tmp:  # an export is meant to be shared: files get the umask's mode
        save_file(tensors, str(tmp / EXPORT_WEIGHTS), metadata={"format": "pt", "format_version": str(EXPORT_FORMAT_VERSION)})
        # what a load checks (rundir/weights.py): a flipped byte in a tensor loaded and sampled without a word
        meta["export"]["sha256"] = sha256_file(tmp / EXPORT_WEIGHTS)
        (tmp / EXPORT_CONFIG).write_text(json.dumps(meta, indent=1) + "\n")
        copy_folder(tok, tmp / RUN_SUBDIR)  # a trained tokenizer travels with the weights (GPT-2's: nothing)
    return out
