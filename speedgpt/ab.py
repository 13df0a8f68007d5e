"""`speedgpt ab`: a paired A/B of two configurations over several seeds, judged on validation loss
and on training time to a target loss.

Seed s of arm A and of arm B get the same train.seed (same init where the architecture is the
same, same data order). Runs go in the order A B A B ...; with several GPUs one wave runs one run
per GPU at once (A and B of a seed side by side, GPUs swapped every seed so a faster GPU favours
neither arm). Each run is `python -m speedgpt train ... --run-dir OUT/<arm>-seed<s>` with its output
in OUT/<arm>-seed<s>/train.log. A run counts as finished when its metrics.jsonl holds the final
validation of its configured steps, so an interrupted `ab` resumes where it stopped; a half-run is
resumed from its checkpoint or rerun from scratch. Results: a table, OUT/summary.json, OUT/ab.png
and a markdown row for docs/experiments.md (which explains the statistics).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ab_stats import describe, paired
from .atomic import atomic_file, atomic_write
from .outdir import OutDirError, make_out_dir, os_error_line
from .provenance import short_commit

ARMS = ("a", "b")
STATUS_FILE = "ab_status.json"  # written into a run dir when the run failed
LOG_FILE = "train.log"


class AbError(ValueError):
    """Bad input or an unusable state; the message says what to do."""


@dataclass
class Arm:
    name: str  # "a" | "b"
    preset: str
    overrides: list[str]
    text: str  # as given, for the notebook


@dataclass
class Run:
    arm: str
    seed: int
    index: int  # seed's position (0..N-1)
    run_dir: Path
    argv: list[str]  # the train command's arguments after `python -m speedgpt train`
    steps: int
    config: dict = field(default_factory=dict)  # the resolved config the run must have


@dataclass
class Plan:
    arms: dict[str, Arm]
    common: list[str]
    seeds: list[int]
    runs: list[Run]  # in launch order: A B A B ...
    out: Path
    configs: dict[str, dict] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Arms and the plan.

def parse_arm(name: str, text: str, default_preset: str) -> Arm:
    """An arm's text: overrides like "--optim.normuon=false", optionally "--preset NAME"."""
    try:
        words = shlex.split(text or "")
    except ValueError as e:
        raise AbError(f"--{name} {text!r}: cannot split it into arguments ({e}); check the quotes") from None
    preset, overrides, i = default_preset, [], 0
    while i < len(words):
        w = words[i]
        if w == "--preset":
            if i + 1 >= len(words):
                raise AbError(f"--{name}: --preset needs a name, e.g. --{name} \"--preset speedrun-r28\"")
            preset, i = words[i + 1], i + 2
            continue
        if w.startswith("--preset="):
            preset = w.split("=", 1)[1]
        elif w.startswith("--") and "=" in w and "." in w.split("=", 1)[0]:
            overrides.append(w)
        elif w.startswith("--") and "=" not in w and i + 1 < len(words) and not words[i + 1].startswith("--"):
            overrides.append(f"{w}={words[i + 1]}")
            i += 1
        else:
            raise AbError(f"--{name}: '{w}' is not a config override; write --section.key=value or --preset NAME")
        i += 1
    if not preset:
        raise AbError(f"arm {name.upper()} has no preset: pass --preset P or put --preset in --{name}")
    return Arm(name, preset, overrides, text or "")


def _resolve(arm: Arm, common: list[str]):
    from .config import ConfigError, resolve, validate

    try:
        cfg = resolve(arm.preset, None, [*common, *arm.overrides])
        validate(cfg)
    except ConfigError as e:
        raise AbError(f"arm {arm.name.upper()}: {e}") from None
    return cfg


def _comparable(d: dict) -> dict:
    """A config dict without what does not change a run's numbers' identity (its directory, name)."""
    d = json.loads(json.dumps(d))
    d["run"].pop("dir", None)
    d["run"].pop("name", None)
    return d


def check_existing(run: Run) -> None:
    """A run directory left by an earlier `ab` must hold this plan's configuration."""
    from .config import ConfigError
    from .rundir import RunDir

    rundir = RunDir(run.run_dir)
    if not rundir.is_run():
        return
    try:
        have = _comparable(rundir.read_config().to_dict())
    except ConfigError:
        return  # unreadable: the run is redone from scratch
    if have != run.config:
        diff = [f"{sec}.{k}" for sec in run.config if isinstance(run.config[sec], dict)
                for k in run.config[sec] if have.get(sec, {}).get(k) != run.config[sec][k]]
        raise AbError(f"{run.run_dir} holds a run of another configuration (differs in {', '.join(diff[:4]) or 'preset'}); "
                      f"use a new --out or delete it")


