"""Chat evaluation: the held-out assistant-token loss, exact-match generative tasks (the built-in ones,
a GSM8K-layout file) and multiple-choice tasks in chat form (ARC/MMLU-layout files), summed up as a
ChatCORE-style centred mean.

Centring (nanochat's ChatCORE): a task's accuracy a with chance level c scores (a - c) / (1 - c), so 0 is
guessing and 1 is perfect, whatever the number of choices; generative tasks have c = 0.

File layouts (JSONL, one example per line):
- multiple choice, ARC/MMLU style: {"question": str, "choices": [str, ...], "answer": int | "A".."Z"}
  (ARC's {"choices": {"text": [...], "label": [...]}, "answerKey": "B"} is read too). The prompt lists
  the choices as "A. ...", the model is right when its likeliest letter is the answer's.
- exact match, GSM8K style: {"question": str, "answer": str}; the expected answer is what follows the
  last "####" (GSM8K's final answer), else the whole answer; the reply counts when its last number (or,
  for a non-numeric answer, its whole stripped text) equals it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .data import utf8_lines
from .pack import IGNORE, pack_rows, row_tensors
from .template import ChatTemplate

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@torch.no_grad()
def assistant_loss(model, convs: Sequence[tuple[list[int], list[int]]], row_len: int, pad_id: int,
                   rows_per_batch: int = 8) -> float:
    """Mean loss over the assistant's tokens of `convs` (nats per token)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rows = pack_rows(convs, row_len)
    total, count = 0.0, 0
    for i in range(0, len(rows), rows_per_batch):
        inputs, targets = row_tensors(convs, rows[i:i + rows_per_batch], row_len, pad_id)
        total += float(model(inputs.to(device), targets.to(device), reduction="sum"))
        count += int((targets != IGNORE).sum())
    model.train(was_training)
    return total / max(count, 1)


def reply(model, template: ChatTemplate, question: str, max_new_tokens: int = 32) -> str:
    """The model's greedy answer to one user message."""
    return replies(model, template, [question], max_new_tokens)[0]


def replies(model, template: ChatTemplate, questions: Sequence[str], max_new_tokens: int = 32) -> list[str]:
    """Greedy answers to several single-turn questions, generated in one batch."""
    from ..infer.generate import generate_batch

    was_training = model.training
    prompts = [template.render_prompt([{"role": "user", "content": q}]) for q in questions]
    out = generate_batch(model, prompts, max_new_tokens, temperature=0.0, stop_token=template.assistant_end)
    model.train(was_training)
    return [template.tokenizer.decode(ids).strip() for ids in out]


def normalize_answer(text: str) -> str:
    """The part of a reply that exact match compares: its last number (commas dropped), else its stripped text."""
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else text.strip()


@dataclass
class TaskScore:
    task: str
    accuracy: float
    chance: float
    n: int

    @property
    def centred(self) -> float:
        return (self.accuracy - self.chance) / (1 - self.chance)


def exact_match(model, template: ChatTemplate, task: str, pairs: Sequence[tuple[str, str]], batch: int = 32,
                max_new_tokens: int = 32) -> TaskScore:
    right = 0
    for i in range(0, len(pairs), batch):
        chunk = pairs[i:i + batch]
        for (_, answer), got in zip(chunk, replies(model, template, [q for q, _ in chunk], max_new_tokens)):
            right += normalize_answer(got) == normalize_answer(answer)
    return TaskScore(task, right / max(len(pairs), 1), 0.0, len(pairs))


@torch.no_grad()
def multiple_choice(model, template: ChatTemplate, task: str, items: Sequence[tuple[str, list[str], int]]
                    ) -> TaskScore:
    """Each item's prompt lists the choices; right when the likeliest choice letter is the answer's."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    right, chance = 0, 0.0
    for question, choices, answer in items:
        body = question + "\n" + "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
        ids = template.render_prompt([{"role": "user", "content": body}])
        logits = model(torch.tensor([ids], device=device))[0, -1]
        letter_ids = [template.tokenizer.encode(LETTERS[i])[0] for i in range(len(choices))]
        right += int(int(torch.argmax(logits[letter_ids])) == answer)
        chance += 1 / len(choices)
    model.train(was_training)
    n = max(len(items), 1)
    return TaskScore(task, right / n, chance / n, len(items))


def chatcore(scores: Sequence[TaskScore]) -> float:
    """The mean of the tasks' centred accuracies."""
    return sum(s.centred for s in scores) / max(len(scores), 1)


# ----------------------------------------------------------------------------- task files


