"""`speedgpt sweep`: train a grid of depths x budgets, then find the compute-optimal frontier.

    speedgpt sweep --out sweeps/s1 --depths 4,6,8 --flops 1e15,3e15,1e16 [--preset P] [--key=value ...]
    speedgpt sweep --out sweeps/s2 --depths 4,6,8 --tokens-per-param 4,10,20

Each grid point is one `speedgpt train` subprocess with its own run directory under the sweep
directory (`d{depth}-{budget}`), so a crash, an out-of-memory or a Ctrl-C loses at most one run:
calling the same command again skips finished runs, resumes a run that has a checkpoint and
starts the others afresh. A run stopped by `train.time_budget_s` is finished (its budget is part
of its config): it is analyzed with the steps it trained, and its row says "time budget". Then the analysis (also on its own: `--analyze`) reads every run's final
validation loss and training FLOPs and writes into the sweep directory:

* ``sweep.md``: one row per run, and the frontier: per budget the best depth, the parameter count
  at the minimum of a parabola fitted to loss over log(params) (Chinchilla's "approach 2"), and
  the fitted power laws N_opt = k C^a and L = k' C^b (scipy.stats.linregress in log-log space);
* ``frontier.png`` (loss against FLOPs, one line per depth, the frontier and its fit) and
  ``optimal_params.png`` (N_opt against FLOPs with its fit);
* ``results.json`` with the same numbers.

The sweep also records its preset and overrides in ``sweep.json``: `--analyze` alone checks every
finished run against them, so runs of other settings never share one frontier.

The runner is a small one of its own (one subprocess at a time, its output in the run's
train.log); runs use every GPU the machine gives one process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .argv import Parser, refuse_empty_paths
from .atomic import atomic_file, atomic_write
from .provenance import short_commit, source_version


class SweepError(ValueError):
    """Bad sweep arguments or no finished run to analyze; the message says what to do."""


@dataclass
class Point:
    depth: int
    budget: float  # tokens per parameter, or FLOPs
    name: str


@dataclass
class RunResult:
    name: str
    kind: str  # "flops_budget" or "tokens_per_param"
    depth: int
    budget: float
    params: int  # scaling parameters (budget.scaling_params)
    batch_tokens: int
    steps: int
    tokens: int
    flops: float
    val_loss: float
    time_s: float
    ended_by: str = "steps"  # or "time budget": train.time_budget_s stopped it (steps is then what it trained)


def _fmt_budget(kind: str, value: float) -> str:
    if kind == "tokens_per_param":
        return f"r{value:g}"
    mantissa, _, exponent = f"{value:.3g}".partition("e")
    return f"c{mantissa}e{int(exponent)}" if exponent else f"c{mantissa}"  # 8e+09 -> c8e9


def grid(depths: list[int], budgets: list[float], kind: str) -> list[Point]:
    return [Point(d, b, f"d{d}-{_fmt_budget(kind, b)}") for b in budgets for d in depths]


# The keys a sweep sets per run: an override of one of them would be overridden in turn.
SWEPT_KEYS = ("model.depth", "model.model_dim", "model.num_heads", "train.tokens_per_param", "train.flops_budget")


def run_overrides(point: Point, kind: str) -> list[str]:
    """The per-run keys (SWEPT_KEYS): the depth (width and heads derived from it) and the budget."""
    other = "flops_budget" if kind == "tokens_per_param" else "tokens_per_param"
    return [f"--model.depth={point.depth}", "--model.model_dim=0", "--model.num_heads=0",
            f"--train.{kind}={point.budget!r}", f"--train.{other}=0"]


def point_overrides(point: Point, kind: str, overrides: list[str]) -> list[str]:
    """Every override of a point's `speedgpt train`, as it runs and as `plan` resolves it."""
    return [*overrides, *run_overrides(point, kind), "--run.report=false", f"--run.name={point.name}"]


