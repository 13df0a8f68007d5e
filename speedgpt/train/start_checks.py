"""What a run's config asks of this machine that the config's own checks (config/validate.py) cannot see, checked
as soon as the rank's device is known and before any data, model or run file is made: a run that cannot go on
here is refused in one line naming the fix (ConfigError), not at its first step with a raw torch or OS error."""

from __future__ import annotations

import torch

from ..config import Config, ConfigError


def check_on_this_machine(cfg: Config, device: torch.device) -> None:
    check_attention_backend(cfg.model.attn_backend, device)


def check_attention_backend(requested: str, device: torch.device) -> None:
    """An explicit flex off CUDA: torch's FlexAttention runs a forward there (evaluation and tests use it, as the
    unfused reference) but has no backward, so training died at its first step ("FlexAttention does not support
    backward on CPU") after the data was built and the first validation ran. "auto" picks sdpa there itself."""
    if requested == "flex" and device.type != "cuda":
        raise ConfigError(f"model.attn_backend=flex trains on a CUDA GPU only (FlexAttention has no backward on "
                          f"{device.type}); use --model.attn_backend=auto (sdpa here) or sdpa")