def _config_without_seed_and_dir(cfg) -> dict:
    d = cfg.to_dict()
    d["train"].pop("seed")
    d["run"].pop("dir")
    d["run"].pop("name")
    d.pop("preset")
    return d


def make_plan(*, preset: str, common: list[str], a: str, b: str, seeds: int, out: Path,
              allow_same: bool = False, seed_base: int | None = None, save_checkpoint: bool = True) -> Plan:
    if seeds < 2:
        raise AbError(f"--seeds {seeds}: a paired comparison needs at least 2 seeds (3 or more to resolve "
                      f"small effects; docs/experiments.md)")
    arms = {"a": parse_arm("a", a, preset), "b": parse_arm("b", b, preset)}
    for arm in arms.values():
        if any(o.lstrip("-").split("=", 1)[0] in ("train.seed", "run.dir") for o in arm.overrides):
            raise AbError(f"--{arm.name} sets train.seed or run.dir; ab sets them (paired seeds, one dir per run)")
    cfgs = {k: _resolve(arm, common) for k, arm in arms.items()}
    if not allow_same and _config_without_seed_and_dir(cfgs["a"]) == _config_without_seed_and_dir(cfgs["b"]):
        raise AbError("arms A and B resolve to the same configuration; give them different overrides, or pass "
                      "--allow-same for an A/A test of the noise")
    base = cfgs["a"].train.seed if seed_base is None else seed_base
    seed_list = [base + i for i in range(seeds)]
    runs = []
    extra = ["--run.report=false"] + ([] if save_checkpoint else ["--train.save_final_checkpoint=false"])
    for i, s in enumerate(seed_list):
        for k in ARMS:
            arm = arms[k]
            run_dir = out / f"{k}-seed{s}"
            overrides = [*extra, *common, *arm.overrides, f"--train.seed={s}"]
            argv = ["--preset", arm.preset, *overrides, "--run-dir", str(run_dir)]
            cfg = _resolve(Arm(k, arm.preset, overrides, arm.text), [])
            runs.append(Run(k, s, i, run_dir, argv, cfg.train.steps, _comparable(cfg.to_dict())))
    return Plan(arms, common, seed_list, runs, out, {k: c.to_dict() for k, c in cfgs.items()})


