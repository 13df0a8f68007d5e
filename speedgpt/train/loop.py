"""The training loop, importable and testable: `train(cfg)` runs a whole job.

One optimizer step = `grad_accum` micro-batches per rank. Hyperparameters that change during
training (lr, Muon momentum and weight decay, attention window) come from pure schedule
functions of the step, so a resumed run recomputes them exactly. The host reads device values
(`.item()`) only on logging, evaluation and checkpoint steps.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..budget import resolve_budget
from ..config import Config, ConfigError, micro_batch_rows, validate
from ..model.build import model_from_config
from ..model.gpt import GPT
from ..optim.build import build_optimizers
from ..optim.schedules import lr_multiplier, muon_momentum, muon_weight_decay
from ..parallel.ddp import clip_grad_norm_
from ..parallel.dist import DistInfo, barrier, init_distributed, mean_over_ranks, teardown
from .. import faults
from ..rundir import RunDir, default_run_dir
from ..rundir.checkpoint import CheckpointSaveError, load_checkpoint
from ..rundir.env import environment_snapshot
from ..rundir.metrics import TIME_BUDGET_EVENT
from ..stages import Stage, resolve_stage_table, stage_micro_batch, stage_plan, windows_at
from .guard import NonFiniteError, NumericsGuard
from .hardware import peak_flops
from .preempt import StopRequest, TrainingStopped


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    train_time_s: float
    val_loss: float | None
    train_losses: list[float] = field(default_factory=list)  # every step's loss (mean over micro-batches)
    val_history: list[tuple[int, float]] = field(default_factory=list)
    # The trained model, on the rank that writes the run (None elsewhere): the CLI samples from it.
    model: GPT | None = field(default=None, repr=False)


def resolve_data_files(cfg: Config, dist_info: DistInfo, log) -> tuple[list[Path], list[Path]]:
    from ..data.shards import find_shards

    d = cfg.data
    if d.train_files:
        train_files = find_shards(d.train_files, "train")
        val_files = find_shards(d.val_files or d.train_files, "val")
        return train_files, val_files
    from ..data.tokenize import ensure_local_python_corpus

    out = d.default_corpus_dir()
    if dist_info.is_main:
        log(f"data: no data.train_files given; using the local Python-source corpus at {out}")
        ensure_local_python_corpus(out, max_tokens=d.local_max_tokens or None)
    barrier()
    return find_shards(out, "train"), find_shards(out, "val")


def compile_blocks(model: GPT, **compile_kwargs) -> None:
    """torch.compile each transformer block in place: each block's backward is then its own autograd
    node, so gradient hooks (and the reductions they start) fire block by block during the backward."""
    for block in model.blocks:
        block.compile(dynamic=False, **compile_kwargs)


def should_resume(resume: bool | str, run_dir: Path) -> bool:
    """`resume` is True, False or "auto": resume when the run directory has a checkpoint. A worker
    that torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0) also resumes when one exists, so
    `torchrun --max-restarts=N ... --run-dir DIR` recovers from a dead worker without a human."""
    if resume is True:
        return True
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    if resume == "auto" or restarted:
        return bool(RunDir(run_dir).list_checkpoints())
    return False


class Trainer:
    def __init__(self, cfg: Config, *, run_dir: Path | None = None, resume: bool | str = False, quiet: bool = False):
        # A budget (tokens per parameter, FLOPs, derived batch, tuned width) becomes numbers once, here;
        # the resolved config is the one saved in the run dir and printed below.
        cfg, budget_lines = resolve_budget(cfg)
        self.dist = init_distributed(cfg.train.device)
        validate(cfg, self.dist.world_size)
        self.cfg = cfg = resolve_stage_table(cfg)  # saved with concrete values, like the budget's
        self.quiet = quiet or not self.dist.is_main
        for line in budget_lines:
            self.log(line)
        self.run_dir = Path(run_dir or cfg.run.dir or default_run_dir(cfg))
        self.rundir = RunDir(self.run_dir)
        self.resume = should_resume(resume, self.run_dir)
        self.guard = NumericsGuard(cfg.train.on_nonfinite, self.dist.device, self.dist.rank, self.dist.world_size)
        self.stop_request = StopRequest()
        self.lr_scale = 1.0  # lowered by each numerics rollback; part of the checkpointed state
        self.rollbacks = 0
        self.device = self.dist.device
        # The run's own micro-batching (validation uses it); a stage table's steps have their own (train_step).
        self.micro_batch, self.grad_accum = micro_batch_rows(cfg, self.dist.world_size)
        self.plan = stage_plan(cfg)
        self.stage: Stage | None = None  # the stage the loop last set up; None: none yet (start, resume, warmup)
        # Called as hook(trainer, previous, stage) when training enters another stage (previous None after
        # the start, a resume or the warmup's reset): a switch that changes the model at a stage boundary
        # (untying the embedding from the head, say) sets itself up for `stage` here, reading its own key
        # of the stage's table row from `stage.row` (None without a table). Hooks must leave
        # the model in a state that depends only on the stage and the state dict, so resume stays exact.
        self.stage_hooks: list = []
        self._flops_per_token: dict[int, float] = {}

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, d = self.cfg, self.cfg.data
        from ..data.capacity import check_capacity
        from ..data.loader import TokenLoader

        self.choose_strategy()  # before anything is allocated: a config that cannot fit fails here

        if self.dist.is_main:
            self.rundir.write_config(cfg)
            self.rundir.write_env(environment_snapshot(self.device))
        barrier()
        self.train_files, self.val_files = resolve_data_files(cfg, self.dist, self.log)
        for stage in self.plan.stages:
            rows, accum = stage_micro_batch(cfg, stage, self.dist.world_size)
            check_capacity(self.train_files, seq_len=stage.seq_len, batch_size=rows,
                           world_size=self.dist.world_size, grad_accum=accum, lenient=d.on_bad_shard == "skip")
        self.val_tokens = self.usable_val_tokens()
        self.loader = TokenLoader(self.train_files, seq_len=d.seq_len, batch_size=self.micro_batch,
                                  rank=self.dist.rank, world_size=self.dist.world_size, device=self.device,
                                  seed=cfg.train.seed, packing=d.packing, grad_accum=self.grad_accum,
                                  on_bad_shard=d.on_bad_shard, vocab_size=cfg.model.vocab_size)
        # Stop and save decisions travel on a CPU (gloo) group: combining them every step costs no
        # device sync, and all ranks stop or save at the same step.
        self.control_group = (torch.distributed.new_group(backend="gloo") if self.dist.world_size > 1 else None)
        # The windows of the finished model are its default (sampling, FLOP counts); training and
        # validation pass each step's own windows to the forward.
        if self.strategy == "fsdp":
            from ..parallel.dist import ensure_process_group
            from ..parallel.fsdp import build_fsdp_model

            ensure_process_group(self.device)
            self.model: GPT = build_fsdp_model(cfg, self.device, self.dist.world_size,
                                               compile_blocks=cfg.train.compile)
        else:
            self.model = model_from_config(cfg, self.device, world_size=self.dist.world_size)
        rt = self.model.runtime
        block = rt.window_block
        lengths = [("data.seq_len", d.seq_len), ("data.val_seq_len", d.val_seq_len)]
        lengths += [(f"train.stages[{s.index}].seq_len", s.seq_len) for s in self.plan.stages if self.plan.from_table]
        for key, length in lengths:
            if rt.attn_backend == "flex" and length % block:
                raise ConfigError(f"{key}={length} must be a multiple of schedule.window_block={block} for "
                                  f"FlexAttention; use {max(block, length // block * block)} or "
                                  f"--model.attn_backend=sdpa")
        self.log_fallbacks()
        self.optimizers = build_optimizers(self.model, cfg.optim, self.device, strategy=self.strategy)
        self.grad_sync = self.optimizers.grad_sync  # overlapped gradient reduction (no-op on one rank)
        self.has_experts = bool(cfg.model.moe_experts)
        if self.has_experts:  # aux-loss-free balancing: expert biases move after each optimizer step
            from ..model.moe import balance_experts

            rate = cfg.model.moe_bias_rate
            self.optimizers.adam.register_step_post_hook(lambda *_: balance_experts(self.model, rate))
        self.forward = self.compiled_forward()
        self._window_tensors: dict[tuple[int, int], torch.Tensor] = {}
        self._mtp_tensors = self.mtp_weight_tensors()
        self.yarn = None  # model.yarn: the rotary state of every step (model/yarn.py), as device tensors per state
        if cfg.model.yarn:
            from ..model.yarn import YarnSchedule

            self.yarn, self._yarn_tensors = YarnSchedule.from_config(cfg), {}
        self.step = 0
        self.tokens = 0
        self.train_time = 0.0
        self.last_save_time = time.monotonic()
        self.metrics = self.rundir.metrics_logger(tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb,
                                     wandb_project=cfg.run.wandb_project, run_name=cfg.run.name or None,
                                     config=cfg.to_dict(), enabled=self.dist.is_main)
        self.peak = peak_flops(self.device, cfg.train.peak_flops)
        n = self.model.num_params()
        self.log(f"model: {n / 1e6:.1f}M parameters ({self.model.num_params(False) / 1e6:.1f}M non-embedding), "
                 f"depth {cfg.model.depth}, width {cfg.model.resolved_dim()}, attention {rt.attn_backend}, "
                 f"device {self.device}, dtype {rt.dtype}, strategy {self.strategy}")
        if self.has_experts:
            self.log(f"experts: {self.model.active_params() / 1e6:.1f}M parameters active per token "
                     f"(MFU counts these)")
        if self.plan.from_table:
            for line in self.plan.describe(cfg, self.dist.world_size):
                self.log(line)
            self.metrics.log({"event": "stages", "step": self.step, "stages": self.plan.as_records()})
        else:
            self.log(f"batch: {cfg.train.batch_tokens} tokens/step = {self.dist.world_size} rank(s) x "
                     f"{self.grad_accum} micro-step(s) x {self.micro_batch} row(s) x {d.seq_len} tokens")
        if self.resume:
            self.load_latest()
        elif cfg.train.on_nonfinite == "rollback":
            self.save()  # step 0: something to roll back to before the first periodic checkpoint

    def choose_strategy(self) -> None:
        """parallel.strategy resolved ("auto": ddp if its estimate fits the device, else fsdp), with
        the memory estimate printed; raises ConfigError naming the knobs when it cannot fit."""
        from ..device import resolve_dtype
        from ..parallel.memory import choose_strategy

        dtype_bytes = resolve_dtype(self.cfg.train.dtype, self.device).itemsize
        self.strategy, est = choose_strategy(self.cfg, self.dist.world_size, self.device, dtype_bytes=dtype_bytes)
        self.memory_estimate = est
        self.log(f"memory: {est.describe()}")

    def log_fallbacks(self) -> None:
        """A switch that cannot take effect here says what runs instead: the model's own dtype."""
        cfg, rt = self.cfg, self.model.runtime
        where = self.device.type if self.device.type != "cuda" else "this GPU"
        dtype = str(rt.dtype).removeprefix("torch.")
        if cfg.model.fp8_head and not rt.fp8_head:
            self.log(f"fp8 head: not supported on {where} (needs CUDA capability >= 8.9); "
                     f"the head runs in {dtype} like the rest of the model")
        if cfg.model.fp8_mlp and not any(b.mlp.fp8_scaling for b in self.model.blocks):
            self.log(f"fp8 mlp: not supported on {where} (needs CUDA capability >= 8.9 and MLP widths that are "
                     f"multiples of 16); the MLP runs in {dtype} like the rest of the model")
        if cfg.model.fp8_attn and not any(b.attn is not None and b.attn.fp8_scaling for b in self.model.blocks):
            self.log(f"fp8 attn: not supported on {where} (needs CUDA capability >= 8.9 and attention widths that "
                     f"are multiples of 16); the attention projections run in {dtype} like the rest of the model")
        if cfg.model.fused_ce and not rt.fused_ce:
            self.log(f"fused ce: not supported on {where} (needs CUDA and Triton); the loss runs as PyTorch ops "
                     f"in float32")

    def compiled_forward(self):
        """The model under torch.compile (with this run's Inductor settings), or the model itself."""
        cfg = self.cfg
        if cfg.train.compile:
            import torch._inductor.config as inductor_config

            inductor_config.coordinate_descent_tuning = cfg.train.coordinate_descent_tuning
            from .inductor_tuning import persistent_reductions_upto

            note = persistent_reductions_upto(cfg.train.persistent_reductions_upto)
            if note:
                self.log(note)
        if not cfg.train.compile or self.strategy == "fsdp":  # fsdp: compiled block by block (build_fsdp_model)
            return self.model
        if cfg.train.compile_scope == "block":  # reductions then start inside the backward
            compile_blocks(self.model)
            return self.model
        return torch.compile(self.model, dynamic=False)

    def usable_val_tokens(self) -> int:
        """data.val_tokens, rounded down to whole evaluation steps and capped by the val shards' size."""
        from ..data.shards import read_header

        d = self.cfg.data
        step = (d.val_seq_len or d.seq_len) * self.micro_batch * self.dist.world_size
        available = sum(read_header(f) for f in self.val_files) - 1
        tokens = min(d.val_tokens, available) // step * step
        if tokens <= 0:
            raise ValueError(f"the validation shards hold {available + 1:,} tokens, less than one evaluation step of "
                             f"{step:,}; add validation data or lower data.seq_len / data.val_seq_len")
        if tokens != d.val_tokens:
            self.log(f"validation: scoring {tokens:,} tokens (data.val_tokens={d.val_tokens:,}, "
                     f"val shards hold {available + 1:,}, steps of {step:,})")
        return tokens

    # ------------------------------------------------------------------------------------------
    def mtp_weight_tensors(self) -> list[torch.Tensor | None]:
        """Every step's multi-token-prediction weights as its own device tensor, made once before
        training (None for steps that predict the next token only): no host-to-device copy, and so
        no sync, inside the timed steps."""
        if not self.plan.has_mtp:
            return []
        out: list[torch.Tensor | None] = []
        for stage in self.plan.stages:
            if stage.predicts == 1:
                out += [None] * stage.steps
                continue
            table = torch.tensor([stage.mtp_weights_at(step) for step in range(stage.start, stage.end)],
                                 dtype=torch.float32, device=self.device)
            out += [row.clone() for row in table]  # separate tensors: a compiled graph sees the same layout each step
        return out

    def enter_stage(self, step: int) -> Stage:
        """The stage of `step`, set up (loader micro-batching, stage hooks) when it is not the current one."""
        stage = self.plan.stage_at(step)
        if stage is not self.stage:
            previous, self.stage = self.stage, stage
            _, accum = stage_micro_batch(self.cfg, stage, self.dist.world_size)
            self.loader.set_grad_accum(accum)
            for hook in self.stage_hooks:
                hook(self, previous, stage)
        return stage

    def set_hyperparameters(self, step: int):
        cfg = self.cfg
        # A stage's lr_mul scales the schedule (x 1.0 exactly without a stage table)
        mult = lr_multiplier(cfg.schedule, step, cfg.train.steps) * self.plan.stage_at(step).lr_mul
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * mult
        o = cfg.optim
        momentum = muon_momentum(step, o.muon_momentum_start, o.muon_momentum, o.muon_momentum_warmup_steps)
        weight_decay = muon_weight_decay(o.muon_weight_decay, o.wd_schedule, mult, step / cfg.train.steps)
        for group in self.optimizers.muon.param_groups if self.optimizers.muon is not None else []:
            group["momentum"] = momentum
            group["weight_decay"] = weight_decay
        return self.windows_at(step)

    def windows_at(self, step: int):
        """The attention windows of `step` in the form the forward takes: the schedule's (long, short)
        tokens; under compile a device tensor. Training step k and the validation after k steps both
        use them, so validation scores the model with the windows it is trained at (as record #28)."""
        cfg = self.cfg
        windows = windows_at(cfg, step, self.plan)
        if not cfg.train.compile:
            return windows
        # A compiled graph specializes on Python ints: windows enter as device tensors so the growing
        # window schedule does not recompile. Cached, so each distinct value is copied to the device once.
        if windows not in self._window_tensors:
            self._window_tensors[windows] = torch.tensor(windows, dtype=torch.int32, device=self.device)
        return self._window_tensors[windows]

    def rope_at(self, step: int):
        """YaRN's (frequencies, attention-scale multiplier) of `step` as device tensors (so the compiled
        model does not recompile as they change), each state copied to the device once; None without YaRN."""
        if self.yarn is None:
            return None
        key = self.yarn.index(step)
        if key not in self._yarn_tensors:
            self._yarn_tensors[key] = self.yarn.tensors(step, self.device)
        return self._yarn_tensors[key]

    def train_step(self, step: int) -> torch.Tensor:
        rank = self.dist.rank
        if faults.fires("exit", step, rank):
            os._exit(1)  # a crashed worker (fault suite)
        if faults.fires("sigterm", step, rank):
            os.kill(os.getpid(), signal.SIGTERM)
        stage = self.enter_stage(step)
        rows, grad_accum = stage_micro_batch(self.cfg, stage, self.dist.world_size)
        mtp_weights = self._mtp_tensors[step] if self._mtp_tensors else None
        windows = self.set_hyperparameters(step)
        rope = self.rope_at(step)
        self.model.sync_embed_tying(step, self.cfg.train.steps, self.optimizers)  # model.tie_embed_frac's untie step
        if self.lr_scale != 1.0:
            for opt in self.optimizers:
                for group in opt.param_groups:
                    group["lr"] *= self.lr_scale
        total = torch.zeros((), device=self.device)
        self.grad_sync.timing = (step + 1) % self.cfg.train.log_every == 0  # comm_wait_ms on logging steps
        for i in range(grad_accum):
            inputs, targets = self.loader.next_batch(rows, stage.seq_len, stage.max_doc_len)
            if mtp_weights is None:
                loss = self.forward(inputs, targets, windows=windows, rope=rope) / grad_accum
            else:
                loss = self.forward(inputs, targets, windows=windows, rope=rope, mtp_weights=mtp_weights) / grad_accum
            if i == 0 and faults.fires("nan", step, rank):
                loss = loss * float("nan")
            self.grad_sync.prepare(final=i == grad_accum - 1)  # only the last backward communicates
            loss.backward()
            total += loss.detach()
        norm = None
        if self.cfg.optim.grad_clip:
            norm = clip_grad_norm_(self.optimizers, self.cfg.optim.grad_clip)  # works on sharded, reduced grads
            if self.strategy == "fsdp":  # a replicated DTensor: the same global norm on every rank
                norm = norm.full_tensor()
        skip = self.guard.mode == "skip"
        bad = self.guard.observe(step, total, norm, self.optimizers if skip else None)
        if skip:
            self.guard.masked_step(self.optimizers, bad, step)
        else:
            self.optimizers.step(step)
        self.model.zero_grad(set_to_none=True)
        return total

    @torch.no_grad()
    def evaluate(self, step: int | None = None) -> float:
        """Mean validation loss of the model after `step` training steps (default: the current one),
        at that step's attention windows."""
        from ..data.val import val_batches

        d = self.cfg.data
        seq = d.val_seq_len or d.seq_len
        windows = self.windows_at(self.step if step is None else step)
        rope = self.rope_at(self.step if step is None else step)
        self.model.eval()
        losses = []
        for inputs, targets in val_batches(self.val_files, seq_len=seq, batch_size=self.micro_batch,
                                           max_tokens=self.val_tokens, rank=self.dist.rank,
                                           world_size=self.dist.world_size, device=self.device):
            losses.append(self.forward(inputs, targets, windows=windows, rope=rope))
        self.model.train()
        loss = torch.stack(losses).mean()
        if self.dist.world_size > 1:
            torch.distributed.all_reduce(loss)  # SUM, then divide: gloo has no AVG
            loss /= self.dist.world_size
        return loss.item()

    # ------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"tokens": self.tokens, "train_time_s": self.train_time, "loader": self.loader.state_dict(),
                "rng_cpu": torch.get_rng_state().tolist(), "lr_scale": self.lr_scale}

    def save(self, final: bool = False) -> Path | None:
        """Write a checkpoint (rank 0; every rank with train.checkpoint_format=dcp). A failed write keeps
        the previous checkpoints and is reported; training goes on, except for the final save (`final`),
        whose failure is an error."""
        if self.cfg.train.checkpoint_format != "full":
            return self.save_dcp()
        path, error = None, None
        optim_states = self.optimizers.state_dict()  # sharded: a collective, all ranks
        model_state = self.full_model_state()  # fsdp: a collective too
        if self.dist.is_main:
            t = self.cfg.train
            try:
                path = self.rundir.save_checkpoint(self.step, model_state, optim_states, self.state(),
                                                   keep=t.keep_checkpoints, keep_every=t.keep_checkpoint_every)
            except CheckpointSaveError as e:
                error = e
                print(f"warning: {e}" + ("" if final else "; training continues"), flush=True)
                self.metrics.log({"event": "checkpoint_failed", "step": self.step, "error": str(e)})
        self.last_save_time = time.monotonic()
        barrier()
        if error is not None and final:
            raise error
        return path

    def save_dcp(self) -> Path | None:
        """Every rank writes its shards (rundir/dcp.py); with dcp_async in the background, published
        at the next save or at the end of the run."""
        from ..rundir import dcp

        self.finish_checkpoint()
        background = self.cfg.train.checkpoint_format == "dcp_async"
        self.pending_checkpoint = dcp.save(self.rundir.checkpoints, self.step,
                                           dcp.flat_state(self.model, self.optimizers), self.state(),
                                           is_main=self.dist.is_main, keep=self.cfg.train.keep_checkpoints,
                                           keep_every=self.cfg.train.keep_checkpoint_every, background=background)
        self.last_save_time = time.monotonic()
        return None if background else self.finish_checkpoint()

    def finish_checkpoint(self) -> Path | None:
        """Wait for a checkpoint being written in the background and publish it (every rank)."""
        pending, self.pending_checkpoint = getattr(self, "pending_checkpoint", None), None
        return pending.finish() if pending is not None else None

    def full_model_state(self) -> dict:
        """The model's weights, whole (the same checkpoint format for every strategy and world size).
        Under fsdp a collective: the shards are gathered, onto rank 0 only and into CPU memory."""
        if self.strategy != "fsdp":
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_model_state(self, state: dict) -> None:
        if self.strategy != "fsdp":
            self.model.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))

    def load_latest(self) -> None:
        from ..rundir import dcp

        self.finish_checkpoint()  # a checkpoint still being written in the background (a rollback)
        path = self.rundir.latest_checkpoint()
        if dcp.is_dcp_checkpoint(path):  # written by any number of ranks, under any strategy
            state = dcp.load_into(path, self.model, self.optimizers)
        else:
            model_state, optim_states, state = load_checkpoint(path, map_location=self.device)
            self.load_model_state(model_state)
            self.optimizers.load_state_dict(optim_states)
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(torch.tensor(state["rng_cpu"], dtype=torch.uint8))
        self.step, self.tokens, self.train_time = state["step"], state["tokens"], state["train_time_s"]
        self.lr_scale = state.get("lr_scale", 1.0)
        self.stage = None  # set up again from the resumed step
        self.guard.reset()
        self.log(f"resumed from {path} at step {self.step} ({self.tokens:,} tokens)")
        self.metrics.log({"event": "resume", "step": self.step, "tokens": self.tokens, "time_s": self.train_time})

    def warmup_then_reset(self) -> float:
        """Compile and autotune on real steps, then restore the exact initial state: the measured run
        starts cold in its numbers but warm in its kernels."""
        n = self.cfg.train.warmup_steps
        if n <= 0:
            return 0.0
        t0 = time.perf_counter()
        model_state = copy.deepcopy(self.model.state_dict())
        optim_states = copy.deepcopy(self.optimizers.state_dict())
        loader_state = self.loader.state_dict()
        for step in self.warmup_schedule():
            self.train_step(step)
        self.evaluate()
        self.model.load_state_dict(model_state)
        self.optimizers.load_state_dict(optim_states)
        self.loader.load_state_dict(loader_state)
        self.stage = None  # the run sets up its first stage again (hooks included)
        self.guard.reset()  # what the warmup steps saw is not the run's
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def flops_per_token(self, seq_len: int) -> float:
        """The model's training FLOPs per token at a row length (cached: a stage table has a few)."""
        if seq_len not in self._flops_per_token:
            self._flops_per_token[seq_len] = self.model.flops_per_token(seq_len)
        return self._flops_per_token[seq_len]

    def warmup_schedule(self) -> list[int]:
        """The steps the warmup trains: train.warmup_steps spread over the run, so every window size the
        run will use gets compiled, plus the first step of every later stage (its batch, row length and
        MTP weight count are new shapes), and model.tie_embed_frac's untie step (the untied model is
        another graph; the spread misses it when the untie comes late), in order."""
        from ..model.embeddings import EmbedTying

        n, total = self.cfg.train.warmup_steps, self.cfg.train.steps
        spread = [min(total - 1, (i * total) // n) for i in range(n)]
        extra = {stage.start for stage in self.plan.stages} if self.plan.from_table else set()
        if n and self.cfg.model.tie_embed_frac:
            untie = EmbedTying(self.cfg.model.tie_embed_frac).untie_step(total, self.cfg.optim.adam_every)
            extra |= {untie} if untie < total else set()
        if not extra:
            return spread
        return sorted(set(spread) | extra)

    # ------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        self.setup()
        with self.stop_request:
            return self._run()

    def _run(self) -> TrainResult:
        t = self.cfg.train
        warm_s = self.warmup_then_reset()
        if warm_s:
            self.log(f"compile + warmup: {warm_s:.1f}s (not counted in training time)")
            self.metrics.log({"event": "warmup", "step": self.step, "tokens": self.tokens, "time_s": 0.0,
                              "warmup_s": warm_s})
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        result = TrainResult(self.run_dir, self.step, self.tokens, self.train_time, None)
        if self.step == 0 and t.val_every:
            self.record_validation(result)  # the starting point of the curves
        last_log_time, last_log_step, last_log_tokens = self.train_time, self.step, self.tokens
        t_start = time.perf_counter() - self.train_time
        first_step = self.step  # result.train_losses[i] is step first_step + i
        stop = False
        while self.step < t.steps and not stop:
            self.stop_request.step = self.step
            loss = self.train_step(self.step)
            self.tokens += self.stage.batch_tokens
            self.step += 1
            self.stop_request.step = self.step  # a signal from here on arrives before the next step
            self.train_time = time.perf_counter() - t_start
            result.train_losses.append(loss)
            if t.time_budget_s and self.budget_spent():
                self.log(f"time budget of {t.time_budget_s}s reached at step {self.step}")
                # A finished run with fewer steps than configured (rundir/metrics.py ended_by).
                self.metrics.log({"event": TIME_BUDGET_EVENT, "step": self.step, "tokens": self.tokens,
                                  "time_s": self.train_time, "budget_s": t.time_budget_s})
                stop = True
            signalled, save_due = self.step_control()
            last = self.step == t.steps or stop or signalled
            log_step = self.step % t.log_every == 0 or last
            ckpt_step = ((t.checkpoint_every and self.step % t.checkpoint_every == 0) or save_due
                         or (last and t.save_final_checkpoint))
            if (log_step or ckpt_step) and self.guard.mode != "skip":
                # A host read that these steps pay for anyway: act on a NaN before it is logged or saved.
                rolled_back = self.check_numerics()
                if rolled_back:
                    del result.train_losses[self.step - first_step:]
                    t_start = time.perf_counter() - self.train_time
                    last_log_time, last_log_step, last_log_tokens = self.train_time, self.step, self.tokens
                    continue
            if signalled:
                self.sync_device()
                path = self.save(final=True)
                self.metrics.log({"event": "stopped", "step": self.step, "tokens": self.tokens,
                                  "time_s": self.train_time, "signal": self.stop_request.signum})
                self.metrics.close()
                raise TrainingStopped(self.stop_request.signum, self.step, path, self.run_dir,
                                      self.stop_request.signal_step)
            if log_step:
                self.sync_device()
                self.train_time = time.perf_counter() - t_start
                n = max(1, self.step - last_log_step)
                dt = (self.train_time - last_log_time) / n
                tokens_per_step = (self.tokens - last_log_tokens) / n  # a stage boundary can lie in between
                last_log_time, last_log_step, last_log_tokens = self.train_time, self.step, self.tokens
                # The mean over the steps since the last log (over the global batch): a smoother curve
                # than one step's loss, for the same single host sync.
                window = self.window_mean(torch.stack(result.train_losses[-n:]))
                self.log_train(window.item(), dt, tokens_per_step, self.flops_per_token(self.stage.seq_len))
            if (t.val_every and self.step % t.val_every == 0) or last:
                self.sync_device()  # queued training kernels count as training, not as evaluation
                # ...and so in the val record's time_s, which equal-time comparisons read (a step that
                # is not a logging step last set train_time before its kernels had finished).
                self.train_time = time.perf_counter() - t_start
                t_eval = time.perf_counter()
                self.record_validation(result)
                t_start += time.perf_counter() - t_eval  # evaluation is not training time
            if ckpt_step:
                self.sync_device()
                t_ckpt = time.perf_counter()
                self.save(final=last)
                t_start += time.perf_counter() - t_ckpt
        result.steps, result.tokens, result.train_time_s = self.step, self.tokens, self.train_time
        if result.train_losses:  # one collective at the end: every step's loss over the global batch
            result.train_losses = mean_over_ranks(torch.stack(result.train_losses)).tolist()
        result.val_loss = result.val_history[-1][1] if result.val_history else None
        self.finish(result)
        return result

    def step_control(self) -> tuple[bool, bool]:
        """(stop on a signal, time-based checkpoint due) after a step, the same on every rank: the
        flags are combined on the CPU group (any rank's signal stops all; rank 0's clock decides
        the save), so this costs no device sync."""
        signalled = bool(self.stop_request.signum)
        minutes = self.cfg.train.checkpoint_every_min
        due = bool(minutes) and self.dist.is_main and time.monotonic() - self.last_save_time >= minutes * 60
        if self.dist.world_size == 1:
            return signalled, due
        flags = torch.tensor([float(signalled), float(due)])
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self.control_group)
        if flags[0] and not self.stop_request.signum:
            self.stop_request.signum = signal.SIGTERM  # another rank was signalled
        return bool(flags[0]), bool(flags[1])

    def check_numerics(self) -> bool:
        """Act on a non-finite loss or gradient seen since the last check: raise (abort), or roll
        back to the newest checkpoint with a lower lr and return True. False: all finite."""
        bad = self.guard.first_bad_by_rank()
        if not bad:
            return False
        rank, step = min(bad.items(), key=lambda kv: (kv[1], kv[0]))
        found = self.rundir.list_checkpoints()
        good = found[-1] if found else None
        t = self.cfg.train
        what = f"non-finite loss or gradient at step {step + 1} (rank {rank})"
        if t.on_nonfinite == "rollback" and good is not None and self.rollbacks < t.max_rollbacks:
            self.rollbacks += 1
            self.load_latest()
            self.lr_scale *= t.rollback_lr_factor
            self.log(f"{what}: rolled back to {good} (step {self.step}); learning rates x{self.lr_scale:g} "
                     f"from here (rollback {self.rollbacks} of at most {t.max_rollbacks})")
            self.metrics.log({"event": "rollback", "step": self.step, "bad_step": step + 1, "rank": rank,
                              "lr_scale": self.lr_scale})
            return True
        if t.on_nonfinite == "rollback":
            why = "no checkpoint to roll back to" if good is None else f"{self.rollbacks} rollbacks used up"
            what += f" ({why})"
        last = f"the last good checkpoint is {good}" if good else "no checkpoint was written"
        self.metrics.close()
        raise NonFiniteError(f"{what}; {last}. Lower the learning rates (e.g. --optim.muon_lr), enable "
                             f"--optim.grad_clip=1.0, or set --train.on_nonfinite=skip|rollback")

    def sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def budget_spent(self) -> bool:
        """Whether train.time_budget_s is used up. Every rank must stop at the same step (or their
        collectives would no longer match), so on several ranks rank 0's clock decides, read on
        logging steps only: that keeps the broadcast, a host sync, off the other steps."""
        if self.dist.world_size == 1:
            return self.train_time >= self.cfg.train.time_budget_s
        if self.step % self.cfg.train.log_every:
            return False
        flag = torch.tensor([float(self.train_time >= self.cfg.train.time_budget_s)], device=self.device)
        torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())

    def record_validation(self, result: TrainResult) -> None:
        val = self.evaluate()
        result.val_history.append((self.step, val))
        self.metrics.log({"step": self.step, "tokens": self.tokens, "time_s": self.train_time, "val_loss": val})
        self.log(f"step {self.step}/{self.cfg.train.steps} | val loss {val:.4f}")

    def window_mean(self, losses: torch.Tensor) -> torch.Tensor:
        """Mean loss of the steps since the last log over the global batch; skipped (non-finite)
        steps are left out, and counted in the record instead."""
        if self.guard.mode != "skip":
            return mean_over_ranks(losses.mean())
        finite = torch.isfinite(losses)
        return mean_over_ranks(torch.where(finite, losses, 0.0).sum() / finite.sum().clamp(min=1))

    def log_train(self, loss: float, step_s: float, tokens_per_step: int, flops_per_token: float) -> None:
        t = self.cfg.train
        tok_s = tokens_per_step / step_s if step_s > 0 else 0.0
        extra = ""
        record = {"step": self.step, "tokens": self.tokens, "time_s": round(self.train_time, 3),
                  "train_loss": loss, "lr": (self.optimizers.muon or self.optimizers.adam).param_groups[0]["lr"],
                  "tok_per_s": round(tok_s, 1), "step_ms": round(step_s * 1e3, 2),
                  "cropped_share": round(self.loader.cropped_share, 5)}  # of the data read, share never trained
        if self.has_experts:  # per MoE layer: the busiest expert's load over the mean since the last log
            from ..model.moe import expert_load_report

            record["moe_max_load"] = expert_load_report(self.model)
        skipped = int(self.guard.skipped.item()) if self.guard.mode == "skip" else 0
        if skipped:
            record["skipped_steps"] = skipped
            extra += f" | {skipped} step(s) skipped (non-finite)"
        if self.loader.skipped_shards:
            record["bad_shards"] = len(self.loader.skipped_shards)
            extra += f" | {record['bad_shards']} bad shard(s) skipped"
        wait_ms = self.grad_sync.comm_wait_ms()  # exposed communication of this (logging) step
        if wait_ms is not None:
            record["comm_wait_ms"] = round(wait_ms, 3)
        if self.device.type == "cuda":
            record["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
            extra += f" | mem {record['peak_mem_gib']:.1f} GiB"
        if self.peak:
            record["mfu"] = round(tok_s * flops_per_token / (self.peak * self.dist.world_size), 4)
            extra += f" | MFU {record['mfu'] * 100:.1f}%"
        self.metrics.log(record)
        remaining = (t.steps - self.step) * step_s
        self.log(f"step {self.step}/{t.steps} | loss {loss:.4f} | {tok_s:,.0f} tok/s | {step_s * 1e3:.0f} ms/step"
                 f"{extra} | {self.train_time:.0f}s elapsed, ~{remaining:.0f}s left")

    def finish(self, result: TrainResult) -> None:
        self.finish_checkpoint()
        self.metrics.close()
        if self.strategy == "fsdp":  # sampling runs on rank 0 alone: it gets an unsharded copy
            state = self.full_model_state()
            if self.dist.is_main:
                result.model = model_from_config(self.cfg, self.device, world_size=self.dist.world_size)
                result.model.load_state_dict(state)
        elif self.dist.is_main:
            result.model = self.model
        self.log(f"done: {result.steps} steps, {result.tokens:,} tokens in {result.train_time_s:.1f}s; "
                 f"run dir {self.run_dir}")


def train(cfg: Config, *, run_dir: Path | str | None = None, resume: bool | str = False,
          quiet: bool = False) -> TrainResult:
    try:
        return Trainer(cfg, run_dir=Path(run_dir) if run_dir else None, resume=resume, quiet=quiet).run()
    finally:
        teardown()  # also after an error: a crashed rank must not leave the process group behind
