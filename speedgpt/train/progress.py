"""Training progress: the training-time clock, and the records of logging and validation steps
(loss, step time, throughput, MFU, memory, data and numerics counters) written to metrics.jsonl
and the console."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from ..config import TrainConfig
from ..parallel.dist import mean_over_ranks


class TrainClock:
    """Seconds spent training: wall time since the start, less what ran under `paused()`
    (evaluation, checkpoints), which is not training time."""

    def __init__(self, elapsed: float = 0.0):
        self.restart(elapsed)

    def restart(self, elapsed: float) -> None:
        """Continue from `elapsed` seconds of training (a start, a resume or a rollback)."""
        self._start = time.perf_counter() - elapsed

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    @contextmanager
    def paused(self):
        t = time.perf_counter()
        yield
        self._start += time.perf_counter() - t


class ProgressLog:
    """The records of logging steps (means over the steps since the previous one) and of validations."""

    def __init__(self, t: TrainConfig, metrics, log, *, model, optimizers, loader, guard, grad_sync,
                 device: torch.device, peak: float | None, world_size: int, has_experts: bool):
        self.t, self.metrics, self.log = t, metrics, log
        self.model, self.optimizers, self.loader, self.guard, self.grad_sync = model, optimizers, loader, guard, grad_sync
        self.device, self.peak, self.world_size, self.has_experts = device, peak, world_size, has_experts
        self._flops_per_token: dict[int, float] = {}
        self.since(0, 0, 0.0)

    def since(self, step: int, tokens: int, train_time: float) -> None:
        """The next logging step reports the steps after this point (the start, a logging step, a rollback)."""
        self.last_step, self.last_tokens, self.last_time = step, tokens, train_time
        self.last_row_docs = self.loader.row_docs or (0, 0)

    def flops_per_token(self, seq_len: int) -> float:
        """The model's training FLOPs per token at a row length (cached: a stage table has a few)."""
        if seq_len not in self._flops_per_token:
            self._flops_per_token[seq_len] = self.model.flops_per_token(seq_len)
        return self._flops_per_token[seq_len]

    def log_train(self, step: int, tokens: int, train_time: float, losses: list[torch.Tensor], seq_len: int) -> None:
        """Log the steps since the last logging step; `losses` is every step's loss on this rank, newest last."""
        n = max(1, step - self.last_step)
        step_s = (train_time - self.last_time) / n
        tokens_per_step = (tokens - self.last_tokens) / n  # a stage boundary can lie in between
        rows_before, docs_before = self.last_row_docs
        self.since(step, tokens, train_time)
        # The mean over the steps since the last log (over the global batch): a smoother curve
        # than one step's loss, for the same single host sync.
        loss = self.window_mean(torch.stack(losses[-n:])).item()
        tok_s = tokens_per_step / step_s if step_s > 0 else 0.0
        extra = ""
        record = {"step": step, "tokens": tokens, "time_s": round(train_time, 3),
                  "train_loss": loss, "lr": (self.optimizers.muon or self.optimizers.adam).param_groups[0]["lr"],
                  "tok_per_s": round(tok_s, 1), "step_ms": round(step_s * 1e3, 2),
                  "cropped_share": round(self.loader.cropped_share, 5)}  # of the data read, share never trained
        if self.has_experts:  # per MoE layer: expert loads, router logits, balancing bias, weight norms
            from ..model.moe import moe_health

            health = moe_health(self.model)
            record.update(health)
            extra += (f" | moe logit {max(health['moe_logit_max']):.1f} load {min(health['moe_min_load']):.2f}-"
                      f"{max(health['moe_max_load']):.2f} bias {max(health['moe_bias_range']):.3f}")
        skipped = int(self.guard.skipped.item()) if self.guard.mode == "skip" else 0
        if skipped:
            record["skipped_steps"] = skipped
            extra += f" | {skipped} step(s) skipped (non-finite)"
        if self.loader.row_docs is not None:  # long_docs=mix: distinct documents per row since the last log
            rows, docs = self.last_row_docs[0] - rows_before, self.last_row_docs[1] - docs_before
            if rows:
                record["docs_per_row"] = round(docs / rows, 2)
                extra += f" | {record['docs_per_row']:.1f} docs/row"
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
            record["mfu"] = round(tok_s * self.flops_per_token(seq_len) / (self.peak * self.world_size), 4)
            extra += f" | MFU {record['mfu'] * 100:.1f}%"
        self.metrics.log(record)
        remaining = (self.t.steps - step) * step_s
        self.log(f"step {step}/{self.t.steps} | loss {loss:.4f} | {tok_s:,.0f} tok/s | {step_s * 1e3:.0f} ms/step"
                 f"{extra} | {train_time:.0f}s elapsed, ~{remaining:.0f}s left")

    def window_mean(self, losses: torch.Tensor) -> torch.Tensor:
        """Mean loss of the steps since the last log over the global batch; skipped (non-finite)
        steps are left out, and counted in the record instead."""
        if self.guard.mode != "skip":
            return mean_over_ranks(losses.mean())
        finite = torch.isfinite(losses)
        return mean_over_ranks(torch.where(finite, losses, 0.0).sum() / finite.sum().clamp(min=1))

    def log_validation(self, step: int, tokens: int, train_time: float, val_loss: float) -> None:
        self.metrics.log({"step": step, "tokens": tokens, "time_s": train_time, "val_loss": val_loss})
        self.log(f"step {step}/{self.t.steps} | val loss {val_loss:.4f}")