def _read_run(run_dir: Path):
    """(config, metrics records) of a run directory, or None when it has no run or no metrics yet."""
    from .rundir import RunDir
    from .rundir.reuse import found_run_config

    run = RunDir(run_dir)
    cfg = found_run_config(run_dir)  # a run whose config.toml is unreadable or gone: refused, never passed over
    if cfg is None or not run.metrics_path.is_file():
        return None
    return cfg, run.read_metrics()


def _ended_by(read) -> str | None:
    from .rundir.metrics import ended_by

    return ended_by(read[1], read[0].train.steps) if read else None


def finished(run_dir: Path) -> str | None:
    """How a run ended ("steps" or "time budget": both finished, rundir/metrics.py ended_by), or
    None while it has not: its metrics hold no final validation."""
    return _ended_by(_read_run(run_dir))


def _has_checkpoint(run_dir: Path) -> bool:
    from .rundir import RunDir

    return bool(RunDir(run_dir).list_checkpoints())


def run_point(out: Path, point: Point, kind: str, preset: str, overrides: list[str], echo=print,
              workdir: str | None = None) -> bool:
    """Train one grid point in a subprocess (skipped when finished); True when it finished."""
    run_dir = out / point.name
    how = finished(run_dir)
    if how:
        echo(f"sweep: {point.name}: finished earlier{' (stopped by its time budget)' if how != 'steps' else ''}, "
             f"skipped")
        return True
    cmd = [sys.executable, "-m", "speedgpt", "train"]
    if _has_checkpoint(run_dir):
        cmd += ["--resume", str(run_dir)]
        echo(f"sweep: {point.name}: resuming from its checkpoint")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)  # a run that died before its first checkpoint
        run_dir.mkdir(parents=True)
        cmd += ["--preset", preset, *point_overrides(point, kind, overrides), "--run-dir", str(run_dir)]
        echo(f"sweep: {point.name}: training")
    with open(run_dir / "train.log", "a") as log:
        # By path, like `speedgpt ab` (ab/run.py execute): an inherited cwd that was replaced breaks `import torch`.
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir or os.getcwd()).returncode
    if rc != 0:
        tail = (run_dir / "train.log").read_text(errors="replace").strip().splitlines()[-1:]
        echo(f"sweep: {point.name}: failed (exit {rc}): {tail[0] if tail else ''} (log: {run_dir / 'train.log'})")
        return False
    if not finished(run_dir):
        # Exit 0 without its final validation (a resume that found the run "complete, nothing to train" though its
        # metrics lack that validation, as ab/run.py's _classify says): the analysis would leave it out, and the
        # sweep said nothing.
        echo(f"sweep: {point.name}: failed: its train exited 0 but its metrics hold no final validation, so the "
             f"analysis cannot use it; delete {run_dir} and run the same command again to train it afresh "
             f"(log: {run_dir / 'train.log'})")
        return False
    return True


def _point_of(cfg, name: str) -> tuple[str, Point]:
    """The kind of budget ("flops_budget" or "tokens_per_param") and the grid point a run's saved config stands for."""
    kind = "flops_budget" if cfg.train.flops_budget else "tokens_per_param"
    return kind, Point(cfg.model.depth, getattr(cfg.train, kind), name)


def collect(out: Path) -> list[RunResult]:
    """The finished runs of a sweep directory."""
    from .budget import describe, training_flops_per_token

    results = []
    for run_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        read = _read_run(run_dir)  # once: what `finished` reads is what the row needs
        how = _ended_by(read)
        if not how:
            continue
        cfg, records = read
        b = describe(cfg)
        last = [r for r in records if "val_loss" in r and r.get("event") != "eval"][-1]
        kind, pt = _point_of(cfg, run_dir.name)
        results.append(RunResult(run_dir.name, kind, pt.depth, pt.budget, b.scaling_params, b.batch_tokens,
                                 int(last["step"]), int(last["tokens"]),
                                 last["tokens"] * training_flops_per_token(cfg), float(last["val_loss"]),
                                 float(last.get("time_s", 0.0)), how))
    return results


# ---------------------------------------------------------------------------------------------
# The frontier.

