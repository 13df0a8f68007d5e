"""The training loop, importable and testable: `train(cfg)` runs a whole job.

One optimizer step = `grad_accum` micro-batches per rank. Hyperparameters that change during
training (lr, Muon momentum and weight decay, attention window) come from pure schedule
functions of the step (step_schedule.py), so a resumed run recomputes them exactly. The host
reads device values (`.item()`) only on logging, evaluation and checkpoint steps.

The parts the loop drives live next to it: build.py (data, loader, strategy, model), compile.py,
warmup.py (which steps the compile warmup trains, and the reset after it), validation.py,
checkpointing.py, control.py (signal, clock and budget decisions shared by all ranks),
nonfinite.py (rollback or abort), progress.py (training time and the logged records) and start_checks.py
(what the config asks of this machine, refused before anything is built).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import faults
from ..config import Config, check_cudagraph_strategy
from ..model.build import model_from_config
from ..model.gpt import GPT
from ..optim.build import build_optimizers
from ..parallel.ddp import clip_grad_norm_
from ..parallel.dist import barrier, from_rank0, grad_comm_dtype, init_distributed, mean_over_ranks, teardown
from ..plan import RunPlan
from ..planner import plan_run
from ..rundir import RunDir, default_run_dir, with_run_dir
from ..rundir.checkpoint import CheckpointError
from ..rundir.env import environment_snapshot, record_resume
from ..rundir.metrics import TIME_BUDGET_EVENT
from ..stages import Stage
from .build import (build_model, check_data_capacity, check_row_lengths, choose_strategy, data_epoch_lines,
                    describe_run, document_sample, fallback_notes, mix_preview, resolve_data_files, train_loader)
from .checkpointing import Checkpointer, should_resume
from .compile import compiled_forward, grads_out_of_cudagraph_pool, open_compile_cache, uses_cudagraphs
from .compile_watch import AFTER_WARMUP, VALIDATION_AFTER_WARMUP, CompileWatch
from .control import RunControl
from .guard import NonFiniteError, NumericsGuard
from .hardware import peak_flops
from .nonfinite import Rollbacks
from .preempt import StoppedMidStep, StopRequest, TrainingStopped
from .progress import ProgressLog, TrainClock
from .resume import check_resume
from .start_checks import check_on_this_machine
from .step_schedule import StepInputs, apply_hyperparameters
from .tokenizer import adopt_shards_tokenizer, check_sample_prompt, check_same_tokenizer, keep_in_run, log_compression
from .validation import Validator
from .validation_ahead import ValidationAhead, room_for_a_helper
from .validation_ahead import why_not as why_not_ahead
from .warmup import restored_afterwards, warmup_steps


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


class Trainer:
    def __init__(self, cfg: Config, *, run_dir: Path | None = None, resume: bool | str = False, quiet: bool = False,
                 extend: bool = False):
        # The shards' tokenizer sets the vocabulary and BOS id; the run's plan (plan.py) is resolved
        # once, here: a budget (tokens per parameter, FLOPs, derived batch, tuned width) becomes numbers,
        # the stage table concrete values; the resolved config is the one saved in the run dir, and
        # the plan is printed below and saved beside it (plan.json).
        cfg, self.tokenizer, tokenizer_lines = adopt_shards_tokenizer(cfg)
        run_dir = run_dir or cfg.run.dir or default_run_dir(cfg)  # (a bad run.name fails before the group exists)
        self.dist = init_distributed(cfg.train.device)
        # Every rank writes where rank 0 does: each rank named the default runs/<name>-<time> by its own clock (two
        # ranks a second apart wrote their shards, DCP files and records into two folders), and rank 0's is the one
        # `speedgpt train` locked and checked (commands/train.py runs those checks on rank 0 only).
        self.run_dir = Path(from_rank0(str(run_dir)))
        cfg = with_run_dir(cfg, self.run_dir)  # what config.toml and the checkpoints record
        check_on_this_machine(cfg, self.dist.device)  # before anything is read, built or written
        self.plan: RunPlan = plan_run(cfg, self.dist.world_size)
        self.cfg = cfg = self.plan.cfg
        check_sample_prompt(cfg, self.tokenizer)
        self.quiet = quiet or not self.dist.is_main
        for line in tokenizer_lines + list(self.plan.budget_lines):
            self.log(line)
        self.rundir = RunDir(self.run_dir)
        self.resume = should_resume(resume, self.run_dir)
        self.resume_changes: list[str] = []  # what --extend accepted, for env.json's entry of this resume
        if self.resume:  # a finished run, or a schedule changed without `extend`: stop before anything is built
            check_same_tokenizer(self.tokenizer, self.run_dir)
            self.resume_changes = check_resume(cfg, self.run_dir, extend=extend)
        self.guard = NumericsGuard(cfg.train.on_nonfinite, self.dist.device, self.dist.rank, self.dist.world_size)
        self.rollbacks = Rollbacks(cfg.train)  # and the lr scale they left, part of the checkpointed state
        self.stop_request = StopRequest()
        self.device = self.dist.device
        # The run's own micro-batching (validation uses it); a stage table's steps have their own (train_step).
        self.micro_batch, self.grad_accum = self.plan.micro_batch, self.plan.grad_accum
        self.cudagraphs = uses_cudagraphs(cfg)  # train.compile_mode: the first backward's gradients are copied out
        self.stage: Stage | None = None  # the stage the loop last set up; None: none yet (start, resume, warmup)
        self.stage_batch: tuple[int, int] = (self.micro_batch, self.grad_accum)  # self.stage's (enter_stage)
        # Called as hook(trainer, previous, stage) when training enters another stage (previous None after
        # the start, a resume or the warmup's reset): a switch that changes the model at a stage boundary
        # (untying the embedding from the head, say) sets itself up for `stage` here, reading its own key
        # of the stage's table row from `stage.row` (None without a table). Hooks must leave
        # the model in a state that depends only on the stage and the state dict, so resume stays exact.
        self.stage_hooks: list = []
        self.validation_ahead: ValidationAhead | None = None  # the validation graph's compile helper (setup)
        self.validation_ahead_note: str | None = None  # what came of the helper (its log line; bench prints it)

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, d, dist = self.cfg, self.cfg.data, self.dist
        # Before anything is allocated: a config that cannot fit fails here.
        self.strategy, self.memory_estimate = choose_strategy(cfg, dist.world_size, self.device, self.log)
        check_cudagraph_strategy(cfg.train, self.strategy, chosen=cfg.parallel.strategy == "auto")
        self.train_files, self.val_files = resolve_data_files(cfg, dist, self.log)
        self.crop_coverage = check_data_capacity(cfg, self.plan, self.train_files)
        self.validator = Validator(d, self.val_files, self.micro_batch, dist, self.log, vocab_size=cfg.model.vocab_size)
        # Only once the data is there: a run refused for its data must not leave a run directory
        # behind, which would refuse the corrected command as "already holds a run". A resume writes
        # them once its checkpoint has loaded (load_latest): a refused resume leaves the run as it was.
        if dist.is_main and not self.resume:
            self.rundir.write_config(cfg)
            self.rundir.write_plan(self.plan.as_dict())
            keep_in_run(self.tokenizer, self.run_dir)
            self.rundir.write_env(environment_snapshot(self.device))
        barrier()
        self.loader = train_loader(cfg, self.train_files, dist, self.micro_batch, self.grad_accum)
        self.control = RunControl(cfg.train, dist, self.stop_request)
        self.model: GPT = build_model(cfg, self.device, dist.world_size, self.strategy)
        check_row_lengths(cfg, self.plan, self.model, self.device, dist.world_size,
                          self.validator.largest_batch_rows)
        for note in fallback_notes(cfg, self.model, self.device):
            self.log(note)
        self.optimizers = build_optimizers(self.model, cfg.optim, self.device, strategy=self.strategy,
                                           grad_comm_dtype=grad_comm_dtype(cfg.parallel.grad_comm_dtype),
                                           grads_read_each_step=self.guard.reads_gradients)
        self.grad_sync = self.optimizers.grad_sync  # overlapped gradient reduction (no-op on one rank)
        self.has_experts = bool(cfg.model.moe_experts)
        if self.has_experts:  # aux-loss-free balancing: expert biases move after each optimizer step
            from ..model.moe import balance_experts

            rate = cfg.model.moe_bias_rate
            self.optimizers.adam.register_step_post_hook(lambda *_: balance_experts(self.model, rate))
        # Before the first compile: the cache's folders in place and its saved artifacts loaded
        self.compile_cache = open_compile_cache(cfg, dist, self.log)
        self.compile_watch = CompileWatch(enabled=cfg.train.compile)
        t0 = time.perf_counter()
        self.forward = compiled_forward(cfg, self.model, self.strategy, self.log, self.compile_cache)
        # torch.compile only wraps the model, except where it installs dynamo's saved package (precompile): its
        # backends loaded, instead of a trace and compile in the warmup. Counted in "compile + warmup".
        self.compile_call_s = time.perf_counter() - t0
        self.inputs = StepInputs(self.plan, self.device, rope_state=self.model.rope_state)
        self.step = 0
        self.tokens = 0
        self.train_time = 0.0
        self.metrics = self.rundir.metrics_logger(tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb,
                                                  wandb_project=cfg.run.wandb_project, run_name=cfg.run.name or None,
                                                  config=cfg.to_dict(), enabled=dist.is_main)
        if dist.is_main and not self.resume:
            log_compression(self.tokenizer, self.val_files, self.validator.tokens, self.metrics)
        self.checkpoints = Checkpointer(self.rundir, cfg, dist, self.strategy, self.model, self.optimizers,
                                        self.metrics)
        self.peak = peak_flops(self.device, cfg.train.peak_flops)
        self.progress = ProgressLog(cfg.train, self.metrics, self.log, model=self.model, optimizers=self.optimizers,
                                    loader=self.loader, guard=self.guard, grad_sync=self.grad_sync,
                                    device=self.device, peak=self.peak, world_size=dist.world_size,
                                    has_experts=self.has_experts)
        for line in describe_run(cfg, self.model, self.plan, self.strategy, self.device):
            self.log(line)
        # the documents' lengths for the window check: read on the rank that logs only
        documents = document_sample(cfg, self.plan, self.train_files, self.crop_coverage) if dist.is_main else None
        for line in data_epoch_lines(cfg, self.plan, self.loader.corpus_tokens, mix_preview(self.plan, self.loader),
                                     coverage=self.crop_coverage, documents=documents):
            self.log(line)
        if self.resume:
            self.load_latest()
            if dist.is_main:
                self.rundir.write_config(cfg)
                self.rundir.write_plan(self.plan.as_dict())
                record_resume(self.rundir, environment_snapshot(self.device), self.step, self.resume_changes)
        elif cfg.train.on_nonfinite == "rollback":
            self.save()  # step 0: something to roll back to before the first periodic checkpoint
        if self.plan.from_table:
            self.metrics.log({"event": "stages", "step": self.step, "stages": self.plan.as_records()})
        # Last in the setup, so a setup that fails leaves no helper behind
        not_ahead = why_not_ahead(cfg, dist.world_size, self.device, self.strategy, self.compile_cache,
                                  lambda: room_for_a_helper(cfg, self.device, self.memory_estimate))
        if not_ahead and cfg.train.compile_validation_ahead == "on":
            self.log(f"compile: train.compile_validation_ahead=on does nothing here ({not_ahead})")
        self.validation_ahead = None if not_ahead else ValidationAhead.start(cfg, self.run_dir, self.log)

    # ------------------------------------------------------------------------------------------
    def enter_stage(self, step: int) -> Stage:
        """The stage of `step`, set up (loader micro-batching, stage hooks) when it is not the current one."""
        stage = self.plan.stage_at(step)
        if stage is not self.stage:
            previous, self.stage = self.stage, stage
            # (rows per micro-step, micro-steps) of this stage: fixed within it, so worked out once here
            self.stage_batch = self.plan.stage_batch(stage)
            self.loader.set_grad_accum(self.stage_batch[1])
            for hook in self.stage_hooks:
                hook(self, previous, stage)
        return stage

    def train_step(self, step: int) -> torch.Tensor:
        rank = self.dist.rank
        if faults.fires("exit", step, rank):
            os._exit(1)  # a crashed worker (fault suite)
        if faults.fires("sigterm", step, rank):
            os.kill(os.getpid(), signal.SIGTERM)
        stage = self.enter_stage(step)
        rows, grad_accum = self.stage_batch
        mtp_weights = self.inputs.mtp_weights_at(step)
        apply_hyperparameters(self.optimizers, self.plan, step, self.rollbacks.lr_scale)
        windows, rope = self.inputs.windows_at(step), self.inputs.rope_at(step)
        self.model.sync_embed_tying(step, self.cfg.train.steps, self.optimizers)  # model.tie_embed_frac's untie step
        total = torch.zeros((), device=self.device)
        self.grad_sync.timing = (step + 1) % self.cfg.train.log_every == 0  # comm_wait_ms on logging steps
        self.optimizers.begin_step(step)  # optim.adam_every: no collective for Adam's gradients when it is not due
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
            if self.cudagraphs and i == 0:
                grads_out_of_cudagraph_pool(self.model)
            total += loss.detach()
        self.optimizers.fold_tied_grads()  # model.tie_embed_frac: before anything reads the gradients (clipping)
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

    def evaluate(self, step: int | None = None, *, warmup: bool = False) -> float:
        """Mean validation loss of the model after `step` training steps (default: the current one),
        at that step's attention windows; `warmup`: one batch of each shape only (Validator.loss)."""
        step = self.step if step is None else step
        return self.validator.loss(self.model, self.forward, self.inputs.windows_at(step), self.inputs.rope_at(step),
                                   warmup=warmup)

    def record_budget_end(self) -> None:
        """train.time_budget_s ended the run at this step: with the final validation there, a finished run with fewer
        steps than configured (rundir/metrics.py ended_by)."""
        self.metrics.log({"event": TIME_BUDGET_EVENT, "step": self.step, "tokens": self.tokens,
                          "time_s": self.train_time, "budget_s": self.cfg.train.time_budget_s})

    def record_validation(self, result: TrainResult) -> None:
        with self.compile_watch.span(VALIDATION_AFTER_WARMUP):  # a graph compiled here is one the warmup missed
            val = self.evaluate()
        result.val_history.append((self.step, val))
        self.progress.log_validation(self.step, self.tokens, self.train_time, val)

    def warmup_then_reset(self) -> float:
        """Compile and autotune on real steps (warmup.py chooses which), then restore the exact initial
        state: the measured run starts cold in its numbers but warm in its kernels."""
        if self.cfg.train.warmup_steps <= 0:
            return 0.0
        t0, watch = time.perf_counter(), self.compile_watch
        try:
            with restored_afterwards(self.model, self.optimizers, self.loader), faults.suspended():
                for step in warmup_steps(self.cfg, self.plan):
                    with watch.span(f"stage {self.plan.stage_at(step).index}" if self.plan.from_table
                                    else "training"):
                        self.train_step(step)
                with watch.span("validation"):
                    if self.validation_ahead is not None:  # its wait is part of compile + warmup
                        self.validation_ahead_note = self.validation_ahead.wait(
                            stopping=lambda: bool(self.stop_request.signum))
                        self.log(self.validation_ahead_note)
                        self.validation_ahead = None
                    for _ in range(2 if self.cudagraphs else 1):  # CUDA graphs record on a graph's 2nd call
                        self.evaluate(warmup=True)
        finally:
            if self.validation_ahead is not None:  # a warmup that failed before validation
                self.validation_ahead.stop()
                self.validation_ahead = None
        self.stage = None  # the run sets up its first stage again (hooks included)
        self.guard.reset()  # what the warmup steps saw is not the run's
        if self.has_experts:  # nor what its forwards counted for the MoE metrics
            from ..model.moe import reset_health

            reset_health(self.model)
        self.sync_device()
        warm_s = time.perf_counter() - t0 + self.compile_call_s
        for line in watch.lines():
            self.log(line)
        compiled = watch.record() if watch.enabled else None
        if compiled is not None:
            self.metrics.log({"event": "compile", "step": self.step, "tokens": self.tokens, "time_s": 0.0, **compiled})
        if self.compile_cache is not None:  # what a later run loads: every rank its own (compile_cache.py)
            self.log(self.compile_cache.save(compiled["graphs"] if compiled is not None else None)
                     or "compile cache: torch recorded nothing to save")
        return warm_s

    # ------------------------------------------------------------------------------------------
    def state(self) -> dict:
        """The trainer's progress, saved with each checkpoint (the model and optimizers beside it)."""
        return {"tokens": self.tokens, "train_time_s": self.train_time, "loader": self.loader.state_dict(),
                "rng_cpu": torch.get_rng_state().tolist(), "lr_scale": self.rollbacks.lr_scale,
                "config": self.cfg.to_dict()}  # what a resume checks its config against (train/resume.py)

    def save(self, final: bool = False) -> Path | None:
        return self.checkpoints.save(self.step, self.state(), final=final)

    def load_latest(self) -> int:
        """Continue from the newest checkpoint: model, optimizers, data position, RNG and counters. Returns its step."""
        path, state = self.checkpoints.load_latest(self.device)
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(torch.tensor(state["rng_cpu"], dtype=torch.uint8))
        self.step, self.tokens, self.train_time = state["step"], state["tokens"], state["train_time_s"]
        self.rollbacks.lr_scale = state.get("lr_scale", 1.0)
        self.stage = None  # set up again from the resumed step
        self.guard.reset()
        self.log(f"resumed from {path} at step {self.step} ({self.tokens:,} tokens)")
        self.metrics.log({"event": "resume", "step": self.step, "tokens": self.tokens, "time_s": self.train_time})
        return self.step

    def sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        self.setup()
        with self.stop_request:
            try:
                return self._run()
            except (TrainingStopped, CheckpointError, NonFiniteError):
                raise  # a stop already said, a save that failed, diverged numerics: each its own line and status
            except Exception as e:
                if not self.stop_request.signum:
                    raise
                # The signal's own doing, most likely (preempt.StoppedMidStep): say it was a stop, exit 128 + N.
                self.metrics.log({"event": "stopped", "step": self.step, "tokens": self.tokens,
                                  "time_s": self.train_time, "signal": self.stop_request.signum,
                                  "error": type(e).__name__})
                self.metrics.close()
                raise StoppedMidStep(self.stop_request.signum, self.step, self.run_dir, e,
                                     bool(self.rundir.list_checkpoints())) from e

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
        self.progress.since(self.step, self.tokens, self.train_time)
        clock = TrainClock(self.train_time)
        first_step = self.step  # result.train_losses[i] is step first_step + i
        # A resume past its time budget reaches here only to take the final validation its stop left out
        # (train/resume.py); every rank reads the same saved train time, so all agree not to train.
        stop = bool(t.time_budget_s) and self.step > 0 and self.train_time >= t.time_budget_s
        while self.step < t.steps and not stop:
            self.stop_request.step = self.step
            with self.compile_watch.span(AFTER_WARMUP):  # a graph compiled here is one the warmup missed
                loss = self.train_step(self.step)
            self.tokens += self.stage.batch_tokens
            self.step += 1
            self.stop_request.step = self.step  # a signal from here on arrives before the next step
            self.train_time = clock.elapsed()
            result.train_losses.append(loss)
            if t.time_budget_s and self.control.budget_spent(self.step, self.train_time):
                self.log(f"time budget of {t.time_budget_s}s reached at step {self.step}")
                self.record_budget_end()
                stop = True
            signalled, save_due = self.control.after_step(self.checkpoints.last_save_time)
            last = self.step == t.steps or stop or signalled
            log_step = self.step % t.log_every == 0 or last
            ckpt_step = ((t.checkpoint_every and self.step % t.checkpoint_every == 0) or save_due
                         or (last and t.save_final_checkpoint))
            if (log_step or ckpt_step) and self.guard.mode != "skip":
                # A host read that these steps pay for anyway: act on a NaN before it is logged or saved.
                if self.rollbacks.respond(self.guard.first_bad_by_rank(), self.rundir, self.load_latest,
                                          self.log, self.metrics):
                    del result.train_losses[self.step - first_step:]
                    clock.restart(self.train_time)
                    self.progress.since(self.step, self.tokens, self.train_time)
                    continue
            if log_step:  # a signalled step too (it is `last`): its loss is on the curve the resume continues
                self.sync_device()
                self.train_time = clock.elapsed()
                self.progress.log_train(self.step, self.tokens, self.train_time, result.train_losses,
                                        self.stage.seq_len)
            if signalled:
                self.sync_device()
                path = self.save(final=True)
                self.metrics.log({"event": "stopped", "step": self.step, "tokens": self.tokens,
                                  "time_s": self.train_time, "signal": self.stop_request.signum})
                self.metrics.close()
                raise TrainingStopped(self.stop_request.signum, self.step, path, self.run_dir,
                                      self.stop_request.signal_step)
            if (t.val_every and self.step % t.val_every == 0) or last:
                self.sync_device()  # queued training kernels count as training, not as evaluation
                # ...and so in the val record's time_s, which equal-time comparisons read (a step that
                # is not a logging step last set train_time before its kernels had finished).
                self.train_time = clock.elapsed()
                with clock.paused():  # evaluation is not training time
                    self.record_validation(result)
            if ckpt_step:
                self.sync_device()
                with clock.paused():
                    self.save(final=last)
        if first_step == self.step and (self.step == t.steps or stop):  # (no step trained, so none validated)
            # A resume of a run stopped in its last step, or in the step that spent its time budget
            # (train/resume.py): its final validation is all it lacks.
            self.log(f"step {self.step} is the run's last: its final validation, which the stop left out")
            if stop:  # the budget's record too: a stop between the budget's checks (on several ranks rank 0's clock
                # is read on logging steps only), or a lowered budget, saved a spent time without it; a repeat of it
                # is one record
                self.record_budget_end()
            self.record_validation(result)
        result.steps, result.tokens, result.train_time_s = self.step, self.tokens, self.train_time
        if result.train_losses:  # one collective at the end: every step's loss over the global batch
            result.train_losses = mean_over_ranks(torch.stack(result.train_losses)).tolist()
        result.val_loss = result.val_history[-1][1] if result.val_history else None
        self.finish(result)
        return result

    def finish(self, result: TrainResult) -> None:
        late = any(self.compile_watch.spans_compiled(label) for label in (AFTER_WARMUP, VALIDATION_AFTER_WARMUP))
        if late:  # a finding: the warmup did not compile every graph the run needed
            for line in self.compile_watch.lines():
                self.log(line)
            self.metrics.log({"event": "compile", "step": self.step, "tokens": self.tokens, "time_s": self.train_time,
                              **self.compile_watch.record()})
        self.compile_watch.close()
        self.checkpoints.finish()
        self.metrics.close()
        if self.strategy == "fsdp":  # sampling runs on rank 0 alone: it gets an unsharded copy
            state = self.checkpoints.full_model_state()
            if self.dist.is_main:
                result.model = model_from_config(self.cfg, self.device, world_size=self.dist.world_size)
                result.model.load_state_dict(state)
        elif self.dist.is_main:
            result.model = self.model
        self.log(f"done: {result.steps} steps, {result.tokens:,} tokens in {result.train_time_s:.1f}s; "
                 f"run dir {self.run_dir}")


def train(cfg: Config, *, run_dir: Path | str | None = None, resume: bool | str = False,
          quiet: bool = False, extend: bool = False) -> TrainResult:
    """Run a whole job. `resume` (True, or "auto": when the run directory has a checkpoint) continues
    the run from its latest checkpoint (train/resume.py checks it first: RunComplete when there is
    nothing left to train); `extend` lets that resume change train.steps or the schedules."""
    try:
        return Trainer(cfg, run_dir=Path(run_dir) if run_dir else None, resume=resume, quiet=quiet,
                       extend=extend).run()
    finally:
        teardown()  # also after an error: a crashed rank must not leave the process group behind
