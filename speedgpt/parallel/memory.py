"""Memory per device before anything is allocated: parameters, gradients, optimizer state and
activations, for a strategy (ddp | fsdp) and a world size; `choose_strategy` resolves "auto" and
refuses a config that cannot fit, naming the knobs to turn.

The counts come from the model built on the meta device (exact parameter numbers, no memory);
the activation term is a per-layer model of what the backward keeps (see `activation_bytes`), an
estimate. Everything is in bytes.

What each strategy keeps on one device (N parameters, W ranks, block = the largest block's
parameters, all masters fp32):
  ddp:  params 4N, grads 4N (every rank reduces the full gradients), optimizer state / W
        (DistAdam / DistMuon shard it ZeRO-1 style; on one rank it is whole).
  fsdp: params 4N / W plus the gathered working copy of two blocks (the one computing and the
        one prefetched) in the compute dtype; grads 4N / W plus one block's unsharded gradients;
        optimizer state / W.
Optimizer state: Adam 8 bytes per parameter (two fp32 moments), Muon 4 (one momentum buffer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..config import Config, ConfigError

GIB = 2 ** 30


@dataclass(frozen=True)
class MemoryEstimate:
    strategy: str
    world_size: int
    micro_batch: int
    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def describe(self) -> str:
        parts = ", ".join(f"{k} {getattr(self, k) / GIB:.2f}" for k in ("params", "grads", "optimizer", "activations"))
        return (f"{self.strategy} on {self.world_size} rank(s), micro-batch {self.micro_batch}: "
                f"{self.total / GIB:.2f} GiB per device ({parts} GiB; an estimate)")


@dataclass(frozen=True)
class ParamCounts:
    total: int
    adam: int  # parameters with two Adam moments
    muon: int  # hidden matrices with one momentum buffer (0 with optim.kind="adamw")
    largest_block: int


def param_counts(cfg: Config) -> ParamCounts:
    """Exact parameter counts from the model built on the meta device (no memory is allocated)."""
    from ..model.gpt import GPT
    from ..model.runtime import ModelRuntime, max_seq_len

    with torch.device("meta"):
        model = GPT(cfg.model, max_seq_len(cfg), ModelRuntime(device=torch.device("meta")))
    total = sum(p.numel() for p in model.parameters())
    matrices = sum(p.numel() for p in model.param_groups()["matrix"])
    muon = matrices if cfg.optim.kind == "muon" else 0
    largest = max(sum(p.numel() for p in b.parameters()) for b in model.blocks)
    return ParamCounts(total=total, adam=total - muon, muon=muon, largest_block=largest)


def activation_bytes(cfg: Config, micro_batch: int, dtype_bytes: int) -> float:
    """What one micro-batch's backward keeps, per device. Per token and layer, in the compute dtype:
    the block input and its norm, q, k, v before and after norm and rotary, and the attention output
    (8 widths when heads x head_dim = width and every head has its own k and v; fewer with grouped-
    query attention), and the MLP's normed input, hidden pre-activation and ReLU² output (1 width +
    2 hidden). With activation checkpointing only each block's input is kept, plus one
    block's full set while it is recomputed. The head adds fp32 logits and their gradient
    (2 x 4 bytes x padded vocab per token) and the embeddings' outputs."""
    m = cfg.model
    tokens = micro_batch * cfg.data.seq_len
    dim = m.resolved_dim()
    hidden = int(m.mlp_ratio * dim)
    q = m.resolved_heads() * m.head_dim
    kv = m.resolved_kv_heads() * m.head_dim
    # input and norm (2 dim), q k v before (q + 2 kv) and after norm and rotary (q + kv, and v), attention
    # output (q): 8 widths when q = kv = dim; then the MLP's norm, pre-activation and ReLU².
    per_layer = 2 * dim + 3 * q + 3 * kv + dim + 2 * hidden
    if cfg.parallel.activation_checkpointing:
        layers = m.depth * dim + per_layer
    else:
        layers = m.depth * per_layer
    embeds = (1 + (len(m.value_embed_layers) or m.value_embeds) + bool(m.bigram_vocab_mult)) * dim  # token, value, bigram
    head = 2 * 4 * m.padded_vocab()
    return tokens * ((layers + embeds) * dtype_bytes + head)