def power_law(x: list[float], y: list[float]) -> dict | None:
    """y = k x^a fitted by least squares in log-log space; None with fewer than two distinct x."""
    from scipy import stats

    if len(set(x)) < 2:
        return None
    fit = stats.linregress([math.log(v) for v in x], [math.log(v) for v in y])
    return {"k": math.exp(fit.intercept), "a": fit.slope, "r2": fit.rvalue ** 2}


def optimal_params(points: list[RunResult]) -> float:
    """The parameter count of least loss among runs of one budget: the vertex of a parabola in
    log(params) when at least three depths bracket it, else the best run's count."""
    import numpy as np

    best = min(points, key=lambda r: r.val_loss)
    if len(points) < 3:
        return float(best.params)
    x = np.log([r.params for r in points])
    a, b, _ = np.polyfit(x, [r.val_loss for r in points], 2)
    if a <= 0:
        return float(best.params)  # no minimum inside: the frontier lies beyond the grid
    vertex = -b / (2 * a)
    return float(math.exp(min(max(vertex, x.min()), x.max())))


def frontier(results: list[RunResult]) -> dict:
    """Per budget: FLOPs, best run, N_opt; the power laws over budgets. FLOP-budget grids group runs by
    budget; tokens-per-param grids (each run its own FLOPs) use the lower envelope of loss over FLOPs."""
    by_budget: dict[float, list[RunResult]] = {}
    for r in results:
        by_budget.setdefault(r.budget, []).append(r)
    rows = []
    if all(r.kind == "flops_budget" for r in results):  # every depth of a budget spends (about) the same
        for budget, runs in sorted(by_budget.items()):
            best = min(runs, key=lambda r: r.val_loss)
            rows.append({"flops": budget, "best": best.name, "loss": best.val_loss,
                         "params_opt": optimal_params(runs), "depths": len(runs)})
    else:
        envelope = float("inf")
        for r in sorted(results, key=lambda r: r.flops):
            if r.val_loss < envelope:
                envelope = r.val_loss
                rows.append({"flops": r.flops, "best": r.name, "loss": r.val_loss, "params_opt": float(r.params),
                             "depths": 1})
    return {"rows": rows,
            "params_fit": power_law([r["flops"] for r in rows], [r["params_opt"] for r in rows]),
            "loss_fit": power_law([r["flops"] for r in rows], [r["loss"] for r in rows])}


def _fit_text(fit: dict | None, what: str) -> str:
    if fit is None:
        return f"{what}: not fitted (needs at least two budgets)"
    return f"{what} = {fit['k']:.4g} x C^{fit['a']:.4f} (r² {fit['r2']:.3f})"


