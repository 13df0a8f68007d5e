"""Embedding-side switches of the later speedrun records (each off by default; see config/model.py).

- `BigramHashEmbedding` (record #62): a table indexed by a hash of (previous token, token), zero at
  init, added to every block's input through one learned scalar per layer.
- `SmearGate` (record #34): each position's embedding takes a gated share of the previous
  position's embedding, a cheap one-token look-back that attention heads otherwise learn.
- Tied embedding and lm_head (records #51, #53): the embedding holds the head's values until the untie
  step, when the head's Adam state is copied into the embedding too (`EmbedTying`).

Both look-backs need the token before each position. In training a row's first position has none
(the records' first position of the batch likewise); with a KV cache, the previous call's last
token is kept on the cache (`lookback`), so cached decoding equals a full forward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Record #62's hash: two odd multipliers spread (previous, current) over the table; XOR mixes them.
BIGRAM_MUL_CURRENT = 36313
BIGRAM_MUL_PREVIOUS = 27191


def previous_tokens(inputs_BT: torch.Tensor, kv_cache=None) -> torch.Tensor | None:
    """The token before each row's first position: the last token the KV cache has seen (None without
    a cache, or on its first call). Records this call's last token on the cache for the next call."""
    if kv_cache is None:
        return None
    prev = getattr(kv_cache, "lookback_tokens", None) if kv_cache.pos else None
    kv_cache.lookback_tokens = inputs_BT[:, -1:].clone()  # an attribute of our own on the cache
    return prev


def bigram_hash(inputs_BT: torch.Tensor, rows: int, prev_B1: torch.Tensor | None = None) -> torch.Tensor:
    """Row of the bigram table for each position: (36313 * token XOR 27191 * previous) mod (rows - 1);
    a position without a previous token gets the reserved last row, rows - 1 (record #62). int64, so
    that larger vocabularies cannot overflow (for GPT-2's, int32 as in the record gives the same rows)."""
    x = inputs_BT.long()
    mod = rows - 1
    prev = F.pad(x[:, :-1], (1, 0)) if prev_B1 is None else torch.cat([prev_B1.long(), x[:, :-1]], dim=1)
    h = torch.bitwise_xor(BIGRAM_MUL_CURRENT * x, BIGRAM_MUL_PREVIOUS * prev) % mod
    if prev_B1 is None:
        h[:, 0] = mod
    return h


class BigramHashEmbedding(nn.Module):
    """`rows` x `dim` table (a multiple of the vocabulary) and one scalar per layer: block i's input
    gains lambdas[i] * table[hash]. The table starts at zero, so the model starts as without it."""

    def __init__(self, rows: int, dim: int, depth: int):
        super().__init__()
        self.rows = rows
        self.embed = nn.Embedding(rows, dim)
        self.lambdas = nn.Parameter(torch.empty(depth))

    def init_plan(self, prefix: str = "") -> list:
        return [(prefix + "embed.weight", torch.Tensor.zero_),
                (prefix + "lambdas", lambda t: t.fill_(0.1))]  # record #62's init

    def forward(self, inputs_BT: torch.Tensor, prev_B1: torch.Tensor | None = None) -> torch.Tensor:
        return self.embed(bigram_hash(inputs_BT, self.rows, prev_B1))


class SmearGate(nn.Module):
    """e_t <- e_t + lambda * sigmoid(w . e_t[:gate_dim]) * e_{t-1} on the raw token embeddings (before
    the norm). lambda starts at 0 and w at zero, so the model starts as without it (record #34)."""

    def __init__(self, gate_dim: int):
        super().__init__()
        self.gate = nn.Linear(gate_dim, 1, bias=False)
        self.smear_lambda = nn.Parameter(torch.empty(1))

    def init_plan(self, prefix: str = "") -> list:
        return [(prefix + "gate.weight", torch.Tensor.zero_), (prefix + "smear_lambda", torch.Tensor.zero_)]

    def forward(self, e_BTD: torch.Tensor, prev_B1D: torch.Tensor | None = None) -> torch.Tensor:
        # The previous position's embedding; zero where there is none (the row's first, uncached).
        prev = F.pad(e_BTD[:, :-1], (0, 0, 1, 0)) if prev_B1D is None else torch.cat([prev_B1D, e_BTD[:, :-1]], 1)
        w = self.gate.weight
        g = self.smear_lambda.to(e_BTD.dtype) * torch.sigmoid(F.linear(e_BTD[..., :w.size(-1)], w.to(e_BTD.dtype)))
        return e_BTD + g * prev


class EmbedTying:
    """Embedding tied to the lm_head until `untie_step(total)`, then untied (records #51, #53).

    The tying is data, not structure: the lookup always reads `embed.weight`, so the compiled forward is
    one graph in both phases (a Python branch between two tables was a second graph, ~75 s of compiling
    on an H100). While tied, the optimizers keep the embedding equal to the head (same (vocab, dim)
    layout): after the gradients' reduction the embedding's gradient is added into the head's, which
    thus gets the gradients of both uses; the embedding takes no step of its own, and after each
    update it takes the head's values (`Optimizers.fold_tied_grads`, `Optimizers.step`). At the untie
    step `copy_head_to_embed` copies the head's weights and its Adam state (moments and step count,
    shard for shard: both parameters have the same shape, so every optimizer implementation shards
    them alike) into the embedding; no Adam gradient is waiting then (optim.adam_every: `untie_step`
    falls on an Adam window's start). The phase lives in the model's state dict (buffer
    `embed_untied`), so checkpoints, resume, eval and export all see it."""

    def __init__(self, frac: float):
        self.frac = frac

    def untie_step(self, total_steps: int, adam_every: int = 1) -> int:
        """The first training step that runs untied: ceil(frac x total) (record #53: frac 2/3), moved back
        to the first step of its Adam window with optim.adam_every > 1.

        Why: inside a window Adam has not stepped, so the head's weights and Adam state are those of the
        window's first step, and a lookup of the tied head reads the same values as one of its copy. Only
        the gradients' destination differs: tied, the lookup's gradient waits on the head, summed with the
        head's own, and no later split can tell them apart. Untying at the window's start is the exact
        split: each parameter waits with its own uses' gradients, as if untied when the window began.
        (Record #53 with #39 likewise unties on an Adam step's boundary.)"""
        step = math.ceil(self.frac * total_steps)
        if step >= total_steps:
            return step  # tied throughout (record #51)
        return step - step % adam_every

    @staticmethod
    @torch.no_grad()
    def copy_head_to_embed(embed: torch.Tensor, head: torch.Tensor, optimizers=None) -> None:
        embed.copy_(head)
        for opt in optimizers or []:
            state = opt.state.get(head)
            if state:
                # Moments in the embedding's own dtype: a bf16 embedding (model.bf16_embeds) under an fp32
                # head got fp32 moments, and Adam refused its bf16 gradient at the next step. Every moment
                # tensor, whole or a rank's flat DistAdam shard; only the scalar step count keeps its dtype.
                opt.state[embed] = {k: (v.to(embed.dtype, copy=True) if v.dim() > 0 else v.clone())
                                    if isinstance(v, torch.Tensor) else v for k, v in state.items()}
