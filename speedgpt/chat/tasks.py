"""Built-in synthetic chat tasks, made locally so `speedgpt sft` and `eval --chat` run offline: two-number
arithmetic, spelling a word letter by letter, and counting a letter in a word (nanochat's SpellingBee
idea). Each example is a question with one exact answer, so a model's reply is scored by exact match.

Words come from GPT-2's bundled vocabulary (whole lowercase words of 3-9 letters), so nothing is
downloaded. The held-out examples (`heldout`) are drawn from their own seed and never appear in the
training stream (`training_conversations` skips them).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from importlib import resources
from typing import Callable, Iterator

HELDOUT_SEED = 1_000_003  # a seed stream of its own: held-out questions differ from training draws
HELDOUT_PER_TASK = 100  # held-out questions per task: what evaluation can score, and training never sees


@dataclass(frozen=True)
class Example:
    task: str
    question: str
    answer: str

    def conversation(self) -> list[dict]:
        return [{"role": "user", "content": self.question}, {"role": "assistant", "content": self.answer}]


@functools.cache
def words() -> tuple[str, ...]:
    """Lowercase words of 3-9 letters that are whole tokens of GPT-2's vocabulary (with a leading space)."""
    vocab = json.loads((resources.files("speedgpt.data") / "gpt2_bpe" / "encoder.json").read_text(encoding="utf-8"))
    out = {t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isascii() and t[1:].isalpha()
           and t[1:].islower() and 3 <= len(t) - 1 <= 9}
    return tuple(sorted(out))


def arithmetic(rng: random.Random) -> Example:
    a, b = rng.randrange(100), rng.randrange(100)
    op = rng.choice("+-")
    value = a + b if op == "+" else a - b
    return Example("arithmetic", f"What is {a} {op} {b}?", str(value))


def spelling(rng: random.Random) -> Example:
    word = rng.choice(words())
    return Example("spelling", f"Spell the word '{word}' letter by letter.", "-".join(word))


def letter_count(rng: random.Random) -> Example:
    word = rng.choice(words())
    # half the time a letter of the word, else any letter (a zero count is an answer too)
    letter = rng.choice(word) if rng.random() < 0.5 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    return Example("letter_count", f"How many times does the letter '{letter}' appear in '{word}'?",
                   str(word.count(letter)))


TASKS: dict[str, Callable[[random.Random], Example]] = {
    "arithmetic": arithmetic, "spelling": spelling, "letter_count": letter_count}


def heldout_count_problem(flag: str, count: int) -> str | None:
    """Why `count` held-out examples per task cannot be scored (`sft --eval-examples`, `eval --chat-examples`): more
    than there are were scored as all there are, while sft.json recorded the number asked for."""
    if 0 <= count <= HELDOUT_PER_TASK:
        return None
    return f"{flag} {count}: must be 0..{HELDOUT_PER_TASK} (the held-out set's size per task)"


@functools.cache
def heldout(per_task: int = HELDOUT_PER_TASK) -> tuple[Example, ...]:
    """The held-out examples of every task (distinct questions, the same on every call)."""
    rng = random.Random(HELDOUT_SEED)
    out: list[Example] = []
    for name, make in TASKS.items():
        seen: set[str] = set()
        while len(seen) < per_task:
            ex = make(rng)
            if ex.question not in seen:
                seen.add(ex.question)
                out.append(ex)
    return tuple(out)


def first_heldout(per_task: int, task: str | None = None) -> list[Example]:
    """The first `per_task` held-out examples of each task (or of `task` alone)."""
    counts: dict[str, int] = {}
    out = []
    for ex in heldout():
        if (task is None or ex.task == task) and counts.get(ex.task, 0) < per_task:
            counts[ex.task] = counts.get(ex.task, 0) + 1
            out.append(ex)
    return out


def training_examples(seed: int, heldout_per_task: int = HELDOUT_PER_TASK) -> Iterator[Example]:
    """An endless stream of training examples, the tasks in turn, none of them a held-out question."""
    rng = random.Random(seed)
    held = {ex.question for ex in heldout(heldout_per_task)}
    makers = list(TASKS.values())
    i = 0
    while True:
        ex = makers[i % len(makers)](rng)
        if ex.question not in held:
            yield ex
            i += 1
