"""Load a trained model for evaluation or sampling, from a run directory or an export directory
(rundir/weights.py finds and reads the weights; the model is rebuilt from the saved config)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..rundir.weights import (LoadError, check_weights_fit, load_config, load_state, locate, shapes_of,
                              strip_wrapper_prefixes)

__all__ = ["LoadError", "load_model", "locate"]


def load_model(run_dir_or_export: str | Path, *, device: str | torch.device = "auto",
               checkpoint: str | int | None = None, dtype: torch.dtype | None = None, cfg=None):
    """(model, cfg): the model in eval mode on `device`, weights from the run's latest (or the named)
    checkpoint, or from an export directory.

    `dtype` is the compute dtype; default as in training: bf16 on CUDA, fp32 elsewhere (or the
    config's explicit train.dtype). Parameters stay fp32 masters, as the trainer keeps them.
    """
    from ..model.build import model_from_config
    from ..device import DeviceError, resolve_device

    source = locate(run_dir_or_export, checkpoint)
    cfg = load_config(source) if cfg is None else cfg
    try:
        dev = resolve_device(device)
    except DeviceError as e:
        raise LoadError(str(e)) from None
    # The windows of the checkpoint's step: a mid-run checkpoint is scored (and samples) as training
    # validated it at that step; a finished run's step is the last, whose windows are the final ones.
    model = model_from_config(cfg, dev, dtype=dtype, step=source.step)
    state = strip_wrapper_prefixes(load_state(source, dev))
    check_weights_fit(source, shapes_of(model.state_dict()), state)
    model.load_state_dict(state)
    model.eval()
    return model, cfg
