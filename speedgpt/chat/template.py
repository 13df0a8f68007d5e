"""The chat template: a conversation as token ids with special tokens, and the mask of the ids the
assistant says (the only ones SFT trains on).

    BOS <|user_start|> text <|user_end|> <|assistant_start|> text <|assistant_end|> <|user_start|> ...

The special tokens take the ids right after the tokenizer's own (GPT-2: 50257.., rows of the padded
vocabulary that pretraining never targets; a trained tokenizer: its next ids, which must also fall
in the padded rows). A chat model's config says so with model.vocab_size = tokenizer vocab + the
specials, which changes no weight shape. The tool pair is reserved (ids fixed now, so a later tool
format needs no new vocabulary) but not rendered yet.

A system message is folded into the first user message (nanochat's way): the model has no separate
role for it. Mask 1 marks the assistant's text and its <|assistant_end|> (so the model learns to
stop); the role tokens and everything the user says are 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ..tokenizer.core import Tokenizer

SPECIALS = ("<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
            "<|tool_start|>", "<|tool_end|>")
ROLES = ("system", "user", "assistant")


class ConversationError(ValueError):
    """A conversation the template cannot render; the message says what is wrong."""


def chat_vocab_size(tokenizer: Tokenizer) -> int:
    """model.vocab_size of a chat model with this tokenizer: its ids, then the specials."""
    return tokenizer.vocab_size + len(SPECIALS)


def special_token_bytes(tokenizer: Tokenizer, vocab_size: int) -> dict[int, bytes]:
    """The chat specials a model of `vocab_size` ids has (none for a base model), each id with its name's bytes: how
    `speedgpt sample` prints one that an SFT model emits (the tokenizer has no bytes for them)."""
    return {tokenizer.vocab_size + i: name.encode() for i, name in enumerate(SPECIALS)
            if tokenizer.vocab_size + i < vocab_size}


@dataclass(frozen=True)
class ChatTemplate:
    tokenizer: Tokenizer

    def special(self, name: str) -> int:
        return self.tokenizer.vocab_size + SPECIALS.index(name)

    @property
    def specials(self) -> dict[str, int]:
        return {name: self.special(name) for name in SPECIALS}

    @property
    def bos(self) -> int:
        return self.tokenizer.bos_id

    @property
    def assistant_end(self) -> int:
        return self.special("<|assistant_end|>")

    def turns(self, messages: Sequence[dict]) -> list[tuple[str, str]]:
        """(role, text) of each turn, the system message folded into the first user turn; checked:
        user and assistant alternate, starting with the user; text is a non-empty string."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ConversationError("'messages' must be a non-empty list of {\"role\", \"content\"}")
        turns: list[tuple[str, str]] = []
        system = None
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ConversationError(f"message {i} is not {{\"role\", \"content\"}}")
            role, text = m["role"], m["content"]
            if role not in ROLES:
                raise ConversationError(f"message {i} has unknown role {role!r}; roles: {', '.join(ROLES)}")
            if not isinstance(text, str):
                raise ConversationError(f"message {i} ({role}) has content of type {type(text).__name__}: it must "
                                        f"be a string (the text of the turn)")
            if not text.strip():
                raise ConversationError(f"message {i} ({role}) has empty content")
            if role == "system":
                if i != 0:
                    raise ConversationError(f"message {i}: a system message can only come first")
                system = text
                continue
            want = "user" if not turns or turns[-1][0] == "assistant" else "assistant"
            if role != want:
                raise ConversationError(f"message {i} is {role!r} where {want!r} was expected (user and "
                                        f"assistant alternate, starting with the user)")
            if system is not None:
                text, system = f"{system}\n\n{text}", None
            turns.append((role, text))
        if not turns:
            raise ConversationError("a conversation needs a user message")
        return turns

    def render(self, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
        """(ids, mask) of a whole conversation, which must end with the assistant: mask[i] = 1 where
        ids[i] is what the assistant says (its text and <|assistant_end|>)."""
        turns = self.turns(messages)
        if turns[-1][0] != "assistant":
            raise ConversationError("a training conversation must end with an assistant message")
        ids, mask = [self.bos], [0]
        for role, text in turns:
            start, end = self.special(f"<|{role}_start|>"), self.special(f"<|{role}_end|>")
            body = self.tokenizer.encode(text)
            trained = int(role == "assistant")
            ids += [start, *body, end]
            mask += [0] + [trained] * (len(body) + 1)
        return ids, mask

    def render_prompt(self, messages: Sequence[dict]) -> list[int]:
        """The ids that ask for the next assistant turn: the conversation (ending with the user),
        then <|assistant_start|>."""
        turns = self.turns(messages)
        if turns[-1][0] != "user":
            raise ConversationError("a prompt must end with a user message")
        ids, _ = self.render([*messages, {"role": "assistant", "content": "."}])
        cut = len(ids) - 1 - ids[::-1].index(self.special("<|assistant_start|>"))
        return ids[:cut + 1]

    def jinja(self) -> str:
        """The same template in Jinja, for a Hugging Face export's `chat_template`
        (transformers' apply_chat_template gives render's ids / render_prompt's with
        add_generation_prompt)."""
        bos = "<|endoftext|>"
        return (
            "{{ '" + bos + "' }}"
            "{% set ns = namespace(system='') %}"
            "{% for m in messages %}"
            "{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\\n\\n' %}"
            "{% elif m['role'] == 'user' %}{{ '<|user_start|>' + ns.system + m['content'] + '<|user_end|>' }}"
            "{% set ns.system = '' %}"
            "{% else %}{{ '<|assistant_start|>' + m['content'] + '<|assistant_end|>' }}{% endif %}"
            "{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant_start|>' }}{% endif %}"
        )


def chat_template(tokenizer: Tokenizer, model_cfg) -> ChatTemplate:
    """The template of a model whose config has room for the specials; a ConversationError that says
    what to do otherwise (a base model: fine-tune it with `speedgpt sft` first)."""
    if model_cfg.vocab_size < chat_vocab_size(tokenizer):
        raise ConversationError(f"the model's vocabulary ({model_cfg.vocab_size}) has no chat tokens (needs "
                                f"{chat_vocab_size(tokenizer)}): it is a base model; fine-tune it with "
                                f"`speedgpt sft RUN` and chat with the SFT run")
    return ChatTemplate(tokenizer)


def check_room(tokenizer: Tokenizer, model_cfg) -> None:
    """The specials must land in rows the model already has (its padded vocabulary)."""
    need = chat_vocab_size(tokenizer)
    padded = model_cfg.padded_vocab()
    if need > padded:
        raise ConversationError(f"the chat tokens need ids up to {need - 1} but the model's padded vocabulary "
                                f"has {padded} rows (tokenizer vocab {tokenizer.vocab_size}, "
                                f"model.vocab_pad_multiple={model_cfg.vocab_pad_multiple}); train the base model's "
                                f"tokenizer with --vocab-size {tokenizer.vocab_size - len(SPECIALS)} or less, or "
                                f"a larger model.vocab_pad_multiple")
