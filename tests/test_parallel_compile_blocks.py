"""ddp with train.compile_scope="block": each compiled block is its own autograd node, so gradient
reductions start while the backward is still computing earlier blocks (gloo, 2 ranks).

Markers (identity autograd functions, outside the compiled blocks) record when the backward reaches
each block; the gradient sync records each reduction it launches. In the measured (second) step,
reductions are launched before the backward has started on the first block. The blocks are
compiled with the aot_eager backend: the same autograd structure as Inductor's, without code
generation (fast on CPU)."""

import torch
import torch.distributed as dist

from distkit import spawn_local
from speedgpt.config import ModelConfig, OptimConfig
from speedgpt.model.build import build_model
from speedgpt.optim.build import build_optimizers
from speedgpt.train.compile import compile_blocks

EVENTS: list = []


class Marker(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, label):
        ctx.label = label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        EVENTS.append(ctx.label)
        return grad, None


class Marked(torch.nn.Module):
    """A block between two markers: ("start", i) when its backward begins, ("done", i) when it ends."""

    def __init__(self, block, i):
        super().__init__()
        self.block, self.i = block, i

    def forward(self, x, *rest):
        y = self.block(Marker.apply(x, ("done", self.i)), *rest)
        return Marker.apply(y, ("start", self.i))


def _worker(rank, world):
    dist.init_process_group("gloo")
    try:
        cpu = torch.device("cpu")
        model = build_model(ModelConfig(depth=3, model_dim=64, head_dim=16, value_embeds=1, vocab_size=256), 32)
        opts = build_optimizers(model, OptimConfig(), cpu)
        sync = opts.grad_sync
        launch = sync._launch
        sync._launch = lambda b: (EVENTS.append("launch"), launch(b))[1]
        compile_blocks(model, backend="aot_eager")
        model.blocks = torch.nn.ModuleList(Marked(b, i) for i, b in enumerate(model.blocks))
        g = torch.Generator().manual_seed(rank)
        for step in range(2):  # the first synced step fixes the launch order; the second is measured
            EVENTS.clear()
            x = torch.randint(0, 256, (2, 32), generator=g)
            sync.prepare(final=True)
            model(x, x).backward()
            backward_events = list(EVENTS)
            opts.step()
            model.zero_grad(set_to_none=True)
        first_block = backward_events.index(("start", 0))
        assert backward_events.index(("start", 2)) < backward_events.index(("start", 1)) < first_block
        assert "launch" in backward_events[:first_block], backward_events
    finally:
        dist.destroy_process_group()


def test_per_block_compile_reduces_gradients_during_the_backward(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    spawn_local(_worker, 2)
