"""Supervised fine-tuning: a base run's model trained on conversations, the loss on the assistant's
tokens only (pack.py's IGNORE targets), into a run directory of its own.

What it inherits from the base run: the whole config (model, batch, learning rates and schedule,
optim settings), so `--section.key=value` overrides work as in `speedgpt train`; the chat model's
config differs only in model.vocab_size (the chat tokens, template.py). It reuses the trainer's parts
(model_from_config, build_optimizers, the plan's lr schedule, the run dir's checkpoints and metrics);
what it does not share is the data path: whole conversations in padded rows instead of the shards'
token stream. Single process, no compile: SFT runs are short.

The step's loss is the sum over every assistant token of the step divided by their count, so micro-batches
with more assistant tokens weigh more (each token counts once, as in one big batch).

RUN/sft.json records the base run, the data and the options; a resume reads it back, and continues
from the newest checkpoint with the same data order (the loader's (epoch, row)), as `train` resumes.
Its paths are absolute, so a resume from another directory finds them; the checkpoint holds every weight,
so a resume needs no base run. A run stopped before its first checkpoint has nothing to resume: --resume
starts it again from step 0 with its own sft.json and config.toml.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..rundir import SFT_SPEC_FILE
from ..rundir.metrics import SFT_EVAL_EVENT
from .tasks import HELDOUT_PER_TASK

SPEC_FILE = SFT_SPEC_FILE  # (rundir/reuse.py: `train --overwrite` removes it with the run)


# The train.* keys an SFT run does not apply (one process, eager, a fixed number of steps, checkpoints by step, a
# non-finite step always stops it): an override of one was written into config.toml and ignored (`sft BASE
# --train.time_budget_s=60` trained every step). The base run's values of them are inherited and harmless.
UNREAD_TRAIN_KEYS = ("tokens_per_param", "flops_budget", "horizon", "time_budget_s", "checkpoint_every_min",
                     "save_final_checkpoint", "checkpoint_format", "keep_checkpoint_every", "on_nonfinite",
                     "rollback_lr_factor", "max_rollbacks", "compile", "compile_scope", "compile_backend",
                     "compile_mode", "compile_cache", "compile_precompile", "compile_validation_ahead",
                     "coordinate_descent_tuning", "autotune_pointwise", "persistent_reductions_upto", "warmup_steps",
                     "peak_flops")


@dataclass
class SFTSpec:
    base_run: str
    data: list[str] = field(default_factory=list)  # FILE[:WEIGHT]; empty: the built-in tasks
    load_optimizer: bool = False  # warm-start Adam/Muon state from the base run's checkpoint
    builtin_examples: int = 20_000  # built-in training conversations per epoch (when data is empty)
    eval_examples: int = 50  # held-out examples per built-in task scored by exact match at each eval
    heldout_examples: int = HELDOUT_PER_TASK  # held-out built-in conversations per task for the assistant-token loss
    # How --data files become training and held-out conversations (data.mixture): 2 since 2026-12-05 (copies dropped,
    # held out before the weights); a run saved before has none, read as 1
    split: int = 2
    # The base checkpoint's step, which the model's default windows are of (infer/load.py): a resume rebuilds the
    # model with it, without the base run; None in runs saved before it was recorded (they load the base run again)
    base_step: int | None = None

    def data_paths(self, fn) -> list[str]:
        """The data entries with each FILE of FILE[:WEIGHT] replaced by fn(FILE), its weight kept."""
        from .data import split_source

        def one(entry: str) -> str:
            path, weight = split_source(entry)
            return fn(path) + (entry[len(path):] if weight is not None else "")
        return [one(entry) for entry in self.data]

    def absolute(self) -> "SFTSpec":
        """This spec with its paths absolute: a resume from another directory reads the same files."""
        def absolute(path: str) -> str:
            return str(Path(path).expanduser().absolute())
        return replace(self, base_run=absolute(self.base_run), data=self.data_paths(absolute))

    def located(self, run_dir: Path) -> "SFTSpec":
        """A loaded spec whose relative paths (runs saved before sft.json held absolute ones) are read from the
        directory the run was started in (env.json's "cwd"); FileNotFoundError naming that when it is unknown
        and the path is not found from here either. The base run only where the resume needs it."""
        from ..rundir.env import started_in

        start = started_in(run_dir)

        def locate(path: str, what: str) -> str:
            if Path(path).expanduser().is_absolute() or Path(path).exists():
                return path
            if start is not None and (Path(start) / path).exists():
                return str(Path(start) / path)
            where = f"the directory it was started in ({start})" if start else \
                "the directory it was started in, which its env.json does not record"
            raise FileNotFoundError(f"{run_dir}/{SPEC_FILE} names {what} {path}, a path relative to {where}, and it "
                                    f"is not found from here: resume from that directory")
        data = self.data_paths(lambda path: locate(path, "--data file"))
        from ..rundir import RunDir

        needs_base = self.base_step is None or not RunDir(run_dir).list_checkpoints()
        return replace(self, base_run=locate(self.base_run, "base run") if needs_base else self.base_run, data=data)

    def save(self, run_dir: Path) -> None:
        (run_dir / SPEC_FILE).write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, run_dir: Path) -> "SFTSpec":
        """The spec `sft` saved in `run_dir`; a ValueError naming the file for one emptied or cut short (json's own
        "Expecting value: line 1 column 1 (char 0)" named neither the file nor the fix)."""
        path = run_dir / SPEC_FILE
        try:
            return cls(**{"split": 1, **json.loads(path.read_text(encoding="utf-8"))})
        except (ValueError, TypeError) as e:  # not JSON, not an object, or keys missing or unknown
            raise ValueError(f"{path} is unreadable ({type(e).__name__}: {e}), emptied or cut short; restore it (its "
                             f"base run and --data files are in the command that started the run, argv in "
                             f"{run_dir / 'env.json'})") from None


def sft_config(base_run: str | Path, overrides: list[str]):
    """The base run's config with room for the chat tokens, then `overrides`."""
    from ..config import apply_overrides
    from ..config.validate import check_config
    from ..rundir import RunDir
    from ..tokenizer.folder import run_tokenizer
    from .template import chat_vocab_size, check_room

    run = RunDir(base_run)
    if not run.is_run():
        raise FileNotFoundError(f"base run {base_run} holds no run (no config.toml); pass a run directory of "
                                f"`speedgpt train`")
    base = run.read_config()
    tok = run_tokenizer(base_run, base)
    check_room(tok, base.model)
    cfg = apply_overrides(base, [f"--model.vocab_size={chat_vocab_size(tok)}", *overrides])
    check_config(cfg)  # a bad override (--train.steps=0, say) is one line, as `speedgpt train` says it
    return cfg, tok


@dataclass
class SFTResult:
    run_dir: Path
    steps: int
    history: list[dict]  # the eval records (step, heldout_loss, per-task exact match)
    model: object = None


class SFTTrainer:
    def __init__(self, cfg, tokenizer, spec: SFTSpec, run_dir: Path, resume: bool = False, quiet: bool = False,
                 restart: bool = False):
        from ..device import resolve_device
        from ..rundir import with_run_dir
        from .template import ChatTemplate

        # run.dir: this SFT run's directory, not the base run's its config came from
        self.cfg, self.spec, self.run_dir, self.resume, self.quiet = (with_run_dir(cfg, run_dir), spec, Path(run_dir),
                                                                      resume, quiet)
        self.restart = restart  # the run in run_dir stopped before its first checkpoint: its files are replaced
        self.template = ChatTemplate(tokenizer)
        self.device = resolve_device(cfg.train.device)
        self.duplicates = 0  # exact copies dropped from the --data files (data.mixture)

    def log(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)

    def conversations(self):
        """(training, held-out) rendered conversations."""
        from .data import ChatDataError, mixture, parse_source
        from .tasks import first_heldout, training_examples

        row_len = self.cfg.data.seq_len + 1
        if self.spec.data:
            mix = mixture([parse_source(s) for s in self.spec.data], self.template, row_len)
            if not mix.train:
                raise ChatDataError(f"--data holds {len(mix.heldout):,} distinct conversation(s), all held out (the "
                                    f"first of every 20, for the held-out loss), or weighted to none: nothing to "
                                    f"train on; add conversations or raise the files' weights")
            self.duplicates = mix.duplicates
            return mix.train, mix.heldout
        stream = training_examples(self.cfg.train.seed)
        train = [self.template.render(next(stream).conversation()) for _ in range(self.spec.builtin_examples)]
        held = first_heldout(self.spec.heldout_examples)
        return train, [self.template.render(e.conversation()) for e in held]

    def setup(self) -> None:
        from ..infer.load import load_model
        from ..optim.build import build_optimizers
        from ..plan import RunPlan
        from ..rundir import RunDir
        from ..rundir.env import environment_snapshot
        from ..train.tokenizer import keep_in_run
        from .pack import ConversationLoader

        cfg = self.cfg
        torch.manual_seed(cfg.train.seed)
        self.plan = RunPlan.of(cfg)
        self.train_convs, self.heldout_convs = self.conversations()
        self.loader = ConversationLoader(self.train_convs, cfg.data.seq_len + 1, self.plan.micro_batch,
                                         cfg.train.seed, self.template.bos, self.device)
        if self.resume and self.spec.base_step is not None:  # the checkpoint loaded below holds every weight
            from ..model.build import model_from_config

            self.model = model_from_config(cfg, self.device, step=self.spec.base_step)
        else:
            from ..rundir.weights import locate

            self.model, _ = load_model(self.spec.base_run, device=self.device, cfg=cfg)
            if self.spec.base_step is None and not self.resume:
                self.spec.base_step = locate(self.spec.base_run).step
        self.model.train()
        self.optimizers = build_optimizers(self.model, cfg.optim, self.device, world_size=1)
        self.rundir = RunDir(self.run_dir)
        self.step = 0
        if self.resume:
            from ..rundir.checkpoint import load_checkpoint

            model_state, optim_state, state = load_checkpoint(self.rundir.latest_checkpoint(), self.device)
            self.model.load_state_dict(model_state)
            self.optimizers.load_state_dict(optim_state)
            self.loader.load_state_dict(state["loader"])
            torch.set_rng_state(torch.tensor(state["rng_cpu"], dtype=torch.uint8))
            self.step = int(state["step"])
            self.log(f"resumed {self.run_dir} at step {self.step}")
        else:
            if self.restart:  # its metrics (steps without a checkpoint) would mix with this start's
                from ..rundir.reuse import prepare_new_run_dir

                prepare_new_run_dir(self.run_dir, overwrite=True)
                self.log(f"{self.run_dir} has no checkpoint (stopped before its first): nothing to resume; started "
                         f"again from step 0 with its own {SPEC_FILE} and config.toml")
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.rundir.write_config(cfg)
            self.spec.save(self.run_dir)
            keep_in_run(self.template.tokenizer, self.run_dir)
            self.rundir.write_env(environment_snapshot(self.device))
            if self.spec.load_optimizer:
                self.warm_start_optimizers()
        self.metrics = self.rundir.metrics_logger(config=cfg.to_dict())
        dropped = f" ({self.duplicates:,} exact duplicates dropped)" if self.duplicates else ""
        self.log(f"sft: {len(self.train_convs):,} training conversations, {len(self.heldout_convs):,} held out"
                 f"{dropped}; "
                 f"{cfg.train.steps} steps of {self.plan.micro_batch * self.plan.grad_accum} rows x "
                 f"{cfg.data.seq_len} tokens; base run {self.spec.base_run}")

    def warm_start_optimizers(self) -> None:
        """The base run's optimizer state (moments, Muon momentum) from its latest checkpoint; this run's
        own learning rates stay (the container loads only per-parameter state)."""
        from ..rundir import RunDir
        from ..rundir.checkpoint import load_checkpoint

        base = RunDir(self.spec.base_run)
        if not base.list_checkpoints():
            raise FileNotFoundError(f"--load-optimizer: base run {self.spec.base_run} has no checkpoint; train it "
                                    f"with checkpoints or leave --load-optimizer out")
        _, optim_state, _ = load_checkpoint(base.latest_checkpoint(), self.device)
        self.optimizers.load_state_dict(optim_state)
        self.log(f"optimizer state warm-started from {base.latest_checkpoint()}")

    def train_step(self, step: int) -> float:
        from ..parallel.ddp import clip_grad_norm_
        from ..train.step_schedule import apply_hyperparameters
        from .pack import IGNORE

        apply_hyperparameters(self.optimizers, self.plan, step)
        batches = [self.loader.next_batch() for _ in range(self.plan.grad_accum)]
        count = sum(int((t != IGNORE).sum()) for _, t in batches)
        total = 0.0
        for inputs, targets in batches:
            loss = self.model(inputs, targets, reduction="sum") / max(count, 1)
            loss.backward()
            total += float(loss.detach())
        self.optimizers.fold_tied_grads()  # (model.tie_embed_frac) before anything reads the gradients, as train's
        self.check_finite(step, total)
        if self.cfg.optim.grad_clip:  # the base run's or an override's: it was written into config.toml, never applied
            clip_grad_norm_(self.optimizers, self.cfg.optim.grad_clip)
        self.optimizers.step(step)
        self.model.zero_grad(set_to_none=True)
        return total

    def check_finite(self, step: int, loss: float) -> None:
        """NonFiniteError, before the update is applied, when the step's loss or a gradient is not finite. Without it
        the NaN weights were trained on, saved in every later checkpoint and the run said "done", exit 0 (and `chat`
        answered from them). SFT stops whatever train.on_nonfinite says: skip and rollback are `train`'s."""
        from ..train.guard import NonFiniteError, nonfinite_grads

        bad_grads = nonfinite_grads(self.optimizers)
        if math.isfinite(loss) and (bad_grads is None or not bool(bad_grads)):
            return
        found = self.rundir.list_checkpoints()
        last = f"the last good checkpoint is {found[-1]}" if found else "no checkpoint was written"
        self.metrics.close()
        raise NonFiniteError(f"non-finite loss or gradient at SFT step {step + 1}, not applied; {last}. Lower the "
                             f"learning rates (e.g. --optim.muon_lr, --optim.embed_lr) or clip the gradients "
                             f"(--optim.grad_clip=1.0)")

    def record_evaluation(self) -> dict:
        """evaluate(), logged to the metrics and the console; returns the record."""
        record = self.evaluate()
        self.metrics.log(record)
        self.log(_describe(record))
        return record

    def evaluate(self) -> dict:
        from .evaluate import assistant_loss, builtin_scores, chatcore

        record = {"event": SFT_EVAL_EVENT, "step": self.step, "heldout_loss": assistant_loss(
            self.model, self.heldout_convs, self.cfg.data.seq_len + 1, self.template.bos, self.plan.micro_batch)}
        if self.spec.eval_examples:
            scores = builtin_scores(self.model, self.template, self.spec.eval_examples)
            record.update({f"exact_{s.task}": s.accuracy for s in scores})
            record["chatcore"] = chatcore(scores)
        return record

    def save(self) -> Path:
        state = {"loader": self.loader.state_dict(), "rng_cpu": torch.get_rng_state().tolist(),
                 "config": self.cfg.to_dict()}
        return self.rundir.save_checkpoint(self.step, self.model.state_dict(), self.optimizers.state_dict(), state,
                                    keep=self.cfg.train.keep_checkpoints)

    def run(self) -> SFTResult:
        from ..train.preempt import StopRequest, TrainingStopped

        self.setup()
        t = self.cfg.train
        history: list[dict] = []
        if self.step == 0:
            history.append(self.record_evaluation())
        t0 = time.perf_counter()
        # SIGTERM / Ctrl-C: the step finishes, a checkpoint is written, `--resume` continues (as `train`)
        with StopRequest(announce=not self.quiet) as stop:
            while self.step < t.steps:
                loss = self.train_step(self.step)
                self.step = stop.step = self.step + 1
                last = self.step == t.steps
                if self.step % t.log_every == 0 or last:
                    self.metrics.log({"step": self.step, "train_loss": loss, "time_s": time.perf_counter() - t0})
                    self.log(f"step {self.step}/{t.steps} train loss {loss:.4f}")
                if stop.signum:
                    path = self.save()
                    self.metrics.close()
                    raise TrainingStopped(stop.signum, self.step, path, self.run_dir, stop.signal_step)
                if (t.val_every and self.step % t.val_every == 0) or last:
                    history.append(self.record_evaluation())
                if (t.checkpoint_every and self.step % t.checkpoint_every == 0) or last:
                    self.save()
        if self.step == t.steps and not history:  # resumed at its last step, which a stop left unevaluated
            self.log(f"step {self.step} is the run's last: its final evaluation, which the stop left out")
            history.append(self.record_evaluation())
        self.metrics.close()
        self.log(f"done: {self.step} SFT steps; run dir {self.run_dir}")
        return SFTResult(self.run_dir, self.step, history, self.model)


def _describe(record: dict) -> str:
    parts = [f"eval step {record['step']}: held-out assistant loss {record['heldout_loss']:.4f}"]
    parts += [f"{k.removeprefix('exact_')} {v:.0%}" for k, v in record.items() if k.startswith("exact_")]
    if "chatcore" in record:
        parts.append(f"chatcore {record['chatcore']:.3f}")
    return ", ".join(parts)


def sft(base_run: str | Path, run_dir: str | Path, overrides: list[str] | None = None, *,
        spec: SFTSpec | None = None, resume: bool = False, quiet: bool = False, extend: bool = False) -> SFTResult:
    """Fine-tune `base_run` into `run_dir`; with `resume`, continue `run_dir` from its latest checkpoint
    (its sft.json and config.toml, then `overrides`); a changed train.steps or schedule needs `extend`, as
    `train`'s resume (train/resume.py check_resume: ConfigError without it, RunComplete at the run's end)."""
    from ..train.resume import check_resume
    from ..config import apply_overrides
    from ..config.validate import check_config
    from ..rundir import RunDir
    from ..tokenizer.folder import run_tokenizer

    run_dir = Path(run_dir)
    restart = False
    if resume:
        if not (run_dir / SPEC_FILE).is_file():
            raise FileNotFoundError(f"{run_dir} holds no SFT run (no {SPEC_FILE}): --resume continues a run of "
                                    f"`speedgpt sft`; to fine-tune a base run: speedgpt sft {run_dir}")
        spec = SFTSpec.load(run_dir)
        if spec.data and spec.split != SFTSpec.split:  # its rows would be other conversations from its position on
            raise ValueError(f"{run_dir} chose its training and held-out conversations as speedgpt did before "
                             f"2026-12-05; this one chooses others: start it again (speedgpt sft {spec.base_run} "
                             f"--data ...)")
        spec = spec.located(run_dir)
        cfg = apply_overrides(RunDir(run_dir).read_config(), list(overrides or []))
        check_config(cfg)
        # Stopped before its first checkpoint (killed, say): started again with its config; the base run's
        # tokenizer, as the run's own copy goes with the files a restart replaces
        restart = not RunDir(run_dir).list_checkpoints()
        if restart:
            tok = sft_config(spec.base_run, [])[1]
        else:
            check_resume(cfg, run_dir, extend=extend)
            tok = run_tokenizer(run_dir, cfg)
    else:
        spec = (spec or SFTSpec(str(base_run))).absolute()
        cfg, tok = sft_config(spec.base_run, list(overrides or []))
    return SFTTrainer(cfg, tok, spec, run_dir, resume=resume and not restart, quiet=quiet, restart=restart).run()
