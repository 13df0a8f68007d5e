"""The run's sections besides model and optim (data, parallel, schedule, training with its stage table,
run) and `Config`, which holds them all; `SECTIONS` maps each section name to its dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import ModelConfig
from .optim import OptimConfig


@dataclass
class DataConfig:
    train_files: str = ""  # glob, directory or file of .bin shards; empty: the local Python-source corpus
    val_files: str = ""
    # The shards' tokenizer folder (`speedgpt tokenizer train --out`); empty: the tokenizer/ folder that
    # `data tokenize --tokenizer` puts next to the shards. Shards that record no tokenizer are GPT-2's.
    tokenizer: str = ""
    cache_dir: str = ""  # where the default corpus is built; empty: ~/.cache/speedgpt
    local_max_tokens: int = 20_000_000  # cap for the default corpus (0: everything)
    # The default corpus's documents: 0 = whole files; N = pieces of about N characters, shuffled, so
    # a small step holds many files (corpus.PythonSourceFiles). The CPU preset's steps are 1,024 tokens.
    local_piece_chars: int = 0
    seq_len: int = 1024  # tokens per row
    val_tokens: int = 1_048_576
    val_seq_len: int = 0  # 0: seq_len
    # How documents fill training rows (every row starts at a BOS, no padding): "greedy" in stream order
    # (data/greedy.py); "bestfit": the largest buffered document that fits whole, cutting one only when
    # none fits (data/bestfit.py); "record28": record #28's find_batch_starts (a row is the seq_len + 1
    # tokens from a BOS, the next row starts at the first BOS >= seq_len later, and a step starts at the
    # next shard when < 2 x its tokens + 1 are left in this one; it skips document tails by design).
    packing: str = "greedy"
    # The tokens a row cannot take whole (the tail of a document longer than a stage's max_doc_len, or cut
    # by the row's end): "split" puts them in further pieces, each starting with a BOS (no token skipped);
    # "crop" skips them, as the speedrun records' loaders do (fine for short web documents, costly for
    # code, books and papers: 77 % of a Python-source corpus under speedrun-latest's stages); "mix" fills
    # each row with the next pieces (at most max_doc_len tokens) of mix_docs open documents taken in a
    # seeded random order, so a row holds many documents and none is skipped (data/mix.py; greedy packing).
    long_docs: str = "split"
    # long_docs=mix: documents open at once; a document's next piece comes a round (mix_docs pieces) later
    mix_docs: int = 1024
    # Longest document piece in a row where no stage table row sets max_doc_len (a run without a table too);
    # 0: no cap. greedy packing only.
    max_doc_len: int = 0
    # greedy + split: a piece that continues a document starts with a BOS, so the attention masks see it as a
    # document of its own; false: it attends back to the document's piece before it where both share a row.
    continued_bos: bool = True
    # The first epoch reads documents shuffled by the seed (as later epochs do) instead of in shard order;
    # false keeps the records' order (a corpus tokenized in its sources' order meets them one by one).
    shuffle_first_epoch: bool = False
    # A shard found corrupt or truncated during training: "stop" the run (error naming file and
    # offset) or "skip" it (logged, counted in metrics as bad_shards; exact resume still holds).
    on_bad_shard: str = "stop"

    def cache_root(self) -> Path:
        """Where built corpora and downloaded eval data live (read at call time, never at import)."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path.home() / ".cache" / "speedgpt"

    def default_corpus_dir(self) -> Path:
        """The local Python-source corpus used when no data.train_files is given."""
        name = f"local-python-{self.local_max_tokens}" if self.local_max_tokens else "local-python-all"
        return self.cache_root() / (f"{name}-pieces{self.local_piece_chars}" if self.local_piece_chars else name)

@dataclass
class ParallelConfig:
    # How the model is spread over the ranks (docs/distributed.md):
    #   "ddp": every rank holds the whole model and its gradients; optimizer state sharded (ZeRO-1 style);
    #   "fsdp": parameters, gradients and optimizer state sharded per transformer block (FSDP2, fully_shard);
    #   "auto": ddp when its estimated memory per GPU fits the device, fsdp otherwise.
    strategy: str = "ddp"
    reshard_after_forward: bool = True  # fsdp: free each block's gathered weights after its forward (less memory, one more all-gather)
    activation_checkpointing: bool = False  # recompute each block's activations in the backward instead of keeping them
    memory_limit_gib: float = 0.0  # memory per device the estimate must fit in; 0: the GPU's own (no check on CPU)
    # dtype of the gradients' reduce-scatter: "param" (the parameter's, fp32) or "bf16" (half the bytes, coarser
    # sums; it changes the math: a loss A/B comes before any preset turns it on). docs/distributed.md
    grad_comm_dtype: str = "param"


