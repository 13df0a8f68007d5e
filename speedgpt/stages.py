"""Training stages: a run cut into spans, each with its own batch, row length, attention windows,
multi-token-prediction weights and lr multiplier (the later speedrun records' stage tables).

The table is config data (`[[train.stages]]` in a preset, `train.stages` in a run's config.toml).
`stage_plan(cfg)` resolves it once into `Stage`s with concrete step ranges; everything a step needs
from it (its stage, windows, MTP weights, lr multiplier, micro-batching) is then a pure function of
the step, which the run's plan (plan.py) gives, so a resumed run lands in the right stage without
storing anything. A config without a table is one stage made of the run's own keys: the loop runs
exactly as it did before stages.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from .config import Config, ConfigError, StageConfig, micro_batch_rows
from .config.validate import FLOAT32_MAX

# The shares of a table must add up to 1 within this (they are written as decimals like 0.33).
SHARE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Stage:
    """One resolved stage: steps [start, end) and concrete values for each of its keys."""

    index: int
    start: int
    end: int
    batch_tokens: int
    seq_len: int
    max_doc_len: int  # 0: documents are not cut (beyond the row's own length)
    windows: tuple[int, int] | None  # (long, short) tokens for the whole stage; None: the window schedule's
    mtp_weights: tuple[float, ...]  # at the stage's first step; (1.0,): next-token prediction only
    mtp_weights_end: tuple[float, ...]  # at its last step (linear in between)
    lr_mul: float
    # The table's row as given (None without a table): a stage hook of the loop reads a key that a
    # switch adds to StageConfig from here (say, whether the embedding is tied to the head).
    row: StageConfig | None = field(default=None, compare=False, repr=False)

    @property
    def steps(self) -> int:
        return self.end - self.start

    def mtp_weights_at(self, step: int) -> tuple[float, ...]:
        """The weights of `step`: linear from mtp_weights at the stage's first step to mtp_weights_end
        at its end (the record's [1, .5, .25 -> 0]), constant when both are the same."""
        if self.mtp_weights == self.mtp_weights_end:
            return self.mtp_weights
        t = (step - self.start) / self.steps
        return tuple(a + (b - a) * t for a, b in zip(self.mtp_weights, self.mtp_weights_end))

    @property
    def predicts(self) -> int:
        """Tokens ahead the loss scores (1: next-token only)."""
        return len(self.mtp_weights)


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    from_table: bool  # False: the run has no train.stages (one implicit stage)

    def stage_at(self, step: int) -> Stage:
        """The stage that trains step `step` (steps at or past the end: the last stage, whose windows
        the finished model is validated and sampled with)."""
        for stage in self.stages:
            if step < stage.end:
                return stage
        return self.stages[-1]

    @property
    def has_mtp(self) -> bool:
        return any(s.predicts > 1 for s in self.stages)

    def max_seq_len(self) -> int:
        return max(s.seq_len for s in self.stages)

    def min_batch_tokens(self) -> int:
        return min(s.batch_tokens for s in self.stages)

    def as_records(self) -> list[dict]:
        """The resolved table as plain dicts (the run's metrics.jsonl keeps it)."""
        return [{"stage": s.index, "start": s.start, "end": s.end, "batch_tokens": s.batch_tokens,
                 "seq_len": s.seq_len, "max_doc_len": s.max_doc_len, "windows": list(s.windows) if s.windows else None,
                 "mtp_weights": list(s.mtp_weights), "mtp_weights_end": list(s.mtp_weights_end),
                 "lr_mul": s.lr_mul} for s in self.stages]


def stage_plan(cfg: Config) -> StagePlan:
    """Resolve train.stages into step ranges and concrete values (raises ConfigError on a bad table)."""
    t, d = cfg.train, cfg.data
    if not t.stages:
        return StagePlan((Stage(0, 0, t.steps, t.batch_tokens, d.seq_len, d.max_doc_len, None, (1.0,), (1.0,), 1.0),),
                         False)
    total_share = sum(s.share for s in t.stages)
    if any(s.share <= 0 for s in t.stages) or abs(total_share - 1.0) > SHARE_TOLERANCE:
        raise ConfigError(f"train.stages: every stage needs a share > 0 and the shares must add up to 1 "
                          f"(they add up to {total_share:g}); fix the stages' share values")
    stages, start, cumulative = [], 0, 0.0
    for i, s in enumerate(t.stages):
        cumulative += s.share
        end = t.steps if i == len(t.stages) - 1 else round(cumulative * t.steps)
        if end <= start:
            raise ConfigError(f"train.stages[{i}] gets no step of train.steps={t.steps} (share {s.share:g}); "
                              f"raise its share or train.steps")
        weights = tuple(s.mtp_weights) or (1.0,)
        weights_end = tuple(s.mtp_weights_end) or weights
        stages.append(Stage(i, start, end, s.batch_tokens or t.batch_tokens, s.seq_len or d.seq_len,
                            s.max_doc_len or d.max_doc_len, _stage_windows(cfg, i), weights, weights_end, s.lr_mul,
                            row=s))
        start = end
    return StagePlan(tuple(stages), True)


def fit_rows_to_world(cfg: Config, world_size: int) -> tuple[Config, list[str]]:
    """A stage table's rows fitted to `world_size` ranks, and a start-log line per row length changed. A stage
    whose share of a rank (batch_tokens / world_size) is not a whole number of its rows takes that share as one row
    when it is less than two rows (one micro-step, at most twice a row's activations), else rows of the largest
    length that divides both (their gcd). So speedrun-latest's rows of 32,768 (one graph on 1-4 GPUs) become, on 8,
    one row of 16,384 in the first stage and of 49,152 in the last, the preset's own shapes there, instead of failing.
    The run's own rows (data.seq_len: the micro-step's token cap and validation's batching) likewise, with
    train.batch_tokens. Only with a stage table and more than one rank: a single-stage config's rows, or one rank's,
    are the user's, and a mismatch stays an error naming the fix; so is a stage whose batch is not a whole number of
    its rows on any world size, and one that does not split among the ranks (validate's errors). The same config on
    the same world size fits the same way, and the fitted lengths are written into the resolved config
    (config.toml, plan.json). A resume on another world size plans its own rows: train/resume.py does not count
    row lengths as a schedule change."""
    t, d = cfg.train, cfg.data
    if not t.stages or world_size <= 1:
        return cfg, []

    def fitted(batch_tokens: int, seq_len: int) -> int:
        # only what the world size breaks: a table whose batch is not whole rows anyway is the user's to fix
        if seq_len < 2 or batch_tokens % seq_len or batch_tokens % world_size:
            return seq_len
        share = batch_tokens // world_size
        if share % seq_len == 0:
            return seq_len
        return share if share < 2 * seq_len else math.gcd(share, seq_len)

    batches = [s.batch_tokens or t.batch_tokens for s in t.stages]
    owns = [s.seq_len or d.seq_len for s in t.stages]
    fits = [fitted(batch, own) for batch, own in zip(batches, owns)]
    run_rows = fitted(t.batch_tokens, d.seq_len)
    if fits == owns and run_rows == d.seq_len:
        return cfg, []
    lines = []
    out = copy.deepcopy(cfg)
    for i, (row, batch, own, fit) in enumerate(zip(out.train.stages, batches, owns, fits)):
        if fit != own:
            lines.append(f"train.stages[{i}]: rows of {fit:,} tokens on {world_size} ranks (seq_len={own:,} is not a "
                         f"whole number of rows of a rank's {batch // world_size:,} tokens)")
        row.seq_len = fit  # written out, so a change of data.seq_len below leaves the stage's rows as fitted
    if run_rows != d.seq_len:
        lines.append(f"data.seq_len: rows of {run_rows:,} tokens on {world_size} ranks for the run's own batch "
                     f"(the micro-step's token cap, validation's batching; {d.seq_len:,} is not a whole number of "
                     f"rows of a rank's {t.batch_tokens // world_size:,} tokens)")
        out.data.seq_len = run_rows
    return out, lines


def resolve_stage_table(cfg: Config, plan: StagePlan | None = None) -> Config:
    """A copy of cfg whose train.stages rows hold concrete values (the run's batch and row length in
    place of zeros, the short window, the weights at both ends): the table the run's config.toml keeps.
    Windows left at 0 stay 0 (they follow the window schedule). `plan`: cfg's table, if derived already."""
    if not cfg.train.stages:
        return cfg
    plan = plan or stage_plan(cfg)
    cfg = copy.deepcopy(cfg)
    for row, stage in zip(cfg.train.stages, plan.stages):
        row.batch_tokens, row.seq_len, row.max_doc_len = stage.batch_tokens, stage.seq_len, stage.max_doc_len
        if stage.windows:
            row.window_long, row.window_short = stage.windows
        row.mtp_weights, row.mtp_weights_end = list(stage.mtp_weights), list(stage.mtp_weights_end)
    return cfg


def _stage_windows(cfg: Config, i: int) -> tuple[int, int] | None:
    s, sched = cfg.train.stages[i], cfg.schedule
    if not s.window_long:
        if s.window_short:
            raise ConfigError(f"train.stages[{i}].window_short={s.window_short} needs window_long too "
                              f"(0 leaves both to the window schedule)")
        return None
    block = sched.window_block
    short = s.window_short or max(block, int(s.window_long // block * sched.short_window_frac) * block)
    for key, value in (("window_long", s.window_long), ("window_short", short)):
        if value < block or value % block:
            raise ConfigError(f"train.stages[{i}].{key}={value} must be a positive multiple of "
                              f"schedule.window_block={block}")
    if short > s.window_long:
        raise ConfigError(f"train.stages[{i}].window_short={short} exceeds window_long={s.window_long}")
    return s.window_long, short


def stage_micro_batch(cfg: Config, stage: Stage, world_size: int = 1) -> tuple[int, int]:
    """(rows per micro-step per rank, gradient-accumulation steps) of a stage. Without a table, the
    run's own (`micro_batch_rows`). With one, a micro-step holds at most the tokens of the run's own
    micro-step (train.micro_batch_size rows of data.seq_len; all of a rank's rows when that is 0), so
    a stage with shorter rows takes more of them and memory stays bounded: the rows are the largest
    divisor of the rank's rows within that cap."""
    if not cfg.train.stages:
        return micro_batch_rows(cfg, world_size)
    rows_global = stage.batch_tokens // stage.seq_len
    if stage.batch_tokens % stage.seq_len or rows_global % world_size:
        raise ConfigError(f"train.stages[{stage.index}]: batch_tokens={stage.batch_tokens} must be a whole number "
                          f"of rows of seq_len={stage.seq_len}, and the rows a multiple of {world_size} rank(s)")
    rows_rank = rows_global // world_size
    mb = cfg.train.micro_batch_size
    cap = max(1, mb * cfg.data.seq_len // stage.seq_len) if mb else rows_rank
    rows = max(r for r in range(1, min(cap, rows_rank) + 1) if rows_rank % r == 0)
    return rows, rows_rank // rows


def _check_stage_lr_fits(cfg: Config, index: int, lr_mul: float) -> None:
    """A stage's lr_mul times a learning rate is what the optimizer's float32 step applies: past float32's range
    it failed at the stage's first step as torch's "value cannot be converted to type float without overflow",
    naming no key (each factor alone fits: config/validate.py checks the optim keys)."""
    key, lr = max(((k, v) for k, v in vars(cfg.optim).items() if k.endswith("_lr") and isinstance(v, float)),
                  key=lambda kv: kv[1])
    if lr * lr_mul > FLOAT32_MAX:
        raise ConfigError(f"train.stages[{index}].lr_mul={lr_mul:g} times optim.{key}={lr:g} is {lr * lr_mul:.3g}, "
                          f"beyond float32 (at most {FLOAT32_MAX:.3g}), in which training applies it; give an lr_mul "
                          f"of at most {FLOAT32_MAX / lr:.3g}")


def check_stages(cfg: Config, world_size: int = 1) -> StagePlan:
    """Raise ConfigError for the first inconsistent stage (called by plan.validate); return the table."""
    t = cfg.train
    if not t.stages:
        return stage_plan(cfg)
    if t.tokens_per_param or t.flops_budget:
        raise ConfigError("train.stages with a budget (train.tokens_per_param / train.flops_budget) is not "
                          "supported: the batch changes per stage; set train.steps instead")
    for i, s in enumerate(t.stages):
        for key in ("batch_tokens", "seq_len", "max_doc_len", "window_long", "window_short"):
            if getattr(s, key) < 0:
                raise ConfigError(f"train.stages[{i}].{key}={getattr(s, key)} must be >= 0 (0: the run's own)")
        if (s.seq_len or cfg.data.seq_len) < 2:
            raise ConfigError(f"train.stages[{i}].seq_len={s.seq_len} must be at least 2")
        if s.max_doc_len and cfg.data.packing != "greedy":
            raise ConfigError(f"train.stages[{i}].max_doc_len={s.max_doc_len} works with data.packing=greedy only; "
                              f"use --data.packing=greedy or leave max_doc_len at 0")
        if not (s.lr_mul > 0 and math.isfinite(s.lr_mul)):
            raise ConfigError(f"train.stages[{i}].lr_mul={s.lr_mul} must be > 0")
        _check_stage_lr_fits(cfg, i, s.lr_mul)
        weights = s.mtp_weights or [1.0]
        if weights[0] != 1.0 or (s.mtp_weights_end and s.mtp_weights_end[0] != 1.0):
            raise ConfigError(f"train.stages[{i}]: the first MTP weight (the next token's) must be 1.0, got "
                              f"{s.mtp_weights} -> {s.mtp_weights_end}; scale the loss with lr_mul instead")
        if s.mtp_weights_end and len(s.mtp_weights_end) != len(weights):
            raise ConfigError(f"train.stages[{i}].mtp_weights_end={s.mtp_weights_end} must have as many weights as "
                              f"mtp_weights={weights} (or be empty)")
        if any(not (w >= 0 and math.isfinite(w)) for w in [*weights, *s.mtp_weights_end]):
            raise ConfigError(f"train.stages[{i}]: MTP weights must be finite and >= 0")
    plan = stage_plan(cfg)
    for stage in plan.stages:
        stage_micro_batch(cfg, stage, world_size)
        if stage.predicts >= stage.seq_len:
            raise ConfigError(f"train.stages[{stage.index}]: {stage.predicts} MTP weights need rows longer than "
                              f"seq_len={stage.seq_len}")
    return plan
