"""One line per config key, for `speedgpt config` (the one place config keys are described).

tests/test_config_docs.py fails when a key of a config dataclass has no line here: a new key in
speedgpt/config/ needs its description added in the same change.
"""

from __future__ import annotations

DESCRIPTIONS: dict[str, str] = {
    # model
    "model.depth": "transformer blocks; with model_dim=0 the width is derived from it (depth * aspect_ratio)",
    "model.model_dim": "residual width; 0: depth * aspect_ratio rounded up to a multiple of head_dim",
    "model.head_dim": "width of one attention head",
    "model.num_heads": "attention heads; 0: model_dim // head_dim",
    "model.num_kv_heads": "grouped-query attention: key/value heads, each shared by num_heads / num_kv_heads query heads; 0: num_heads",
    "model.aspect_ratio": "width per block of depth when model_dim=0 (nanochat's depth knob)",
    "model.mlp_ratio": "MLP hidden width as a multiple of model_dim",
    "model.vocab_size": "tokenizer vocabulary (GPT-2: 50257); train sets it from shards that record their tokenizer",
    "model.bos_id": "id of the document separator that starts every document (GPT-2: 50256); train sets it from the shards",
    "model.vocab_pad_multiple": "pad the embedding/head rows to a multiple of this (50257 -> 50304) for fast matmuls",
    "model.rope_base": "rotary embedding base frequency",
    "model.rope_half_truncate": "rotate only half the head dims; the rest carry position-free content",
    "model.value_embeds": "value embeddings shared U-shaped by the first and last k layers; 0 disables",
    "model.unet_skips": "U-net skip connections from early to late blocks",
    "model.x0_mixing": "mix the initial embedding x0 into every block's input with learned scalars",
    "model.attn_free_layers": "indices of blocks without attention (MLP only)",
    "model.window_pattern": "per-layer Long/Short sliding attention window, repeated to depth (e.g. SSSL)",
    "model.attn_scale": "attention logit scale; 0: 1/sqrt(head_dim)",
    "model.attn_gate": "sparse per-head sigmoid gate on the attention output (speedrun record #28)",
    "model.attn_gate_dim": "input channels the attention gate reads (and the smear, skip and value-embedding gates)",
    "model.logit_softcap": "cap logits smoothly at +-this value (tanh); 0 disables",
    "model.attn_backend": "auto (flex on a CUDA GPU of capability >= 8, else sdpa) | sdpa (dense masks) | flex "
                          "(block-sparse FlexAttention; trains on CUDA only)",
    "model.doc_masking": "attend only within a document (documents start at BOS)",
    "model.fp8_head": "lm_head in FP8 (CUDA capability >= 8.9); elsewhere it runs in the model's dtype",
    "model.fp8_head_w_bound": "FP8 head weight scale = bound / 448 (|W| up to it representable); record #28: 0.875",
    "model.fp8_head_train_only": "FP8 head only in training; evaluation uses the bf16 head (record #28)",
    "model.fp8_head_fp8_wgrad": "unfused FP8 head: weight gradient as an FP8 matmul, fp32 out (record #28); off: bf16",
    "model.bf16_embeds": "keep the embeddings in bfloat16",
    "model.fused_ce": "softcapped cross-entropy as a Triton kernel (CUDA + Triton); elsewhere the PyTorch loss",
    "model.fused_mtp": "with fused_ce: multi-token prediction and logit_rescale through the fused loss too (with "
                       "fp8_head: the fused head + loss op); false: their unfused paths (torch MTP loss over fp32 "
                       "logits, unfused FP8 head)",
    "model.fp8_mlp": "MLP matmuls in FP8 with dynamic scales (CUDA capability >= 8.9); elsewhere the model's dtype",
    "model.fp8_scaling": "the scaling of fp8_mlp and fp8_attn: rowwise (one scale per token / output unit) | tensorwise (one per tensor)",
    "model.fp8_attn": "attention qkv and output projections in FP8, like fp8_mlp",
    "model.fp8_mlp_fused_act": "with rowwise fp8_mlp: ReLU^2 and its FP8 casts as one Triton kernel each way",
    "model.key_offset": "partial key offset (record #49): long-window layers' keys take their stationary rotary dims from "
                        "the previous position (not across a document start); awaits an A/B",
    "model.paired_head_layers": "paired-head attention (record #58) in these layers: heads h and h + H/2 attend as one "
                                "sequence of 2T positions (windows count its positions); awaits an A/B",
    "model.yarn": "YaRN (record #31): rescale rotary frequencies and the attention scale at each growth of the long "
                  "window, in training, validation and eval; awaits an A/B",
    "model.moe_experts": "Mixture-of-Experts: routed experts per MoE layer (DeepSeek-V3 style); 0: dense MLPs everywhere",
    "model.moe_top_k": "routed experts each token uses (sigmoid affinities, top-k)",
    "model.moe_shared_experts": "experts every token uses; expert width = dense MLP width / (top_k + shared)",
    "model.moe_dense_layers": "the first this many layers keep the dense MLP",
    "model.moe_bias_rate": "aux-loss-free balancing: each expert's routing bias moves this much per optimizer step",
    # the later records' switches: off by default, none proven here yet (docs/experiments.md)
    "model.bigram_vocab_mult": "bigram hash embedding (record #62): a zero-initialized table of this x padded-vocab rows, "
                               "indexed by a hash of (previous, current) token, added to every block's input through "
                               "per-layer scalars (init 0.1); 0: off (record: 5)",
    "model.smear": "smear gate (record #34): each embedding gains lambda * sigmoid(w . e[:attn_gate_dim]) x the previous "
                   "token's embedding; lambda and w start at zero",
    "model.value_embed_gates": "per-head gates 2 sigmoid(w . x[:attn_gate_dim]) on the value embeddings (record #55); 1 at init",
    "model.skip_gates": "gates 2 sigmoid(w . x0[:attn_gate_dim]) on the U-net skip connections (record #55); 1 at init",
    "model.backout_layer": "backout (record #40): subtract lambda (init 0.5) x this block's output before the final norm; "
                           "-1: off (record: 8 of 12)",
    "model.logit_rescale": "logits 23 sigmoid((z + 5) / 7.5) instead of the symmetric softcap (record #54); the fused "
                           "loss takes it as a softcap of 11.5 on (z + 5) * 11.5 / 15",
    "model.tie_embed_frac": "embedding tied to the lm_head (lookup reads its rows; head init N(0, 0.005^2)) for this "
                            "fraction of the steps, then untied with weights and Adam state copied (record #53: 2/3, "
                            "its embedding lr after: 0.008; 1: tied throughout, record #51); 0: untied. With "
                            "optim.adam_every > 1 the untie moves back to the first step of its Adam window",
    "model.value_embed_layers": "one untied value embedding for each listed layer (record #63: first 2 and last 3 of "
                                "its 11); empty: value_embeds shared U-shaped",
    "model.mimetic_vo_beta": "mimetic init (record #64): V = sqrt(beta) I and O = -sqrt(beta) I per head, plus "
                             "N(0, 0.01^2); 0: off (record: 0.05)",
    # data
    "data.train_files": "glob, directory or file of .bin shards; empty: the local Python-source corpus",
    "data.val_files": "val shards; empty: the val_*.bin next to train_files",
    "data.tokenizer": "the shards' tokenizer folder; empty: tokenizer/ next to the shards, GPT-2 for shards that record none",
    "data.cache_dir": "where the default corpus and downloaded eval data live; empty: ~/.cache/speedgpt",
    "data.local_max_tokens": "token cap of the default local Python-source corpus (0: every file)",
    "data.local_piece_chars": "documents of the default corpus: 0 = whole files; N = pieces of about N characters cut "
                              "at top-level statements and shuffled (seeded), so a small step holds many files; "
                              "val takes whole files",
    "data.seq_len": "tokens per training row",
    "data.val_tokens": "tokens scored at each validation (capped at what the val shards hold)",
    "data.val_seq_len": "tokens per validation row; 0: seq_len",
    "data.on_bad_shard": "a shard found corrupt or truncated mid-run: stop (error naming file and byte) | skip it "
                         "(counted as bad_shards; greedy packing only)",
    "data.packing": "how documents fill rows: greedy (stream order) | bestfit (largest that fits) | record28 (record #28's rows and shard changes)",
    "data.long_docs": "tokens a row cannot take whole (a document past a stage's max_doc_len, or cut by the row's end): split (further pieces behind a BOS) | crop (skipped, as the records do) | mix (rows of the next pieces of mix_docs open documents in a seeded random order; greedy packing)",
    "data.mix_docs": "long_docs=mix: documents open at once; a row holds pieces of up to this many",
    "data.max_doc_len": "longest document piece in a row where the stage table sets none (0: no cap; greedy packing)",
    "data.shuffle_first_epoch": "the first epoch reads documents in a seeded shuffled order too; false: in shard order (the records')",
    "data.continued_bos": "greedy + split: a piece continuing a document starts with a BOS (its own document for the masks); false: none",
    # optim
    "optim.muon_lr": "Muon learning rate for the hidden matrices",
    "optim.muon_momentum": "Muon momentum after its warmup",
    "optim.muon_momentum_start": "Muon momentum at step 0",
    "optim.muon_momentum_warmup_steps": "steps to ramp Muon momentum from start to final",
    "optim.muon_nesterov": "Nesterov momentum in Muon",
    "optim.muon_ns_steps": "orthogonalization iterations (at most 5 with polar_express)",
    "optim.muon_weight_decay": "decoupled weight decay of Muon's matrices: p <- p - lr * wd * p each step",
    "optim.muon_ortho": "newton_schulz (one quintic) | polar_express (a minimax-optimal quintic per iteration)",
    "optim.normuon": "NorMuon: divide update rows by the root of their EMA mean square, keep the matrix norm",
    "optim.normuon_beta2": "EMA factor of NorMuon's per-row second moment",
    "optim.cautious_wd": "decay only where parameter and update share a sign (needs muon_weight_decay > 0)",
    "optim.wd_schedule": "constant | lr (Muon's weight decay follows the lr schedule's multiplier)",
    "optim.embed_lr": "Adam learning rate of the token embedding",
    "optim.value_embed_lr": "Adam learning rate of the value embeddings",
    "optim.head_lr": "Adam learning rate of the lm_head",
    "optim.scalar_lr": "Adam learning rate of the scalar parameters (mixing, gates)",
    "optim.router_lr": "Adam learning rate of the MoE routers (a step moves a logit by up to ~0.8 x router_lr x width)",
    "optim.adam_beta1": "Adam beta1",
    "optim.adam_beta2": "Adam beta2",
    "optim.adam_eps": "Adam epsilon",
    "optim.adam_weight_decay": "Adam decoupled weight decay",
    "optim.adam_every": "Adam's parameters step every N optimizer steps on the sum of the N steps' gradients (record "
                        "#39: 2; Muon still steps every step); 1: every step; N > 1 awaits an A/B. On several ranks "
                        "(ddp) Adam's gradients are reduced on its steps only, unless optim.grad_clip or "
                        "train.on_nonfinite=skip reads them every step",
    "optim.grad_clip": "global gradient-norm clipping threshold; 0 disables",
    "optim.scale_lr_by_width": "scale Adam lrs by (768 / model_dim) ** 0.5 (depth-knob models)",
    "optim.muon_shape_factor": "Muon lr factor max(1, rows/cols)^0.5 on: rows_over_cols (this layout) | record28 (its layout)",
    "optim.muon_ns_fused": "Newton-Schulz lines as fused multiply-adds (addmm/baddbmm), as record #28",
    "optim.tuned_width": "width the lrs and Muon decay were tuned at; the budget rescales them to this model (0: off)",
    "optim.kind": "muon (Muon for hidden matrices, Adam for the rest) | adamw (one AdamW for everything: the large-model recipe)",
    "optim.adamw_lr": "optim.kind=adamw: the learning rate of every parameter",
    "optim.adamw_weight_decay": "optim.kind=adamw: decoupled weight decay of the matrices (hidden and head; not embeddings or scalars)",
    "optim.bigram_embed_lr": "Adam lr of the bigram hash table (model.bigram_vocab_mult; record #62: 0.008 x 75)",
    "optim.smear_gate_lr": "Adam lr of the smear gate's weights (model.smear; records #53+: 0.008 x 0.01)",
    "optim.skip_gate_lr": "Adam lr of the skip gates' weights (model.skip_gates; record #55: 0.008 x 0.05)",
    "optim.value_embed_gate_lr": "Adam lr of the value-embedding gates (model.value_embed_gates; record #55: 0.008)",
    # schedule
    "schedule.kind": "lr schedule: constant_cooldown (with warmup_frac: WSD) | warmup_cosine",
    "schedule.warmup_frac": "fraction of steps for linear lr warmup",
    "schedule.cooldown_frac": "fraction of steps at the end for the lr cooldown",
    "schedule.final_lr_frac": "lr at the end of the cooldown, as a fraction of the peak",
    "schedule.window_start": "sliding attention window at step 0, in tokens (rounded to window_block)",
    "schedule.window_end": "sliding attention window at the last step, in tokens (grown linearly)",
    "schedule.window_block": "attention window granularity (FlexAttention block size)",
    "schedule.short_window_frac": "short ('S') layers' window as a fraction of the long one",
    "schedule.window_rule": "long-window growth: linear (round) | record28 (ceil(x (end - block/2) / block) blocks)",
    # train
    "train.steps": "optimizer steps: the horizon unless a budget (tokens_per_param, flops_budget) sets it; "
                   "--train.steps=N over a budget makes it the horizon again (train.horizon=steps)",
    "train.batch_tokens": "global tokens per optimizer step (the same on any number of GPUs); 0: derived from the budget",
    "train.tokens_per_param": "horizon as training tokens per scaling parameter; steps follow (0: off)",
    "train.flops_budget": "horizon as training FLOPs; steps follow (0: off; at most one of the two budgets)",
    "train.horizon": "what sets the horizon: auto (a budget when one is set, else steps) | steps (train.steps; a "
                     "budget then only derives a batch of 0); --train.steps=N over a budget writes steps",
    "train.micro_batch_size": "rows per micro-step per rank; 0: the largest that fits batch_tokens in one go",
    "train.val_every": "validate every this many steps (and at the end)",
    "train.log_every": "log the train loss every this many steps",
    "train.checkpoint_every": "checkpoint every this many steps; 0: only by time (checkpoint_every_min) and at the end",
    "train.checkpoint_every_min": "also checkpoint after this many minutes of wall-clock time since the last one; 0: off",
    "train.keep_checkpoint_every": "also keep, for good, every checkpoint whose step is a multiple of this; 0: none",
    "train.on_nonfinite": "a non-finite loss/gradient: abort (name step, rank, last good checkpoint) | skip the "
                          "step's update | rollback to the newest checkpoint with a lower lr",
    "train.rollback_lr_factor": "on_nonfinite=rollback: multiply every lr by this after each rollback",
    "train.max_rollbacks": "on_nonfinite=rollback: roll back at most this many times, then abort",
    "train.save_final_checkpoint": "write a checkpoint at the end (false: A/B runs that only need their curves)",
    "train.checkpoint_format": "full (rank 0 writes whole tensors) | dcp (every rank writes its shards, torch.distributed.checkpoint) | dcp_async (dcp in the background)",
    "train.keep_checkpoints": "checkpoints kept on disk: the newest this many (older ones are deleted, but for "
                              "keep_checkpoint_every's); 0: keep all",
    "train.seed": "seed of the model init and the data order",
    "train.device": "auto | cpu | cuda | cuda:N | mps",
    "train.dtype": "auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float32",
    "train.compile": "torch.compile the model",
    "train.compile_scope": "what train.compile compiles under ddp: model (one graph) | block (each block: reductions start inside the backward); fsdp: always block",
    "train.compile_precompile": "dynamo's traced code kept in train.compile_cache too (torch's experimental caching "
                                "precompile): a fresh machine's start from the artifacts traces nothing (speedrun-latest "
                                "on an H100: 14.2 s compile + warmup); compile_scope=model with the inductor backend; off, "
                                "with one line, under fsdp, below torch 2.11 or without a compile cache",
    "train.compile_validation_ahead": "the validation graph compiled in a helper process while the run compiles "
                                      "training's, on a cold start: auto (one CUDA process, twice the memory estimate "
                                      "free on its GPU) | on (CPU too) | off",
    "train.compile_backend": "who compiles the graphs: inductor (fused kernels) | aot_eager | eager (no codegen: "
                             "fast start, slow steps; graph counting)",
    "train.compile_mode": "torch.compile's mode (Inductor): default | reduce-overhead (CUDA graphs: one launch a "
                          "compiled forward or backward) | max-autotune (CUDA graphs and kernel autotuning) | "
                          "max-autotune-no-cudagraphs",
    "train.compile_cache": "folder that keeps compiled code for the next run (same GPU, versions and FP8 code; "
                           "AOTAutograd's cache then keeps the FP8 graphs too); empty: "
                           "$XDG_CACHE_HOME/speedgpt/compile; off: none",
    "train.coordinate_descent_tuning": "Inductor tunes its kernels' launch configs: slower compile, faster steps",
    "train.autotune_pointwise": "Inductor compiles several launch configs per pointwise kernel and keeps the "
                                "fastest; false: one (fewer kernels to compile cold)",
    "train.persistent_reductions_upto": "keep reduction rows up to this many elements in registers; 0: Inductor's choice",
    "train.warmup_steps": "compile warmup on real data, then an exact state reset: this many steps spread over the run "
                          "(each later stage's first step added) and one validation batch of each shape; 0: none",
    "train.time_budget_s": "stop early (final eval and checkpoint) after this much training time; 0: no limit",
    "train.peak_flops": "bf16 peak FLOP/s for MFU; 0: the device's table value",
    "train.stages": "training stages ([[train.stages]] tables, speedgpt/stages.py): spans of the run with their own "
                    "batch, row length, windows, MTP weights and lr; empty: one stage of the keys above",
    # one row of train.stages
    "train.stages.share": "the stage's share of train.steps (> 0; the shares add up to 1)",
    "train.stages.batch_tokens": "global tokens per optimizer step in the stage; 0: train.batch_tokens. A micro-step "
                                 "holds at most train.micro_batch_size x data.seq_len tokens (all rows when 0)",
    "train.stages.seq_len": "tokens per training row in the stage, which also bounds how much of one document a row "
                            "holds; 0: data.seq_len",
    "train.stages.max_doc_len": "longest document piece in the stage's rows: the rest goes on as further pieces "
                                "(split, mix) or is skipped (crop: the records' max_doc_len); greedy packing; "
                                "0: data.max_doc_len",
    "train.stages.window_long": "long attention window (tokens, a multiple of schedule.window_block) for the whole "
                                "stage; 0: the window schedule's",
    "train.stages.window_short": "short attention window (tokens); 0: schedule.short_window_frac of window_long",
    "train.stages.mtp_weights": "multi-token prediction: weight k scores the token k+1 ahead with the one lm_head "
                                "(first weight 1.0); [] or [1.0]: next-token only (validation always is)",
    "train.stages.mtp_weights_end": "the MTP weights at the stage's end, reached linearly (same length); []: constant",
    "train.stages.lr_mul": "multiplies every learning rate in the stage, on top of the lr schedule",
    # run
    "run.name": "run name (legend label, default run directory name)",
    "run.dir": "run directory; empty: runs/<name>-<time>",
    "run.sample_tokens": "new tokens of the sample printed at the end, at most the model's context; 0 disables",
    "run.sample_prompt": "prompt of that sample",
    "run.report": "write report.png and report.html at the end",
    "run.tensorboard": "also log to TensorBoard (extra .[tensorboard])",
    "run.wandb": "also log to Weights & Biases (extra .[wandb])",
    "run.wandb_project": "Weights & Biases project name",
    # parallel
    "parallel.strategy": "ddp (whole model per GPU, sharded optimizer state) | fsdp (FSDP2: parameters, gradients, optimizer state sharded) | auto (ddp if its memory estimate fits)",
    "parallel.reshard_after_forward": "fsdp: free each block's gathered weights after its forward (less memory, one more all-gather in the backward)",
    "parallel.activation_checkpointing": "recompute each block's activations in the backward instead of keeping them",
    "parallel.memory_limit_gib": "memory per device the estimate must fit in; 0: the GPU's own (no check on CPU)",
    "parallel.grad_comm_dtype": ("dtype the gradients are reduce-scattered in: param (the parameter's: fp32) | bf16 "
                                 "(half the bytes, sums rounded to bf16; ddp, and fsdp's reduce_dtype); changes the "
                                 "math: no preset turns it on before a loss A/B"),
    "preset": "the preset the config started from (informational)",
}


