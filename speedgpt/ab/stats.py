"""Paired statistics of an A/B: per-arm means, and B - A over seeds run in pairs (same seed, same
data order, same init where the architecture agrees), with a t confidence interval and a one-sided
paired t-test for "B is lower" (a lower loss or a shorter time is better). scipy does the
distributions."""

from __future__ import annotations

import math
from typing import Sequence


def describe(values: Sequence[float]) -> dict:
    """n, mean and sample standard deviation (None where undefined)."""
    vals = [float(v) for v in values]
    n = len(vals)
    mean = sum(vals) / n if n else None
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n >= 2 else None
    return {"n": n, "mean": mean, "std": std}


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict:
    """B - A over pairs: mean, sd, the two-sided `confidence` interval of the mean difference
    (mean +- t_{(1+c)/2, n-1} sd / sqrt(n)) and the one-sided p-value of the paired t-test whose
    alternative is "B is lower than A" (scipy.stats.ttest_rel(b, a, alternative="less"))."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values for A but {len(b)} for B")
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    d = describe(diffs)
    out = {"n": d["n"], "diffs": diffs, "mean_diff": d["mean"], "sd_diff": d["std"], "ci95": None, "t": None,
           "p_b_better": None, "note": ""}
    if d["n"] < 2:
        out["note"] = f"{d['n']} complete pair(s): a paired test needs at least 2"
        return out
    se = d["std"] / math.sqrt(d["n"])
    if se == 0:
        out["note"] = "every pair has the same difference: no spread to test against"
        out["ci95"] = [d["mean"], d["mean"]]
        return out
    half = stats.t.ppf((1 + confidence) / 2, d["n"] - 1) * se
    out["ci95"] = [d["mean"] - half, d["mean"] + half]
    res = stats.ttest_rel(b, a, alternative="less")
    out["t"], out["p_b_better"] = float(res.statistic), float(res.pvalue)
    return out


def detectable_difference(sd_diff: float, n: int, alpha: float = 0.05) -> float:
    """The smallest mean paired difference a one-sided test at `alpha` calls significant with n pairs
    of this spread: t_{1-alpha, n-1} sd / sqrt(n) (docs/experiments.md, "Resolution")."""
    from scipy import stats

    return float(stats.t.ppf(1 - alpha, n - 1) * sd_diff / math.sqrt(n))