@dataclass
class ScheduleConfig:
    kind: str = "constant_cooldown"  # constant_cooldown (with warmup_frac: WSD) | warmup_cosine
    warmup_frac: float = 0.0
    cooldown_frac: float = 0.45
    final_lr_frac: float = 0.1
    # Sliding attention window, in tokens, grown linearly over training (rounded to window_block).
    window_start: int = 1792
    window_end: int = 1792
    window_block: int = 128
    short_window_frac: float = 0.5
    # How the long window grows: "linear" (round(start + x (end - start)) blocks at progress x) or
    # "record28" (record #28: ceil(x (end - block/2) / block) blocks, at least one; window_start unused).
    window_rule: str = "linear"


@dataclass
class StageConfig:
    """One row of a stage table (train.stages): a span of the run with its own batch, shapes, windows,
    multi-token-prediction weights and lr multiplier. Zeros fall back to the run's own keys."""
    share: float = 0.0  # this stage's share of train.steps; the shares of a table add up to 1
    batch_tokens: int = 0  # global tokens per optimizer step in this stage; 0: train.batch_tokens
    seq_len: int = 0  # tokens per training row in this stage; 0: data.seq_len
    # Longest document piece in a row (greedy packing): a document longer than this goes on as further pieces
    # (data.long_docs="split" or "mix") or loses its tail ("crop", the records' max_doc_len / train_max_seq_len);
    # 0: data.max_doc_len.
    max_doc_len: int = 0
    window_long: int = 0  # long attention window in tokens for the whole stage; 0: the schedule's windows
    window_short: int = 0  # short window in tokens; 0: schedule.short_window_frac of window_long
    # Multi-token prediction: weight k scores the token k + 1 ahead (weight 0 is next-token, always 1).
    # [1.0] (or []) is plain next-token training. mtp_weights_end (same length) ramps linearly to it.
    mtp_weights: list[float] = field(default_factory=list)
    mtp_weights_end: list[float] = field(default_factory=list)
    lr_mul: float = 1.0  # multiplies every learning rate in this stage, on top of the lr schedule


