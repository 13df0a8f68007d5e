"""The plan of an A/B: the two arms (overrides, optionally their own preset), the paired seeds,
each run's command and resolved config, and the launch order over devices."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..rundir.reuse import comparable_config

ARMS = ("a", "b")


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


def _resolve(arm: Arm, common: list[str], *, run: bool = False):
    """The arm's config, validated. `run`: the config a run of it saves, its plan's (planner.plan_run:
    budget and stage table resolved), so that ab/run.py's check of a finished run compares like with like."""
    from ..config import ConfigError, resolve
    from ..plan import validate
    from ..planner import plan_run

    try:
        cfg = resolve(arm.preset, None, [*common, *arm.overrides])
        if run:
            return plan_run(cfg).cfg
        validate(cfg)
    except ConfigError as e:
        raise AbError(f"arm {arm.name.upper()}: {e}") from None
    return cfg


def _config_without_seed_and_dir(cfg) -> dict:
    """`comparable_config`, less the seed, the preset's name and the `run` section (the end sample, report and
    loggers: none changes a step or a loss): what makes two arms the same."""
    d = comparable_config(cfg.to_dict())
    d["train"].pop("seed")
    d.pop("preset")
    d.pop("run")
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
    from ..data.shards import given_shards_problem

    for cfg in cfgs.values():  # an arm's named shards are usable: else one line now, not a crashed run per seed
        problem = given_shards_problem(cfg.data)
        if problem:
            raise AbError(problem)
    if not allow_same and _config_without_seed_and_dir(cfgs["a"]) == _config_without_seed_and_dir(cfgs["b"]):
        raise AbError("arms A and B resolve to the same configuration (run.* keys, the sample, report and loggers, "
                      "change no step or loss); give them different overrides, or pass --allow-same for an A/A test "
                      "of the noise")
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
            cfg = _resolve(Arm(k, arm.preset, overrides, arm.text), [], run=True)
            runs.append(Run(k, s, i, run_dir, argv, cfg.train.steps, comparable_config(cfg.to_dict())))
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


def visible_gpus() -> int:
    """The CUDA devices this process sees (0 without CUDA): what --devices may name (tests stand in GPUs here)."""
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def detect_devices(spec: str) -> list[str]:
    """"auto": every CUDA device (or one CPU slot); "cpu"; or a list such as "0,1", of GPUs that are here: one that
    is not was launched anyway, and each of its runs failed (or ran on the CPU) instead of the command refusing.
    The dry run checks them too, as it checks --out: it shows the commands this machine would run."""
    if spec == "auto":
        n = visible_gpus()
        listed = _listed_gpus()
        if n and listed is not None:  # the allocation's own ids (_listed_gpus): 0..n-1 would be other GPUs
            return listed[:n]
        return [str(i) for i in range(n)] if n else ["cpu"]
    if spec == "cpu":
        return ["cpu"]
    devs = [d.strip() for d in spec.split(",") if d.strip()]
    if not devs or not all(d.isdigit() for d in devs):
        raise AbError(f"--devices {spec!r}: use auto, cpu, or GPU indices like 0,1")
    listed = _listed_gpus()
    if listed is not None:  # a scheduler's allocation: each run's CUDA_VISIBLE_DEVICES is one of these ids
        missing = [d for d in devs if d not in listed]
        if missing:
            raise AbError(f"--devices {spec}: GPU {', '.join(missing)} is not in CUDA_VISIBLE_DEVICES={','.join(listed)}"
                          f"; use --devices auto, cpu or ids from that list")
        return devs
    n = visible_gpus()
    missing = [d for d in devs if int(d) >= n]
    if missing:
        seen = f"{n} GPU(s), 0..{n - 1}" if n else "no GPU"
        fix = f"auto, cpu or indices below {n}" if n else "auto or cpu"
        raise AbError(f"--devices {spec}: no GPU {', '.join(missing)} here (this machine sees {seen}); use --devices {fix}")
    return devs


def _listed_gpus() -> list[str] | None:
    """The GPU ids CUDA_VISIBLE_DEVICES lists where it lists numbers: each run gets its device as its own
    CUDA_VISIBLE_DEVICES (ab/run.py), so under CUDA_VISIBLE_DEVICES=4,5 the ids --devices names are 4 and 5, not
    torch's 0 and 1 (a review: 4,5 was refused and 0,1 ran outside the allocation). None when unset, or not
    numbers (UUIDs, MIG names): then torch's count decides."""
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed if listed and all(d.isdigit() for d in listed) else None