def waves(runs: list[Run], devices: list[str], concurrent: int = 1) -> list[list[tuple[Run, str]]]:
    """Groups of runs launched together, each run with its device. Slots = devices x concurrent; runs
    keep their A B A B order. On an even number of slots a seed's A and B share a wave; every other
    seed the device order is reversed, so A and B alternate between devices."""
    slots = [d for d in devices for _ in range(concurrent)]
    out, i = [], 0
    while i < len(runs):
        chunk = runs[i:i + len(slots)]
        order = slots if (i // len(slots)) % 2 == 0 else list(reversed(slots))
        if len(slots) == 1:
            order = slots
        out.append(list(zip(chunk, order)))
        i += len(slots)
    return out


def detect_devices(spec: str) -> list[str]:
    """"auto": every CUDA device (or one CPU slot); "cpu"; or a list such as "0,1"."""
    if spec == "auto":
        try:
            import torch

            n = torch.cuda.device_count()
        except Exception:
            n = 0
        return [str(i) for i in range(n)] if n else ["cpu"]
    if spec == "cpu":
        return ["cpu"]
    devs = [d.strip() for d in spec.split(",") if d.strip()]
    if not devs or not all(d.isdigit() for d in devs):
        raise AbError(f"--devices {spec!r}: use auto, cpu, or GPU indices like 0,1")
    return devs


# ---------------------------------------------------------------------------------------------
# Run state and execution.

def read_records(run_dir: Path) -> list[dict]:
    from .rundir import RunDir

    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return RunDir(run_dir).read_metrics()
    except FileNotFoundError:
        return []


def is_finished(run: Run) -> bool:
    """Its final validation is logged: after all its steps, or where train.time_budget_s stopped it."""
    from .rundir.metrics import ended_by

    return ended_by(read_records(run.run_dir), run.steps) is not None


def failure_of(run: Run) -> dict | None:
    path = run.run_dir / STATUS_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def train_command(run: Run) -> list[str]:
    """The subprocess: a fresh run, or a resume from the run's own checkpoint."""
    from .rundir import RunDir

    rundir = RunDir(run.run_dir)
    if rundir.list_checkpoints() and rundir.is_run():
        return [sys.executable, "-m", "speedgpt", "train", "--resume", str(run.run_dir)]
    return [sys.executable, "-m", "speedgpt", "train", *run.argv]


def _classify(run: Run, returncode: int) -> dict:
    log = (run.run_dir / LOG_FILE).read_text(errors="replace") if (run.run_dir / LOG_FILE).is_file() else ""
    diverged = "FloatingPointError" in log or "loss became" in log or any(
        isinstance(r.get("val_loss"), float) and not math.isfinite(r["val_loss"]) for r in read_records(run.run_dir))
    last = [line for line in log.strip().splitlines() if line.strip()][-1:] or [""]
    return {"status": "diverged" if diverged else "crashed", "returncode": returncode, "last_line": last[0][:300]}


def execute(plan: Plan, devices: list[str], concurrent: int, *, print_fn=print, retry_failed: bool = False,
            workdir: str | None = None) -> None:
    # Children start in `workdir` by its path, not in the inherited directory: if that directory was
    # replaced while `ab` ran (a re-synced checkout), an inherited, deleted cwd makes `import torch` abort
    # ("oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"); seen on a GPU machine, 2026-11-24.
    workdir = workdir or os.getcwd()
    for run in plan.runs:
        check_existing(run)
    for wave in waves(plan.runs, devices, concurrent):
        procs = []
        for run, device in wave:
            fail = failure_of(run)
            if is_finished(run) or (fail and fail.get("status") == "diverged" and not retry_failed):
                continue
            cmd = train_command(run)
            if cmd[4] != "--resume" and run.run_dir.exists():
                shutil.rmtree(run.run_dir)  # a half-run without a checkpoint: start over
            run.run_dir.mkdir(parents=True, exist_ok=True)
            (run.run_dir / STATUS_FILE).unlink(missing_ok=True)
            env = dict(os.environ)
            # The children import this same speedgpt, wherever `ab` was started from.
            root = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
            if device != "cpu":
                env["CUDA_VISIBLE_DEVICES"] = device
            print_fn(f"ab: {run.arm.upper()} seed {run.seed} on {'GPU ' + device if device != 'cpu' else 'CPU'}: "
                     f"{shlex.join(cmd[1:])}")
            log = open(run.run_dir / LOG_FILE, "a")
            procs.append((run, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir), log))
        for run, proc, log in procs:
            rc = proc.wait()
            log.close()
            if rc != 0 or not is_finished(run):
                status = _classify(run, rc)
                atomic_write(run.run_dir / STATUS_FILE, json.dumps(status))
                print_fn(f"ab: {run.arm.upper()} seed {run.seed} {status['status']} (exit {rc}); see "
                         f"{run.run_dir / LOG_FILE}")


# ---------------------------------------------------------------------------------------------
# Results.

def crossing(curve: list[tuple[float, float]], target: float) -> float | None:
    """The x at which a (x, loss) curve first reaches `target`, linear between evaluations."""
    prev = None
    for x, loss in curve:
        if loss <= target:
            if prev is None:
                return x
            x0, l0 = prev
            return x0 + (l0 - target) / (l0 - loss) * (x - x0)
        prev = (x, loss)
    return None


def run_result(run: Run, target: float | None) -> dict:
    from .rundir.metrics import ended_by

    records = read_records(run.run_dir)
    recs = [r for r in records if "val_loss" in r and r.get("event") != "eval"]
    fail = failure_of(run)
    how = ended_by(records, run.steps)
    out = {"arm": run.arm, "seed": run.seed, "run_dir": str(run.run_dir), "status": "finished"}
    if fail or how is None:
        out["status"] = fail["status"] if fail else "missing"
        if fail:
            out["error"] = fail.get("last_line", "")
        return out
    out["ended_by"] = how
    curve = [{"step": r["step"], "tokens": r.get("tokens"), "time_s": r.get("time_s"), "val_loss": r["val_loss"]}
             for r in recs]
    final = curve[-1]
    out.update(curve=curve, final_loss=final["val_loss"], steps=final["step"], tokens=final["tokens"],
               train_time_s=final["time_s"], step_ms=1000 * final["time_s"] / max(1, final["step"]))
    if target is not None:
        out["time_to_target_s"] = crossing([(c["time_s"], c["val_loss"]) for c in curve], target)
        out["steps_to_target"] = crossing([(c["step"], c["val_loss"]) for c in curve], target)
        out["tokens_to_target"] = crossing([(c["tokens"], c["val_loss"]) for c in curve], target)
    return out


