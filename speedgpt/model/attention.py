"""Attention with document-causal sliding-window masks, through one interface for two backends.

- `sdpa`: PyTorch scaled_dot_product_attention; runs on any device. Document and window masks
  become a dense boolean mask, so it suits short sequences (CPU runs, tests, sampling).
- `flex`: FlexAttention with block-sparse masks built on the device each step; the GPU path
  for long packed sequences (the speedrun's 48K-token rows).

The model builds one `AttnContext` per forward (masks for the long and the short window) and
every layer picks the one its window pattern names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .fp8_linear import fits_fp8, fp8_linear_dynamic
from .rotary import Rotary

FLEX_BLOCK = 128


PAIRED = "2"  # suffix of the mask keys of paired-head layers ("L2", "S2"): masks over the doubled sequence


def mask_side(T: int, key: str) -> int:
    """The side of mask `key`'s masks for rows of T tokens: a paired-head key's sequence is doubled (two heads a
    position)."""
    return 2 * T if key.endswith(PAIRED) else T


@dataclass
class AttnContext:
    backend: str
    # "L"/"S" (and "L2"/"S2" for paired-head layers) -> dense bool mask (sdpa), BlockMask (flex), or
    # None (plain causal)
    masks: dict[str, Any]
    windows: Any = None  # (long, short) in tokens: the KV-cache path builds its masks from them
    # (B, T) bool, True where a document starts (BOS): the partial key offset does not shift a key
    # across it. None: shift everywhere but position 0 (no document masking, or no key offset).
    doc_start: torch.Tensor | None = None
    # YaRN's attention-scale multiplier on the queries (a 0-d tensor, model/yarn.py), set by GPT.forward with the
    # rotation below; None: the layers' own scale. The state's whole tables stay in GPT.forward: a sharded block's
    # inputs are cast to the compute dtype on every call (FSDP2's mixed precision), and they would be too.
    q_scale: torch.Tensor | None = None
    # paired (bool) -> this forward's rotary (cos, sin) (Rotary.cos_sin), made by GPT.forward before the blocks for
    # all layers: one set of ops for dynamo to trace instead of one a layer (issue 33). None until then (a dataclass
    # default_factory dict cost dynamo ~0.2 s to trace): each layer's Rotary makes its own
    rotary_tables: dict | None = None


def document_ids(inputs_BT: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Document index of every position: a new document starts at each BOS token."""
    return torch.cumsum((inputs_BT == bos_id).to(torch.int32), dim=-1)


def window_blocks(window, block: int):
    """Whole blocks a window spans (rounded up, so any window >= the sequence means all of it)."""
    return (window + block - 1) // block


def dense_mask(doc_BT: torch.Tensor | None, T: int, window, block: int, device: torch.device) -> torch.Tensor:
    """(B or 1, 1, T, T) boolean mask: causal, same document, and key block within `window // block`
    blocks of the query's block (the window is block-granular, as on the flex path)."""
    q = torch.arange(T, device=device)[:, None]
    k = torch.arange(T, device=device)[None, :]
    # "key block > query block - window blocks" compares a row against a column, so no T x T tensor of block
    # distances is made (int64: 512 GiB at validation's rows of 262,144, 8x the mask itself; wave 24)
    first_excluded = q // block - window_blocks(window, block)
    allowed = k <= q
    allowed &= k // block > first_excluded  # in place: at most two T x T masks at a time while building
    if doc_BT is None:
        return allowed[None, None]
    mask = doc_BT[:, :, None] == doc_BT[:, None, :]
    mask &= allowed
    return mask[:, None]


def _nearest_first_lists(partial_BQK: torch.Tensor, full_BQK: torch.Tensor):
    """Counts and key-block lists of each query block, nearest (highest index) first, so that clamping a count keeps
    the blocks closest to the query: that is how windows shrink. The lists follow from the documents being
    contiguous, without a sort (torch 2.11 built the argsort this replaced into a cold start's two slowest Triton
    kernels, 20.2 s and 14.6 s, wave 18): query block i's full blocks are the run i-1, i-2, ... of its count; its
    partial blocks are i itself, then (if i lies in one document) the block where that document starts, just before
    the full run, or (if several documents meet in i) the run i-1, i-2, ... back to the first one's start. Entries
    past a count are never read; they are clamped to valid block indices."""
    partial_n = partial_BQK.sum(dim=-1, dtype=torch.int32)
    full_n = full_BQK.sum(dim=-1, dtype=torch.int32)
    n = partial_BQK.size(-1)
    i = torch.arange(n, device=partial_BQK.device, dtype=torch.int32)[:, None]
    k = torch.arange(n, device=partial_BQK.device, dtype=torch.int32)[None, :]
    full_idx = (i - 1 - k).expand_as(full_BQK)
    partial_idx = torch.where(k == 0, i, i - k - full_n[..., None])
    return _as_flex_lists(partial_n, partial_idx), _as_flex_lists(full_n, full_idx)


