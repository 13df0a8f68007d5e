"""Validation of a Config's sections: one line per problem, naming the key and the fix.

The checks that need the run's stage table (its rows, windows and the switches that read them)
come after these, in plan.validate, which is what commands call: the config package builds on
nothing above it, so it cannot derive the table itself."""

from __future__ import annotations

import math

from .errors import ConfigError
from .model_checks import check_model
from .optim import OptimConfig
from .sections import COMPILE_MODES, CUDAGRAPH_MODES, Config, ParallelConfig, RunConfig, ScheduleConfig, TrainConfig


# The longest run a plan spans: the plan walks every step once at start (plan.json's window changes, YaRN's
# tables), about 1 us a step, so 10M steps take seconds; --train.steps=1e12 hung there with no word, and 1e30
# wrote a config.toml integer beyond TOML's 64 bits. (GPT-3's 300B tokens were ~94K steps.)
MAX_STEPS = 10_000_000


def micro_batch_rows(cfg: Config, world_size: int = 1) -> tuple[int, int]:
    """(rows per micro-step per rank, gradient-accumulation steps) for this world size."""
    t = cfg.train
    seq = cfg.data.seq_len
    rows_global = t.batch_tokens // seq
    if rows_global % world_size:
        raise ConfigError(
            f"train.batch_tokens={t.batch_tokens} is {rows_global} rows of data.seq_len={seq}, which does not divide "
            f"across {world_size} ranks; make the row count a multiple of {world_size}")
    rows_rank = rows_global // world_size
    mb = t.micro_batch_size or rows_rank
    if rows_rank % mb:
        raise ConfigError(
            f"train.micro_batch_size={mb} does not divide the {rows_rank} rows each of {world_size} rank(s) gets per "
            f"step; choose a divisor of {rows_rank}")
    return mb, rows_rank // mb


def check_config(cfg: Config, world_size: int = 1) -> None:
    """Raise ConfigError for the first inconsistent value, section by section (plan.validate runs
    this first, then the stage table's checks)."""
    check_model(cfg.model)
    _check_data_and_batch(cfg, world_size)
    _check_schedule(cfg.schedule)
    _check_optim(cfg.optim)
    _check_parallel(cfg.parallel, cfg.train)
    _check_checkpointed_experts(cfg)
    _check_run(cfg.run)
    _check_float32(cfg)  # after the ranges, which name their keys' own bounds
    _check_no_nan(cfg)  # last: the checks above name their own keys' ranges


def _check_no_nan(cfg: Config) -> None:
    """No key means anything by nan, and `nan < 0` is false: it passed every `< 0` check above
    (--train.checkpoint_every_min=nan turned time-based checkpoints off without a word)."""
    for key in _nan_keys(cfg.to_dict()):
        raise ConfigError(f"{key}=nan is not a number; give a number for {key} (`speedgpt config` describes it)")