def resolve_target(spec: str | None, results: list[dict]) -> float | None:
    """A number, or "a" / "b": the mean final loss of that arm's finished runs."""
    if spec is None:
        return None
    if spec.lower() in ARMS:
        finals = [r["final_loss"] for r in results if r["arm"] == spec.lower() and "final_loss" in r]
        return sum(finals) / len(finals) if finals else None
    try:
        return float(spec)
    except ValueError:
        raise AbError(f"--target-loss {spec!r}: give a loss such as 3.28, or a / b (that arm's mean final loss)")


def summarize(plan: Plan, target_spec: str | None, *, concurrent: int = 1,
              step_ms: dict[str, float] | None = None) -> dict:
    results = [run_result(r, None) for r in plan.runs]
    target = resolve_target(target_spec, results)
    results = [run_result(r, target) for r in plan.runs]
    speed_ok = concurrent == 1
    for r in results:
        if "final_loss" not in r or target is None:
            continue
        if not speed_ok:  # shared GPUs: measured times are not speed figures
            r["measured_time_to_target_s"] = r.pop("time_to_target_s")
            ms = (step_ms or {}).get(r["arm"])
            st = r.get("steps_to_target")
            r["time_to_target_s"] = st * ms / 1000 if (ms is not None and st is not None) else None
    by_arm = {k: {r["seed"]: r for r in results if r["arm"] == k} for k in ARMS}
    summary: dict = {
        "command": None, "target_loss": target, "target_spec": target_spec, "seeds": plan.seeds,
        "times_are_speed_figures": speed_ok, "concurrent": concurrent, "step_ms_given": step_ms or None,
        "arms": {}, "paired": {}, "failures": [], "unreached": [],
        "configs": {k: {"preset": plan.arms[k].preset, "overrides": plan.arms[k].overrides} for k in ARMS},
        "common_overrides": plan.common,
    }
    for r in results:
        if r["status"] != "finished":
            summary["failures"].append({"arm": r["arm"], "seed": r["seed"], "status": r["status"],
                                        "error": r.get("error", ""), "run_dir": r["run_dir"]})
        elif target is not None and r.get("steps_to_target") is None:
            summary["unreached"].append({"arm": r["arm"], "seed": r["seed"], "final_loss": r["final_loss"]})
    metrics = ["final_loss", "step_ms", "train_time_s"] + (["time_to_target_s", "steps_to_target"]
                                                            if target is not None else [])
    for k in ARMS:
        arm = {"runs": [by_arm[k][s] for s in plan.seeds]}
        for m in metrics:
            vals = {s: by_arm[k][s].get(m) for s in plan.seeds}
            got = [v for v in vals.values() if v is not None]
            arm[m] = {"per_seed": vals, **describe(got)}
        summary["arms"][k] = arm
    for m in ["final_loss"] + (["time_to_target_s"] if target is not None else []):
        pairs = [(by_arm["a"][s].get(m), by_arm["b"][s].get(m)) for s in plan.seeds]
        full = [(x, y) for x, y in pairs if x is not None and y is not None]
        res = paired([x for x, _ in full], [y for _, y in full])
        res["pairs_dropped"] = len(pairs) - len(full)
        if m == "time_to_target_s" and not speed_ok and not step_ms:
            res = {"n": 0, "note": "unavailable: runs shared GPUs (--concurrent > 1); give --step-ms A=..,B=.. "
                                   "from `speedgpt bench` to turn steps to target into times"}
        summary["paired"][m] = res
    return summary