def estimate_memory(cfg: Config, strategy: str, world_size: int, *, dtype_bytes: int = 2,
                    counts: ParamCounts | None = None) -> MemoryEstimate:
    """Bytes per device for `strategy` ("ddp" | "fsdp") on `world_size` ranks. `dtype_bytes`: the
    compute dtype's size (2 for bf16 on GPUs, 4 for fp32 on CPUs)."""
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy '{strategy}' has no memory model; use ddp or fsdp")
    counts = counts or param_counts(cfg)
    w = world_size
    from ..plan import RunPlan

    micro_batch = RunPlan.of(cfg, w).micro_batch  # the run's own micro-step
    optimizer = (8 * counts.adam + 4 * counts.muon) / w
    if strategy == "ddp":
        params = 4.0 * counts.total
        grads = 4.0 * counts.total
    else:
        params = 4.0 * counts.total / w + 2 * dtype_bytes * counts.largest_block
        grads = 4.0 * counts.total / w + dtype_bytes * counts.largest_block
    return MemoryEstimate(strategy=strategy, world_size=w, micro_batch=micro_batch, params=params, grads=grads,
                          optimizer=optimizer, activations=activation_bytes(cfg, micro_batch, dtype_bytes))


def device_memory_limit(cfg: Config, device: torch.device) -> float | None:
    """Bytes the estimate must fit in: parallel.memory_limit_gib, else the GPU's memory; None: no limit."""
    if cfg.parallel.memory_limit_gib:
        return cfg.parallel.memory_limit_gib * GIB
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return None


# The estimate leaves this share of the device for what it does not model (allocator
# fragmentation, communication buffers, compile workspaces, the CUDA context).
HEADROOM = 0.9


def choose_strategy(cfg: Config, world_size: int, device: torch.device, *, dtype_bytes: int = 2,
                    counts: ParamCounts | None = None) -> tuple[str, MemoryEstimate]:
    """The strategy to run ("auto": ddp if it fits, else fsdp) and its estimate. Raises ConfigError,
    with the estimate and the knobs to turn, when the chosen strategy does not fit."""
    counts = counts or param_counts(cfg)
    limit = device_memory_limit(cfg, device)
    wanted = cfg.parallel.strategy
    ddp = estimate_memory(cfg, "ddp", world_size, dtype_bytes=dtype_bytes, counts=counts)
    if wanted == "auto":
        strategy = "ddp" if limit is None or ddp.total <= HEADROOM * limit else "fsdp"
    else:
        strategy = wanted
    est = ddp if strategy == "ddp" else estimate_memory(cfg, "fsdp", world_size, dtype_bytes=dtype_bytes,
                                                         counts=counts)
    if limit is not None and est.total > HEADROOM * limit:
        knobs = ["a smaller --train.micro_batch_size"]
        if not cfg.parallel.activation_checkpointing:
            knobs.append("--parallel.activation_checkpointing=true")
        if strategy == "ddp":
            knobs.append("--parallel.strategy=fsdp")
        knobs.append("more GPUs")
        raise ConfigError(f"does not fit: {est.describe()}, over {HEADROOM:.0%} of {limit / GIB:.1f} GiB; "
                          f"try {', '.join(knobs)}")
    ram, local = host_share(device, world_size) if limit is None else (None, 1)
    if ram and est.total * local > ram:  # a host's CPU ranks share its memory; past it the run dies of OOM later
        raise ConfigError(f"does not fit: {est.describe()}{f' x {local} ranks' if local > 1 else ''}, more than this "
                          f"machine's {ram / GIB:.1f} GiB; try a smaller --model.depth or --train.micro_batch_size, "
                          f"or a GPU (a CPU preset: --preset tiny-cpu; --parallel.memory_limit_gib=N sets the limit)")
    return strategy, est