def _as_flex_lists(count_BQ: torch.Tensor, idx_BQK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A count and its block list (both int32) as BlockMask takes them: contiguous, with a head dimension of 1; entries
    past the count (never read) clamped to valid block indices."""
    return count_BQ[:, None].contiguous(), idx_BQK.clamp(0, idx_BQK.size(-1) - 1)[:, None].contiguous()


class FlexMasks:
    """Block-sparse masks for one batch, from which any window's BlockMask is cheap to derive.

    Documents are contiguous (document ids never decrease along a row: document_ids' cumsum, or all zeros
    without document masking; the block lists below are built on it), so the key blocks a query block may see
    form one run ending at the query's own block: "partial" blocks (the diagonal and the document's first block,
    which need the token-level mask) and "full" blocks strictly between (no mask evaluation at all). Built
    from block-level document ranges with dense ops only: no host sync, so it compiles into the step.
    """

    def __init__(self, doc_BT: torch.Tensor, block: int):
        B, T = doc_BT.shape
        if T % block:
            raise ValueError(f"sequence length {T} must be a multiple of the attention block {block} for flex")
        self.doc = doc_BT
        self.block = block
        nblk = T // block
        first = doc_BT.view(B, nblk, block)[:, :, 0]
        last = doc_BT.view(B, nblk, block)[:, :, -1]
        idx = torch.arange(nblk, device=doc_BT.device)
        causal_any = idx[:, None] >= idx[None, :]
        causal_all = idx[:, None] > idx[None, :]
        # Query block i and key block j share a document if their doc ranges overlap;
        # every pair of tokens shares it if both blocks lie inside one document.
        doc_any = (first[:, :, None] <= last[:, None, :]) & (last[:, :, None] >= first[:, None, :])
        doc_all = (first[:, :, None] == last[:, None, :]) & (last[:, :, None] == first[:, None, :])
        full = causal_all[None] & doc_all
        partial = causal_any[None] & doc_any & ~full
        (self.partial_n, self.partial_idx), (self.full_n, self.full_idx) = _nearest_first_lists(partial, full)
        self.partial, self.full = partial, full  # for the query-side lists of each window

    def block_mask(self, window):
        from torch.nn.attention.flex_attention import BlockMask

        doc, block = self.doc, self.block
        w = window_blocks(window, block)  # a python int or a 0-d tensor

        # The block lists alone already enforce the window on the fused GPU kernel; the mask_mod says
        # it too, because it is the definition of the mask (the unfused reference path uses only it).
        def document_causal(b, h, q_idx, kv_idx):
            in_window = (q_idx // block) - (kv_idx // block) < w
            return (q_idx >= kv_idx) & (doc[b, q_idx] == doc[b, kv_idx]) & in_window

        full_n = torch.clamp_max(self.full_n, w - 1)
        partial_n = torch.clamp_max(self.partial_n, w - full_n)
        # The query-side lists serve only the backward: a forward without grad (validation, sampling) leaves them
        # out. Built here without BlockMask.from_kv_blocks, whose per-row torch.vmap dynamo traces for ~0.5 s a mask
        # (benchmarks/trace_time.py), and without its scatter and sort: the same lists (within their counts).
        if torch.is_grad_enabled():
            partial_q, full_q = _query_side_lists(self.partial, self.full, self.full_n, partial_n, full_n)
        else:
            partial_q = full_q = (None, None)
        return BlockMask(seq_lengths=(doc.size(-1), doc.size(-1)), kv_num_blocks=partial_n, kv_indices=self.partial_idx,
                         full_kv_num_blocks=full_n, full_kv_indices=self.full_idx, q_num_blocks=partial_q[0],
                         q_indices=partial_q[1], full_q_num_blocks=full_q[0], full_q_indices=full_q[1],
                         BLOCK_SIZE=(block, block), mask_mod=document_causal)


def _query_side_lists(partial_BQK: torch.Tensor, full_BQK: torch.Tensor, full_n_B1Q: torch.Tensor,
                      partial_n_B1Q: torch.Tensor, full_n_clamped_B1Q: torch.Tensor):
    """The query blocks of each key block (the backward's lists), for the key-side lists of _nearest_first_lists
    clamped to a window's counts; ascending, as flex orders them. Which blocks: key block j is listed by query block i
    where j lies within i's (clamped) count, an elementwise test on the dense masks. Their order, again from the
    documents being contiguous, without a sort or scatter: a full key block j's queries are the run j+1, j+2, ...;
    a partial one's are j itself, then either the run j+1, ... (several documents meet in j) or the one block past
    the run of j's document's full blocks where that document ends (j lies in one document). Entries past a count are
    never read; they are clamped to valid block indices."""
    n = partial_BQK.size(-1)
    i = torch.arange(n, device=partial_BQK.device, dtype=torch.int32)[:, None]  # query block (rows), list slot k
    j = torch.arange(n, device=partial_BQK.device, dtype=torch.int32)[None, :]  # key block (columns)
    full_n, partial_n, full_n_clamped = (c.squeeze(1)[..., None] for c in (full_n_B1Q, partial_n_B1Q,
                                                                             full_n_clamped_B1Q))
    # where key block j sits in query block i's list (_nearest_first_lists), against i's clamped count
    partial_listed = partial_BQK & ((i == j) | (i - j - full_n < partial_n))
    full_listed = full_BQK & (i - 1 - j < full_n_clamped)
    full_after = full_BQK.sum(dim=-2, dtype=torch.int32)[..., None]  # per key block: query blocks it is full for
    key, slot = j.transpose(0, 1), i.transpose(0, 1)  # now rows are key blocks, columns list slots
    partial_idx = torch.where(slot == 0, key, key + slot + full_after)
    full_idx = (key + 1 + slot).expand_as(partial_idx)
    return (_as_flex_lists(partial_listed.sum(dim=-2, dtype=torch.int32), partial_idx),
            _as_flex_lists(full_listed.sum(dim=-2, dtype=torch.int32), full_idx))


def build_context(inputs_BT: torch.Tensor, *, backend: str, windows, doc_masking: bool,
                  bos_id: int, patterns, block: int = FLEX_BLOCK, doc_starts: bool = False) -> AttnContext:
    """The masks of the mask keys in `patterns` (a string of L/S, or an iterable of keys that may
    include the paired-head keys "L2"/"S2"); `doc_starts`: also the document starts (key offset)."""
    B, T = inputs_BT.shape
    device = inputs_BT.device
    doc = document_ids(inputs_BT, bos_id) if doc_masking else torch.zeros_like(inputs_BT, dtype=torch.int32)
    masks: dict[str, Any] = {}
    if backend == "flex" and T % block:
        # Short odd-length inputs (sampling without cache, HellaSwag rows): the dense mask is exact
        # and cheap there; flex's block lists need whole blocks.
        backend = "sdpa"
    wanted = set(patterns)
    flex: dict[bool, FlexMasks] = {}
    # Paired-head layers attend over a sequence twice as long (two heads per position), whose
    # documents are the same, each position doubled; windows count its (doubled) positions.
    doubled = doc.repeat_interleave(2, dim=1) if wanted & {"L" + PAIRED, "S" + PAIRED} else None
    for key in ("L", "S", "L" + PAIRED, "S" + PAIRED):
        if key not in wanted:
            continue
        window = windows[0] if key[0] == "L" else windows[1]
        paired = key.endswith(PAIRED)
        d, n = doubled if paired else doc, mask_side(T, key)
        if backend == "flex":
            if paired not in flex:
                flex[paired] = FlexMasks(d, block)
            masks[key] = flex[paired].block_mask(window)
        elif not doc_masking and not isinstance(window, torch.Tensor) and window >= n:
            masks[key] = None  # plain causal: lets SDPA pick its fused kernels
        else:
            masks[key] = dense_mask(d if doc_masking else None, n, window, block, device)
    doc_start = (inputs_BT == bos_id) if doc_starts and doc_masking else None
    return AttnContext(backend=backend, masks=masks, windows=windows, doc_start=doc_start)


@torch.compiler.disable
def build_context_eagerly(inputs_BT: torch.Tensor, **kwargs) -> AttnContext:
    """build_context run outside any compiled graph; the masks then enter the graph as inputs.

    Why: with torch 2.11 on an H100 and an H200, a whole-model graph that built the flex block masks
    of a batch of several rows (B > 1: the depth-ladder, MoE and dense-1b presets, 16 x 2048) faulted
    in the first long-window layer's flex kernel ("an illegal memory access"), while B = 1 (the
    speedrun presets) and masks built outside the graph (per-block compile) ran. The masks are a few
    small ops per step, so building them eagerly costs next to nothing."""
    return build_context(inputs_BT, **kwargs)


_compiled_flex = None
# Devices whose eager flex calls run the fused kernel (compiled once, lazily); elsewhere (CPU) flex's reference
# path, which needs no compile. Tests add "cpu" to run the GPU's code path here.
FUSED_FLEX_DEVICES = ("cuda",)


def flex_attention_fused(q, k, v, block_mask, scale: float, enable_gqa: bool = False) -> torch.Tensor:
    """FlexAttention through its fused kernel also when the model itself runs eagerly (eval, sampling
    without compile): uncompiled, flex materializes the whole (T x T) score matrix, 54 GiB at 48K
    tokens. CPU keeps the reference path.

    Inside a compiled model flex is called directly (dynamo captures it as its own op, and Inductor fuses
    it): reaching the lazily compiled wrapper there made dynamo guard on `_compiled_flex is None`, so the
    whole model was traced and compiled a second time once the first call had set it (issue 33)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling() or q.device.type not in FUSED_FLEX_DEVICES:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention_compiled_only, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def flex_attention_compiled_only(q, k, v, block_mask, scale: float, enable_gqa: bool = False) -> torch.Tensor:
    """flex_attention for torch.compile to trace. Run as plain Python, which is what dynamo does when it
    gives up on a frame (its recompile limit: issue 33's per-block compile asked for 1536 GiB), it stops
    with one line instead of building the dense score matrix."""
    from torch.nn.attention.flex_attention import flex_attention

    if not torch.compiler.is_compiling():
        raise RuntimeError(f"flex attention fell back to eager on {q.device} (torch._dynamo gave up compiling "
                           f"it: TORCH_LOGS=recompiles says why); eager flex would build the dense "
                           f"{q.size(-2)} x {k.size(-2)} score matrix per head, so it stops here")
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


