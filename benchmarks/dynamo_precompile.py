"""Can a warm start skip dynamo's trace? speedgpt's own model, cold then on a fresh machine (issue 33).

Each start is a fresh `speedgpt train` process (the trainer's compile path: compile cache opened and loaded,
torch.compile of the model and its loss, warmup steps, the artifacts saved; train.compile_watch's accounting).
Per mode (`--train.compile_precompile=false|true`, the switch that sets torch._dynamo.config.caching_precompile):
  cold     an empty cache folder;
  fresh    a new folder holding only the cold start's artifact files (a fresh machine of the same versions);
and with precompile on, starts of a changed config (`--changed`, e.g. another seq_len or depth) in a copy of the
fresh start's whole folder, where dynamo's saved package of GPT.forward now sits: its entries load but their
guards must fail, so the changed config traces again and trains as a compiled run of it without the cache does
(`--train.compile_cache=off`; losses compared to the bit).
Per start: `start s` = the cache's load + `c+w` (compile + warmup, as the log prints it: since ad0ba09 it counts
torch.compile's call, where with precompile the saved package is installed, its backends loaded and their kernels
built, before the warmup); `load`, the cache's load and torch.compile's call; `proc`, the whole process; the
warmup's trace / aot / inductor / kernels seconds (train/compile_breakdown.py); graphs / frames dynamo compiled in
the warmup and `late` (after it: a guard that failed at a later step); dynamo cache hits / misses / errors; the
FX-graph and AOTAutograd caches' hits / misses; `drop`: guards caching precompile dropped (by type below the table);
`bnf`: torch's "Backend not found" warnings; train and val loss (a fresh start's against its cold start's: to the
bit).

Usage (CPU, ~10 min on 2 shared cores; figures: docs/benchmarks.md, "Can a warm start skip dynamo's trace?"):
  python benchmarks/dynamo_precompile.py [--preset tiny-cpu] [--set="OVERRIDES"] [--modes off on]
      [--changed=--data.seq_len=64 --changed=--model.depth=3 | --changed=none] [--fp8] [--keep DIR]
`--fp8` takes the GPU presets' FP8 paths on the CPU, in bf16 (FP8_SET below; torch 2.13's CPU _scaled_mm): their
custom autograd Functions and custom ops in dynamo's package (the fused head + loss needs Triton and stays off).
`--set` replaces the default small-model overrides (SMALL below); on a GPU give the preset's own, e.g.
`--preset speedrun-124m --set="--train.steps=4 --train.warmup_steps=2 --train.val_every=0 --data.val_tokens=262144
--data.train_files=DIR --run.report=false --run.sample_tokens=0"`. Precompile is the trainer's switch
(`train.compile_precompile`), flex attention included: the trainer restores a package's saved guards in a tracing
context (speedgpt/train/precompile_guards.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MARK = "DYNAMO_PRECOMPILE_RESULT "
# A small speedrun-shaped model that compiles in about a minute on one CPU core (2 blocks, value embeddings,
# the build_context_eagerly graph break, validation's no-grad recompile).
SMALL = ["--model.depth=2", "--train.steps=3", "--train.warmup_steps=1", "--train.val_every=0",
         "--data.val_tokens=1024", "--run.report=false", "--run.sample_tokens=0"]
INSTALL_TIMERS = ("after_deserialization", "precompile_load_guards", "precompile_build_guards")  # _dynamo/package.py
FP8 = "DYNAMO_PRECOMPILE_FP8"
# --fp8: the GPU presets' FP8 switches, in bf16 (their compute dtype); the child then lets the CPU take them
FP8_SET = ["--model.fp8_head=true", "--model.fp8_attn=true", "--model.fp8_mlp=true", "--train.dtype=bfloat16"]
DROPPED = re.compile(r"\] (\w+) guard on .* is dropped with caching_precompile=True")


def child(argv: list[str]) -> int:
    """One start: `speedgpt train argv` in this process, then one line of what torch counted. The compile cache's
    load and the model's torch.compile are timed with speedgpt's own breakdown (compile_breakdown.py): with caching
    precompile the saved package is installed inside torch.compile (its backends loaded, their kernels built),
    before the warmup that the start log's compile lines watch."""
    import torch
    from torch._dynamo.utils import counters
    from torch._functorch._aot_autograd.autograd_cache import should_bundle_autograd_cache

    import speedgpt.train.loop as loop
    from speedgpt.cli import main as speedgpt_main
    from speedgpt.train import compile_breakdown

    torch.set_num_threads(1)
    if os.environ.get(FP8):  # torch 2.13's CPU runs _scaled_mm (row-wise scales too): the FP8 paths as on a GPU
        import speedgpt.model.runtime as runtime

        runtime.fp8_supported = lambda device: True
    timed: dict[str, dict] = {}

    def timing(name, fn):
        def call(*args, **kwargs):
            before, t0 = compile_breakdown.snapshot(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = compile_breakdown.combine(compile_breakdown.snapshot(), before, -1)
                timed[name] = {"wall_s": time.perf_counter() - t0, **compile_breakdown.phases(spent)}
        return call

    loop.open_compile_cache = timing("load", loop.open_compile_cache)
    loop.compiled_forward = timing("install", loop.compiled_forward)
    status = speedgpt_main(argv)
    from torch._dynamo.utils import compilation_time_metrics

    print(MARK + json.dumps({
        "status": status,
        "timed": timed,
        # torch's own timers inside a package's install: its backends, then its guards read and built
        "install_timers": {k: sum(compilation_time_metrics.get(k, ())) for k in INSTALL_TIMERS},
        "dynamo_cache": dict(counters["dynamo_cache"]),
        "caching_precompile": torch._dynamo.config.caching_precompile,
        "bundled_autograd_cache": should_bundle_autograd_cache(),
        "allow_custom_autograd": torch._functorch.config.autograd_cache_allow_custom_autograd_functions,
    }), flush=True)
    return status


def start(label: str, preset: str, overrides: list[str], cache: Path | str, run_dir: Path,
          env_extra: dict | None = None) -> dict:
    """A fresh process's start (compiled; cache "off": without the compile cache); what it compiled and loaded,
    from its metrics.jsonl, its log and its counters."""
    args = ["train", "--preset", preset, *overrides, "--run-dir", str(run_dir), "--train.compile=true",
            f"--train.compile_cache={cache}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env_extra or {}))
    env.pop("TORCH_LOGS", None)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True,
                       cwd=ROOT)
    out = {"label": label, "process_s": time.perf_counter() - t0, "rc": p.returncode}
    run_dir.parent.mkdir(parents=True, exist_ok=True)  # a child that failed early made no folder
    (run_dir.parent / f"{run_dir.name}.log").write_text(p.stdout + p.stderr)
    marks = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
    if p.returncode != 0 or not marks:
        errors = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        out["error"] = errors[-1][:160] if errors else "no output"
        return out
    out.update(json.loads(marks[-1][len(MARK):]))
    out["load_s"] = sum(t["wall_s"] for t in out["timed"].values())  # the cache's load + torch.compile's call
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    compiles = [r for r in records if r.get("event") == "compile"]
    if compiles:
        warm = compiles[0]
        out.update({k: warm[k] for k in ("graphs", "frames", "recompiles", "compile_s", "trace_s", "aot_s",
                                         "inductor_s", "kernels_s", "fx_cache_hits", "fx_cache_misses",
                                         "aot_cache_hits", "aot_cache_misses")})
        late = [s for s in compiles[-1]["spans"] if s["label"] == "after the warmup"]
        out["late_graphs"] = late[0]["graphs"] if late else 0
    out["warmup_s"] = next((r["warmup_s"] for r in records if r.get("event") == "warmup"), None)
    out["train_loss"] = next((r["train_loss"] for r in reversed(records) if "train_loss" in r), None)
    out["val_loss"] = next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None)
    out["dropped"] = dict(Counter(DROPPED.findall(p.stderr)))
    out["backend_not_found"] = p.stderr.count("Backend not found")
    out["cache_line"] = next((ln for ln in p.stdout.splitlines() if ln.startswith("compile cache: loaded")
                              or ln.startswith("compile cache: nothing saved")), "")
    out["precompile_off_line"] = next((ln for ln in p.stdout.splitlines()
                                       if "compile_precompile is off" in ln), "")
    return out