def _nan_keys(value, key: str = ""):
    if isinstance(value, float) and math.isnan(value):
        yield key
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _nan_keys(item, f"{key}.{name}" if key else name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nan_keys(item, f"{key}[{i}]")


# The optimizer's and the model's float keys meet float32 tensors (lrs, decays, eps; the softcap, attention scale):
# one past float32's range failed at the first step as torch's "value cannot be converted to type float without
# overflow", naming no key (--optim.muon_lr=1e308), or was inf there and a non-finite loss that blamed the learning
# rates (--model.logit_softcap=1e308); a positive one below float32's smallest was 0 (--optim.adam_eps=1e-300
# divided by zero, a non-finite loss at step 2). The other sections' floats (budgets, FLOPs, times) stay Python's.
_FLOAT32_SECTIONS = ("model", "optim")
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32 (subnormal)


def _check_float32(cfg: Config) -> None:
    for section in _FLOAT32_SECTIONS:
        for key, value in vars(getattr(cfg, section)).items():
            if not isinstance(value, float):
                continue
            if abs(value) > FLOAT32_MAX:
                raise ConfigError(f"{section}.{key}={value:g} is beyond float32 (at most {FLOAT32_MAX:.3g}), in which "
                                  f"training applies it; give a value float32 holds")
            if value and abs(value) < FLOAT32_TINY / 2:  # rounds to 0
                raise ConfigError(f"{section}.{key}={value:g} is 0 in float32 (the smallest positive is "
                                  f"{FLOAT32_TINY:.3g}), in which training applies it; give 0, or a value float32 "
                                  f"holds")


def _check_run(r: RunConfig) -> None:
    # The sample is printed after training: a bad value found only then cost the whole run's time. (Whether the
    # prompt and the sample fit the model's context needs the run's tokenizer: train/tokenizer.py check_sample_prompt.)
    if r.sample_tokens < 0:
        raise ConfigError(f"run.sample_tokens={r.sample_tokens} must be >= 0 (new tokens of the sample printed after "
                          f"training; 0: no sample)")


def _check_parallel(par: ParallelConfig, t: TrainConfig) -> None:
    if t.compile_scope not in ("model", "block"):
        raise ConfigError(f"train.compile_scope='{t.compile_scope}' must be model or block")
    if t.compile_validation_ahead not in ("auto", "on", "off"):
        raise ConfigError(f"train.compile_validation_ahead='{t.compile_validation_ahead}' must be auto, on or off")
    if t.compile_backend not in ("inductor", "aot_eager", "eager"):
        raise ConfigError(f"train.compile_backend='{t.compile_backend}' must be inductor, aot_eager or eager")
    if t.compile_mode not in COMPILE_MODES:
        raise ConfigError(f"train.compile_mode='{t.compile_mode}' must be one of {', '.join(COMPILE_MODES)}")
    if t.compile_mode != "default" and not t.compile:
        raise ConfigError(f"train.compile_mode='{t.compile_mode}' is torch.compile's mode: give --train.compile=true "
                          f"or --train.compile_mode=default")
    if t.compile_mode != "default" and t.compile_backend != "inductor":
        raise ConfigError(f"train.compile_mode='{t.compile_mode}' is an Inductor mode: give "
                          f"--train.compile_backend=inductor or --train.compile_mode=default")
    check_cudagraph_strategy(t, par.strategy)
    if t.checkpoint_format not in ("full", "dcp", "dcp_async"):
        raise ConfigError(f"train.checkpoint_format='{t.checkpoint_format}' must be full, dcp or dcp_async")
    if par.strategy not in ("ddp", "fsdp", "auto"):
        raise ConfigError(f"parallel.strategy='{par.strategy}' must be ddp, fsdp or auto")
    if par.memory_limit_gib < 0:
        raise ConfigError(f"parallel.memory_limit_gib={par.memory_limit_gib} must be >= 0 (0: the GPU's own memory)")
    if par.grad_comm_dtype not in ("param", "bf16"):
        raise ConfigError(f"parallel.grad_comm_dtype='{par.grad_comm_dtype}' must be param or bf16")


def check_cudagraph_strategy(t: TrainConfig, strategy: str, chosen: bool = False) -> None:
    """CUDA graphs are not tried under fsdp (FSDP2 frees and regathers its parameters' storage every step): a config
    that asks for both fails here, and the trainer calls this again with the strategy parallel.strategy=auto chose
    (`chosen`), before the run directory is written."""
    if t.compile and t.compile_mode in CUDAGRAPH_MODES and strategy == "fsdp":
        fix = ("parallel.strategy=auto chose fsdp for this model; use --train.compile_mode=default" if chosen else
               "use --parallel.strategy=ddp or --train.compile_mode=default")
        raise ConfigError(f"train.compile_mode='{t.compile_mode}' (CUDA graphs) is not tried under fsdp; {fix}")


def _check_checkpointed_experts(cfg: Config) -> None:
    """Dynamo refuses an MoE block inside its checkpoint operator (its load counters are buffer updates: "HOP:
    Unsafe side effect"), so in a whole-model compile the checkpointed MoE blocks ran eagerly: flex attention
    then stops on the GPU (model/attention.py). Compiled block by block, they compile (issue 34)."""
    t = cfg.train
    if (t.compile and t.compile_scope == "model" and cfg.parallel.strategy != "fsdp"
            and cfg.parallel.activation_checkpointing and cfg.model.moe_experts):
        raise ConfigError(f"parallel.activation_checkpointing=true with MoE layers (model.moe_experts="
                          f"{cfg.model.moe_experts}) does not compile with train.compile_scope=model (the checkpointed "
                          "MoE blocks would run eagerly); set --train.compile_scope=block")


def _check_data_and_batch(cfg: Config, world_size: int) -> None:
    d, t = cfg.data, cfg.train
    # 0 means "none" / "the device's table" for both; a negative or NaN one meant that too, silently (a negative
    # peak wrote a negative MFU into metrics.jsonl)
    for key, value, zero in (("time_budget_s", t.time_budget_s, "no time limit"),
                             ("peak_flops", t.peak_flops, "the device's table value")):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"train.{key}={value} must be finite and >= 0 (0: {zero})")
    if d.seq_len < 2:
        raise ConfigError(f"data.seq_len={d.seq_len} must be at least 2")
    if t.batch_tokens % d.seq_len:
        raise ConfigError(f"train.batch_tokens={t.batch_tokens} is not divisible by data.seq_len={d.seq_len}; "
                          f"use a multiple such as {max(1, t.batch_tokens // d.seq_len) * d.seq_len}")
    if t.micro_batch_size < 0:
        raise ConfigError(f"train.micro_batch_size={t.micro_batch_size} must be >= 0 (0: all of a rank's rows at once)")
    if t.batch_tokens < 0 or (t.batch_tokens == 0 and not (t.tokens_per_param or t.flops_budget)):
        raise ConfigError(f"train.batch_tokens={t.batch_tokens} must be > 0, or 0 (derived) with "
                          f"train.tokens_per_param or train.flops_budget set")
    if t.batch_tokens:  # a derived batch (0) is checked once budget.resolve_budget has set it
        micro_batch_rows(cfg, world_size)
    if t.steps < 1:
        raise ConfigError(f"train.steps={t.steps} must be at least 1")
    if t.steps > MAX_STEPS:
        raise ConfigError(f"train.steps={t.steps:,} is more than {MAX_STEPS:,}, the most a plan spans (every step's "
                          f"windows are planned at start); to stop a run by time, give train.time_budget_s beside the "
                          f"step count its lr schedule should span")
    if t.log_every < 1:
        raise ConfigError(f"train.log_every={t.log_every} must be at least 1")
    for key in ("val_every", "checkpoint_every", "warmup_steps"):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be >= 0 (0 turns it off / picks the default)")
    if d.packing not in ("greedy", "bestfit", "record28"):
        raise ConfigError(f"data.packing='{d.packing}' must be greedy, bestfit or record28")
    if d.long_docs not in ("split", "crop", "mix"):
        raise ConfigError(f"data.long_docs='{d.long_docs}' must be split, crop or mix")
    if d.long_docs == "mix" and d.packing != "greedy":
        # speedrun-124m and speedrun-latest mix (waves 5 and 7): a user asking for another packing there wants
        # its rows instead
        raise ConfigError(f"data.long_docs=mix works with data.packing=greedy only, not {d.packing}; "
                          f"add --data.packing=greedy, or for {d.packing}'s own rows --data.long_docs=split "
                          f"--data.max_doc_len=0")
    if d.mix_docs < 1:
        raise ConfigError(f"data.mix_docs={d.mix_docs} must be at least 1 (documents open at once), e.g. 1024")
    if d.max_doc_len < 0 or (d.max_doc_len and d.packing != "greedy"):
        raise ConfigError(f"data.max_doc_len={d.max_doc_len} must be >= 0 and works with data.packing=greedy "
                          f"only; leave it at 0 or use --data.packing=greedy")
    if not d.continued_bos and (d.packing != "greedy" or d.long_docs != "split"):
        raise ConfigError("data.continued_bos=false works with data.packing=greedy and data.long_docs=split only "
                          "(best-fit rows put other documents before a continuing piece); set it back to true")
    if d.on_bad_shard not in ("stop", "skip"):
        raise ConfigError(f"data.on_bad_shard='{d.on_bad_shard}' must be stop or skip")
    if d.on_bad_shard == "skip" and (d.packing != "greedy" or d.long_docs == "mix"):
        raise ConfigError("data.on_bad_shard=skip works with data.packing=greedy and data.long_docs split or crop "
                          "only; use one or the other")
    if t.on_nonfinite not in ("abort", "skip", "rollback"):
        raise ConfigError(f"train.on_nonfinite='{t.on_nonfinite}' must be one of abort, skip, rollback")
    if not 0.0 < t.rollback_lr_factor <= 1.0:
        raise ConfigError(f"train.rollback_lr_factor={t.rollback_lr_factor} must lie in (0, 1], e.g. 0.5")
    for key in ("checkpoint_every_min", "keep_checkpoints", "keep_checkpoint_every", "max_rollbacks"):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be >= 0")
    if d.val_seq_len and d.val_seq_len < 2:
        raise ConfigError(f"data.val_seq_len={d.val_seq_len} must be 0 (same as data.seq_len) or at least 2")
    if t.dtype not in ("auto", "bfloat16", "float32"):
        raise ConfigError(f"train.dtype='{t.dtype}' must be auto, bfloat16 or float32")


