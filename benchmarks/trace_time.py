"""Dynamo's trace of a preset's model at full size, timed on the CPU (issue 33: the part of every GPU start that no
Inductor cache holds; a warm start of speedrun-latest on an H200 spent 14.9 of its 29.0 s there, wave 15).

The model is built at the preset's size and traced on a short row (static shapes: the row's length changes the
graph's sizes, not what dynamo walks through). Flex attention takes its GPU code path (FUSED_FLEX_DEVICES + "cpu",
its CPU-backward refusal lifted, as tests/test_compile_graphs.py does). The FP8 paths are a GPU's (a CPU run
leaves them off) unless --fp8 (below): their custom Functions add to a GPU trace. Each repeat resets dynamo and
traces the training forward (with the first stage's MTP weights, when the preset has them) and the validation
forward (no grad).
  --backend eager      dynamo alone (the "trace" phase of the start log's compile time)
  --backend aot_eager  dynamo, then AOTAutograd's joint trace and partition (a backward is run to compile it)
  --backend aot_eager_decomp_partition  the same with Inductor's decompositions and its min-cut partitioner
--fp8 takes the preset's FP8 paths as a GPU does, in bf16 (torch 2.13's CPU runs _scaled_mm, row-wise scales too;
the fused ReLU² custom ops run their torch reference), all but the fused head + loss, whose kernels need Triton (the
FP8 head then takes its unfused custom ops). --bf16 runs the model in bf16 without them (the baseline to set --fp8
against: a bf16 model traces its weights' casts, which fp32, a CPU's default, does not have).
The times printed per forward include running it once eagerly on the CPU (dynamo's eager backend runs the graph);
"bytecode tracing" is dynamo's own timer of the trace alone.
--profile prints dynamo's own per-function timings of the last repeat's training trace (torch's dynamo_profiler).

Usage: python benchmarks/trace_time.py [--preset speedrun-latest] [--backend eager] [--repeats 3] [--fp8 | --bf16]
       [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def flex_on_the_cpu() -> None:
    import torch.nn.attention.flex_attention as flex_module

    from speedgpt.model import attention

    attention.FUSED_FLEX_DEVICES = ("cuda", "cpu")
    flex_module._validate_device = lambda *args: None  # flex's Python check before the op; its math runs on CPU


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="speedrun-latest")
    ap.add_argument("--backend", default="eager", choices=("eager", "aot_eager", "aot_eager_decomp_partition"))
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--fp8", action="store_true", help="the preset's FP8 paths that run without Triton, in bf16")
    kind.add_argument("--bf16", action="store_true", help="the model in bf16, without the FP8 paths")
    ap.add_argument("--rows", type=int, default=1024, help="tokens in the traced row (a multiple of 128)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.rows <= 0 or args.rows % 128:
        ap.error(f"--rows {args.rows}: give a positive multiple of 128 (flex's block; other rows trace the dense path)")
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give at least 1")

    from torch._dynamo.utils import compile_times, counters

    from speedgpt.config import ConfigError, apply_overrides, load_preset
    from speedgpt.model.build import build_model
    from speedgpt.model.runtime import cpu_runs_rowwise_fp8, max_seq_len, resolve_runtime

    try:
        preset = load_preset(args.preset)
    except ConfigError as e:
        ap.error(str(e))
    flex_on_the_cpu()
    torch.set_num_threads(2)
    cfg = apply_overrides(preset, [
        "--train.device=cpu", "--model.attn_backend=flex", f"--data.seq_len={args.rows}",
        f"--data.val_seq_len={args.rows}", "--train.stages=[]", f"--train.batch_tokens={args.rows}"])
    mtp = preset.train.stages[0].mtp_weights if preset.train.stages else ()
    runtime = resolve_runtime(cfg, "cpu")
    if args.bf16:
        runtime = runtime.replace(dtype=torch.bfloat16)
    if args.fp8:
        if not cpu_runs_rowwise_fp8():
            ap.error("--fp8 needs a torch whose CPU _scaled_mm takes row-wise scales (2.13 on); leave --fp8 out")
        m = cfg.model
        runtime = runtime.replace(fp8_head=m.fp8_head, fp8_mlp=m.fp8_scaling if m.fp8_mlp else "",
                                  fp8_attn=m.fp8_scaling if m.fp8_attn else "", dtype=torch.bfloat16)  # as on a GPU
    model = build_model(cfg.model, max_seq_len(cfg), runtime, seed=cfg.train.seed)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.model.vocab_size, (1, args.rows), generator=g)
    x[0, ::300] = cfg.model.bos_id  # documents, so the masks have something to mask
    y = torch.randint(0, cfg.model.vocab_size, (1, args.rows), generator=g)
    weights = torch.tensor(mtp) if len(mtp) > 1 else None
    print(f"{args.preset}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"depth {cfg.model.depth}, row of {args.rows}, MTP weights {list(mtp) or None}, backend {args.backend}, "
          f"{str(runtime.dtype).removeprefix('torch.')}, FP8 head / attention / MLP: {runtime.fp8_head} / "
          f"{runtime.fp8_attn or 'off'} / {runtime.fp8_mlp or 'off'}; "
          f"torch {torch.__version__}")
    rows, tracings = [], []
    for repeat in range(args.repeats):
        torch._dynamo.reset()
        counters.clear()
        if args.profile and repeat == args.repeats - 1:
            torch._dynamo.config.dynamo_profiler = True
        compiled = torch.compile(model, backend=args.backend, dynamic=False)
        t0 = time.perf_counter()
        loss = compiled(x, y, mtp_weights=weights)
        t1 = time.perf_counter()
        if args.backend.startswith("aot_eager"):
            loss.backward()
            model.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        torch._dynamo.config.dynamo_profiler = False
        with torch.no_grad():
            compiled(x, y)
        t3 = time.perf_counter()
        names, values = compile_times(repr="csv", aggregate=True)
        tracing = dict(zip(names, values)).get("bytecode_tracing", float("nan"))
        rows.append((t1 - t0, t2 - t1, t3 - t2))
        tracings.append(float(tracing))
        print(f"  repeat {repeat + 1}: training forward {t1 - t0:.2f} s"
              + (f" (+ backward {t2 - t1:.2f} s)" if args.backend.startswith("aot_eager") else "")
              + f", validation forward {t3 - t2:.2f} s; dynamo's bytecode tracing {float(tracing):.2f} s in all; "
                f"{counters['stats']['unique_graphs']} graphs")
    train = statistics.median(r[0] + r[1] for r in rows)
    val = statistics.median(r[2] for r in rows)
    print(f"median of {len(rows)}: training {train:.2f} s, validation {val:.2f} s, both {train + val:.2f} s; "
          f"dynamo's bytecode tracing {statistics.median(tracings):.2f} s")


if __name__ == "__main__":
    main()
