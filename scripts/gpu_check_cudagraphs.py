"""GPU check (issue 34): does torch.compile's CUDA-graph mode ("reduce-overhead") run speedgpt's training
micro-steps, give the same gradients, and take the host's launches off a small micro-step?

Wave 13 read a floor of ~32-35 ms a micro-step on an H200 (speedrun-latest in micro-steps of 1 x 16,384: 283.6 ms
a stage-0 step in 8 of them, 227.9 ms in 4 of 1 x 32,768): the host launching ~900 kernels through Inductor's
Python wrapper and the autograd engine, by our reading. A CUDA graph replays a compiled forward or backward with
one launch. This builds the preset's model on one GPU (its weights from the config's seed), feeds it micro-steps of
random tokens with a BOS every ~700 (documents for the masks) at a training step of the preset's schedule, and per
compile mode prints (reduce-overhead in the trainer's pattern: a cudagraph step marked before each micro-step, the
gradients copied out of the graphs' buffers after the first backward; wave 15 ran it with one mark a step and no
copy): compile + first steps, ms a step and a micro-step (CUDA events, gradients accumulated over the
micro-steps, then dropped; no optimizer), peak memory, Inductor's "skipping cudagraphs" reasons (none: captured),
and the accumulated gradients of the first step against the default mode's (the same math, so a difference beyond
rounding means a replay overwrote a gradient it still needed; the default mode runs twice, the second run's difference
is the noise floor). Exit 1 when reduce-overhead fails or its gradients differ by 5 % of a parameter's largest
gradient or more; 2 without a CUDA GPU or with bad arguments.

    python scripts/gpu_check_cudagraphs.py [--preset speedrun-latest] [--step 20] [--rows 1] [--seq-len 16384]
        [--micro-steps 8] [--steps 6] [--depth N]
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

# default twice: the second run's gradients against the first's are the noise floor (atomic adds in the embeddings'
# backward, FP8 rounding), the bar reduce-overhead's difference is read against
MODES = ("default", "default-again", "reduce-overhead")
DEVICE = "cuda"


class _Skips(logging.Handler):
    """Inductor's reasons for running a graph without a CUDA graph ("skipping cudagraphs due to ..."; its
    counter says how many)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "skipping cudagraphs" in msg:
            self.reasons.append(msg.splitlines()[0][:160])