@torch.no_grad()
def init_from_plan(module: nn.Module) -> None:
    """Fill a module's parameters by its `init_plan()` (a list of (name, fill function))."""
    params = dict(module.named_parameters())
    for name, fill in module.init_plan():
        fill(params[name])


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    """Linear layer whose fp32 master weight is cast to the activations' dtype at use."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.type_as(x))


class KVCache:
    """Keys and values of every layer for incremental decoding; positions fill left to right."""

    def __init__(self, num_layers: int, batch: int, heads: int, max_len: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype):
        self.k = torch.zeros(num_layers, batch, heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.pos = 0
        self.max_len = max_len
        # Partial key offset: each layer's last key before its shift, for the next token's shift
        self.last_keys: dict[int, torch.Tensor] = {}

    def update(self, layer: int, k_BHTD: torch.Tensor, v_BHTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = k_BHTD.size(2)
        if self.pos + T > self.max_len:
            raise ValueError(f"KV cache full: {self.pos + T} positions > {self.max_len}")
        self.k[layer, :, :, self.pos:self.pos + T] = k_BHTD
        self.v[layer, :, :, self.pos:self.pos + T] = v_BHTD
        return self.k[layer, :, :, :self.pos + T], self.v[layer, :, :, :self.pos + T]


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, head_dim: int, rotary: Rotary, *, scale: float,
                 gate_dim: int = 0, layer: int = 0, window_key: str = "L", window_block: int = FLEX_BLOCK,
                 fp8_scaling: str = "", num_kv_heads: int = 0, key_offset: bool = False, paired: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        hdim = num_heads * head_dim
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_kv_heads == num_heads:
            # One merged weight for q, k and v: one matmul, and Muon orthogonalizes each of the three.
            self.qkv_w = nn.Parameter(torch.empty(3, hdim, dim))
        else:
            # Grouped-query attention: k and v have fewer heads than q, so q has its own matrix and k, v
            # share a merged one; Muon still orthogonalizes each of the three.
            self.q_w = nn.Parameter(torch.empty(hdim, dim))
            self.kv_w = nn.Parameter(torch.empty(2, self.num_kv_heads * head_dim, dim))
        self.proj = CastedLinear(hdim, dim)
        self.gate = CastedLinear(gate_dim, num_heads) if gate_dim else None
        self.rotary = rotary
        self.layer = layer  # this layer's slot in the KV cache
        self.window_key = window_key  # "L" or "S": which of the context's windows this layer uses
        self.window_block = window_block
        # Partial key offset (record #49): keys' stationary rotary dims come from the previous position
        if key_offset and not rotary.half_truncate:
            raise ValueError("the partial key offset shifts the stationary (zero-frequency) rotary dims; "
                             "it needs model.rope_half_truncate=true")
        self.key_offset = key_offset
        # Paired-head attention (record #58): heads h and h + H/2 attend as one sequence of 2T positions
        if paired and (num_heads % 2 or self.num_kv_heads != num_heads):
            raise ValueError(f"paired-head attention needs an even number of heads ({num_heads}) and no "
                             f"grouped-query attention")
        self.paired = paired
        self.mask_key = window_key + (PAIRED if paired else "")
        # "rowwise" / "tensorwise": FP8 qkv and output matmuls, where asked for and the shapes allow
        # (FP8 projections are for the merged q, k, v weight; grouped-query layers keep bf16)
        self.fp8_scaling = (fp8_scaling if self.num_kv_heads == num_heads and fits_fp8(self.qkv_w, self.proj.weight)
                            else "")

    def init_plan(self, prefix: str = "") -> list:
        """(parameter name, fill function) in initialization order: see GPT.init_plan."""
        def uniform(t):
            bound = (3 ** 0.5) * 0.5 * t.size(-1) ** -0.5  # uniform with std 0.5/sqrt(dim)
            t.uniform_(-bound, bound)

        qkv = [("qkv_w", uniform)] if self.num_kv_heads == self.num_heads else [("q_w", uniform), ("kv_w", uniform)]
        plan = qkv + [("proj.weight", torch.Tensor.zero_)]  # every block starts as the identity on the residual
        if self.gate is not None:
            plan.append(("gate.weight", torch.Tensor.zero_))  # gates start half open: sigmoid(0)
        return [(prefix + name, fn) for name, fn in plan]

    init_weights = init_from_plan

    def qkv(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, T, H, Dh), k and v (B, T, KV, Dh)."""
        B, T, _ = x_BTD.shape
        H, KV, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        if KV != H:
            q = F.linear(x_BTD, self.q_w.type_as(x_BTD)).view(B, T, H, Dh)
            k, v = F.linear(x_BTD, self.kv_w.flatten(end_dim=1).type_as(x_BTD)).view(B, T, 2 * KV, Dh).chunk(2, dim=-2)
            return q, k, v
        qkv_w = self.qkv_w.flatten(end_dim=1)
        if self.fp8_scaling:
            # bf16 input gradient: Inductor casts the 2304-wide rows of dqkv (out of the rotary and QK-norm
            # backward) only in two passes; in FP8 the whole model ran 1.2 % slower (docs/benchmarks.md)
            # bf16 out; in the activations' dtype, else an fp32 run (train.dtype=float32) meets its fp32 value
            # embeddings in v, and attention refuses the mixed q, k, v (a no-op in bf16)
            qkv = fp8_linear_dynamic(x_BTD, qkv_w, self.fp8_scaling, fp8_grad_input=False).type_as(x_BTD)
            qkv = qkv.view(B, T, 3 * H, Dh)
        else:
            qkv = F.linear(x_BTD, qkv_w.type_as(x_BTD)).view(B, T, 3 * H, Dh)
        q, k, v = qkv.chunk(3, dim=-2)
        return q, k, v

    def forward(self, x_BTD: torch.Tensor, ve_BTD: torch.Tensor | None, v_lambdas: torch.Tensor,
                ctx: AttnContext, kv_cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, Dh = self.num_heads, self.head_dim
        gqa = self.num_kv_heads != H
        q, k, v = self.qkv(x_BTD)
        q, k = norm(q), norm(k)
        pos = kv_cache.pos if kv_cache is not None else 0
        # the forward's rotation and YaRN's query scale (GPT.forward); a context of its own (a layer called alone) has
        # neither: Rotary takes its own tables
        cos_sin = ctx.rotary_tables[self.paired] if ctx.rotary_tables is not None else None
        q = self.rotary(q, pos, paired=self.paired, scale=ctx.q_scale, cos_sin=cos_sin)
        k = self.rotary(k, pos, paired=self.paired, cos_sin=cos_sin)
        if self.key_offset:
            k = self.offset_keys(k, ctx.doc_start, kv_cache)
        v0, v1 = v_lambdas.unbind(0)  # one op whose backward is one stack (two indexings: two select_scatters)
        if ve_BTD is not None:
            v = v0 * v + v1 * ve_BTD.view_as(v)
        else:
            v = v0 * v
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)
            window = ctx.windows[0] if self.window_key == "L" else ctx.windows[1]
            block = self.window_block
            Tk = k.size(2)
            if self.paired:  # the cache holds heads as usual; pair them for attention
                q, k, v = (pair_heads(t.transpose(1, 2)).transpose(1, 2) for t in (q, k, v))
            r = 2 if self.paired else 1  # positions per token
            qpos = torch.arange(r * pos, r * (pos + T), device=x_BTD.device)[:, None]
            kpos = torch.arange(r * Tk, device=x_BTD.device)[None, :]
            mask = (kpos <= qpos) & ((qpos // block) - (kpos // block) < window_blocks(window, block))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        else:
            if self.paired:
                q, k, v = (pair_heads(t.transpose(1, 2)).transpose(1, 2) for t in (q, k, v))
            mask = ctx.masks[self.mask_key]
            if ctx.backend == "flex":
                y = flex_attention_fused(q, k, v, mask, self.scale, enable_gqa=gqa)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                                   enable_gqa=gqa)
        y = y.transpose(1, 2)  # B, T, H, Dh (paired: B, 2T, H/2, Dh)
        if self.paired:
            y = y.reshape(B, T, H, Dh)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x_BTD[..., :self.gate.in_features])).unsqueeze(-1)
        y = y.reshape(B, T, H * Dh)
        if self.fp8_scaling:
            return fp8_linear_dynamic(y, self.proj.weight, self.fp8_scaling)
        return self.proj(y)

    def offset_keys(self, k_BTHD: torch.Tensor, doc_start_BT: torch.Tensor | None,
                    kv_cache: KVCache | None) -> torch.Tensor:
        """The partial key offset: each key's stationary dims (the quarters [D/4, D/2) and [3D/4, D),
        which half-truncated rotary leaves unrotated) taken from the previous position's key, so one
        layer can match "the token after X" (1-layer induction). A key keeps its own at a sequence's
        first position and, with document masking, at a document's first token (record #49 shifts
        across documents; here nothing crosses a document boundary)."""
        first = k_BTHD[:, :1]
        if kv_cache is not None:
            if kv_cache.pos > 0:
                first = kv_cache.last_keys[self.layer]
            kv_cache.last_keys[self.layer] = k_BTHD[:, -1:]
        prev = torch.cat([first, k_BTHD[:, :-1]], dim=1)
        if doc_start_BT is not None:
            prev = torch.where(doc_start_BT[:, :, None, None], k_BTHD, prev)
        q4 = self.head_dim // 4
        return torch.cat([k_BTHD[..., :q4], prev[..., q4:2 * q4], k_BTHD[..., 2 * q4:3 * q4], prev[..., 3 * q4:]],
                         dim=-1)


def pair_heads(x_BTHD: torch.Tensor) -> torch.Tensor:
    """(B, T, H, D) -> (B, 2T, H/2, D): position 2t holds heads 0..H/2-1 of token t, position 2t + 1
    heads H/2..H-1, so head h and head h + H/2 form a pair (record #58's reshape). The inverse is a
    reshape back to (B, T, H, D). Rotary (model/rotary.py, paired) rotates head h at 2t + (h mod 2),
    as the record does: that is its slot 2t + (h >= H/2) when H/2 is even; with an odd number of
    pairs (the record's 6 heads) some pairs have their two rotations the other way round."""
    B, T, H, D = x_BTHD.shape
    return x_BTHD.reshape(B, 2 * T, H // 2, D)
