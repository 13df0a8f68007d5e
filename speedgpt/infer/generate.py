"""Autoregressive sampling with a KV cache, so each new token costs one position's compute."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..model.attention import KVCache
from ..model.gpt import BOS_ID, GPT


def _pick(logits_BV: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator | None) -> torch.Tensor:
    if temperature <= 0:
        return logits_BV.argmax(dim=-1, keepdim=True)
    logits_BV = logits_BV / temperature
    if top_k:
        kth = torch.topk(logits_BV, min(top_k, logits_BV.size(-1))).values[:, -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth, float("-inf"))
    probs = torch.softmax(logits_BV.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=gen)


@torch.no_grad()
def generate(model: GPT, prompt_BT: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = None, use_cache: bool = True) -> Iterator[torch.Tensor]:
    """Yield (B, 1) next tokens. Prompts of one batch share a length (and so positions)."""
    model.eval()
    device = prompt_BT.device
    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    vocab = model.vocab_size
    B, T = prompt_BT.shape
    max_len = min(model.rotary.max_seq_len, T + max_new_tokens)
    if T >= model.rotary.max_seq_len:
        raise ValueError(f"prompt of {T} tokens does not fit the model's context of {model.rotary.max_seq_len}")
    seq = prompt_BT
    if use_cache:
        cfg = model.cfg
        cache = KVCache(cfg.depth, B, cfg.resolved_heads(), max_len, cfg.head_dim, device, model.compute_dtype)
        logits = model(prompt_BT, kv_cache=cache)[:, -1, :vocab]
    else:
        logits = model(seq)[:, -1, :vocab]
    for i in range(max_new_tokens):
        nxt = _pick(logits, temperature, top_k, gen)
        yield nxt
        if T + i + 1 >= max_len:
            return
        if use_cache:
            logits = model(nxt, kv_cache=cache)[:, -1, :vocab]
        else:
            seq = torch.cat([seq, nxt], dim=1)
            logits = model(seq)[:, -1, :vocab]


def sample_text(model: GPT, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.8,
                top_k: int | None = 50, seed: int | None = 0, stream=None) -> str:
    """Sample one continuation of `prompt`; stops at end-of-text. Streams pieces to `stream(str)` if given."""
    from ..data.tokenizer import get_tokenizer

    enc = get_tokenizer()
    device = next(model.parameters()).device
    prompt_ids = [BOS_ID] + enc.encode_ordinary(prompt)
    out: list[int] = []
    for tok in generate(model, torch.tensor([prompt_ids], device=device), max_new_tokens,
                        temperature=temperature, top_k=top_k, seed=seed):
        t = int(tok[0, 0])
        if t == BOS_ID:  # end of document
            break
        out.append(t)
        if stream is not None:
            stream(enc.decode([t]))
    return prompt + enc.decode(out)