def _check_schedule(s: ScheduleConfig) -> None:
    if s.window_block < 1:
        raise ConfigError(f"schedule.window_block={s.window_block} must be at least 1 (128 suits FlexAttention)")
    if s.kind == "wsd":
        raise ConfigError("schedule.kind='wsd' is constant_cooldown with a warmup; use --schedule.kind=constant_cooldown "
                          "and --schedule.warmup_frac")
    if s.kind not in ("constant_cooldown", "warmup_cosine"):
        raise ConfigError(f"schedule.kind='{s.kind}' must be one of constant_cooldown, warmup_cosine")
    for key in ("warmup_frac", "cooldown_frac", "final_lr_frac", "short_window_frac"):
        v = getattr(s, key)
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"schedule.{key}={v} must lie in [0, 1]")
    if s.warmup_frac + s.cooldown_frac > 1.0 and s.kind != "warmup_cosine":
        raise ConfigError(f"schedule.warmup_frac + schedule.cooldown_frac = {s.warmup_frac + s.cooldown_frac} > 1")
    if s.window_start < 1 or s.window_end < s.window_start:
        raise ConfigError(f"schedule.window_start={s.window_start}..window_end={s.window_end} must grow and be >= 1")
    if s.window_rule not in ("linear", "record28"):
        raise ConfigError(f"schedule.window_rule='{s.window_rule}' must be linear or record28")