def host_share(device: torch.device, world_size: int) -> tuple[float | None, int]:
    """On a CPU: this machine's memory (None where the OS does not say) and the ranks on it that share it (torchrun's
    LOCAL_WORLD_SIZE, else all `world_size`). Elsewhere (None, 1): a GPU's memory is its process's own."""
    if device.type != "cpu":
        return None, 1
    return host_memory(), int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


@dataclass(frozen=True)
class SdpaMasks:
    """What sdpa's dense masks of a model take: `mask_keys`, the masks each forward builds (GPT.mask_keys);
    `layer_keys`, each attention layer's; `copy_bytes`, the compute dtype's size; `checkpointed`, activation
    checkpointing."""

    mask_keys: tuple[str, ...]
    layer_keys: tuple[str, ...]
    copy_bytes: int = 4
    checkpointed: bool = False

    def boolean_bytes(self, micro_rows: int, length: int) -> int:
        """The boolean masks a forward holds for a micro-batch of rows of `length` tokens: one a row and key."""
        from ..model.attention import mask_side

        return micro_rows * sum(mask_side(length, key) ** 2 for key in set(self.mask_keys))

    def peak_bytes(self, micro_rows: int, length: int, device: torch.device, training: bool) -> int:
        """The boolean masks, and on a CPU the copy of its mask in the compute dtype that each sdpa call makes (torch
        2.13 on a CPU grew 68 MiB a layer at rows of 4,096 in float32: 4.25 bytes an element), which training's
        backward keeps for each attention layer (one at a time under activation checkpointing, whose blocks save
        nothing) and validation holds one at a time. CUDA's copies are not counted: there the figure is a lower
        bound."""
        from ..model.attention import mask_side

        masks = self.boolean_bytes(micro_rows, length)
        if device.type == "cuda":
            return masks
        copies = [self.copy_bytes * micro_rows * mask_side(length, key) ** 2 for key in self.layer_keys]
        return masks + (sum(copies) if training and not self.checkpointed else max(copies, default=0))


def check_dense_masks(shapes, attention: SdpaMasks, device: torch.device, cfg: Config, world_size: int) -> None:
    """Fail before the first forward when sdpa's dense masks (SdpaMasks.peak_bytes) for the rows of some stage or of
    validation pass the memory choose_strategy checks against: the GPU's or parallel.memory_limit_gib, else on a
    CPU the host's, shared by its ranks. Wave 24's sdpa run of speedrun-latest stopped at its first forward with a
    CUDA out-of-memory that named no fix; on a CPU the kernel killed such a run without a word. `shapes`: (config
    key, rows per micro-step, row length, training) of each shape the run meets."""
    limit, ranks = device_memory_limit(cfg, device), 1
    if limit is None:
        limit, ranks = host_share(device, world_size)
    if limit is None:
        return
    for key, micro_rows, length, training in shapes:
        need = attention.peak_bytes(micro_rows, length, device, training) * ranks
        if need > HEADROOM * limit:
            where = "this GPU's" if device.type == "cuda" else "the limit's" if cfg.parallel.memory_limit_gib \
                else "this machine's"
            flex = ("--model.attn_backend=flex (a CUDA GPU of compute capability >= 8)" if device.type != "cuda"
                    else "--model.attn_backend=flex")
            raise ConfigError(f"model.attn_backend=sdpa builds dense attention masks: {micro_rows} row(s) of "
                              f"{length:,} tokens ({key}) need {need / GIB:,.1f} GiB of them"
                              f"{f' for {ranks} ranks' if ranks > 1 else ''}, more than {HEADROOM:.0%} of {where} "
                              f"{limit / GIB:,.1f} GiB; use {flex} or shorter rows ({key})")


def host_memory() -> float | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
