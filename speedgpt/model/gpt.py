"""Decoder-only GPT in the speedrun's shape.

Token embedding normalized, RMSNorm without weights, QK-norm, rotary embeddings, merged QKV,
ReLU² MLP, zero-initialized output projections, value embeddings shared U-shaped across layers,
U-net skip connections, x0 mixing per block, optional attention-free layers, untied lm_head over
a padded vocabulary, and a tanh logit softcap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig
from .attention import (AttnContext, CastedLinear, CausalSelfAttention, KVCache, build_context,
                        build_context_eagerly, init_from_plan, norm)
from .embeddings import BigramHashEmbedding, EmbedTying, SmearGate, previous_tokens
from .fp8_head import E4M3_MAX, fp8_head_cross_entropy, fp8_linear
from .gates import (SkipGates, gate_value_embed, mimetic_fills, rescale_as_affine_softcap, rescale_for_softcap,
                    rescale_logits)
from .kernels.softcap_ce import softcap_cross_entropy
from .mlp import MLP
from .moe import MoE, recompute_marked
from .mtp import multi_token_loss, target_rows
from .rotary import Rotary
from .runtime import ModelRuntime
from .yarn import RopeState


def checkpoint_block(block: nn.Module, args: tuple) -> torch.Tensor:
    """block(*args), keeping only its inputs for the backward, which recomputes the rest. Run by Python
    (eager, compile_scope=block), the recompute is marked so that MoE layers count their tokens once
    (`recompute_marked`). In a whole-model graph a block goes into dynamo's checkpoint operator, which
    AOTAutograd recomputes from the graph and which takes no context_fn but selective checkpointing's;
    except an MoE block in training: dynamo keeps its buffer updates out of that operator ("HOP: Unsafe
    side effect") and Python runs the checkpoint, marked as above."""
    if torch.compiler.is_compiling() and not (isinstance(block.mlp, MoE) and block.training):
        return checkpoint(block, *args, use_reentrant=False)
    return checkpoint(block, *args, use_reentrant=False, context_fn=recompute_marked)


class Block(nn.Module):
    """One layer: x0 mixing, attention (unless the layer is attention-free) and the MLP. Everything
    that is constant per layer (its index, window, FP8 choices) is fixed here at construction."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary, layer: int, runtime: ModelRuntime):
        super().__init__()
        dim = cfg.resolved_dim()
        scale = cfg.attn_scale or cfg.head_dim ** -0.5
        window_key = cfg.window_key(layer)
        self.attn = (CausalSelfAttention(dim, cfg.resolved_heads(), cfg.head_dim, rotary, scale=scale,
                                         gate_dim=cfg.attn_gate_dim if cfg.attn_gate else 0, layer=layer,
                                         window_key=window_key, window_block=runtime.window_block,
                                         fp8_scaling=runtime.fp8_attn, num_kv_heads=cfg.resolved_kv_heads(),
                                         key_offset=cfg.key_offset and window_key == "L",
                                         paired=layer in cfg.paired_head_layers)
                     if layer not in cfg.attn_free_layers else None)
        if cfg.moe_experts and layer >= cfg.moe_dense_layers:
            self.mlp = MoE(dim, int(cfg.mlp_ratio * dim), cfg.moe_experts, cfg.moe_top_k, cfg.moe_shared_experts,
                           grouped=runtime.moe_grouped)
        else:
            self.mlp = MLP(dim, int(cfg.mlp_ratio * dim), fp8_scaling=runtime.fp8_mlp,
                           fused_act=runtime.fp8_mlp_fused_act)
        self.window_key = window_key
        self.x0_mixing = cfg.x0_mixing
        # Per-head gates on this layer's value embedding (record #55), read from the normed input
        self.ve_gate = (nn.Parameter(torch.empty(cfg.resolved_kv_heads(), cfg.attn_gate_dim))
                        if cfg.value_embed_gates and self.attn is not None and cfg.value_embed_slot(layer) is not None
                        else None)

    def init_plan(self, prefix: str = "") -> list:
        attn = self.attn.init_plan(prefix + "attn.") if self.attn is not None else []
        gate = [(prefix + "ve_gate", torch.Tensor.zero_)] if self.ve_gate is not None else []  # 2 sigmoid(0) = 1
        return attn + self.mlp.init_plan(prefix + "mlp.") + gate

    init_weights = init_from_plan

    def forward(self, x, x0, ve, lambdas, v_lambdas, ctx: AttnContext, kv_cache: KVCache | None, extra=None):
        if self.x0_mixing:
            l0, l1 = lambdas.unbind(0)  # one op whose backward is one stack (two indexings: two select_scatters)
            x = l0 * x + l1 * x0
        if extra is not None:  # the bigram hash embedding's share (record #62), next to x0's
            x = x + extra
        if self.attn is not None:
            h = norm(x)
            if self.ve_gate is not None and ve is not None:
                ve = gate_value_embed(ve, h, self.ve_gate)
            x = x + self.attn(h, ve, v_lambdas, ctx, kv_cache)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    """Build through model/build.py (`model_from_config`, `build_model`): it allocates on the device
    and initializes; the runtime (dtype, backend, FP8, default windows) is fixed at construction."""

    def __init__(self, cfg: ModelConfig, max_seq_len: int, runtime: ModelRuntime | None = None):
        super().__init__()
        runtime = runtime or ModelRuntime()
        self.cfg = cfg
        self.runtime = runtime
        depth, dim, vocab = cfg.depth, cfg.resolved_dim(), cfg.padded_vocab()
        self.vocab_size = cfg.vocab_size
        self.embed = nn.Embedding(vocab, dim)
        # Value embeddings are added to v: as wide as the key/value heads (narrower with grouped-query attention).
        ve_dim = cfg.resolved_kv_heads() * cfg.head_dim if cfg.resolved_kv_heads() != cfg.resolved_heads() else dim
        num_ve = len(cfg.value_embed_layers) or cfg.value_embeds
        self.value_embeds = nn.ModuleList(nn.Embedding(vocab, ve_dim) for _ in range(num_ve))
        self.rotary = Rotary(cfg.head_dim, max_seq_len, cfg.rope_base, cfg.rope_half_truncate,
                             paired=bool(cfg.paired_head_layers))
        self.blocks = nn.ModuleList(Block(cfg, self.rotary, i, runtime) for i in range(depth))
        self.lm_head = CastedLinear(dim, vocab)
        self.num_skips = depth // 2 if cfg.unet_skips else 0
        self.skip_weights = nn.Parameter(torch.empty(self.num_skips))
        self.block_lambdas = nn.Parameter(torch.empty(depth, 2))  # x <- l0 * x + l1 * x0
        self.v_lambdas = nn.Parameter(torch.empty(depth, 2))  # v <- l0 * v + l1 * value_embed
        self.window_keys = "".join(block.window_key for block in self.blocks)
        # The masks a forward builds: one per window, and per window of the paired-head layers
        self.mask_keys = sorted({b.attn.mask_key if b.attn is not None else b.window_key for b in self.blocks})
        self.key_offset = any(b.attn is not None and b.attn.key_offset for b in self.blocks)
        # The rotations a forward makes its layers' tables for: unpaired, paired (record #58's layers), or both
        self.rotary_kinds = tuple(sorted({b.attn.paired for b in self.blocks if b.attn is not None}))
        # The later records' switches (model/embeddings.py, model/gates.py). Off, they add no parameter,
        # buffer or computation: the state dict, the optimizer groups and the losses are as before.
        gate_dim = cfg.attn_gate_dim
        self.bigram = BigramHashEmbedding(cfg.bigram_vocab_mult * vocab, dim, depth) if cfg.bigram_vocab_mult else None
        self.smear = SmearGate(gate_dim) if cfg.smear else None
        self.skip_gates = SkipGates(self.num_skips, gate_dim) if cfg.skip_gates and self.num_skips else None
        self.backout_lambda = nn.Parameter(torch.empty(1)) if cfg.backout_layer >= 0 else None
        self.tying = EmbedTying(cfg.tie_embed_frac) if cfg.tie_embed_frac else None
        # Tied (records #51, #53): the optimizers keep the embedding equal to the head (EmbedTying). A host flag
        # that forward never reads: both phases run the same compiled graph.
        self.embed_tied = self.tying is not None
        if self.tying is not None:
            # The phase travels with the weights (checkpoints, eval, export); the Python flag follows it on load.
            self.register_buffer("embed_untied", torch.zeros((), dtype=torch.bool))
            self.register_load_state_dict_post_hook(lambda module, _keys: module._sync_tying_flag())
        self.windows = runtime.windows or (max_seq_len, max_seq_len)  # (long, short) when forward gets none
        if runtime.yarn is not None:
            # YaRN's state when forward gets none (eval, sampling): kept on the device with the model, so
            # a KV-cache decode step copies nothing from the host. Not persistent: the runtime decides it.
            self.register_buffer("yarn_freq", torch.tensor(runtime.yarn[0], dtype=torch.float32), persistent=False)
            self.register_buffer("yarn_scale", torch.tensor(runtime.yarn[1], dtype=torch.float32), persistent=False)
        # The loss path, chosen once: the FP8 head fused with the loss (training steps; evaluation
        # and per-token losses take the fused loss over the FP8 head's logits), the fused loss over
        # the head's logits, or the reference softcap + cross-entropy in torch.
        if runtime.fp8_head and runtime.fused_ce:
            self.loss_path = "fp8_fused"
        else:
            self.loss_path = "fused_ce" if runtime.fused_ce else "torch"
        # model.fused_mtp: multi-token prediction and the logit rescale take the fused path too (see loss)
        self.fused_mtp = cfg.fused_mtp and self.loss_path != "torch"

    def init_plan(self) -> list:
        """Every parameter's initialization as (name, fill function), in the order the random draws
        happen. A fill works on a whole tensor of the parameter's shape, so a sharded model
        (parallel/fsdp.py) initializes parameter by parameter into the same values as an unsharded
        one, from the same seed, whatever the world size."""
        plan = [("embed.weight", nn.init.normal_)]
        plan += [(f"value_embeds.{i}.weight", nn.init.normal_) for i in range(len(self.value_embeds))]
        for i, block in enumerate(self.blocks):
            plan += block.init_plan(f"blocks.{i}.")
        if self.cfg.mimetic_vo_beta:
            plan = self.mimetic_plan(plan)
        # Zero: uniform predictions at init, loss starts at ln(padded vocab). Tied to the embedding, the
        # head is its lookup table, so it starts small instead (record #51: N(0, 0.005^2)).
        head_fill = (lambda t: t.normal_(0.0, 0.005)) if self.tying is not None else torch.Tensor.zero_
        plan += [("lm_head.weight", head_fill),
                 ("skip_weights", lambda t: t.fill_(1.0)),
                 ("block_lambdas", lambda t: t.copy_(torch.tensor([1.0, 0.0]).expand_as(t))),
                 ("v_lambdas", lambda t: t.fill_(0.5))]
        for name, module in (("bigram.", self.bigram), ("smear.", self.smear), ("skip_gates.", self.skip_gates)):
            plan += module.init_plan(name) if module is not None else []
        if self.backout_lambda is not None:
            plan.append(("backout_lambda", lambda t: t.fill_(0.5)))  # record #40's init
        return plan

    def mimetic_plan(self, plan: list) -> list:
        """`plan` with record #64's mimetic V and O fills for every attention layer (merged qkv weights)."""
        wrap_qkv, out_fill = mimetic_fills(self.cfg.mimetic_vo_beta, self.cfg.resolved_heads(), self.cfg.head_dim)
        out = []
        for name, fill in plan:
            if name.startswith("blocks.") and name.endswith(".attn.qkv_w"):
                fill = wrap_qkv(fill)
            elif name.startswith("blocks.") and name.endswith(".attn.proj.weight"):
                fill = out_fill
            out.append((name, fill))
        return out

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialize every parameter; called after `to_empty` so big models never live on the CPU."""
        params = dict(self.named_parameters())
        for name, fill in self.init_plan():
            fill(params[name])
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Buffers after `to_empty`: the rotary tables, YaRN's default state, the MoE balancing state and
        the tying phase."""
        if self.runtime.yarn is not None:
            self.yarn_freq.copy_(torch.tensor(self.runtime.yarn[0], dtype=torch.float32))
            self.yarn_scale.copy_(torch.tensor(self.runtime.yarn[1], dtype=torch.float32))
        # With YaRN the model's own tables are its default state's: a forward given no state rotates by them.
        self.rotary.init_tables(self.embed.weight.device,
                                freq=self.yarn_freq if self.runtime.yarn is not None else None)
        if self.tying is not None:
            self.embed_untied.fill_(False)  # training starts tied: the embedding holds the head's values
            self.embed_tied = True
            self.embed.weight.copy_(self.lm_head.weight)
        for m in self.modules():
            if isinstance(m, MoE):
                m.init_buffers()

    def value_embed_for_layer(self, ves: list[torch.Tensor], i: int) -> torch.Tensor | None:
        slot = self.cfg.value_embed_slot(i) if ves else None
        return None if slot is None else ves[slot]

    def embeddings(self) -> list[nn.Embedding]:
        """Every lookup table (token, value, bigram): kept in bf16 with model.bf16_embeds, sharded alone by fsdp."""
        return [self.embed, *self.value_embeds] + ([self.bigram.embed] if self.bigram is not None else [])

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings, in both tying phases from the embedding (tied, it holds the head's values)."""
        return self.embed(tokens)

    def tied_params(self) -> tuple[nn.Parameter, nn.Parameter] | None:
        """(embedding, head) while the embedding is tied to the head (model.tie_embed_frac), else None: the
        optimizers add the embedding's gradient into the head's and copy the head's values back after each
        update (optim/container.py), so the lookup of the embedding reads the head's rows."""
        return (self.embed.weight, self.lm_head.weight) if self.embed_tied else None

    def sync_embed_tying(self, step: int, total_steps: int, optimizers=None) -> bool:
        """Put embedding/head tying in the phase of training step `step` (the loop calls this before each
        step's forward): at the untie step the head's weights and Adam state (`optimizers`) are copied into
        the embedding. Returns whether it untied now. A no-op without model.tie_embed_frac.
        The untie falls on the start of an Adam window of `optimizers` (optim.adam_every; EmbedTying.untie_step)."""
        if self.tying is None or not self.embed_tied:
            return False
        if step < self.tying.untie_step(total_steps, getattr(optimizers, "adam_every", 1)):
            return False
        self.tying.copy_head_to_embed(self.embed.weight, self.lm_head.weight, optimizers)
        self.embed_untied.fill_(True)
        self.embed_tied = False
        return True

    @torch.no_grad()
    def _sync_tying_flag(self) -> None:
        self.embed_tied = not bool(self.embed_untied)  # once per load: a host read is fine here
        if self.embed_tied:
            # The head's values, also where the state dict's embedding is not them: checkpoints and exports
            # written before the tying became data left the unused embedding at its initialization.
            self.embed.weight.copy_(self.lm_head.weight)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by optimizer role: hidden matrices go to Muon, the rest to Adam."""
        # MoE routers (experts x width) make logits, like the head: Adam at their own lr (optim.router_lr).
        routers = [m.router for m in self.modules() if isinstance(m, MoE)]
        ve_gates = [b.ve_gate for b in self.blocks if b.ve_gate is not None]
        not_muon = routers + ve_gates
        matrices = [p for p in self.blocks.parameters() if p.ndim >= 2 and all(p is not r for r in not_muon)]
        groups = {
            "matrix": matrices,
            "embed": [self.embed.weight],
            "value_embed": [ve.weight for ve in self.value_embeds],
            "head": [self.lm_head.weight],
            "scalar": [p for p in (self.skip_weights, self.block_lambdas, self.v_lambdas) if p.numel()],
            "router": routers,
        }
        # The later records' parameters (empty groups when their switches are off): Adam, at their own lrs
        groups["scalar"] += ([self.bigram.lambdas] if self.bigram is not None else []) + (
            [self.smear.smear_lambda] if self.smear is not None else []) + (
            [self.backout_lambda] if self.backout_lambda is not None else [])
        groups["bigram_embed"] = [self.bigram.embed.weight] if self.bigram is not None else []
        groups["smear_gate"] = [self.smear.gate.weight] if self.smear is not None else []
        groups["skip_gate"] = [self.skip_gates.weight] if self.skip_gates is not None else []
        groups["value_embed_gate"] = ve_gates
        return groups

    def record28_transposed(self) -> list[nn.Parameter]:
        """Hidden matrices that record #28 stores transposed relative to this model's (out, in) layout:
        the MLP input weights (its c_fc is (dim, hidden), used as x @ c_fc). Its Muon shape factor is
        computed on that layout (optim.muon_shape_factor = "record28")."""
        return [b.mlp.fc.weight for b in self.blocks if isinstance(b.mlp, MLP)]  # (MoE experts: not in record #28)

    @torch.no_grad()
    def rope_state(self, freq, scale) -> RopeState:
        """YaRN's state (frequencies, attention-scale multiplier) in the form forward's `rope` takes, on the
        model's device; made outside the compiled graph (model/rotary.py says why)."""
        device = self.embed.weight.device
        cos, sin = self.rotary.tables(torch.as_tensor(freq, dtype=torch.float32), device)
        return RopeState(cos, sin, torch.as_tensor(scale, dtype=torch.float32).to(device))

    def forward(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor | None = None, *,
                reduction: str = "mean", windows=None, rope=None,
                kv_cache: KVCache | None = None, ctx: AttnContext | None = None,
                mtp_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The loss (targets given; `reduction` as in F.cross_entropy) or the softcapped fp32 logits.
        `windows` (long, short) override the runtime's, `rope` (YaRN's state, model/yarn.py RopeState:
        `rope_state` makes it) too; `ctx` (masks) is built here unless given; `mtp_weights`
        (K > 1 of them, a mean loss): multi-token prediction (model/mtp.py)."""
        cfg, rt = self.cfg, self.runtime
        windows = self.windows if windows is None else windows
        if ctx is None:
            ctx = (self.context(inputs_BT, windows=windows) if kv_cache is None
                   else AttnContext(backend=rt.attn_backend, masks={}, windows=windows,
                                    doc_start=(inputs_BT == cfg.bos_id) if self.key_offset and cfg.doc_masking else None))
        if rope is None and rt.yarn is not None:
            rope = RopeState(self.rotary.cos, self.rotary.sin, self.yarn_scale)
        # Every layer rotates by the same tables: made here once a forward, before the blocks, which only read them (a
        # dict filled inside a block broke activation checkpointing's recomputation and added per-block recompiles).
        # A new dict each call: a context passed in again must not keep another call's. The blocks get the row's
        # rotation and YaRN's query scale, not the state's whole tables (AttnContext.q_scale says why).
        pos = kv_cache.pos if kv_cache is not None else 0
        tables = (rope.cos, rope.sin) if rope is not None else None
        ctx.q_scale = rope.scale if rope is not None else None
        ctx.rotary_tables = {paired: self.rotary.cos_sin(inputs_BT.size(1), pos, paired=paired, tables=tables)
                             for paired in self.rotary_kinds}
        dtype = rt.dtype
        # smear and bigram look one token back; with a KV cache, across calls
        prev = previous_tokens(inputs_BT, kv_cache) if self.smear is not None or self.bigram is not None else None
        e = self.embed_tokens(inputs_BT).to(dtype)
        if self.smear is not None:
            e = self.smear(e, None if prev is None else self.embed_tokens(prev).to(dtype))
        x = x0 = norm(e)
        bigram = self.bigram(inputs_BT, prev).to(dtype) if self.bigram is not None else None
        ves = [ve(inputs_BT).to(dtype) for ve in self.value_embeds]
        skips: list[torch.Tensor] = []
        depth, n = len(self.blocks), self.num_skips
        x_backout = None
        # The per-layer scalar tables taken apart once a forward: unbind's backward is one stack, where an index per
        # layer (and per lambda) puts a select_scatter into zeros each in the backward graph (~150 of speedrun-124m's
        # ~3,000 backward nodes), and every node is compile time.
        block_lambdas, v_lambdas = self.block_lambdas.unbind(0), self.v_lambdas.unbind(0)
        skip_weights = self.skip_weights.unbind(0)
        bigram_lambdas = self.bigram.lambdas.unbind(0) if bigram is not None else None
        for i, block in enumerate(self.blocks):
            if n and i >= depth - n:
                skip = skips.pop()
                if self.skip_gates is not None:
                    skip = self.skip_gates(x0, i - (depth - n)) * skip
                x = x + skip_weights[i - (depth - n)] * skip
            extra = bigram_lambdas[i] * bigram if bigram is not None else None
            args = (x, x0, self.value_embed_for_layer(ves, i), block_lambdas[i], v_lambdas[i], ctx, kv_cache, extra)
            if rt.activation_checkpointing and torch.is_grad_enabled() and kv_cache is None:
                x = checkpoint_block(block, args)
            else:
                x = block(*args)
            if i < n:
                skips.append(x)
            if i == self.cfg.backout_layer:
                x_backout = x
        if kv_cache is not None:
            kv_cache.pos += inputs_BT.size(1)
        if x_backout is not None:  # backout (record #40): what the early layers wrote only for later layers' context
            x = x - self.backout_lambda[0] * x_backout
        x = norm(x)
        if targets_BT is None:
            return self.softcap(self.head(x).float())
        if mtp_weights is not None and mtp_weights.size(0) > 1 and reduction == "mean":
            if self.fused_mtp:  # K targets per row in the fused kernels: one pass over the logits each way
                return self.loss(x, targets_BT, reduction, mtp_weights)
            # the reference: plain torch over the fp32 (B, T, V) logits
            return multi_token_loss(self.softcap(self.head(x).float()), targets_BT, mtp_weights)
        return self.loss(x, targets_BT, reduction)

    def context(self, inputs_BT: torch.Tensor, *, windows=None, backend: str | None = None) -> AttnContext:
        """The attention masks of a batch: the runtime's backend unless `backend` says otherwise (batches
        of ever-changing shapes, such as CORE's, score with "sdpa": flex would compile per shape)."""
        rt = self.runtime
        build = build_context if inputs_BT.size(0) == 1 else build_context_eagerly  # why: its docstring
        return build(inputs_BT, backend=backend or rt.attn_backend, windows=self.windows if windows is None else windows,
                     doc_masking=self.cfg.doc_masking, bos_id=self.cfg.bos_id, patterns=self.mask_keys, block=rt.window_block,
                     doc_starts=self.key_offset)

    def head(self, x_BTD: torch.Tensor) -> torch.Tensor:
        """The lm_head's logits before the softcap, in FP8 where the runtime says so (with
        model.fp8_head_train_only, only in training mode)."""
        rt, cfg = self.runtime, self.cfg
        if not (rt.fp8_head and (self.training or not cfg.fp8_head_train_only)):
            return self.lm_head(x_BTD)
        B, T, D = x_BTD.shape
        return fp8_linear(x_BTD.reshape(B * T, D), self.lm_head.weight, D ** 0.5 / E4M3_MAX,
                          rt.fp8_w_bound / E4M3_MAX, rt.fp8_grad_scale, cfg.fp8_head_fp8_wgrad).view(B, T, -1)

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cfg.logit_rescale:
            return rescale_logits(logits)
        cap = self.cfg.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def loss(self, x_BTD: torch.Tensor, targets_BT: torch.Tensor, reduction: str,
             mtp_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of the final hidden states; `mtp_weights` (fused paths only, reduction "mean"):
        multi_token_loss's sum, as K targets per row for the fused kernels."""
        cfg = self.cfg
        B, T, D = x_BTD.shape
        # Record #54's rescale is a softcap of an affine map of the head's logits (model/gates.py): the
        # fused kernels apply the map as they read the logits. Without model.fused_mtp (the earlier
        # path) the map is a bf16 pass of its own and the FP8 head runs unfused.
        cap, scale, shift = cfg.logit_softcap, 1.0, 0.0
        if cfg.logit_rescale:
            cap, scale, shift = rescale_as_affine_softcap()
        targets, weights = targets_BT.reshape(-1), None
        if mtp_weights is not None:
            targets, weights = target_rows(targets_BT, mtp_weights.size(0)), mtp_weights
        if self.loss_path == "fp8_fused" and reduction in ("mean", "sum") and torch.is_grad_enabled() \
                and (self.fused_mtp or not cfg.logit_rescale):
            # training: head + loss + logit gradient fused; the logits never leave its custom op (model/fp8_head.py)
            return fp8_head_cross_entropy(x_BTD.reshape(B * T, D), self.lm_head.weight, targets, cap,
                                          D ** 0.5 / E4M3_MAX, self.runtime.fp8_w_bound / E4M3_MAX, reduction,
                                          weights=weights, scale=scale, shift=shift)
        logits = self.head(x_BTD)
        if self.loss_path != "torch":
            if cfg.logit_rescale and not self.fused_mtp:
                logits, scale, shift = rescale_for_softcap(logits), 1.0, 0.0
            # fp32 softcap + cross-entropy in one kernel pair; the backward overwrites the (unused) logits
            loss = softcap_cross_entropy(logits.view(-1, logits.size(-1)), targets, cap, reduction,
                                         inplace_backward=True, weights=weights, scale=scale, shift=shift)
            return loss.view_as(targets_BT) if reduction == "none" else loss
        logits = self.softcap(logits.float())
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets_BT.reshape(-1).long(), reduction=reduction)
        return loss.view_as(targets_BT) if reduction == "none" else loss

    def num_params(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            n -= sum(e.weight.numel() for e in self.embeddings())
        return n

    def active_params(self, embeddings: bool = True) -> int:
        """Parameters one token uses: MoE layers count their router, top-k and shared experts only."""
        n = self.num_params(embeddings)
        for m in self.modules():
            if isinstance(m, MoE):
                n -= sum(p.numel() for p in m.parameters()) - m.active_params()
        return n

    def flops_per_token(self, seq_len: int, windows: tuple[int, int] | None = None) -> float:
        """Training FLOPs per token: 6 x matmul parameters, plus attention scores and values over the
        average number of keys a query sees (causal, capped by its window)."""
        windows = self.windows if windows is None else windows
        matmul = self.active_params(embeddings=False) - sum(p.numel() for p in self.param_groups()["scalar"])
        attn = 0.0
        hdim = self.cfg.resolved_heads() * self.cfg.head_dim
        for block in self.blocks:
            if block.attn is None:
                continue
            window = windows[0] if block.window_key == "L" else windows[1]
            keys = min(window, (seq_len + 1) / 2)
            attn += 12 * hdim * keys  # fwd 2 matmuls x 2 FLOPs, x3 for fwd+bwd
        return 6 * matmul + attn