def artifacts_only(src: Path, dst: Path) -> None:
    """What a fresh machine gets: the artifact files and their metadata, nothing of the local caches."""
    for f in src.glob("*/artifacts-*"):
        (dst / f.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst / f.parent.name / f.name)


def seconds(v) -> str:
    return "-" if v is None else f"{v:.1f}"


HEADER = (f"{'start':26} {'start s':>7} {'load':>5} {'c+w':>5} {'proc':>5} {'trace':>5} {'aot':>5} {'ind':>5} "
          f"{'kern':>5} {'g/fr':7} {'late':>4} {'dyn h/m/e':>9} {'fx':>3} {'aot':>3} {'drop':>4} {'bnf':>3}  "
          f"train loss   val loss")


def row(r: dict) -> str:
    """start s = the cache's load + c+w (compile + warmup, which since ad0ba09 counts torch.compile's call: with
    precompile the package's install); load: the cache's load and torch.compile's call; trace ... kern: the warmup's
    compile phases; proc: the whole process."""
    if "error" in r:
        return f"{r['label']:26} rc {r['rc']}: {r['error']}"
    dc = r["dynamo_cache"]
    hits = f"{dc.get('dynamo_cache_hit', 0)}/{dc.get('dynamo_cache_miss', 0)}/{dc.get('dynamo_cache_error', 0)}"
    begin = None if r["warmup_s"] is None else r["timed"]["load"]["wall_s"] + r["warmup_s"]
    phases = " ".join(f"{seconds(r.get(k)):>5}" for k in ("trace_s", "aot_s", "inductor_s", "kernels_s"))
    return (f"{r['label']:26} {seconds(begin):>7} {seconds(r['load_s']):>5} {seconds(r['warmup_s']):>5} "
            f"{seconds(r['process_s']):>5} {phases} {r.get('graphs', '-'):>3}/{r.get('frames', '-'):<3} "
            f"{r.get('late_graphs', '-'):>4} {hits:>9} {r.get('fx_cache_hits', '-')}/{r.get('fx_cache_misses', '-')} "
            f"{r.get('aot_cache_hits', '-')}/{r.get('aot_cache_misses', '-')} {sum(r['dropped'].values()):>4} "
            f"{r['backend_not_found']:>3}  {r['train_loss']!r:.12} {r['val_loss']!r:.12}")


