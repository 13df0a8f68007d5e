"""YaRN rotary rescaling as the attention window grows (speedrun record #31, 2025-09-10).

When the long window grows from `old` to `new` tokens, two things change for a model that was
trained at `old`: slowly rotating dims meet rotation angles they never saw, and the softmax over
more keys gets flatter. At every growth, as YaRN does (Peng et al. 2023, arXiv 2309.00071):

- each rotated pair of dims whose frequency makes fewer than ALPHA turns over the old window has
  its frequency scaled by old / new (its angles over the new window stay in the range it knows);
  those that make more than BETA turns keep it; in between, the factor is interpolated linearly
  in the number of turns;
- the attention scale is multiplied by SCALE_SLOPE * ln(new / old) + 1 (the record's 0.2, YaRN's 0.1).

The rescaling compounds over the growths, so the state of a step is a replay of the window's
changes from step 0: `YarnSchedule` computes it once per distinct state, as a pure function of
the step, so a resumed run, validation and `speedgpt eval` of a checkpoint use the same numbers.
The model receives the state as tensors (RopeState: the rotary tables at its frequencies, made
outside the compiled graph, model/rotary.py says why): it does not recompile when they change. Zero
frequencies (half-truncated rotary's stationary dims) stay zero.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

ALPHA = 1.0  # turns over the old window below which a frequency is fully interpolated
BETA = 32.0  # turns above which it is kept
SCALE_SLOPE = 0.2  # attention scale x (SCALE_SLOPE * ln(new / old) + 1) per growth


class RopeState(NamedTuple):
    """YaRN's state in the form a forward takes it (GPT.forward's `rope`): the rotary tables at the state's
    frequencies (Rotary.tables: every position's cos and sin) and the attention-scale multiplier (0-d float32)."""

    cos: torch.Tensor
    sin: torch.Tensor
    scale: torch.Tensor


def rescale(freq: torch.Tensor, old: int, new: int) -> torch.Tensor:
    """The frequencies after the long window grows from `old` to `new` tokens (one YaRN step)."""
    turns = old * freq / (2 * math.pi)
    ratio = old / new
    keep = torch.clamp((turns - ALPHA) / (BETA - ALPHA), 0, 1)
    return freq * (ratio + keep * (1 - ratio))


def scale_factor(old: int, new: int) -> float:
    return SCALE_SLOPE * math.log(new / old) + 1


class YarnSchedule:
    """YaRN's state for every step of a run whose long window at step s is `long_window(s)`.

    state(step) = (frequencies (head_dim/2,) float32, attention-scale multiplier): the base
    frequencies rescaled at each change of the window over steps 0..step, in order."""

    def __init__(self, base_freq: torch.Tensor, long_window: Callable[[int], int], total: int):
        self.change_steps: list[int] = [0]  # the steps at which the window changes (and step 0)
        self.states: list[tuple[torch.Tensor, float]] = [(base_freq.float().cpu(), 1.0)]
        window = long_window(0)
        for s in range(1, total + 1):  # `total`: the validation after the last step
            w = long_window(s)
            if w != window:
                freq, scale = self.states[-1]
                self.states.append((rescale(freq, window, w), scale * scale_factor(window, w)))
                self.change_steps.append(s)
                window = w

    def index(self, step: int) -> int:
        """Which state applies at `step` (a cache key: steps with the same index share the state)."""
        return bisect.bisect_right(self.change_steps, step) - 1

    def state(self, step: int) -> tuple[torch.Tensor, float]:
        return self.states[self.index(step)]

    @classmethod
    def for_windows(cls, model_cfg, long_window: Callable[[int], int], total: int) -> YarnSchedule:
        """The schedule of a model whose long window at step s is `long_window(s)` over `total`
        steps (a run's plan gives it: plan.RunPlan.yarn)."""
        from .rotary import Rotary

        m = model_cfg
        base = Rotary(m.head_dim, 1, m.rope_base, m.rope_half_truncate).frequencies()
        return cls(base, long_window, total)