# torch.compile's modes that train.compile_mode takes, and those that capture CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class TrainConfig:
    steps: int = 1000  # the horizon, unless a budget below sets it (horizon = "auto")
    batch_tokens: int = 524_288  # global tokens per optimizer step; 0: derived from the horizon (budget.py)
    # The horizon as a budget (0: off; at most one of the two): training tokens = tokens_per_param x scaling
    # parameters (transformer matrices + lm_head), or flops_budget / training FLOPs per token; steps follow.
    tokens_per_param: float = 0.0
    flops_budget: float = 0.0
    # What sets the horizon: auto (a budget when one is set, else steps) | steps (train.steps; a budget then
    # only derives a batch of 0). An override --train.steps=N over a budget writes "steps" (overrides.py).
    horizon: str = "auto"
    micro_batch_size: int = 0  # rows per micro-step per rank; 0: the largest that fits batch_tokens in one go
    val_every: int = 125
    log_every: int = 10
    checkpoint_every: int = 0  # steps between checkpoints; 0: only by time (below) and at the end
    # Minutes of wall-clock time between checkpoints (0: off): bounds what a crash can lose. A
    # SIGTERM/SIGINT saves at the next step boundary anyway (docs/reliability.md).
    checkpoint_every_min: float = 10.0
    save_final_checkpoint: bool = True  # false: no checkpoint at the end (A/B runs that only need their curves)
    # full: rank 0 writes whole tensors (model.pt, optim.pt); dcp: every rank writes its shards with
    # torch.distributed.checkpoint; dcp_async: dcp, written in the background while training goes on
    checkpoint_format: str = "full"
    keep_checkpoints: int = 2  # keep the newest K checkpoints (0: keep all)
    keep_checkpoint_every: int = 0  # also keep every checkpoint whose step is a multiple of M for good (0: none)
    # A non-finite loss or gradient: "abort" (naming step, rank, last good checkpoint), "skip" the
    # step's update, or "rollback" to the newest checkpoint with lrs x rollback_lr_factor.
    on_nonfinite: str = "abort"
    rollback_lr_factor: float = 0.5
    max_rollbacks: int = 3
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float32
    compile: bool = False
    # What train.compile compiles under ddp: "model" (one graph: all gradients arrive at the end of the
    # backward) or "block" (each transformer block on its own: a block's gradient reduction starts while
    # the backward computes the blocks below it). fsdp always compiles per block.
    compile_scope: str = "model"
    # Who compiles the captured graphs: "inductor" (fused kernels: the speed), or "aot_eager" / "eager"
    # (no code generated: fast to start, slow to run; the graph-count tests count graphs with them).
    compile_backend: str = "inductor"
    # torch.compile's mode (Inductor only): "default"; "reduce-overhead" replays each compiled forward and backward
    # as a CUDA graph, one launch where the host otherwise launches hundreds of kernels (speedrun-latest: +0.7 % a
    # step in one bench on two H200s, docs/experiments.md "Wave 15"); "max-autotune" (CUDA graphs too)
    # and "max-autotune-no-cudagraphs" benchmark kernel choices at compile time (a slower compile).
    compile_mode: str = "default"
    # Where compiled code is kept for the next run (train/compile_cache.py): a folder; "" the user's cache
    # ($XDG_CACHE_HOME/speedgpt/compile, ~/.cache when unset); "off": torch's own temporary caches only.
    compile_cache: str = ""
    # Dynamo's traced code kept in the compile cache too (torch's experimental caching precompile): a start
    # that finds it traces nothing (speedrun-latest on a fresh H100 machine: 14.2 s of compile + warmup, wave 18;
    # speedrun-latest's preset sets it; the 4-GPU warm start is owed, docs/experiments.md). Whole-model compile with
    # Inductor and a compile cache only, torch 2.11 or later; elsewhere (fsdp, compile_scope=block, compile off,
    # no cache, flex attention where torch lacks the guard unpickling that precompile_guards.py wraps) the run goes
    # on without it and says so in one line.
    compile_precompile: bool = False
    # The validation graph compiled in a helper process while this one compiles training's
    # (train/validation_ahead.py): "auto" on a cold start of one CUDA process whose GPU has twice the run's
    # memory estimate free (the helper uses host cores the training compile leaves idle, and GPU memory beside the
    # trainer's warmup); "on" wherever a compiled run starts cold (CPU too); "off" compiles it here, after training's.
    compile_validation_ahead: str = "auto"
    # Inductor tunes the launch configs of its generated kernels (norms, pointwise, reductions) by
    # coordinate descent: slower cold compile, faster steps where those kernels matter.
    coordinate_descent_tuning: bool = False
    # Inductor compiles two (1-D) or six (2-D) launch configs of each pointwise kernel and keeps the fastest at its
    # first call; false: its one default config, so a cold start compiles fewer Triton kernels (issue 33's A/B).
    autotune_pointwise: bool = True
    # Inductor keeps rows of up to this many elements in registers for every reduction it can size
    # statically (train/inductor_tuning.py); 0: Inductor's own heuristic.
    persistent_reductions_upto: int = 0
    warmup_steps: int = 0  # compile/kernel warmup steps on real data, then exact state reset
    time_budget_s: float = 0.0  # stop early (with a final eval and checkpoint) after this much training time
    peak_flops: float = 0.0  # bf16 peak for MFU; 0: the device's table value
    # Training stages (speedgpt/stages.py): [[train.stages]] tables in a preset; empty: one stage made
    # of the keys above (today's behaviour).
    stages: list[StageConfig] = field(default_factory=list)


@dataclass
class RunConfig:
    name: str = ""
    dir: str = ""  # empty: runs/<name>-<timestamp>
    sample_tokens: int = 64  # sample printed at the end; 0 disables
    sample_prompt: str = "import"  # no trailing space: GPT-2 attaches a word's space to the next token
    report: bool = True
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "speedgpt"


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    preset: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Config's sections and the dataclass of each: the one table both parsing and rebuilding use.
SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
            "schedule": ScheduleConfig, "train": TrainConfig, "run": RunConfig, "parallel": ParallelConfig}
