"""Dump what every preset's run would do, as text, so a refactor of how runs are planned can be
diffed against the code before it (issue 28, item 4: "every preset's resolved config and printed
plan identical before and after"). On today's code everything comes from the run's plan
(plan.RunPlan, made by planner.plan_run as the trainer makes it), which adds its plan.json at the
end of each file; on code from before the plan, from the functions the trainer called then.

For each preset and world size 1, 2, 4, 8 it writes one file holding: the `speedgpt config` view of
the preset, the config.toml a run would save (budget and stage table resolved), whether validation
passes (or its one-line error), the lines printed at start (budget, model/batch or stage table),
the memory estimates under ddp and fsdp, and a sample of steps (stage boundaries included) with
their stage, micro-batching, attention windows, YaRN state, MTP weights, lr multiplier, Muon
momentum and weight decay.

Everything runs on the meta device or in plain Python (no weights are allocated), so the 1B preset
is as cheap as tiny-cpu. Usage:

    PYTHONPATH=. python scripts/dump_run_plans.py OUT_DIR      # then: diff -r BEFORE_DIR OUT_DIR
    # the code before: git worktree add /tmp/before 077b67a && cd /tmp/before && PYTHONPATH=. python
    #   /path/to/scripts/dump_run_plans.py BEFORE_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

WORLD_SIZES = (1, 2, 4, 8)
CORPUS_TOKENS = 10**9  # a stand-in corpus size for the data-epoch line
SAMPLES = 20  # evenly spread steps, plus every stage's first and last step and the step after the run


def sample_steps(total: int, stage_edges: list[tuple[int, int]]) -> list[int]:
    steps = {round(i * total / (SAMPLES - 1)) for i in range(SAMPLES)}
    for start, end in stage_edges:
        steps |= {start, end - 1}
    return sorted(s for s in steps | {total} if 0 <= s <= total)


def fmt_floats(values) -> str:
    return "[" + ", ".join(float(v).hex() for v in values) + "]"


def dump_preset(name: str, world_size: int) -> list[str]:
    from speedgpt.config import ConfigError, load_preset
    from speedgpt.config_docs import describe_config

    out = [f"# preset {name}, world size {world_size}"]
    cfg = load_preset(name)
    out += ["## speedgpt config --preset " + name, describe_config(cfg)]
    try:
        plan_lines, cfg = planned(cfg, world_size)
    except ConfigError as e:
        return out + [f"## config error: {e}"]
    return out + plan_lines


STEP_HEADER = ("## steps: stage | rows x micro-steps | windows | yarn (scale, freq sum, freq[:4]) | mtp | "
               "lr mult | muon momentum | muon weight decay")


def step_line(step, stage_index, rows, accum, windows, yarn_state, mtp, mult, momentum, wd) -> str:
    if yarn_state is not None:
        freq, scale = yarn_state
        rope = f"{float(scale).hex()} {float(freq.double().sum()).hex()} {fmt_floats(freq[:4].tolist())}"
    else:
        rope = "-"
    return (f"step {step}: stage {stage_index} | {rows} x {accum} | {windows} | {rope} | {fmt_floats(mtp)} | "
            f"{mult.hex()} | {float(momentum).hex()} | {float(wd).hex()}")


def memory_lines(cfg, world_size: int) -> list[str]:
    from speedgpt.config import ConfigError
    from speedgpt.parallel.memory import estimate_memory

    out = ["## memory estimate"]
    for strategy in ("ddp", "fsdp"):
        try:
            out.append(estimate_memory(cfg, strategy, world_size).describe())
        except ConfigError as e:
            out.append(f"{strategy}: config error: {e}")
    return out


def planned(cfg, world_size: int) -> tuple[list[str], object]:
    """The run's plan as text lines, and its resolved config: from the run's plan (plan.RunPlan, as
    the trainer makes it), or on code from before it, from the functions the loop called then."""
    try:
        from speedgpt.planner import plan_run
    except ImportError:
        return planned_before_run_plan(cfg, world_size)
    import json

    from speedgpt.config import to_toml
    from speedgpt.model.build import model_from_config
    from speedgpt.train.build import data_epoch_lines, describe_run

    plan = plan_run(cfg, world_size)
    cfg = plan.cfg
    out = ["## budget lines", *plan.budget_lines, "## config.toml the run saves", to_toml(cfg)]
    model = model_from_config(cfg, "meta", world_size=world_size)
    out += ["## printed at start (model, batch or stages)",
            *describe_run(cfg, model, plan, "ddp", torch.device("cpu")), *data_epoch_lines(cfg, plan, CORPUS_TOKENS)]
    out += memory_lines(cfg, world_size)
    out.append(STEP_HEADER)
    for step in sample_steps(plan.steps, [(s.start, s.end) for s in plan.stages]):
        stage = plan.stage_at(step)
        out.append(step_line(step, stage.index, *plan.stage_batch(stage), plan.windows_at(step),
                             plan.yarn.state(step) if plan.yarn is not None else None, plan.mtp_weights_at(step),
                             plan.lr_mult_at(step), plan.muon_momentum_at(step), plan.muon_weight_decay_at(step)))
    out += ["## plan.json (new with the run plan)", json.dumps(plan.as_dict(), indent=1)]
    return out, cfg


def planned_before_run_plan(cfg, world_size: int) -> tuple[list[str], object]:
    """As `planned`, on the code before issue 28 (main at 077b67a): the functions the loop called."""
    from speedgpt.budget import resolve_budget
    from speedgpt.config import micro_batch_rows, to_toml
    try:
        from speedgpt.plan import validate
    except ImportError:  # the config package validated whole
        from speedgpt.config import validate
    from speedgpt.model.build import model_from_config
    from speedgpt.model.yarn import YarnSchedule
    from speedgpt.optim.schedules import lr_multiplier, muon_momentum, muon_weight_decay
    from speedgpt.stages import resolve_stage_table, stage_micro_batch, stage_plan, windows_at
    from speedgpt.train.build import data_epoch_lines, describe_run
    from speedgpt.train.step_schedule import lr_mult_at

    out = []
    cfg, budget_lines = resolve_budget(cfg)
    out += ["## budget lines", *budget_lines]
    validate(cfg, world_size)
    cfg = resolve_stage_table(cfg)
    out += ["## config.toml the run saves", to_toml(cfg)]
    plan = stage_plan(cfg)
    micro_batch, grad_accum = micro_batch_rows(cfg, world_size)
    model = model_from_config(cfg, "meta", world_size=world_size)
    out += ["## printed at start (model, batch or stages)",
            *describe_run(cfg, model, plan, "ddp", torch.device("cpu"), world_size, micro_batch, grad_accum),
            *data_epoch_lines(cfg, plan, CORPUS_TOKENS)]
    out += memory_lines(cfg, world_size)
    out.append(STEP_HEADER)
    yarn = YarnSchedule.from_config(cfg) if cfg.model.yarn else None
    o, total = cfg.optim, cfg.train.steps
    for step in sample_steps(total, [(s.start, s.end) for s in plan.stages]):
        stage = plan.stage_at(step)
        mult = lr_mult_at(cfg, plan, step)
        momentum = muon_momentum(step, o.muon_momentum_start, o.muon_momentum, o.muon_momentum_warmup_steps)
        wd = muon_weight_decay(o.muon_weight_decay, o.wd_schedule, mult, step / total)
        assert mult == lr_multiplier(cfg.schedule, step, total) * stage.lr_mul
        out.append(step_line(step, stage.index, *stage_micro_batch(cfg, stage, world_size),
                             windows_at(cfg, step, plan), yarn.state(step) if yarn is not None else None,
                             stage.mtp_weights_at(step), mult, momentum, wd))
    return out, cfg


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/dump_run_plans.py OUT_DIR", file=sys.stderr)
        return 2
    from speedgpt.config import preset_names

    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in preset_names():
        for world_size in WORLD_SIZES:
            lines = dump_preset(name, world_size)
            (out_dir / f"{name}.ws{world_size}.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(preset_names()) * len(WORLD_SIZES)} plans to {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
