"""Run configuration as data: dataclasses, TOML presets, command-line overrides, validation.

A run is fully described by one resolved `Config`; `save_toml` writes it into the run
directory and `load_toml` of that file reproduces the run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the fix."""


@dataclass
class ModelConfig:
    # Depth knob: when model_dim is 0 the width is derived as depth * aspect_ratio rounded up to a
    # multiple of head_dim, and the head count follows from the width (nanochat's recipe).
    depth: int = 12
    model_dim: int = 768
    head_dim: int = 128
    num_heads: int = 0  # 0: model_dim // head_dim
    num_kv_heads: int = 0  # grouped-query attention: key/value heads, each shared by num_heads / num_kv_heads queries; 0: num_heads
    aspect_ratio: int = 64
    mlp_ratio: float = 4.0
    vocab_size: int = 50257
    vocab_pad_multiple: int = 128  # 50257 -> 50304: tensor-core friendly head matmul
    rope_base: float = 1024.0
    rope_half_truncate: bool = True  # rotate only half the head dims; the rest carry position-free content
    value_embeds: int = 3  # value embeddings shared U-shaped: first k and last k layers; 0 disables
    unet_skips: bool = True
    x0_mixing: bool = True
    attn_free_layers: list[int] = field(default_factory=list)
    window_pattern: str = "L"  # per-layer Long/Short sliding window, repeated to depth
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim)
    attn_gate: bool = False  # sparse per-head sigmoid gate on attention output (record #28)
    attn_gate_dim: int = 12
    logit_softcap: float = 15.0  # 0 disables
    attn_backend: str = "auto"  # auto | sdpa | flex
    doc_masking: bool = True  # attend only within the document (documents start at BOS)
    fp8_head: bool = False  # lm_head in FP8 via torch._scaled_mm (Hopper+), bf16 fallback elsewhere
    # The FP8 head's static weight scale is fp8_head_w_bound / 448: |W| up to the bound is representable.
    # 24 is generous; record #28 uses w_s = 2^-9, i.e. a bound of 448 * 2^-9 = 0.875 (finer steps).
    fp8_head_w_bound: float = 24.0
    # The FP8 head only while training; evaluation and inference use the bf16 head (record #28's
    # CastedLinear takes the FP8 path only when self.training, so its val losses are bf16-head losses).
    fp8_head_train_only: bool = False
    # The unfused FP8 head's weight gradient as an FP8 matmul (e4m3 input x e5m2 gradient, fp32 out), as
    # record #28 computes it; off: a bf16 matmul (no transposed copy of the logit gradient; more precise)
    fp8_head_fp8_wgrad: bool = False
    bf16_embeds: bool = False
    # Softcapped cross-entropy in Triton (CUDA + triton only). With fp8_head, training runs head + loss
    # as one op whose kernel also writes the e5m2 logit gradient (model/fp8_head.py).
    fused_ce: bool = False
    # MLP matmuls (forward and input gradient) in FP8 with dynamic scales (model/fp8_linear.py; Hopper+,
    # bf16 elsewhere).
    fp8_mlp: bool = False
    fp8_attn: bool = False  # likewise for the attention's qkv and output projections
    # The scaling of both (fp8_mlp, fp8_attn): rowwise (one scale per token / output unit) | tensorwise
    # (one per tensor: a token's output then depends on the rest of the batch, so KV-cached decoding
    # no longer equals a full forward).
    fp8_scaling: str = "rowwise"
    # rowwise fp8_mlp: ReLU² with its FP8 casts as one Triton kernel each way (model/kernels/relu2_fp8.py)
    fp8_mlp_fused_act: bool = True
    # Later speedrun records' attention switches (model/attention.py, model/yarn.py; off until an A/B shows a gain):
    # partial key offset (record #49): in long-window layers, the keys' stationary rotary dims come from the
    # previous position (never across a document start), so one layer can do induction
    key_offset: bool = False
    # paired-head attention (record #58): in these layers heads h and h + H/2 attend as one sequence of 2T positions
    paired_head_layers: list[int] = field(default_factory=list)
    # YaRN (record #31): rescale rotary frequencies and the attention scale each time the long window grows
    yarn: bool = False

    # Mixture-of-Experts MLPs, DeepSeek-V3 style (model/moe.py): 0 experts keeps the dense MLP everywhere.
    moe_experts: int = 0  # routed experts per MoE layer
    moe_top_k: int = 2  # routed experts each token uses
    moe_shared_experts: int = 1  # experts every token uses; expert width = dense MLP width / (top_k + shared)
    moe_dense_layers: int = 1  # the first layers keep the dense MLP (DeepSeek-V3 keeps 3 of 61)
    moe_bias_rate: float = 1e-3  # aux-loss-free balancing: the expert bias moves this much per optimizer step

    # Later speedrun records' embedding-side switches (model/embeddings.py, model/gates.py); all off by
    # default, none proven here yet (docs/experiments.md). Record numbers as in shared/REFERENCE.md.
    bigram_vocab_mult: int = 0  # bigram hash embedding of (previous, current) token: rows = this x padded vocab (#62: 5); 0: off
    smear: bool = False  # smear gate: add a gated share of the previous token's embedding (#34)
    value_embed_gates: bool = False  # per-head sigmoid gates on the value embeddings (#55)
    skip_gates: bool = False  # sigmoid gates on the U-net skip connections, read from x0 (#55)
    backout_layer: int = -1  # backout: subtract a learned share of this block's output before the head (#40: 8); -1: off
    logit_rescale: bool = False  # logits 23 sigmoid((z + 5) / 7.5) instead of the symmetric softcap (#54)
    # Embedding tied to the lm_head (the lookup reads the head's rows) for this fraction of training, then
    # untied with the head's weights and Adam state copied (#53: 2/3; 1.0: tied throughout, #51); 0: untied.
    tie_embed_frac: float = 0.0
    value_embed_layers: list[int] = field(default_factory=list)  # one untied value embedding per listed layer (#63); empty: value_embeds' U-shape
    mimetic_vo_beta: float = 0.0  # mimetic V/O init: V = sqrt(b) I, O = -sqrt(b) I per head, plus noise (#64: 0.05); 0: off

    def resolved_dim(self) -> int:
        if self.model_dim:
            return self.model_dim
        return math.ceil(self.depth * self.aspect_ratio / self.head_dim) * self.head_dim

    def resolved_heads(self) -> int:
        return self.num_heads or self.resolved_dim() // self.head_dim

    def resolved_kv_heads(self) -> int:
        return self.num_kv_heads or self.resolved_heads()

    def padded_vocab(self) -> int:
        m = self.vocab_pad_multiple
        return math.ceil(self.vocab_size / m) * m if m > 1 else self.vocab_size