def config_keys(cfg=None) -> list[tuple[str, object]]:
    """[("section.key", value)] of every config key, in dataclass order."""
    import dataclasses

    from .config import Config

    cfg = Config() if cfg is None else cfg
    keys: list[tuple[str, object]] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys += [(f"{f.name}.{g.name}", getattr(value, g.name)) for g in dataclasses.fields(value)]
        else:
            keys.append((f.name, value))
    return keys


def stage_keys() -> list[str]:
    """The keys of one train.stages row, as "train.stages.<key>"."""
    import dataclasses

    from .config import StageConfig

    return [f"train.stages.{f.name}" for f in dataclasses.fields(StageConfig)]


def describe_config(cfg) -> str:
    """Every key as `section.key = value  # description`, defaults of Config() marked where they differ."""
    from .config import Config

    defaults = dict(config_keys(Config()))
    lines = []
    for key, value in config_keys(cfg):
        shown = _toml_value(value)
        changed = "" if value == defaults[key] else f" (default {_toml_value(defaults[key])})"
        lines.append(f"{key} = {shown}{changed}\n    {DESCRIPTIONS.get(key, '(no description)')}")
        if key == "train.stages":  # the keys of a row, described under the table
            lines += [f"  {k.rsplit('.', 1)[1]}: {DESCRIPTIONS[k]}" for k in stage_keys()]
    return "\n".join(lines)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)