def batch(cfg, rows: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens, a BOS every ~700 (documents of 500-900 tokens), inputs int32 and targets int64 as the
    loader gives them."""
    tokens = torch.randint(0, cfg.model.vocab_size, (rows, seq_len + 1), generator=gen)
    for r in range(rows):
        pos = 0
        while pos < seq_len:
            tokens[r, pos] = cfg.model.bos_id
            pos += int(torch.randint(500, 900, (1,), generator=gen))
    return tokens[:, :-1].to(DEVICE, torch.int32), tokens[:, 1:].to(DEVICE, torch.int64)


def run_mode(mode: str, cfg, plan, step: int, batches, steps: int) -> dict:
    from torch._dynamo.utils import counters

    from speedgpt.model.build import model_from_config
    from speedgpt.train.compile import grads_out_of_cudagraph_pool, marking_steps
    from speedgpt.train.step_schedule import StepInputs

    torch._dynamo.reset()
    model = model_from_config(cfg, DEVICE, step=step)
    model.train()
    inputs = StepInputs(plan, torch.device(DEVICE), rope_state=model.rope_state)
    windows, rope, mtp = inputs.windows_at(step), inputs.rope_at(step), inputs.mtp_weights_at(step)
    cudagraphs = mode == "reduce-overhead"
    forward = torch.compile(model, dynamic=False, mode=mode if cudagraphs else None)
    skips_before = counters["inductor"]["cudagraph_skips"]
    extra = {} if mtp is None else {"mtp_weights": mtp}

    if cudagraphs:  # as the trainer's forward: a cudagraph step marked before each call (micro-step)
        forward = marking_steps(forward)

    def one_step() -> None:
        # as the trainer's step (train/loop.py): the gradients copied out of the graphs' buffers after the first
        # backward
        for i, (x, y) in enumerate(batches):
            loss = forward(x, y, windows=windows, rope=rope, **extra) / len(batches)
            loss.backward()
            if cudagraphs and i == 0:
                grads_out_of_cudagraph_pool(model)

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    one_step()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    for _ in range(2):  # CUDA graphs record on a later call than the compile's
        one_step()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start_s = time.perf_counter() - t0
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        one_step()
        model.zero_grad(set_to_none=True)
        events[i + 1].record()
    torch.cuda.synchronize()
    ms = sorted(events[i].elapsed_time(events[i + 1]) for i in range(steps))
    out = {"start_s": start_s, "ms_mean": sum(ms) / steps, "ms_median": ms[steps // 2],
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "grads": grads,
           "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips_before}
    del forward, model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="speedrun-latest")
    p.add_argument("--step", type=int, default=20, help="the training step whose windows, rotary state and MTP "
                                                         "weights the micro-steps use (default 20: stage 0)")
    p.add_argument("--rows", type=int, default=1, help="rows a micro-step")
    p.add_argument("--seq-len", type=int, default=16384, help="tokens a row (a multiple of the attention block)")
    p.add_argument("--micro-steps", type=int, default=8, help="micro-steps a step")
    p.add_argument("--steps", type=int, default=6, help="timed steps a mode")
    p.add_argument("--depth", type=int, default=0, help="model.depth (0: the preset's)")
    args = p.parse_args(argv)
    for name in ("rows", "seq_len", "micro_steps", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give at least 1")
    if args.step < 0 or args.depth < 0:
        p.error("--step and --depth take 0 or more")
    if not torch.cuda.is_available():
        print("gpu_check_cudagraphs.py: needs a CUDA GPU (CUDA graphs are a CUDA feature); run it on one")
        return 2
    from speedgpt.config import ConfigError, apply_overrides, load_preset
    from speedgpt.plan import RunPlan

    try:
        cfg = load_preset(args.preset)
        if args.depth:
            cfg = apply_overrides(cfg, [f"--model.depth={args.depth}"])
        plan = RunPlan.of(cfg)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"gpu_check_cudagraphs.py: {e}")
        return 2
    if args.step >= plan.steps:
        p.error(f"--step {args.step}: the preset has {plan.steps} steps")
    # the trainer's Inductor settings (train/compile.py's compiled_forward), so both modes build its kernels
    from speedgpt.train.inductor_tuning import apply_inductor_settings

    apply_inductor_settings(cfg.train)
    gen = torch.Generator().manual_seed(0)
    batches = [batch(cfg, args.rows, args.seq_len, gen) for _ in range(args.micro_steps)]
    skips = _Skips()
    logging.getLogger("torch._inductor").addHandler(skips)
    torch._logging.set_logs(cudagraphs=True)  # Inductor says why it skips a graph on this artifact log only
    print(f"{args.preset} at step {args.step}: {args.micro_steps} micro-steps of {args.rows} x {args.seq_len}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    results, ok = {}, True
    for mode in MODES:
        skips.reasons.clear()
        try:
            r = results[mode] = run_mode(mode, cfg, plan, args.step, batches, args.steps)
        except Exception as e:  # a mode that cannot run is this check's finding, not a crash of the check
            print(f"{mode:16s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            ok = False
            continue
        line = (f"{mode:16s} start {r['start_s']:.1f} s, {r['ms_mean']:.1f} ms a step (median {r['ms_median']:.1f}), "
                f"{r['ms_mean'] / args.micro_steps:.1f} ms a micro-step, peak {r['peak_gib']:.1f} GiB")
        if mode == "reduce-overhead":
            reasons = sorted(set(skips.reasons)) or ["(reasons in the cudagraphs log)"]
            line += "; CUDA graphs: " + ("captured" if not r["cudagraph_skips"] else
                                         f"skipped {r['cudagraph_skips']} time(s): " + " | ".join(reasons))
        base = results.get("default")
        if mode != "default" and base is not None:
            worst = max(((g - base["grads"][n]).abs().max() / base["grads"][n].abs().max().clamp_min(1e-30)).item()
                        for n, g in r["grads"].items())
            line += f"; first step's gradients against default's: max relative difference {worst:.2e}"
            if mode == "reduce-overhead":
                # a replay that overwrote a gradient still needed is off by O(1), rounding by far less
                ok &= worst < 5e-2 and set(r["grads"]) == set(base["grads"])
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