@dataclass
class DataConfig:
    train_files: str = ""  # glob, directory or file of .bin shards; empty: the local Python-source corpus
    val_files: str = ""
    cache_dir: str = ""  # where the default corpus is built; empty: ~/.cache/speedgpt
    local_max_tokens: int = 20_000_000  # cap for the default corpus (0: everything)
    seq_len: int = 1024  # tokens per row
    val_tokens: int = 1_048_576
    val_seq_len: int = 0  # 0: seq_len
    # How documents fill training rows (every row starts at a BOS, no padding): "greedy" in stream order,
    # cropping the document a row end cuts; "bestfit": the largest buffered document that fits whole,
    # cropping one only when none fits (data/bestfit.py; fewer tokens cropped); "record28": record #28's
    # find_batch_starts (a row is the seq_len + 1 tokens from a BOS, the next row starts at the first BOS
    # >= seq_len later, and a step starts at the next shard when < 2 x its tokens + 1 are left in this one).
    packing: str = "greedy"
    # A shard found corrupt or truncated during training: "stop" the run (error naming file and
    # offset) or "skip" it (logged, counted in metrics as bad_shards; exact resume still holds).
    on_bad_shard: str = "stop"

    def cache_root(self) -> Path:
        """Where built corpora and downloaded eval data live (read at call time, never at import)."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path.home() / ".cache" / "speedgpt"

    def default_corpus_dir(self) -> Path:
        """The local Python-source corpus used when no data.train_files is given."""
        return self.cache_root() / (f"local-python-{self.local_max_tokens}" if self.local_max_tokens
                                    else "local-python-all")


@dataclass
class OptimConfig:
    muon_lr: float = 0.05
    muon_momentum: float = 0.95
    muon_momentum_start: float = 0.85
    muon_momentum_warmup_steps: int = 300
    muon_nesterov: bool = True
    muon_ns_steps: int = 5  # orthogonalization iterations (at most 5 with polar_express)
    muon_weight_decay: float = 0.0  # decoupled: p <- p - lr * wd * p each step
    # How Muon orthogonalizes: "newton_schulz" repeats one quintic whose singular values end in
    # ~[0.7, 1.2]; "polar_express" (Amsel et al. 2025; speedrun record 2025-09-29) uses a different,
    # minimax-optimal quintic per iteration and ends in ~[0.86, 1.14] for the same five matmul rounds.
    muon_ortho: str = "newton_schulz"
    # NorMuon (Li et al. 2025; speedrun records from 2025-10): orthogonalized updates still give some
    # output units (rows) much larger steps than others; keep an EMA of each row's mean squared update,
    # divide rows by its root, then restore the matrix's Frobenius norm so muon_lr keeps its meaning.
    normuon: bool = False
    normuon_beta2: float = 0.95  # EMA factor of the per-row second moment (the paper's default)
    # Cautious weight decay (Chen et al. 2025; speedrun records 2025-10-28, 2025-11-10): decay Muon's
    # matrices only where the parameter and its update have the same sign (the step already moves
    # them towards zero), so the decay never fights the update. Needs muon_weight_decay > 0.
    cautious_wd: bool = False
    # Muon's weight decay over training: "constant", or "lr": multiplied by the lr schedule's
    # multiplier, so it shrinks in the cooldown with the lr (the 2025-11-10 record's finding; its
    # decay per step is then lr * wd * multiplier, quadratic in the schedule), or "linear": falling
    # linearly from muon_weight_decay at step 0 to zero at the last step (nanochat's depth ladder).
    wd_schedule: str = "constant"
    embed_lr: float = 0.3
    value_embed_lr: float = 0.3
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    adam_beta1: float = 0.8
    adam_beta2: float = 0.95
    adam_eps: float = 1e-10
    adam_weight_decay: float = 0.0
    # Adam's parameters step every N optimizer steps, on the sum of the N steps' gradients (record #39: 2,
    # Muon still every step); 1: every step
    adam_every: int = 1
    grad_clip: float = 0.0  # global-norm clipping; 0 disables
    # Muon's per-matrix lr factor max(1, rows/cols)^0.5: "rows_over_cols" on this model's (out, in)
    # layout; "record28" on record #28's layout, which stores the MLP input weight as (in, out): factor
    # 1 there instead of 2 (every other matrix is the same in both).
    muon_shape_factor: str = "rows_over_cols"
    # Newton-Schulz lines as fused multiply-adds (addmm/baddbmm, one rounding each), as record #28 and
    # torch.optim.Muon compute them; off: separate bf16 multiplies and adds.
    muon_ns_fused: bool = False
    # Depth-knob learning-rate scaling: Adam lrs scale with (768 / model_dim) ** 0.5 when on.
    scale_lr_by_width: bool = False
    # The width the lrs and Muon weight decay were tuned at (0: off). The budget resolution (budget.py)
    # scales Adam lrs by (tuned_width / width) ** 0.5 and muon_weight_decay by (tuned_width / width) ** 2,
    # writes the scaled values into the run's config and sets this back to 0.
    tuned_width: int = 0
    # Which optimizers: "muon" (Muon for hidden matrices, Adam for the rest: the speedrun's) or
    # "adamw" (one AdamW for every parameter, the large-model recipe: optim.adamw_lr for all,
    # betas optim.adam_beta1/adam_beta2, decoupled decay optim.adamw_weight_decay on matrices only).
    kind: str = "muon"
    adamw_lr: float = 3e-4
    adamw_weight_decay: float = 0.1
    # Adam lrs of the later records' parameters (used only when their switch is on): the record's
    # base lr 0.008 x its lr_mul (bigram table 75, smear gate 0.01, skip gate 0.05, value-embedding gates 1).
    bigram_embed_lr: float = 0.6
    smear_gate_lr: float = 8e-5
    skip_gate_lr: float = 4e-4
    value_embed_gate_lr: float = 0.008


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
    # Longest document piece in a row (greedy packing): each document is cut to at most this many tokens
    # and its tail skipped, as the later records' max_doc_len / train_max_seq_len; 0: no cap.
    max_doc_len: int = 0
    window_long: int = 0  # long attention window in tokens for the whole stage; 0: the schedule's windows
    window_short: int = 0  # short window in tokens; 0: schedule.short_window_frac of window_long
    # Multi-token prediction: weight k scores the token k + 1 ahead (weight 0 is next-token, always 1).
    # [1.0] (or []) is plain next-token training. mtp_weights_end (same length) ramps linearly to it.
    mtp_weights: list[float] = field(default_factory=list)
    mtp_weights_end: list[float] = field(default_factory=list)
    lr_mul: float = 1.0  # multiplies every learning rate in this stage, on top of the lr schedule


@dataclass
class TrainConfig:
    steps: int = 1000  # ignored when tokens_per_param or flops_budget sets the horizon
    batch_tokens: int = 524_288  # global tokens per optimizer step; 0: derived from the horizon (budget.py)
    # The horizon as a budget (0: off; at most one of the two): training tokens = tokens_per_param x scaling
    # parameters (transformer matrices + lm_head), or flops_budget / training FLOPs per token; steps follow.
    tokens_per_param: float = 0.0
    flops_budget: float = 0.0
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
    # Inductor tunes the launch configs of its generated kernels (norms, pointwise, reductions) by
    # coordinate descent: slower cold compile, faster steps where those kernels matter.
    coordinate_descent_tuning: bool = False
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


# ---------------------------------------------------------------------------------------------
# Building from dicts, with type checks that name the key.

def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check `value` against the field type; accept ints for floats. Raise ConfigError naming key."""
    origin = typing.get_origin(typ)
    if dataclasses.is_dataclass(typ):  # a table of keys (a row of train.stages)
        if isinstance(value, typ):
            value = dataclasses.asdict(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table of keys ({', '.join(_field_types(typ))}), got {value!r}")
        types_ = _field_types(typ)
        unknown = [k for k in value if k not in types_]
        if unknown:
            raise ConfigError(f"unknown config key '{key}.{unknown[0]}'; known keys: {', '.join(types_)}")
        return typ(**{k: _coerce(f"{key}.{k}", v, types_[k]) for k, v in value.items()})
    if origin is list:
        (item_t,) = typing.get_args(typ)
        if not isinstance(value, list):
            example = "[{share=0.5}, {share=0.5}]" if dataclasses.is_dataclass(item_t) else "[1,2]"
            raise ConfigError(f"{key}: expected a list of {item_t.__name__}, got {value!r}; write e.g. {key}={example}")
        return [_coerce(f"{key}[{i}]", v, item_t) for i, v in enumerate(value)]
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
    name = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{key}: expected {name}, got {value!r} ({type(value).__name__}); fix the value of {key}")


# Keys renamed since runs were first saved: old config.toml files (and overrides) still load.
RENAMED_KEYS = {"model.fp8_mlp_scaling": "model.fp8_scaling"}


def config_from_dict(data: dict[str, Any], base: Config | None = None) -> Config:
    cfg = copy.deepcopy(base) if base is not None else Config()
    for section, values in data.items():
        if section == "preset":
            cfg.preset = str(values)
            continue
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section '{section}'; known sections: {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"'{section}' must be a table of keys, got {values!r}")
        obj = getattr(cfg, section)
        types_ = _field_types(type(obj))
        for key, value in values.items():
            full = RENAMED_KEYS.get(f"{section}.{key}", f"{section}.{key}")
            key = full.split(".", 1)[1]
            if key not in types_:
                close = ", ".join(k for k in types_ if k[:3] == key[:3]) or ", ".join(types_)
                raise ConfigError(f"unknown config key '{full}'; did you mean one of: {close}")
            setattr(obj, key, _coerce(full, value, types_[key]))
    return cfg


def config_from_plain(d: dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (e.g. one sent to another process)."""
    out = Config(preset=d.get("preset", ""))
    for section, cls in SECTIONS.items():
        types_ = _field_types(cls)
        setattr(out, section, cls(**{k: (_coerce(f"{section}.{k}", v, types_[k]) if isinstance(v, list) else v)
                                     for k, v in d.get(section, {}).items()}))
    return out


# ---------------------------------------------------------------------------------------------
# Presets, files and overrides.

def preset_names() -> list[str]:
    root = resources.files("speedgpt") / "presets"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_preset(name: str) -> Config:
    path = resources.files("speedgpt") / "presets" / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown preset '{name}'; available presets: {', '.join(preset_names())}")
    data = tomllib.loads(path.read_text())
    data.setdefault("preset", name)
    return config_from_dict(data)


def load_toml(path: str | Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    return config_from_dict(data)


def _parse_value(text: str) -> Any:
    """Parse an override's value as a TOML value; bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.key=value` overrides (leading dashes optional), e.g. `--model.depth=8`."""
    nested: dict[str, dict[str, Any]] = {}
    for item in overrides:
        text = item.lstrip("-")
        if "=" not in text or "." not in text.split("=", 1)[0]:
            raise ConfigError(f"override '{item}' must look like --section.key=value, e.g. --model.depth=8")
        key, raw = text.split("=", 1)
        section, name = key.split(".", 1)
        nested.setdefault(section, {})[name] = _parse_value(raw)
    return config_from_dict(nested, base=cfg)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(cfg: Config) -> str:
    d = cfg.to_dict()
    lines = [f"preset = {_toml_value(d.pop('preset'))}"]
    for section, values in d.items():
        lines.append(f"\n[{section}]")
        tables = {k: v for k, v in values.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if k not in tables]
        for k, rows in tables.items():  # arrays of tables (train.stages) after the section's plain keys
            for row in rows:
                lines.append(f"\n[[{section}.{k}]]")
                lines += [f"{rk} = {_toml_value(rv)}" for rk, rv in row.items()]
    return "\n".join(lines) + "\n"


def save_toml(cfg: Config, path: str | Path) -> None:
    from .atomic import atomic_write

    atomic_write(path, to_toml(cfg))


# ---------------------------------------------------------------------------------------------
# Validation: one line per problem, naming the key and the fix.

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


def validate(cfg: Config, world_size: int = 1) -> None:
    """Raise ConfigError for the first inconsistent value, section by section."""
    _check_model(cfg.model)
    _check_data_and_batch(cfg, world_size)
    _check_schedule(cfg.schedule)
    _check_optim(cfg.optim)
    _check_parallel(cfg.parallel, cfg.train)
    from .stages import check_stages  # (stages.py builds on this module)

    check_stages(cfg, world_size)


def _check_parallel(par: ParallelConfig, t: TrainConfig) -> None:
    if t.compile_scope not in ("model", "block"):
        raise ConfigError(f"train.compile_scope='{t.compile_scope}' must be model or block")
    if t.checkpoint_format not in ("full", "dcp", "dcp_async"):
        raise ConfigError(f"train.checkpoint_format='{t.checkpoint_format}' must be full, dcp or dcp_async")
    if par.strategy not in ("ddp", "fsdp", "auto"):
        raise ConfigError(f"parallel.strategy='{par.strategy}' must be ddp, fsdp or auto")
    if par.memory_limit_gib < 0:
        raise ConfigError(f"parallel.memory_limit_gib={par.memory_limit_gib} must be >= 0 (0: the GPU's own memory)")


def _check_model(m: ModelConfig) -> None:
    dim = m.resolved_dim()
    if m.depth < 1:
        raise ConfigError(f"model.depth={m.depth} must be at least 1")
    if dim % m.resolved_heads():
        raise ConfigError(f"model.num_heads={m.resolved_heads()} does not divide model.model_dim={dim}; "
                          f"choose heads that divide the width")
    if m.num_heads and m.num_heads * m.head_dim != dim:
        raise ConfigError(f"model.num_heads={m.num_heads} x model.head_dim={m.head_dim} != model.model_dim={dim}; "
                          f"set model.head_dim={dim // m.num_heads}")
    if m.num_kv_heads < 0 or m.resolved_heads() % m.resolved_kv_heads():
        raise ConfigError(f"model.num_kv_heads={m.num_kv_heads} must divide the {m.resolved_heads()} query heads "
                          f"(0: as many as query heads)")
    if m.moe_experts < 0 or (m.moe_experts and not 1 <= m.moe_top_k <= m.moe_experts):
        raise ConfigError(f"model.moe_top_k={m.moe_top_k} must lie in 1..model.moe_experts={m.moe_experts}")
    if m.moe_experts and (m.moe_shared_experts < 0 or not 0 <= m.moe_dense_layers < m.depth):
        raise ConfigError(f"model.moe_dense_layers={m.moe_dense_layers} must leave at least one of the {m.depth} "
                          f"layers for experts, and model.moe_shared_experts={m.moe_shared_experts} must be >= 0")
    if m.head_dim % 4:
        raise ConfigError(f"model.head_dim={m.head_dim} must be a multiple of 4 for rotary embeddings")
    if not m.value_embed_layers and m.value_embeds * 2 > m.depth:
        raise ConfigError(f"model.value_embeds={m.value_embeds} needs depth >= {2 * m.value_embeds} "
                          f"(they are used by the first and last layers); lower it or raise model.depth")
    if m.attn_backend not in ("auto", "sdpa", "flex"):
        raise ConfigError(f"model.attn_backend='{m.attn_backend}' must be one of auto, sdpa, flex")
    if m.fp8_scaling not in ("rowwise", "tensorwise"):
        raise ConfigError(f"model.fp8_scaling='{m.fp8_scaling}' must be rowwise or tensorwise")
    if set(m.window_pattern) - {"L", "S"} or not m.window_pattern:
        raise ConfigError(f"model.window_pattern='{m.window_pattern}' must be letters L (long) and S (short)")
    bad = [i for i in m.attn_free_layers if not 0 <= i < m.depth]
    if bad:
        raise ConfigError(f"model.attn_free_layers={m.attn_free_layers} has layers outside 0..{m.depth - 1}")
    if m.attn_gate and m.attn_gate_dim > dim:
        raise ConfigError(f"model.attn_gate_dim={m.attn_gate_dim} exceeds model_dim={dim}")
    bad = [i for i in m.paired_head_layers if not 0 <= i < m.depth or i in m.attn_free_layers]
    if bad:
        raise ConfigError(f"model.paired_head_layers={m.paired_head_layers}: layers {bad} are outside 0..{m.depth - 1} "
                          f"or attention-free")
    if m.paired_head_layers and (m.resolved_heads() % 2 or m.resolved_kv_heads() != m.resolved_heads()):
        raise ConfigError(f"model.paired_head_layers needs an even number of heads (have {m.resolved_heads()}) and "
                          f"model.num_kv_heads=0 (no grouped-query attention)")
    if m.key_offset and not m.rope_half_truncate:
        raise ConfigError("model.key_offset shifts the stationary rotary dims, which only half-truncated rotary has; "
                          "set model.rope_half_truncate=true")
    if m.fp8_head_w_bound <= 0:
        raise ConfigError(f"model.fp8_head_w_bound={m.fp8_head_w_bound} must be > 0 (record #28: 0.875)")
    _check_later_records(m)


def _check_later_records(m: ModelConfig) -> None:
    """The later records' switches (bigram hash, gates, backout, tying, untied value embeddings)."""
    dim = m.resolved_dim()
    if m.bigram_vocab_mult < 0:
        raise ConfigError(f"model.bigram_vocab_mult={m.bigram_vocab_mult} must be >= 0 (record #62: 5; 0: off)")
    if not -1 <= m.backout_layer < m.depth:
        raise ConfigError(f"model.backout_layer={m.backout_layer} must be a block index 0..{m.depth - 1} "
                          f"(record #40: 8 of 12), or -1 (off)")
    if not 0.0 <= m.tie_embed_frac <= 1.0:
        raise ConfigError(f"model.tie_embed_frac={m.tie_embed_frac} must lie in [0, 1] (record #53: 0.667; 0: untied)")
    layers = m.value_embed_layers
    if layers and (len(set(layers)) != len(layers) or not all(0 <= i < m.depth for i in layers)):
        raise ConfigError(f"model.value_embed_layers={layers} must list distinct layers in 0..{m.depth - 1}")
    if (m.smear or m.value_embed_gates or m.skip_gates) and m.attn_gate_dim > dim:
        raise ConfigError(f"model.attn_gate_dim={m.attn_gate_dim} (the gates' input channels) exceeds model_dim={dim}")
    if m.mimetic_vo_beta < 0 or (m.mimetic_vo_beta and (m.resolved_kv_heads() != m.resolved_heads()
                                                        or m.resolved_heads() * m.head_dim != dim)):
        raise ConfigError(f"model.mimetic_vo_beta={m.mimetic_vo_beta} must be >= 0, and > 0 needs square per-head "
                          f"V and O blocks: num_heads x head_dim == model_dim and no grouped-query attention")


def _check_data_and_batch(cfg: Config, world_size: int) -> None:
    d, t = cfg.data, cfg.train
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
    if t.log_every < 1:
        raise ConfigError(f"train.log_every={t.log_every} must be at least 1")
    for key in ("val_every", "checkpoint_every", "warmup_steps"):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be >= 0 (0 turns it off / picks the default)")
    if d.packing not in ("greedy", "bestfit", "record28"):
        raise ConfigError(f"data.packing='{d.packing}' must be greedy, bestfit or record28")
    if d.on_bad_shard not in ("stop", "skip"):
        raise ConfigError(f"data.on_bad_shard='{d.on_bad_shard}' must be stop or skip")
    if d.on_bad_shard == "skip" and d.packing != "greedy":
        raise ConfigError("data.on_bad_shard=skip works with data.packing=greedy only; use one or the other")
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


def resolve(preset: str | None = None, config_file: str | None = None, overrides: list[str] | None = None) -> Config:
    """Build a Config from a preset or a saved config file, then overrides."""
    if config_file:
        cfg = load_toml(config_file)
    else:
        cfg = load_preset(preset or "tiny-cpu")
    return apply_overrides(cfg, overrides or [])

