"""Multi-token prediction with the one lm_head, as modded-nanogpt record #53 (2025-12-22) trains it.

No extra parameters: the logits at position t, which score the next token t+1, also score the tokens
t+2 .. t+K with weights w_1 .. w_{K-1} (w_0 = 1 for the next token). The loss is the weighted sum
over the K offsets of each position's cross-entropy, averaged over the B*T positions. As in the
record, a target past the end of the row (t + k >= T for offset k) is left out (its term is zero,
the denominator stays B*T), and document boundaries inside a row are not treated specially: near a
document's end the later offsets score the next document's first tokens, as the next-token loss
scores its BOS. The weights enter as a tensor, so a schedule that changes their values does not
recompile; their number is a shape (one compiled graph per count: the trainer pads every stage's
weights with zeros to the run's largest count, train/step_schedule.py).

`multi_token_loss` is the reference (and the CPU path): plain torch over the fp32 logits. With a fused
loss (model.fused_ce, model.fused_mtp) the model passes `target_rows` and the weights to the fused
kernels instead, which compute the same sum in one pass over the logits (GPT.loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def shifted_targets(targets_BT: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets_BTK, valid_TK): targets_BTK[b, t, j] = targets[b, t + j] (0 past the row's end) and
    valid_TK[t, j] = t + j < T, for the K = k offsets 0 .. k-1."""
    T = targets_BT.size(1)
    targets_BTK = F.pad(targets_BT, (0, k - 1)).unfold(1, k, 1)
    ahead = torch.arange(T, device=targets_BT.device)[:, None] + torch.arange(k, device=targets_BT.device)[None, :]
    return targets_BTK, ahead < T


def target_rows(targets_BT: torch.Tensor, k: int, ignore_index: int = -100) -> torch.Tensor:
    """(B*T, k): each position's k targets t, t+1, .., t+k-1 as one row, ignore_index past the row's end:
    the fused losses' form of the same terms (kernels/softcap_ce.py, fp8_head.py)."""
    targets_BTK, valid_TK = shifted_targets(targets_BT, k)
    return torch.where(valid_TK, targets_BTK, ignore_index).reshape(-1, k)


def multi_token_loss(logits_BTV: torch.Tensor, targets_BT: torch.Tensor, weights_K: torch.Tensor) -> torch.Tensor:
    """sum_k w_k * CE(logits[b, t], targets[b, t + k]) summed over valid (b, t, k), divided by B*T.
    `logits_BTV` are the final (softcapped) logits in float32; with weights [1] this is the plain
    mean next-token cross-entropy."""
    B, T, _ = logits_BTV.shape
    K = weights_K.size(0)
    targets_BTK, valid_TK = shifted_targets(targets_BT.long(), K)
    lse_BT = torch.logsumexp(logits_BTV, dim=-1)  # one softmax normalizer serves every offset
    ce_BTK = lse_BT.unsqueeze(-1) - logits_BTV.gather(-1, targets_BTK)
    ce_BTK = torch.where(valid_TK, ce_BTK, 0.0)
    return (ce_BTK * weights_K.to(ce_BTK.dtype)).sum() / (B * T)
