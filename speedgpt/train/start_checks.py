"""What a run's config asks of this machine that the config's own checks (config/validate.py) cannot see, checked
as soon as the rank's device is known and before any data, model or run file is made: a run that cannot go on
here is refused in one line naming the fix (ConfigError), not at its first step with a raw torch or OS error."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config, ConfigError


def check_on_this_machine(cfg: Config, device: torch.device) -> None:
    check_attention_backend(cfg.model.attn_backend, device)
    check_compile_cache(cfg.train.compile_cache)


def check_attention_backend(requested: str, device: torch.device) -> None:
    """An explicit flex off CUDA: torch's FlexAttention runs a forward there (evaluation and tests use it, as the
    unfused reference) but has no backward, so training died at its first step ("FlexAttention does not support
    backward on CPU") after the data was built and the first validation ran. "auto" picks sdpa there itself."""
    if requested == "flex" and device.type != "cuda":
        raise ConfigError(f"model.attn_backend=flex trains on a CUDA GPU only (FlexAttention has no backward on "
                          f"{device.type}); use --model.attn_backend=auto (sdpa here) or sdpa")


def check_compile_cache(setting: str) -> None:
    """train.compile_cache names a folder ("" the default one, "off" none): a file there, or on its path, failed the
    first compile with "[Errno 20] Not a directory" (a new-user audit)."""
    if setting in ("", "off"):
        return
    from ..outdir import OutDirError, check_out_dir

    try:
        check_out_dir(Path(setting).expanduser(), flag="--train.compile_cache")
    except OutDirError as e:
        raise ConfigError(f"{e}, '' for the default folder, or off") from None
