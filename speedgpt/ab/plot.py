"""OUT/ab.png: both arms' validation curves, one line per seed, against time and against tokens."""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_file
from .plan import ARMS


def plot(summary: dict, png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5))
    axes = fig.subplots(1, 2)
    colors = {"a": "tab:blue", "b": "tab:orange"}
    for k in ARMS:
        for i, r in enumerate(summary["arms"][k]["runs"]):
            curve = [c for c in r.get("curve", []) if c["step"] > 0]
            if not curve:
                continue
            label = f"{k.upper()} ({summary['configs'][k]['preset']})" if i == 0 else None
            for ax, key in zip(axes, ("time_s", "tokens")):
                ax.plot([c[key] for c in curve], [c["val_loss"] for c in curve], color=colors[k], alpha=0.7,
                        marker=".", label=label)
    for ax, xl in zip(axes, ("training time (s)" + ("" if summary["times_are_speed_figures"] else
                                                      ", shared GPUs: not a speed figure"), "tokens")):
        ax.set_xlabel(xl)
        ax.set_ylabel("val loss")
        if summary["target_loss"] is not None:
            ax.axhline(summary["target_loss"], color="gray", linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle("speedgpt ab: one line per seed")
    with atomic_file(png) as f:
        FigureCanvasAgg(fig).print_png(f)
