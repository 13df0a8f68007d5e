"""Autoregressive sampling with a KV cache, so each new token costs one position's compute.

Prompts of different lengths share one batch without padding: all rows run through the common
prefix (the shortest prompt's length) in one prefill, then advance one position per step
together; a row whose prompt is not yet used up takes its own next prompt token instead of the
sampled one ("teacher forcing"). Every row thus sits at the same position at every step, so
rotary positions, the causal/window mask and the KV cache need no per-row offsets or padding
masks, and the result equals generating each prompt alone. The price: the longer prompts' tail
goes through the model one token per step instead of in the prefill.

The cache path is checked against the plain full-sequence forward (`use_cache=False`), which is
the reference. The cache does no document masking: both paths agree while a row holds a single
document, i.e. up to the first end-of-text token a row generates, which is where sampling stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from ..model.attention import KVCache
from ..model.gpt import GPT

if TYPE_CHECKING:
    from ..tokenizer.core import Tokenizer


def pick_tokens(logits_BV: torch.Tensor, temperature: float, top_k: int | None,
                gen: torch.Generator | None) -> torch.Tensor:
    """(B, 1) next tokens: greedy at temperature 0, else sampled among the top_k (all: None)."""
    if temperature <= 0:
        return logits_BV.argmax(dim=-1, keepdim=True)
    # The row's largest logit subtracted first (softmax's result is the same): a tiny temperature then divides
    # the others into -inf (probability 0), where the logits alone overflowed to inf and softmax gave nan
    # (torch's "probability tensor contains either `inf`, `nan` or element < 0" at --temperature 1e-39).
    logits_BV = (logits_BV - logits_BV.amax(dim=-1, keepdim=True)) / temperature
    if top_k:
        kth = torch.topk(logits_BV, min(top_k, logits_BV.size(-1))).values[:, -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth, float("-inf"))
    probs = torch.softmax(logits_BV.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=gen)


def _context_len(model: GPT) -> int:
    return model.rotary.max_seq_len


@torch.no_grad()
def decode_steps(model: GPT, prompts: Sequence[Sequence[int]] | torch.Tensor, max_new_tokens: int, *,
                 temperature: float = 1.0, top_k: int | None = None, seed: int | None = None,
                 use_cache: bool = True, device: torch.device | str | None = None
                 ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The core loop. Yields `(pos, tokens_B, generated_B)` for each position filled: the token now at
    `pos` in every row and whether it was sampled (True) or taken from that row's prompt (False).

    Row r gets at most `max_new_tokens` sampled tokens, and no row grows past the model's context
    (its training sequence length). Rows that are done keep being computed (so the batch stays
    rectangular) until the longest is done; callers ignore those positions.
    """
    model.eval()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if isinstance(prompts, torch.Tensor):
        if prompts.ndim != 2:
            raise ValueError(f"prompt tensor must be (batch, length), got shape {tuple(prompts.shape)}")
        device = prompts.device
        rows = prompts.tolist()
    else:
        rows = [list(map(int, p)) for p in prompts]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every prompt needs at least one token (e.g. BOS for an unconditional sample)")
    B, ctx_len = len(rows), _context_len(model)
    lengths = [len(r) for r in rows]
    if max(lengths) >= ctx_len:
        raise ValueError(f"prompt of {max(lengths)} tokens does not fit the model's context of {ctx_len}; "
                         f"shorten it")
    total = min(ctx_len, max(lengths) + max_new_tokens)  # every row's tokens fit in [0, total)
    seq_BT = torch.zeros(B, total, dtype=torch.long, device=device)
    in_prompt_BT = torch.zeros(B, total, dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        seq_BT[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        in_prompt_BT[i, :len(r)] = True
    start = min(lengths)
    if max_new_tokens <= 0 or start >= total:
        return
    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    vocab = model.vocab_size
    cache = None
    if use_cache:
        cfg = model.cfg
        cache = KVCache(cfg.depth, B, cfg.resolved_kv_heads(), total, cfg.head_dim, device, model.runtime.dtype)
        logits_BV = model(seq_BT[:, :start], kv_cache=cache)[:, -1, :vocab]  # prefill the common prefix
    else:
        logits_BV = model(seq_BT[:, :start])[:, -1, :vocab]
    for pos in range(start, total):
        sampled_B = pick_tokens(logits_BV, temperature, top_k, gen)[:, 0]
        forced_B = in_prompt_BT[:, pos]
        seq_BT[:, pos] = torch.where(forced_B, seq_BT[:, pos], sampled_B)
        yield pos, seq_BT[:, pos], ~forced_B
        if pos + 1 >= total:
            return
        if cache is not None:
            logits_BV = model(seq_BT[:, pos:pos + 1], kv_cache=cache)[:, -1, :vocab]  # one new position
        else:
            logits_BV = model(seq_BT[:, :pos + 1])[:, -1, :vocab]


def generate(model: GPT, prompt_BT: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = None, use_cache: bool = True) -> Iterator[torch.Tensor]:
    """Yield (B, 1) next tokens. Prompts of one batch share a length (and so positions); for prompts
    of different lengths and stopping at end-of-text use `generate_batch`."""
    for _, tokens_B, _ in decode_steps(model, prompt_BT, max_new_tokens, temperature=temperature, top_k=top_k,
                                       seed=seed, use_cache=use_cache):
        yield tokens_B[:, None]


def generate_batch(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                   temperature: float = 1.0, top_k: int | None = None, seed: int | None = None,
                   use_cache: bool = True, stop_token: int | None | str = "bos",
                   on_token: Callable[[int, int], None] | None = None) -> list[list[int]]:
    """Generate continuations of token-id prompts (any lengths) in one batch; returns each row's new
    tokens, without the stop token. A row stops at `stop_token` (end-of-text; "bos": the model's
    model.bos_id, the separator that starts the next document; None: never) or after
    `max_new_tokens`; the loop ends when every row has stopped. `on_token(row, token)` sees each
    kept token as it is made, for streaming.
    """
    if stop_token == "bos":
        stop_token = model.cfg.bos_id
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    steps = decode_steps(model, prompts, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                         use_cache=use_cache)
    for _, tokens_B, generated_B in steps:
        # One host read per step: stopping is a per-row Python decision, and streaming needs the ids anyway.
        for row, (tok, is_new) in enumerate(zip(tokens_B.tolist(), generated_B.tolist())):
            if not is_new or done[row]:
                continue
            if tok == stop_token:
                done[row] = True
                continue
            out[row].append(tok)
            if on_token is not None:
                on_token(row, tok)
            if len(out[row]) >= max_new_tokens:
                done[row] = True
        if all(done):
            steps.close()
            break
    return out


class Utf8Stream:
    """Turns token ids into printable text as they come: a BPE token may end mid-way through a
    multi-byte character, so bytes are held back until they complete one."""

    def __init__(self, tokenizer, write: Callable[[str], None], extra: dict[int, bytes] | None = None):
        """`tokenizer`: a tiktoken Encoding; `extra`: the bytes of ids it does not have (a chat model's specials)."""
        import codecs

        self.tokenizer = tokenizer
        self.write = write
        self.extra = extra or {}
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> None:
        text = self.decoder.decode(token_bytes(self.tokenizer, token, self.extra))
        if text:
            self.write(text)

    def flush(self) -> None:
        text = self.decoder.decode(b"", final=True)
        if text:
            self.write(text)


def encode_prompt(prompt: str, tokenizer: Tokenizer | None = None) -> list[int]:
    """BOS + the prompt's tokens: training documents start with BOS, so a prompt is a document's start.
    `tokenizer`: the run's (speedgpt.tokenizer.folder.run_tokenizer); default GPT-2's."""
    from ..tokenizer.core import gpt2_tokenizer

    return (tokenizer or gpt2_tokenizer()).encode_document(prompt)


def context_cut_note(model: GPT, prompts: Sequence[str], max_new_tokens: int, asked: str,
                     tokenizer: Tokenizer | None = None) -> str | None:
    """The note that a continuation will stop at the model's context before `max_new_tokens` (`asked`: how the user
    asked for them, e.g. "--max-tokens 64"), said before sampling so that a shorter one is no surprise; None when the
    longest prompt leaves room for all of them, or leaves none (that prompt gets only sample_texts' error)."""
    context = _context_len(model)
    longest = max(len(encode_prompt(prompt, tokenizer)) for prompt in prompts)
    if longest < context < longest + max_new_tokens:
        return (f"note: the model's context is {context} tokens, so a continuation stops after {context - longest} "
                f"new tokens, not {asked}")
    return None


def sample_texts(model: GPT, prompts: Sequence[str], *, max_new_tokens: int = 64, temperature: float = 0.8,
                 top_k: int | None = 50, seed: int | None = 0, use_cache: bool = True,
                 stream: Callable[[str], None] | None = None, tokenizer: Tokenizer | None = None) -> list[str]:
    """Continue each prompt (one batch); returns prompt + continuation per prompt. With `stream`,
    a single prompt's continuation is passed to it piece by piece as it is generated. `tokenizer`:
    the one the model was trained with (default GPT-2's); a row stops at its separator."""
    from ..chat.template import special_token_bytes
    from ..tokenizer.core import gpt2_tokenizer

    tok = tokenizer or gpt2_tokenizer()
    ids = [encode_prompt(p, tok) for p in prompts]
    specials = special_token_bytes(tok, model.vocab_size)  # an SFT model's chat tokens, printed by name
    on_token = None
    streamer = None
    if stream is not None:
        if len(prompts) != 1:
            raise ValueError("streaming shows one prompt's continuation; pass a single prompt or no stream")
        streamer = Utf8Stream(tok.encoding, stream, specials)
        on_token = lambda row, t: streamer(t)  # noqa: E731
    new = generate_batch(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                         use_cache=use_cache, stop_token=tok.bos_id, on_token=on_token)
    if streamer is not None:
        streamer.flush()
    return [p + decode_with(tok, toks, specials) for p, toks in zip(prompts, new)]


def decode_with(tok: Tokenizer, ids: Sequence[int], extra: dict[int, bytes]) -> str:
    """tok.decode(ids), the ids it does not have (`extra`: a chat model's specials) by their bytes."""
    if not extra:
        return tok.decode(ids)
    return b"".join(token_bytes(tok.encoding, t, extra) for t in ids).decode("utf-8", errors="replace")


def token_bytes(encoding, token: int, extra: dict[int, bytes]) -> bytes:
    """The bytes of one token: the tiktoken `encoding`'s, or `extra`'s for an id it does not have."""
    piece = extra.get(token)
    return encoding.decode_single_token_bytes(token) if piece is None else piece


def sample_text(model: GPT, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.8,
                top_k: int | None = 50, seed: int | None = 0, stream=None, tokenizer: Tokenizer | None = None) -> str:
    """Sample one continuation of `prompt`; stops at end-of-text. Streams pieces to `stream(str)` if given."""
    return sample_texts(model, [prompt], max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                        seed=seed, stream=stream, tokenizer=tokenizer)[0]