def _check_optim(o: OptimConfig) -> None:
    _check_optim_keys(o)
    # Then every learning rate, decay, eps and clip a finite number >= 0 (a negative lr trained the loss upward to a
    # clean exit; inf passed until step 2's non-finite loss), each beta and momentum in [0, 1) (the checks above
    # have their own words for the keys they know).
    for key, value in vars(o).items():
        if isinstance(value, float):
            if key.endswith(("_lr", "_decay", "_eps", "grad_clip")) and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"optim.{key}={value} must be a finite number >= 0")
            if ("momentum" in key or "beta" in key) and not 0.0 <= value < 1.0:
                raise ConfigError(f"optim.{key}={value} must lie in [0, 1)")


def _check_optim_keys(o: OptimConfig) -> None:
    if o.kind not in ("muon", "adamw"):
        raise ConfigError(f"optim.kind='{o.kind}' must be muon or adamw")
    if o.muon_ortho not in ("newton_schulz", "polar_express"):
        raise ConfigError(f"optim.muon_ortho='{o.muon_ortho}' must be newton_schulz or polar_express")
    if o.muon_ns_steps < 1:
        raise ConfigError(f"optim.muon_ns_steps={o.muon_ns_steps} must be at least 1 (5 is the speedrun's)")
    if o.muon_ortho == "polar_express" and o.muon_ns_steps > 5:
        raise ConfigError(f"optim.muon_ns_steps={o.muon_ns_steps}: Polar Express has coefficients for at most 5 "
                          f"iterations; use --optim.muon_ns_steps=5 or --optim.muon_ortho=newton_schulz")
    if not 0.0 < o.normuon_beta2 < 1.0:
        raise ConfigError(f"optim.normuon_beta2={o.normuon_beta2} must lie in (0, 1), e.g. 0.95")
    if o.adam_every < 1:
        raise ConfigError(f"optim.adam_every={o.adam_every} must be at least 1 (1: Adam steps every step; record #39: 2)")
    if o.muon_weight_decay < 0:
        raise ConfigError(f"optim.muon_weight_decay={o.muon_weight_decay} must be >= 0")
    if o.muon_shape_factor not in ("rows_over_cols", "record28"):
        raise ConfigError(f"optim.muon_shape_factor='{o.muon_shape_factor}' must be rows_over_cols or record28")
    if o.wd_schedule not in ("constant", "lr", "linear"):
        raise ConfigError(f"optim.wd_schedule='{o.wd_schedule}' must be constant, lr or linear")
    if not o.muon_weight_decay:  # an A/B run with a switch that silently does nothing would mislead
        for key, on in (("cautious_wd", o.cautious_wd), ("wd_schedule", o.wd_schedule != "constant")):
            if on:
                raise ConfigError(f"optim.{key}={getattr(o, key)!r} does nothing with optim.muon_weight_decay=0; "
                                  f"set a decay, e.g. --optim.muon_weight_decay=0.036")