def main() -> int:
    if sys.argv[1:2] == ["--child"]:  # a start's own process (start() above)
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny-cpu")
    ap.add_argument("--set", default=" ".join(SMALL),
                    help="the overrides of every start, one string (default: a small CPU model)")
    ap.add_argument("--modes", nargs="+", choices=("off", "on"), default=["off", "on"])
    ap.add_argument("--changed", action="append",
                    help="a changed config's override (repeat for more; 'none': no such start; default: "
                         "--data.seq_len=64 and --model.depth=3)")
    ap.add_argument("--fp8", action="store_true",
                    help="CPU only: the FP8 paths of the GPU presets (head, attention and MLP, the fused ReLU² ops' "
                         "torch reference; needs torch 2.13's row-wise CPU _scaled_mm; a GPU takes them anyway)")
    ap.add_argument("--keep", help="a folder for the caches, run dirs and logs (default: a temporary one, removed)")
    args = ap.parse_args()
    if args.fp8:
        from speedgpt.model.runtime import cpu_runs_rowwise_fp8

        if not cpu_runs_rowwise_fp8():
            ap.error("--fp8 needs a torch whose CPU _scaled_mm takes row-wise scales (2.13 on); leave --fp8 out")
    args.set = shlex.split(args.set) + (FP8_SET if args.fp8 else [])
    args.changed = [c for c in args.changed or ["--data.seq_len=64", "--model.depth=3"] if c != "none"]
    if args.keep and Path(args.keep).exists() and any(Path(args.keep).iterdir()):
        print(f"--keep {args.keep} is not empty: name a new folder (each start needs a cache of its own)")
        return 2
    import torch

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dynamo_precompile-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}; speedgpt train --preset {args.preset} {' '.join(args.set)}; work in {root}")
    print(HEADER)
    results = []
    try:
        for mode in args.modes:
            on = mode == "on"
            env = {FP8: "1"} if args.fp8 else {}
            flags = [*args.set, f"--train.compile_precompile={'true' if on else 'false'}"]
            cold = start(f"{mode}: cold", args.preset, flags, root / mode / "cold", root / mode / "run-cold", env)
            print(row(cold), flush=True)
            artifacts_only(root / mode / "cold", root / mode / "fresh")
            fresh = start(f"{mode}: fresh machine", args.preset, flags, root / mode / "fresh",
                          root / mode / "run-fresh", env)
            print(row(fresh), flush=True)
            if "error" not in cold and "error" not in fresh:
                same = (cold["train_loss"], cold["val_loss"]) == (fresh["train_loss"], fresh["val_loss"])
                print(f"{'':26} fresh's losses {'equal cold' if same else 'DIFFER from cold'}'s to the bit; "
                      f"install {describe_install(fresh)}")
            results += [cold, fresh]
            if not on:
                continue
            for i, change in enumerate(args.changed):
                folder = root / mode / f"changed{i}"
                shutil.copytree(root / mode / "fresh", folder)  # the fresh machine's folder, package included
                moved = start(f"on: {change}", args.preset, [*flags, change], folder, root / mode / f"run-changed{i}",
                              env)
                print(row(moved), flush=True)
                ref = start(f"   uncached {change}", args.preset, [*args.set, change], "off",
                            root / mode / f"run-uncached{i}", {FP8: "1"} if args.fp8 else None)
                if "error" not in moved and "error" not in ref:
                    same = (moved["train_loss"], moved["val_loss"]) == (ref["train_loss"], ref["val_loss"])
                    print(f"{'':26} its losses {'equal' if same else 'DIFFER from'} those of a compiled run of it "
                          f"without the cache{' to the bit' if same else ''} ({ref['train_loss']!r:.12}, "
                          f"{ref['val_loss']!r:.12})")
                results += [moved, ref]
        for line in {r["precompile_off_line"] for r in results if r.get("precompile_off_line")}:
            print(line)
        first = next((r for r in results if "caching_precompile" in r and r["label"].startswith("on")), None)
        if first:
            print(f"precompile on: caching_precompile {first['caching_precompile']}, AOTAutograd bundled "
                  f"{first['bundled_autograd_cache']}, custom autograd Functions allowed "
                  f"{first['allow_custom_autograd']}; guards dropped by type: {first['dropped']}")
        (root / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if any("error" in r for r in results) else 0


def describe_install(r: dict) -> str:
    """The package's install inside torch.compile's call. Torch times it as a frame's compile with no backend call
    in it, so compile_breakdown's trace / aot split does not apply there (trace reads the whole install, aot goes
    negative); its Inductor and kernel timers do."""
    t = r["timed"].get("install")
    if not t:
        return "-"
    timers = ", ".join(f"{k} {seconds(v)}" for k, v in r.get("install_timers", {}).items())
    return f"{t['wall_s']:.1f} s (inductor {seconds(t['inductor_s'])}, kernels {seconds(t['kernels_s'])} s; {timers} s)"


if __name__ == "__main__":
    sys.exit(main())
