"""What `train.compile_precompile` brings back on a fresh machine, per kind of model code (issue 33, CPU).

Each case runs as two processes, two machines: a cold start (torch.compile with Inductor and caching precompile,
then speedgpt's CompileCache saves torch's artifacts), then a start from a new folder holding only the artifact
file. Per case it prints the graphs each start traced, the fresh start's dynamo cache hits, torch's
"Backend not found" warnings (a saved entry whose compiled backend is missing: dynamo traces it again), and the
fresh start's exit status and last error line. Cases (small modules, three calls each):
  linear       a linear layer (tests/test_compile_cache.py's case), with its backward
  break        the same behind a @torch.compiler.disable call (build_context_eagerly's graph break)
  autofn       a custom torch.autograd.Function in the graph (what the FP8 paths are: model/fp8_linear.py)
  flex         model/attention.py's flex on its GPU path (FUSED_FLEX_DEVICES + "cpu"); forward only (no CPU
               flex backward in Inductor)
  flex-nested  the same through a lazily made torch.compile of flex inside the model (the code before issue 33's
               fix: the model is traced again once it exists)
Each start calls the trainer's compiled_forward with its CompileCache: AOTAutograd's cache keeps the custom
Functions' graphs there (scoped), and a flex model's saved guards are unpickled inside a throwaway tracing context
(speedgpt/train/precompile_guards.py). --allow-custom-autograd sets torch's switch for the whole process instead
(its env var); --torch-guards leaves guard unpickling to torch alone (the flex case then dies on its fresh start:
"CompilePackage is already initialized", pytorch/pytorch#187736).

Usage: python benchmarks/precompile_probe.py [--cases linear flex ...] [--allow-custom-autograd] [--torch-guards]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ("linear", "break", "autofn", "flex", "flex-nested")
CALLS = 3


class Linear(torch.nn.Module):
    grad = True

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        # what compiled_forward reads of a GPT: with flex it restores saved guards in a trace (precompile_guards.py)
        self.runtime = SimpleNamespace(attn_backend="flex" if "Flex" in type(self).__name__ else "sdpa")

    def forward(self, x):
        return torch.relu(self.proj(x)).square().mean()


@torch.compiler.disable
def eager_double(x):
    return x * 2


class Break(Linear):
    def forward(self, x):
        return super().forward(eager_double(x))


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class AutoFn(Linear):
    def forward(self, x):
        return Square.apply(torch.relu(self.proj(x))).mean()


class Flex(Linear):
    grad = False

    def attend(self, q):
        from speedgpt.model import attention

        return attention.flex_attention_fused(q, q, q, None, 0.25)

    def forward(self, x):
        q = self.proj(x).view(1, 128, 1, 16).transpose(1, 2)
        return self.attend(q).square().mean()


_nested = None


class FlexNested(Flex):
    def attend(self, q):
        global _nested
        from speedgpt.model import attention

        if _nested is None:
            _nested = torch.compile(attention.flex_attention_compiled_only, dynamic=False)
        return _nested(q, q, q, None, 0.25)


def child(case: str, cache_dir: str) -> None:
    """One machine's start: the saved artifacts loaded, CALLS calls, the artifacts saved; one JSON line."""
    from torch._dynamo.utils import counters

    from speedgpt.config import Config, apply_overrides
    from speedgpt.model import attention
    from speedgpt.train.compile import compiled_forward
    from speedgpt.train.compile_cache import CompileCache

    torch.set_num_threads(1)
    attention.FUSED_FLEX_DEVICES = ("cuda", "cpu")
    if os.environ.get("PROBE_TORCH_GUARDS"):
        import speedgpt.train.compile as compile_module

        compile_module.restore_guards_in_a_trace = lambda: True  # precompile on, torch's own guard unpickling
    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true",
                                     f"--train.compile_cache={cache_dir}"])
    cache = CompileCache.for_run(cfg.train.compile_cache, cfg.to_dict(), 1, torch.device("cpu"))
    cache.load()
    torch.manual_seed(0)
    model = {"linear": Linear, "break": Break, "autofn": AutoFn, "flex": Flex, "flex-nested": FlexNested}[case]()
    x = torch.randn(128, 16)
    # with the run's cache, as the trainer calls it: AOTAutograd's cache then keeps custom Functions' graphs too
    compiled = compiled_forward(cfg, model, "ddp", log=lambda line: None, cache=cache)
    with torch.set_grad_enabled(model.grad):
        for _ in range(CALLS):
            out = compiled(x)
            if model.grad:
                out.backward()
    cache.save()
    stats = {"traced": counters["stats"]["unique_graphs"], "hits": counters["dynamo_cache"]["dynamo_cache_hit"]}
    print(json.dumps({**stats, "out": out.item()}))


def start(case: str, cache_dir: Path, env: dict) -> tuple[dict | None, int, str]:
    """A child process: its JSON line (None if it died), its "Backend not found" count, its last error line."""
    env = dict(env, TORCHINDUCTOR_CACHE_DIR=str(cache_dir / "inductor-local"))
    p = subprocess.run([sys.executable, __file__, "--child", case, str(cache_dir)], env=env, capture_output=True,
                       text=True)
    lines = p.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if p.returncode == 0 and lines else None
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith(("AssertionError", "RuntimeError"))]
    return result, p.stderr.count("Backend not found"), errors[-1][:90] if errors else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--allow-custom-autograd", action="store_true")
    ap.add_argument("--torch-guards", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("TORCH_LOGS", None)
    if args.allow_custom_autograd:
        env["TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD"] = "1"
    if args.torch_guards:
        env["PROBE_TORCH_GUARDS"] = "1"
    print(f"torch {torch.__version__}; {CALLS} calls per start; allow custom autograd: "
          f"{args.allow_custom_autograd}; torch's own guard unpickling: {args.torch_guards}")
    print(f"{'case':12} {'cold traced':>11} {'fresh traced':>12} {'hits':>4} {'Backend not found':>17}  "
          f"same out  error")
    root = Path(tempfile.mkdtemp(prefix="precompile_probe-"))
    try:
        for case in args.cases:
            cold, cold_missing, _ = start(case, root / case / "cold", env)
            fresh_dir = root / case / "fresh"
            for f in (root / case / "cold").glob("*/artifacts-*"):  # only the artifact files travel
                (fresh_dir / f.parent.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(f, fresh_dir / f.parent.name / f.name)
            fresh, fresh_missing, error = start(case, fresh_dir, env)
            same = "-" if not (cold and fresh) else ("yes" if cold["out"] == fresh["out"] else "NO")
            print(f"{case:12} {cold['traced'] if cold else 'died':>11} {fresh['traced'] if fresh else 'died':>12} "
                  f"{fresh['hits'] if fresh else '-':>4} {cold_missing + fresh_missing:>17}  {same:8}  {error}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
