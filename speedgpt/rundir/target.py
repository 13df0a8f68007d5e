"""Time, steps and tokens to a target validation loss: the one definition that `speedgpt report`
and `speedgpt ab` both use, so the two never give different figures for the same run.

Evaluations are sparse (every `train.val_every` steps), so the moment a run reaches the target
lies between two of them. Taking the first evaluation at or below the target would charge a run
up to a whole evaluation interval it did not need; the crossing is instead interpolated linearly
between the last evaluation above the target and the first at or below it.
"""

from __future__ import annotations

from typing import Sequence

from .metrics import finite

# Printed under the tables of `speedgpt report` and `speedgpt ab`, so a reader knows what the number is.
TARGET_METHOD = ("time to target: linear between the last evaluation above the target loss and the first at or "
                 "below it (the first evaluation itself if it is already at or below)")

# The record field each figure is read from (metrics.jsonl's record contract).
TARGET_AXES = {"time_to_target_s": "time_s", "steps_to_target": "step", "tokens_to_target": "tokens"}


def crossing(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The x at which a (x, loss) curve, in evaluation order, first reaches `target` (loss <= target):
    linear between the evaluation before and the one that reaches it; None if it never does.
    A curve that later rises above the target again keeps its first crossing."""
    prev = None
    for x, loss in curve:
        if loss <= target:
            if prev is None or loss == target:  # nothing to interpolate from / the crossing is this point
                return x
            x0, l0 = prev
            return x0 + (l0 - target) / (l0 - loss) * (x - x0)  # l0 > target >= loss: no division by zero
        prev = (x, loss)
    return None


def to_target(evals: Sequence[dict], target: float) -> dict[str, float | None]:
    """Time (s), steps and tokens at which a run's evaluations (metrics records with `val_loss`, in
    step order) first reach `target`, each interpolated by `crossing`; None where never reached.
    Records without a finite loss or a finite x are left out of that curve (a NaN loss has no place
    on it, and an old record may lack `tokens`)."""
    out = {}
    for name, key in TARGET_AXES.items():
        curve = [(r[key], r["val_loss"]) for r in evals if finite(r.get(key)) and finite(r.get("val_loss"))]
        out[name] = crossing(curve, target)
    return out