def write_markdown(out: Path, results: list[RunResult], front: dict, commit: str = "unknown") -> Path:
    lines = ["# Sweep", "", f"speedgpt commit {commit} (the analysis's; each run's own is in its env.json)", "", "| run | depth | budget | scaling params | batch | steps | tokens | FLOPs | val loss | time "
             "| ended by |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.budget, r.depth)):
        lines.append(f"| {r.name} | {r.depth} | {r.budget:g} | {r.params:,} | {r.batch_tokens:,} | {r.steps:,} | "
                     f"{r.tokens:,} | {r.flops:.3g} | {r.val_loss:.4f} | {r.time_s:.0f} s | {r.ended_by} |")
    lines += ["", "## Frontier", "", "| FLOPs | best run | val loss | N_opt (scaling params) |", "|---|---|---|---|"]
    for row in front["rows"]:
        lines.append(f"| {row['flops']:.3g} | {row['best']} | {row['loss']:.4f} | {row['params_opt']:,.0f} |")
    lines += ["", "- " + _fit_text(front["params_fit"], "N_opt"), "- " + _fit_text(front["loss_fit"], "val loss"), ""]
    path = out / "sweep.md"
    atomic_write(path, "\n".join(lines))
    return path


def write_plots(out: Path, results: list[RunResult], front: dict) -> list[Path]:
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for depth in sorted({r.depth for r in results}):
        runs = sorted((r for r in results if r.depth == depth), key=lambda r: r.flops)
        ax.plot([r.flops for r in runs], [r.val_loss for r in runs], "o-", label=f"d{depth}")
    xs = [row["flops"] for row in front["rows"]]
    smooth = np.geomspace(min(xs), max(xs), 50)
    ax.plot(xs, [row["loss"] for row in front["rows"]], "k--", lw=1, label="frontier")
    ax.set(xscale="log", xlabel="training FLOPs", ylabel="final val loss", title="loss against compute")
    paths.append(_finish_plot(fig, ax, front["loss_fit"], smooth, out / "frontier.png"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [row["params_opt"] for row in front["rows"]], "o", label="N_opt")
    ax.set(xscale="log", yscale="log", xlabel="training FLOPs", ylabel="scaling parameters",
           title="compute-optimal model size")
    paths.append(_finish_plot(fig, ax, front["params_fit"], smooth, out / "optimal_params.png"))
    return paths


def _finish_plot(fig, ax, fit: dict | None, smooth, path: Path) -> Path:
    """Draw a fitted power law (when there is one), then write the figure atomically and close it."""
    import matplotlib.pyplot as plt

    if fit:
        ax.plot(smooth, fit["k"] * smooth ** fit["a"], "r:", label=f"fit C^{fit['a']:.3f}")
    ax.legend()
    fig.tight_layout()
    with atomic_file(path) as f:
        fig.savefig(f, dpi=120, format="png")
    plt.close(fig)
    return path


def analyze(out: Path, echo=print) -> dict:
    if not out.is_dir():
        what = "is a file, not a sweep directory" if out.exists() else "does not exist"
        raise SweepError(f"--out {out} {what}; pass the directory of a sweep (speedgpt sweep --out DIR ...)")
    results = collect(out)
    if not results:
        raise SweepError(f"no finished run in {out}; run the sweep first (speedgpt sweep --out {out} ...)")
    front = frontier(results)
    version = source_version()  # which code analyzed the runs (provenance.py)
    md = write_markdown(out, results, front, commit=short_commit(version))
    pngs = write_plots(out, results, front)
    data = {"runs": [asdict(r) for r in results], "frontier": front, "code": version}
    atomic_write(out / "results.json", json.dumps(data, indent=1))
    echo(md.read_text())
    echo(f"sweep: wrote {md}, {', '.join(str(p) for p in pngs)}, {out / 'results.json'}")
    return data


# The sweep's preset on a GPU when none is named: one whose layer-indexed switches hold at every depth of a
# ladder (speedrun-latest, train's GPU default, names layers of its 12: at depth 8 its paired-head list fails).
SWEEP_GPU_PRESET = "speedrun-124m"
_EXAMPLES = {"--depths": "4,6,8", "--flops": "1e15,3e15", "--tokens-per-param": "4,10,20"}
_FLAGS = {"flops_budget": "--flops", "tokens_per_param": "--tokens-per-param"}


def _numbers(text: str, flag: str, cast) -> list:
    example = f"e.g. {flag} {_EXAMPLES[flag]}"
    try:
        values = [cast(float(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SweepError(f"{flag} {text!r}: give comma-separated numbers, {example}") from None
    if not values or any(v <= 0 for v in values):
        raise SweepError(f"{flag} {text!r}: give positive numbers, {example}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:  # two points of one name would train into one directory
        raise SweepError(f"{flag} {text!r} names {', '.join(f'{v:g}' for v in twice)} twice; give each value once")
    return values


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="speedgpt sweep", description=__doc__.split("\n\n")[0],
               epilog="other arguments are config overrides for every run, e.g. --data.seq_len=512")
    p.add_argument("--out", required=True, help="the sweep directory (runs, table and plots go there)")
    p.add_argument("--depths", help="comma-separated depths, e.g. 4,6,8")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--tokens-per-param", help="comma-separated training tokens per scaling parameter")
    budget.add_argument("--flops", help="comma-separated training FLOP budgets, e.g. 1e15,3e15")
    p.add_argument("--preset", help=f"preset of every run (default: tiny-cpu without a GPU, {SWEEP_GPU_PRESET} "
                                    "with one)")
    p.add_argument("--dry-run", action="store_true", help="print each run's derived size, batch, steps and FLOPs")
    p.add_argument("--analyze", action="store_true", help="only analyze the finished runs in --out")
    args, overrides = p.parse_known_args(argv)
    refuse_empty_paths(p, args, ("--out",), default=False)  # "" was ".": the sweep's runs went into this directory
    bad = [o for o in overrides if not o.startswith("--") or "=" not in o or "." not in o.split("=", 1)[0]]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like --data.seq_len=512)")
    swept = [o for o in overrides if o[2:].split("=", 1)[0] in SWEPT_KEYS]
    if swept:
        p.error(f"{' '.join(swept)}: the sweep sets {', '.join(SWEPT_KEYS)} per run; give depths with --depths and "
                f"budgets with --flops or --tokens-per-param")
    out = Path(args.out)
    from .config import ConfigError, default_preset
    from .outdir import OutDirError, check_out_dir, make_out_dir, os_error_line

    try:
        if args.analyze:
            checked = check_recorded_settings(out)
            analyze(out)  # (a folder without finished runs is its one-line error)
            if not checked:
                print(f"sweep: note: {out} holds no {SETTINGS_FILE} (the settings a sweep records since 2026-12-06), "
                      f"so its runs' settings were not checked against each other", file=sys.stderr)
            return 0
        if not args.depths or not (args.tokens_per_param or args.flops):
            p.error("give --depths and one of --tokens-per-param or --flops (or --analyze)")
        depths = _numbers(args.depths, "--depths", int)
        kind = "tokens_per_param" if args.tokens_per_param else "flops_budget"
        budgets = _numbers(args.tokens_per_param or args.flops, _FLAGS[kind], float)
        points = grid(depths, budgets, kind)
        preset = args.preset or default_preset(gpu=SWEEP_GPU_PRESET)
        plan_lines: list[str] = []  # printed once --out is known to take the sweep: a refusal prints no plan
        planned = plan(points, kind, preset, overrides, echo=plan_lines.append)  # every config resolves first
        check_out_dir(out)
        check_existing(out, planned)
        check_others(out, planned, preset, overrides)
        print("\n".join(plan_lines))
        if args.dry_run:
            return 0
        make_out_dir(out)
        # What `--analyze` alone checks the runs against (the last sweep's; check_others made the earlier runs its)
        atomic_write(out / SETTINGS_FILE, json.dumps({"preset": preset, "overrides": overrides}, indent=1))
        workdir = os.getcwd()
        failed = [pt.name for pt in points if not run_point(out, pt, kind, preset, overrides, workdir=workdir)]
        analyze(out)
    except (SweepError, ConfigError, OutDirError) as e:
        print(f"speedgpt sweep: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # writing a run's log, the table or the plots: say what to do, not just errno
        print(f"speedgpt sweep: {os_error_line(e, '--out', out)}", file=sys.stderr)
        return 2
    if failed:
        print(f"speedgpt sweep: {len(failed)} run(s) failed: {', '.join(failed)}; the lines above say why "
              f"(and each run's train.log); run the same command again to retry them", file=sys.stderr)
        return 1
    return 0


def plan(points: list[Point], kind: str, preset: str, overrides: list[str], echo=print) -> dict[str, dict]:
    """Resolve every run's budget in-process and print it: a bad grid fails before any training. Returns each
    point's resolved config (`comparable_config`) by name."""
    from .budget import BudgetBelowOneStep, describe
    from .config import resolve
    from .data.shards import given_shards_problem
    from .planner import plan_run
    from .rundir.reuse import comparable_config

    planned = {}
    for pt in points:
        try:
            cfg = resolve(preset, None, point_overrides(pt, kind, overrides))
            run_plan = plan_run(cfg)
        except BudgetBelowOneStep as e:  # a point of no step would train one and stand on the frontier as this one
            flag = _FLAGS[kind]
            raise SweepError(f"{flag} {pt.budget:g} is less than one training step at depth {pt.depth} ({pt.name}); "
                             f"the smallest {flag} for depth {pt.depth} is {e.smallest:.3g}") from None
        if pt is points[0]:  # every point reads the same data: a wrong path is one line, not a crash per run
            problem = given_shards_problem(run_plan.cfg.data)
            if problem:
                raise SweepError(problem)
        b = describe(run_plan.cfg)
        echo(f"sweep: {pt.name}: {b.scaling_params:,} scaling params, batch {b.batch_tokens:,}, {b.steps:,} steps, "
             f"{b.tokens:,} tokens, {b.flops:.3g} FLOPs")
        for line in run_plan.budget_lines:
            if line.startswith("warning:"):
                echo(f"sweep: {pt.name}: {line}")
        planned[pt.name] = comparable_config(run_plan.cfg.to_dict())  # as train saves it: steps derived
    return planned


def check_existing(out: Path, planned: dict[str, dict]) -> None:
    """A run a sweep finds in its directory is skipped or resumed only when it is the run this command plans: a
    finished run of other settings would stand in the table as this one's."""
    from .rundir.reuse import config_differences

    for name, cfg in planned.items():
        diff = config_differences(out / name, cfg)
        if diff:
            raise SweepError(f"{out / name} holds a run of other settings (differs in {', '.join(diff[:4])}); "
                             f"use a new --out for these settings, or delete that run to train it again")


SETTINGS_FILE = "sweep.json"  # the preset and overrides of the sweep that last trained in the directory


def check_recorded_settings(out: Path) -> bool:
    """`--analyze` alone: every finished run in `out` must be one the recorded sweep settings would train (as
    check_others says before a sweep trains). False when `out` holds no settings (made before sweeps wrote them): its
    analysis then says that nothing was checked."""
    path = out / SETTINGS_FILE
    if not path.is_file():
        return False
    try:
        saved = json.loads(path.read_text())
        preset, overrides = saved["preset"], saved["overrides"]
        if not isinstance(preset, str) or not isinstance(overrides, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise SweepError(f"{path} is not a sweep's settings file (JSON with 'preset' and 'overrides'); delete it to "
                         f"analyze without checking the runs' settings") from None
    # The recorded preset is resolved by today's code: a preset changed since the sweep differs too, hence the way out
    check_others(out, {}, preset, overrides, fix=f"move that run out of {out}, or delete {path} to analyze without "
                                                 f"this check (a sweep of an older speedgpt may differ only by a preset "
                                                 f"changed since)")
    return True


def check_others(out: Path, planned: dict[str, dict], preset: str, overrides: list[str], fix: str = "") -> None:
    """The analysis reads every finished run in the sweep directory, not only this command's points: a finished run of
    another grid point is welcome there only when this command would have trained it as it is (same preset and
    overrides at its depth and budget). Else the frontier and its fits would mix settings (an earlier sweep with
    --data.seq_len=64 and this one's 128 in one table, exit 0), so the command is refused before any run."""
    from .budget import BudgetBelowOneStep
    from .config import ConfigError, resolve
    from .planner import plan_run
    from .rundir.reuse import comparable_config, differences_from

    if not out.is_dir():
        return
    for run_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name not in planned):
        read = _read_run(run_dir)
        if not _ended_by(read):  # only finished runs enter the analysis
            continue
        kind, pt = _point_of(read[0], run_dir.name)
        try:
            cfg = plan_run(resolve(preset, None, point_overrides(pt, kind, overrides))).cfg
        except (BudgetBelowOneStep, ConfigError) as e:
            diff = [f"its depth and budget are no run of these settings: {e}"]
        else:  # against the config _read_run read (and refused unreadable), not a second read of the file
            diff = differences_from(read[0], comparable_config(cfg.to_dict()))
        if diff:
            fix = fix or f"use a new --out for these settings, or move that run out of {out}"
            raise SweepError(f"{run_dir} is a finished run of other settings (differs in {', '.join(diff[:4])}), and "
                             f"the analysis would put it on this sweep's frontier; {fix}")
