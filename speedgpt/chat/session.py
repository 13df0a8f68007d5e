"""A conversation with a chat model that keeps its KV cache across turns: each new user message costs
only its own tokens' compute, not the whole history's again.

The ids so far are `ids`; the cache holds the first `cache.pos` of them, so whatever is not yet in it
(the new user turn, the <|assistant_end|> that closed the last answer) is fed at the next turn. An
answer stops at <|assistant_end|>, at `max_new_tokens`, or when the context is full; an answer cut
short (Ctrl-C, a closed web page) is closed with <|assistant_end|> too, so the history stays a valid
conversation.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from ..infer.generate import Utf8Stream, pick_tokens
from ..model.attention import KVCache
from .template import ChatTemplate, ConversationError


class ContextFull(ConversationError):
    pass


class ChatSession:
    def __init__(self, model, template: ChatTemplate, *, temperature: float = 0.8, top_k: int | None = 50,
                 max_new_tokens: int = 256, seed: int | None = None):
        self.model, self.template = model, template
        self.temperature, self.top_k, self.max_new_tokens = temperature, top_k, max_new_tokens
        self.device = next(model.parameters()).device
        self.context = model.rotary.max_seq_len
        self.cut = None  # why the last answer stopped before its <|assistant_end|>: None, "tokens" or "context"
        self.gen = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        self.clear()

    def clear(self) -> None:
        """A new conversation: no history, an empty cache."""
        cfg = self.model.cfg
        self.ids: list[int] = [self.template.bos]
        self.cache = KVCache(cfg.depth, 1, cfg.resolved_kv_heads(), self.context, cfg.head_dim, self.device,
                             self.model.runtime.dtype)

    def load(self, messages: Sequence[dict]) -> None:
        """Start from a conversation that ends with the user (the web page sends its whole history);
        `answer()` then streams the reply."""
        self.clear()
        self.ids = self.template.render_prompt(messages)[:-1]  # without <|assistant_start|>: answer() adds it
        if len(self.ids) + 1 >= self.context:
            raise ContextFull(f"the conversation fills the model's context ({self.context} tokens); start a new one")

    def reply(self, text: str) -> Iterator[str]:
        """Add the user's message and stream the answer's text."""
        t = self.template
        if not text.strip():  # as the template refuses one (the web page, SFT data): `chat --prompt ""` was answered
            raise ConversationError("the message is empty; give the text to answer")  # from an empty turn, exit 0
        turn = [t.special("<|user_start|>"), *t.tokenizer.encode(text), t.special("<|user_end|>")]
        if len(self.ids) + len(turn) + 2 >= self.context:
            raise ContextFull(f"the conversation fills the model's context ({self.context} tokens); /clear "
                              f"starts a new one")
        self.ids += turn
        return self.answer()

    def answer(self) -> Iterator[str]:
        """Stream the assistant's answer to the conversation so far (which ends with the user)."""
        self.ids.append(self.template.special("<|assistant_start|>"))
        return self._answer()

    @torch.no_grad()
    def _answer(self) -> Iterator[str]:
        self.model.eval()
        end, vocab = self.template.assistant_end, self.model.vocab_size
        pieces: list[str] = []
        stream = Utf8Stream(self.template.tokenizer.encoding, pieces.append)
        self.cut = "tokens"  # unless the model ends its answer or the context fills first
        try:
            for _ in range(self.max_new_tokens):
                if len(self.ids) >= self.context:
                    self.cut = "context"
                    break
                new = torch.tensor([self.ids[self.cache.pos:]], device=self.device)
                logits = self.model(new, kv_cache=self.cache)[0, -1, :vocab]
                tok = int(pick_tokens(logits[None], self.temperature, self.top_k, self.gen)[0, 0])
                if tok == end:
                    self.cut = None
                    break
                self.ids.append(tok)
                if tok < self.template.tokenizer.vocab_size:  # a stray special token is not text
                    stream(tok)
                yield from pieces
                pieces.clear()
            stream.flush()
            yield from pieces
        finally:
            self.ids.append(end)  # close the turn, whatever stopped it


def cut_reason(chat: ChatSession) -> str:
    """Why the session's last answer stopped before its end (ChatSession.cut), in the user's words."""
    if chat.cut == "context":
        return f"cut: the conversation fills the model's context ({chat.context} tokens)"
    return f"cut at --max-tokens {chat.max_new_tokens}"
