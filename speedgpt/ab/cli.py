"""`speedgpt ab`'s command line: parse it, plan, run, summarize, write the results."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

from ..argv import Parser, bind_values, refuse_empty_paths
from ..atomic import atomic_write
from ..outdir import OutDirError, check_out_dir, make_out_dir, os_error_line
from ..provenance import short_commit
from .notebook import NOTEBOOK_HEADER, device_name, notebook_row
from .plan import ARMS, AbError, detect_devices, make_plan, waves
from .plot import plot
from .run import execute
from .summary import format_table, resolve_target, summarize

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
            name, ms = k.strip().lower(), float(v)
        except ValueError:
            raise AbError(f"--step-ms {text!r}: write A=812.5,B=790 (milliseconds per step, from speedgpt bench)")
        if not (math.isfinite(ms) and ms > 0):  # nan: every time to target nan
            raise AbError(f"--step-ms {text!r}: a step takes a finite time > 0 ms; write A=812.5,B=790 (from speedgpt "
                          f"bench)")
        out[name] = ms
        if name not in ARMS:
            raise AbError(f"--step-ms {text!r}: names must be A and B")
    return out


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="speedgpt ab", description="Paired A/B of two configs over seeds.",
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
    return p


def common_overrides(rest: list[str], steps: int | None) -> list[str]:
    """The overrides both arms share: every --section.key=value outside the arms, and --steps."""
    common = []
    for item in rest:
        if not (item.startswith("--") and "=" in item and "." in item.split("=", 1)[0]):
            raise AbError(f"unrecognized argument '{item}'; common overrides look like --train.steps=300")
        common.append(item)
    if steps is not None:
        common.append(f"--train.steps={steps}")
    return common


def print_commands(plan, devices: list[str], concurrent: int) -> None:
    """--dry-run: each run's train command, with its device."""
    for wave in waves(plan.runs, devices, concurrent):
        for run, dev in wave:
            prefix = f"CUDA_VISIBLE_DEVICES={dev} " if dev != "cpu" else ""
            print(prefix + shlex.join(["python", "-m", "speedgpt", "train", *run.argv]))


def write_results(summary: dict, plan, out: Path) -> str:
    """OUT/summary.json, OUT/notebook_row.md and OUT/ab.png (a plotting problem is reported, and
    loses nothing else); the notebook row."""
    atomic_write(out / "summary.json", json.dumps(summary, indent=1))
    row = notebook_row(summary, device_name(plan), short_commit())
    atomic_write(out / "notebook_row.md", NOTEBOOK_HEADER + "\n" + row + "\n")
    try:
        plot(summary, out / "ab.png")
    except Exception as e:  # a plotting problem must not lose the statistics
        print(f"ab: plot not written ({type(e).__name__}: {e})")
    return row


def main(argv: list[str]) -> int:
    # An arm's text usually starts with "--", which argparse would take for an option: bind it first.
    p = parser()
    args, rest = p.parse_known_args(bind_values(argv, ("--a", "--b")))
    refuse_empty_paths(p, args, ("--out",))  # "" was a new runs/ab-<time>: a rerun trained every run again
    workdir = os.getcwd()  # relative paths in the arms stay relative to here
    out = Path(args.out or f"runs/ab-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        if args.a is None or args.b is None:
            raise AbError("give both arms: --a \"OVERRIDES\" --b \"OVERRIDES\" (an empty string is the preset itself)")
        common = common_overrides(rest, args.steps)
        if args.concurrent < 1:
            raise AbError(f"--concurrent {args.concurrent} must be at least 1")
        step_ms = parse_step_ms(args.step_ms)
        if step_ms is not None and args.concurrent == 1:  # summarize reads it only for shared devices: else ignored
            raise AbError("--step-ms turns steps to target into times when runs share a device (--concurrent > 1); "
                          "with --concurrent 1 each run's own training time is measured: leave --step-ms out")
        if step_ms is not None and set(step_ms) != set(ARMS):  # the other arm's times to target were all missing
            raise AbError(f"--step-ms {args.step_ms!r}: give both arms, e.g. A=812.5,B=790")
        plan = make_plan(preset=args.preset, common=common, a=args.a, b=args.b, seeds=args.seeds, out=out,
                         allow_same=args.allow_same, seed_base=args.seed_base,
                         save_checkpoint=not args.no_checkpoint)
        resolve_target(args.target_loss, [])  # a bad --target-loss now, not after every run has trained
        devices = detect_devices(args.devices)
        check_out_dir(out)  # a file where --out goes: refused in the dry run too, not only when runs start
        if args.dry_run:
            print_commands(plan, devices, args.concurrent)
            return 0
        make_out_dir(out)
        execute(plan, devices, args.concurrent, retry_failed=args.retry_failed, workdir=workdir)
        summary = summarize(plan, args.target_loss, concurrent=args.concurrent, step_ms=step_ms)
        summary["command"] = "speedgpt ab " + shlex.join(argv)
        summary["devices"] = devices
        print(format_table(summary))
        row = write_results(summary, plan, out)
    except (AbError, OutDirError) as e:
        print(f"speedgpt ab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspeedgpt ab: interrupted; run the same command again to resume (finished runs are kept)",
              file=sys.stderr)
        return 130
    except OSError as e:  # a run directory, log or result that cannot be written: what to do, not just errno
        print(f"speedgpt ab: error: {os_error_line(e, '--out', out)}", file=sys.stderr)
        return 2
    print(f"\nnotebook row (docs/experiments.md):\n{row}\nwrote {out / 'summary.json'}, {out / 'ab.png'}")
    # The statistics need two complete pairs; with fewer the command did not do its job.
    return 0 if (summary["paired"]["final_loss"].get("n") or 0) >= 2 else 1