def _lines(path: Path) -> list[tuple[int, dict]]:
    out = []
    if not Path(path).is_file():
        raise ValueError(f"{path}: {'a folder' if Path(path).is_dir() else 'no such file'}; pass a JSONL file of "
                         f"task examples (docs/chat.md)")
    for n, line in utf8_lines(path, "one task example per line (docs/chat.md)"):
        if line.strip():
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n}: not JSON ({e.msg})") from None
    if not out:  # scored, it would be an accuracy of 0 over n=0 averaged into ChatCORE
        raise ValueError(f"{path}: no examples (the file is empty or blank); pass a JSONL file with one task "
                         f"example per line (docs/chat.md)")
    return out


def read_choice_file(path: Path) -> list[tuple[str, list[str], int]]:
    """ARC/MMLU-layout items: (question, choices, index of the answer)."""
    items = []
    for n, rec in _lines(path):
        try:
            choices, answer = rec["choices"], rec.get("answer", rec.get("answerKey"))
            labels = None
            if isinstance(choices, dict):  # ARC: {"text": [...], "label": ["A", ...]}
                choices, labels = choices["text"], choices["label"]
            if isinstance(answer, str):
                answer = (labels or list(LETTERS)).index(answer.strip())
            if not (isinstance(rec["question"], str) and 2 <= len(choices) <= 26 and 0 <= int(answer) < len(choices)):
                raise ValueError
            items.append((rec["question"], [str(c) for c in choices], int(answer)))
        except (KeyError, ValueError, TypeError):
            raise ValueError(f"{path} line {n}: not a multiple-choice item; expected {{\"question\", \"choices\": "
                             f"[...], \"answer\": index or letter}}") from None
    return items


def read_exact_file(path: Path) -> list[tuple[str, str]]:
    """GSM8K-layout pairs: (question, final answer)."""
    pairs = []
    for n, rec in _lines(path):
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or "answer" not in rec:
            raise ValueError(f"{path} line {n}: expected {{\"question\": str, \"answer\": str}}")
        answer = str(rec["answer"])
        pairs.append((rec["question"], answer.rsplit("####", 1)[-1].strip()))
    return pairs


def builtin_scores(model, template: ChatTemplate, per_task: int) -> list[TaskScore]:
    """Exact match on the first `per_task` held-out examples of each built-in task."""
    from .tasks import TASKS, first_heldout

    scores = []
    for name in TASKS:
        pairs = [(e.question, e.answer) for e in first_heldout(per_task, name)]
        scores.append(exact_match(model, template, name, pairs))
    return scores


def evaluate_chat(source, *, choice_files=(), exact_files=(), per_task: int = 100, limit: int | None = None,
                  device: str = "auto", checkpoint=None, log: bool = True, print_fn=print) -> dict:
    """`speedgpt eval RUN --chat`: the built-in tasks' exact match, plus any task files, and their
    ChatCORE; appended to a run's metrics.jsonl as a chat_eval record (unless `log=False`)."""
    from pathlib import Path

    from ..infer.load import load_model
    from ..rundir import RunDir
    from ..tokenizer.folder import run_tokenizer
    from .template import chat_template

    if not (per_task or exact_files or choice_files):
        raise ValueError("no chat task to score: --chat-examples 0 and no --chat-exact / --chat-choice file")
    # The task files are read before the model is loaded, so that a bad one fails before any scoring.
    exact = [(Path(f).stem, read_exact_file(Path(f))[:limit]) for f in exact_files]
    choice = [(Path(f).stem, read_choice_file(Path(f))[:limit]) for f in choice_files]
    model, cfg = load_model(source, device=device, checkpoint=checkpoint)
    template = chat_template(run_tokenizer(source, cfg), cfg.model)
    scores = builtin_scores(model, template, per_task) if per_task else []
    scores += [exact_match(model, template, task, pairs) for task, pairs in exact]
    scores += [multiple_choice(model, template, task, items) for task, items in choice]
    for s in scores:
        print_fn(f"{s.task:<16} accuracy {s.accuracy:6.1%}  (chance {s.chance:.0%}, centred {s.centred:+.3f}, n={s.n})")
    record = {"event": "chat_eval", "step": 0, "chatcore": chatcore(scores),
              **{f"acc_{s.task}": s.accuracy for s in scores}}
    print_fn(f"ChatCORE {record['chatcore']:+.3f} (mean centred accuracy of {len(scores)} tasks)")
    run = RunDir(source)
    if log and run.is_run():
        record["step"] = max([r.get("step", 0) for r in run.read_metrics()] or [0])
        with run.metrics_logger() as metrics:
            metrics.log(record)
        print_fn(f"eval: appended to {run.metrics_path}")
    return record
