"""Does torch's hierarchical compilation cut the whole-model compile of a speedgpt model? (issue 33, CPU)

`torch.compiler.nested_compile_region` marks a function whose traced graph dynamo may stamp out again for
each later call with matching inputs (the transformer layers of an LLM), so that AOTAutograd and Inductor
compile one layer, not twelve. This probe compiles speedrun-latest scaled down to a small width (its own
block variants turned off, so every block is structurally the same: one window key, no value embeddings, no
paired heads, no attention-free layer) and times the first forward and backward, with `Block.forward` plain
or marked as a nested compile region. torch's `hierarchical_compile` log says per call whether the region was
reused, and if not why. It prints, per mode: the first step's seconds, the subgraphs installed, the reuse
refusals by reason, the loss and the gradient norm (the same model either way, up to float rounding).
Mode region-pytree also registers the blocks' attention context (model/attention.py's AttnContext) as a pytree
dataclass, so that its tensors, not the object, enter the region (torch 2.13 on CPU: fails inside AOTAutograd's
trace with an IndexError; kept to try on a later torch). Mode region-tensors calls the region with the context
taken apart into tensors and constants (rebuilt inside): dynamo then reuses block 0's subgraph for later blocks,
and on torch 2.13 the stamped-out call fails as it runs (its lifted inputs mapped wrongly: an IndexError).

Usage: python benchmarks/nested_region_probe.py [--depth 12] [--backend inductor|aot_eager]
       [--modes plain region region-pytree region-tensors]
(each mode runs in its own process with a new Inductor cache: dynamo's caches and the region mark are
process-wide, and kernels compiled for one mode would be cache hits for the next)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# speedrun-latest without the per-layer variants, at a CPU size
SMALL = ["--model.model_dim=64", "--model.head_dim=16", "--model.attn_backend=sdpa", "--train.device=cpu",
         "--data.seq_len=256", "--model.fp8_head=false", "--model.fp8_mlp=false", "--model.fp8_attn=false",
         "--model.fused_ce=false", "--model.attn_free_layers=[]", "--model.value_embed_layers=[]",
         "--model.value_embeds=1", "--model.paired_head_layers=[]", "--model.backout_layer=-1",
         "--model.window_pattern=L", "--schedule.window_block=16", "--schedule.window_start=16",
         "--schedule.window_end=224", "--train.stages=[]", "--train.batch_tokens=256"]


class _Reuse(logging.Handler):
    """torch's hierarchical_compile lines: subgraphs installed, reuse refusals by reason."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.installed, self.refused = 0, Counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "Installing subgraph" in msg:
            self.installed += 1
        elif "subgraph_reuse:" in msg:
            self.refused[msg.split("subgraph_reuse:", 1)[1].strip()] += 1


def _region_of_tensors(gpt) -> None:
    """Block.forward through a nested compile region whose inputs are tensors, constants and the block: the
    attention context taken apart before the call and put together again inside."""
    import torch

    from speedgpt.model.attention import AttnContext

    plain = gpt.Block.forward

    @torch.compiler.nested_compile_region
    def region(block, x, x0, ve, lambdas, v_lambdas, backend, keys, masks, windows, doc_start, q_scale, extra):
        ctx = AttnContext(backend=backend, masks=dict(zip(keys, masks)), windows=windows, doc_start=doc_start,
                          q_scale=q_scale)
        return plain(block, x, x0, ve, lambdas, v_lambdas, ctx, None, extra)

    def forward(self, x, x0, ve, lambdas, v_lambdas, ctx, kv_cache, extra=None):
        keys = tuple(ctx.masks)
        return region(self, x, x0, ve, lambdas, v_lambdas, ctx.backend, keys, tuple(ctx.masks[k] for k in keys),
                      ctx.windows, ctx.doc_start, ctx.q_scale, extra)

    gpt.Block.forward = forward


def one(mode: str, depth: int, backend: str) -> dict:
    import torch

    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.model import gpt
    from speedgpt.model.build import model_from_config

    torch.set_num_threads(1)
    torch._logging.set_logs(hierarchical_compile=True)
    watch = _Reuse()
    logging.getLogger("torch._dynamo.variables.invoke_subgraph").addHandler(watch)
    if mode in ("region", "region-pytree"):
        gpt.Block.forward = torch.compiler.nested_compile_region(gpt.Block.forward)
    if mode == "region-tensors":
        _region_of_tensors(gpt)
    if mode == "region-pytree":  # the attention context flattened by pytree: its tensors become the region's inputs
        from torch.utils import _pytree

        from speedgpt.model.attention import AttnContext

        _pytree.register_dataclass(AttnContext, field_names=["backend", "masks", "windows", "doc_start", "rope"],
                                   drop_field_names=[])
    cfg = apply_overrides(load_preset("speedrun-latest"), SMALL + [f"--model.depth={depth}"])
    model = model_from_config(cfg, "cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # zero-initialized projections and head would leave most gradients 0
        for p in model.parameters():
            if p.dim() == 2 and not p.any():
                p.normal_(std=0.05, generator=g)
    x = torch.randint(0, cfg.model.vocab_size, (1, 256), generator=g)
    y = torch.randint(0, cfg.model.vocab_size, (1, 256), generator=g)
    forward = torch.compile(model, dynamic=False, backend=backend)
    t0 = time.perf_counter()
    loss = forward(x, y)
    loss.backward()
    seconds = time.perf_counter() - t0
    norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in model.parameters() if p.grad is not None))
    return {"mode": mode, "first_step_s": round(seconds, 1), "subgraphs": watch.installed,
            "refused": dict(watch.refused), "loss": loss.item(), "grad_norm": norm.item()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"])
    p.add_argument("--modes", nargs="+", default=["plain", "region"],
                   choices=["plain", "region", "region-pytree", "region-tensors"])
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: one mode, JSON out
    args = p.parse_args(argv)
    if args.depth < 1:
        p.error(f"--depth {args.depth}: give at least 1")
    if args.one:
        print(json.dumps(one(args.one, args.depth, args.backend)))
        return 0
    for mode in args.modes:
        cmd = [sys.executable, __file__, "--one", mode, "--depth", str(args.depth), "--backend", args.backend]
        # a new Inductor cache each: one mode's compiled kernels (on a CPU, C++ keyed by its source) would be
        # hits for the next (a region after plain: 29 s against 149 s cold, the same kernels)
        with tempfile.TemporaryDirectory(prefix="nested-region-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode:
            print(f"{mode}: failed (exit {out.returncode}): {(out.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{mode:7s} depth {args.depth}, {args.backend}: first step {r['first_step_s']} s, subgraphs installed "
              f"{r['subgraphs']}, reuse refused {r['refused'] or 'never'}, loss {r['loss']:.6f}, "
              f"grad norm {r['grad_norm']:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