def verdict(p: dict, what: str) -> str:
    if p.get("p_b_better") is None:
        return p.get("note") or "no test"
    if p["p_b_better"] < 0.05:
        return f"B lower {what} (p={p['p_b_better']:.3g})"
    if p["p_b_better"] > 0.95:
        return f"B higher {what} (p(B lower)={p['p_b_better']:.3g})"
    return f"no significant {what} difference (p={p['p_b_better']:.3g})"


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(summary: dict) -> str:
    lines = [f"{'arm':<4}{'seed':>7}{'final loss':>12}{'step ms':>10}{'time to target':>16}  status"]
    for k in ARMS:
        for r in summary["arms"][k]["runs"]:
            lines.append(f"{k.upper():<4}{r['seed']:>7}{_fmt(r.get('final_loss'), '.4f'):>12}"
                         f"{_fmt(r.get('step_ms'), '.1f'):>10}{_fmt(r.get('time_to_target_s'), '.2f'):>16}  "
                         f"{r['status']}")
    for k in ARMS:
        f = summary["arms"][k]["final_loss"]
        lines.append(f"{k.upper()} mean final loss {_fmt(f['mean'], '.4f')} +- {_fmt(f['std'], '.4f')} (n={f['n']})")
    for m, what in (("final_loss", "loss"), ("time_to_target_s", "time to target")):
        p = summary["paired"].get(m)
        if not p:
            continue
        ci = p.get("ci95")
        ci_s = f"[{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "-"
        lines.append(f"B - A {what}: mean {_fmt(p.get('mean_diff'), '+.4g')}, 95% CI {ci_s}, n={p.get('n')}: "
                     f"{verdict(p, what)}")
    if summary["target_loss"] is not None:
        lines.append(f"target loss {summary['target_loss']:.4f}"
                     + ("" if summary["times_are_speed_figures"] else " (times: steps to target x --step-ms; "
                        "measured times are not speed figures with --concurrent > 1)"))
    for f in summary["failures"]:
        lines.append(f"FAILED: {f['arm'].upper()} seed {f['seed']} {f['status']}: {f['error']} ({f['run_dir']})")
    for u in summary["unreached"]:
        lines.append(f"target not reached: {u['arm'].upper()} seed {u['seed']} (final {u['final_loss']:.4f})")
    return "\n".join(lines)


def notebook_row(summary: dict, device: str, commit: str) -> str:
    """One markdown table row for docs/experiments.md's A/B log."""
    fa, fb = summary["arms"]["a"]["final_loss"], summary["arms"]["b"]["final_loss"]
    pl = summary["paired"]["final_loss"]
    pt = summary["paired"].get("time_to_target_s") or {}

    def diff(p, spec):
        if p.get("mean_diff") is None:
            return "-"
        ci = p.get("ci95")
        return f"{p['mean_diff']:{spec}} [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else f"{p['mean_diff']:{spec}}"

    p_of = lambda p: _fmt(p.get("p_b_better"), ".3g")  # noqa: E731
    return (f"| {datetime.date.today().isoformat()} | {device} | {commit} | `{summary['command']}` | "
            f"{pl.get('n')} | {_fmt(fa['mean'], '.4f')} | {_fmt(fb['mean'], '.4f')} | {diff(pl, '+.4f')} | "
            f"{p_of(pl)} | {diff(pt, '+.2f') if pt else '-'} | {p_of(pt) if pt else '-'} | "
            f"{verdict(pl, 'loss')}; {len(summary['failures'])} failed |")


