"""The sampling options `speedgpt sample` and `speedgpt chat` share, and their one-line checks."""

from __future__ import annotations

import argparse
import math

FLOAT32_SMALLEST_NORMAL = 2.0 ** -126  # torch.finfo(torch.float32).tiny, without importing torch for argument checks


def add_sampling_options(p: argparse.ArgumentParser, *, temperature: float, max_tokens: int, what: str) -> None:
    """--max-tokens, --temperature, --top-k and --seed; `what` names one generation ("answer", "prompt")."""
    p.add_argument("--max-tokens", type=int, default=max_tokens,
                   help=f"new tokens per {what} at most (default {max_tokens})")
    p.add_argument("--temperature", type=float, default=temperature, help=f"0 for greedy (default {temperature})")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens; 0: all (default 50)")
    p.add_argument("--seed", type=int, help="seed for reproducible output (default: fresh randomness)")


def check_sampling_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A bad value is one line naming it (argparse's exit 2)."""
    if args.max_tokens < 1:
        p.error(f"--max-tokens {args.max_tokens}: must be >= 1")
    if args.top_k < 0:
        p.error(f"--top-k {args.top_k}: must be >= 0 (0: all tokens)")
    if not 0 <= args.temperature < math.inf:  # also rejects nan; inf divides the logits into nan
        p.error(f"--temperature {args.temperature}: must be a finite number >= 0 (0: greedy)")
    if 0 < args.temperature < FLOAT32_SMALLEST_NORMAL:  # 0 or subnormal in float32, where pick_tokens divides
        p.error(f"--temperature {args.temperature}: below float32's smallest normal number "
                f"({FLOAT32_SMALLEST_NORMAL:.3g}), the dtype the logits are divided in; give 0 for greedy, or a "
                f"larger temperature")
    if args.seed is not None and not 0 <= args.seed < 2**63:  # torch's generator takes a signed 64-bit seed
        p.error(f"--seed {args.seed}: must be 0 <= seed < 2**63")