NOTEBOOK_HEADER = ("| date | device | commit | command | pairs | A final | B final | B-A loss [95% CI] | p | "
                   "B-A time to target s [95% CI] | p | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


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


def _device_name(plan: Plan) -> str:
    for run in plan.runs:
        try:
            return json.loads((run.run_dir / "env.json").read_text()).get("device") or "unknown"
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return "unknown"


# ---------------------------------------------------------------------------------------------
# Command line.

EPILOG = """\
examples:
  speedgpt ab --preset speedrun-124m --train.steps=300 --a "--optim.normuon=false" --b "" --seeds 4
  speedgpt ab --a "--preset speedrun-r28" --b "--preset speedrun-124m" --seeds 3 --target-loss a --out runs/ab1
  speedgpt ab --preset tiny-cpu --a "" --b "" --allow-same --seeds 3          # A/A: the noise floor
Arms are override strings (quote them); each may name its own --preset. Common overrides (any
--section.key=value before or after) apply to both arms. docs/experiments.md explains the statistics.
"""


def parse_step_ms(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    out = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        try:
            out[k.strip().lower()] = float(v)
        except ValueError:
            raise AbError(f"--step-ms {text!r}: write A=812.5,B=790 (milliseconds per step, from speedgpt bench)")
        if k.strip().lower() not in ARMS:
            raise AbError(f"--step-ms {text!r}: names must be A and B")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt ab", description="Paired A/B of two configs over seeds.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="", help="preset of both arms (an arm's own --preset wins)")
    p.add_argument("--a", default=None, help='overrides of arm A, e.g. "--optim.normuon=false"')
    p.add_argument("--b", default=None, help='overrides of arm B, e.g. "--preset speedrun-124m"')
    p.add_argument("--seeds", type=int, default=3, help="paired seeds (>= 2; default 3)")
    p.add_argument("--seed-base", type=int, default=None, help="first seed (default: the config's train.seed)")
    p.add_argument("--steps", type=int, default=None, help="shorthand for --train.steps")
    p.add_argument("--target-loss", default=None, help="loss for time to target: a number, or a / b (that "
                                                       "arm's mean final loss)")
    p.add_argument("--out", default=None, help="directory of the runs and results (default runs/ab-<time>)")
    p.add_argument("--devices", default="auto", help="auto (all GPUs, else CPU), cpu, or GPU ids such as 0,1")
    p.add_argument("--concurrent", type=int, default=1, help="runs at once per device (loss-only comparisons)")
    p.add_argument("--step-ms", default=None, help="A=..,B=..: bench step times for time to target when "
                                                   "--concurrent > 1")
    p.add_argument("--allow-same", action="store_true", help="allow identical arms (an A/A noise test)")
    p.add_argument("--no-checkpoint", action="store_true", help="skip the runs' final checkpoints")
    p.add_argument("--retry-failed", action="store_true", help="rerun runs that diverged before")
    p.add_argument("--dry-run", action="store_true", help="print the train commands and exit")
    # An arm's text usually starts with "--", which argparse would take for an option: bind it first.
    bound, i = [], 0
    while i < len(argv):
        if argv[i] in ("--a", "--b") and i + 1 < len(argv):
            bound.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            bound.append(argv[i])
            i += 1
    args, rest = p.parse_known_args(bound)
    workdir = os.getcwd()  # relative paths in the arms stay relative to here
    out = Path(args.out or f"runs/ab-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        if args.a is None or args.b is None:
            raise AbError("give both arms: --a \"OVERRIDES\" --b \"OVERRIDES\" (an empty string is the preset itself)")
        common = []
        for item in rest:
            if not (item.startswith("--") and "=" in item and "." in item.split("=", 1)[0]):
                raise AbError(f"unrecognized argument '{item}'; common overrides look like --train.steps=300")
            common.append(item)
        if args.steps is not None:
            common.append(f"--train.steps={args.steps}")
        if args.concurrent < 1:
            raise AbError(f"--concurrent {args.concurrent} must be at least 1")
        step_ms = parse_step_ms(args.step_ms)
        plan = make_plan(preset=args.preset, common=common, a=args.a, b=args.b, seeds=args.seeds, out=out,
                         allow_same=args.allow_same, seed_base=args.seed_base,
                         save_checkpoint=not args.no_checkpoint)
        devices = detect_devices(args.devices)
        if args.dry_run:
            for wave in waves(plan.runs, devices, args.concurrent):
                for run, dev in wave:
                    prefix = f"CUDA_VISIBLE_DEVICES={dev} " if dev != "cpu" else ""
                    print(prefix + shlex.join(["python", "-m", "speedgpt", "train", *run.argv]))
            return 0
        make_out_dir(out)
        execute(plan, devices, args.concurrent, retry_failed=args.retry_failed, workdir=workdir)
        summary = summarize(plan, args.target_loss, concurrent=args.concurrent, step_ms=step_ms)
    except (AbError, OutDirError) as e:
        print(f"speedgpt ab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspeedgpt ab: interrupted; run the same command again to resume (finished runs are kept)",
              file=sys.stderr)
        return 130
    except OSError as e:  # a run directory or log that cannot be written: say what to do, not just errno
        print(f"speedgpt ab: error: {os_error_line(e, '--out', out)}", file=sys.stderr)
        return 2
    summary["command"] = "speedgpt ab " + shlex.join(argv)
    summary["devices"] = devices
    print(format_table(summary))
    atomic_write(out / "summary.json", json.dumps(summary, indent=1))
    row = notebook_row(summary, _device_name(plan), short_commit())
    atomic_write(out / "notebook_row.md", NOTEBOOK_HEADER + "\n" + row + "\n")
    try:
        plot(summary, out / "ab.png")
    except Exception as e:  # a plotting problem must not lose the statistics
        print(f"ab: plot not written ({type(e).__name__}: {e})")
    print(f"\nnotebook row (docs/experiments.md):\n{row}\nwrote {out / 'summary.json'}, {out / 'ab.png'}")
    # The statistics need two complete pairs; with fewer the command did not do its job.
    return 0 if (summary["paired"]["final_loss"].get("n") or 0) >= 2 else 1
