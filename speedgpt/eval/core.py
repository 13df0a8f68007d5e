"""CORE (DCLM, arXiv:2406.11794): 22 in-context tasks, each scored against its random baseline.

What base models are compared on. Each task is one of three formats, scored by the model's own
token losses (no generation):

* ``multiple_choice`` (query + one of several choices): the prompts differ only at their end;
  the choice whose tokens after the shared prefix have the lowest mean loss wins.
* ``schema`` (one of several contexts + a shared continuation, e.g. Winograd): the prompts
  share their end; the context under which the shared suffix has the lowest mean loss wins.
* ``language_modeling`` (context + continuation, e.g. LAMBADA): correct when greedy decoding
  (the argmax at each position) reproduces every continuation token.

Few-shot examples come first, each ``query<delim>answer`` and a blank line, drawn from the
task's other examples with the benchmark's seeds (data shuffled with 1337; example i's shots by
``random.Random(1234 + i)``), so scores compare with published ones. A task's accuracy is
centered as (acc - baseline) / (1 - baseline) and CORE is the mean over the tasks.

The task bundle (``core.yaml``, ``eval_meta_data.csv``, ``eval_data/*.jsonl``, the layout DCLM and
nanochat use) is read from a directory or downloaded once as a zip. All rows of a task are scored
in length-sorted, right-padded batches (padding after a row cannot change a causal model's
losses on it), so the eval is a few large forwards per task on a GPU.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

CORE_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
FORMATS = ("multiple_choice", "schema", "language_modeling")
# The 22 tasks of CORE and their shots (DCLM's core.yaml), to say so when a bundle differs.
CORE_TASKS = {
    "hellaswag_zeroshot": 0, "jeopardy": 10, "bigbench_qa_wikidata": 10, "arc_easy": 10, "arc_challenge": 10,
    "copa": 0, "commonsense_qa": 10, "piqa": 10, "openbook_qa": 0, "lambada_openai": 0, "hellaswag": 10,
    "winograd": 0, "winogrande": 0, "bigbench_dyck_languages": 10, "agi_eval_lsat_ar": 3,
    "bigbench_cs_algorithms": 10, "bigbench_operators": 10, "bigbench_repeat_copy_logic": 10, "squad": 10,
    "coqa": 0, "boolq": 10, "bigbench_language_identification": 10,
}


class CoreError(ValueError):
    """The bundle is missing or malformed; the message says what to pass instead."""


@dataclass
class Task:
    label: str
    kind: str  # one of FORMATS
    shots: int
    delimiter: str
    random_baseline: float  # accuracy of guessing, as a fraction
    examples: list[dict] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The bundle: a local directory, or the zip downloaded once.

def download_bundle(dest_dir: str | os.PathLike, url: str = CORE_BUNDLE_URL, *, timeout: float = 60.0) -> Path:
    """Fetch and unpack the bundle into ``dest_dir/eval_bundle`` (skipped when present); returns that
    directory. Downloaded to a temp file and unpacked into a temp directory, then renamed, so an
    interrupted download never looks complete."""
    dest_dir = Path(dest_dir)
    bundle = dest_dir / "eval_bundle"
    if (bundle / "core.yaml").is_file():
        return bundle
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".core-download-") as tmp:
        archive = Path(tmp) / "bundle.zip"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp, open(archive, "wb") as f:
                while chunk := resp.read(1 << 20):
                    f.write(chunk)
        except OSError as e:  # URLError, HTTPError and timeouts are all OSErrors
            raise CoreError(f"could not download the CORE bundle from {url} ({e}); fetch it by hand and pass "
                            f"--core-bundle DIR") from e
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(Path(tmp) / "unpacked")
        except zipfile.BadZipFile:
            raise CoreError(f"{url} did not return a zip archive; fetch the bundle by hand and pass "
                            f"--core-bundle DIR") from None
        found = next(iter(sorted((Path(tmp) / "unpacked").rglob("core.yaml"))), None)
        if found is None:
            raise CoreError(f"the archive from {url} holds no core.yaml; not a CORE bundle")
        shutil.rmtree(bundle, ignore_errors=True)  # a partial copy from an older, broken layout
        os.replace(found.parent, bundle)
    return bundle


def _bundle_dir(path: Path) -> Path:
    for cand in (path, path / "eval_bundle"):
        if (cand / "core.yaml").is_file():
            return cand
    raise CoreError(f"no core.yaml in {path} (or {path / 'eval_bundle'}); pass the unpacked CORE bundle or "
                    f"--core-bundle download")


def load_bundle(path: str | os.PathLike, max_per_task: int | None = None) -> list[Task]:
    """The tasks of a bundle directory, each with its examples shuffled by the benchmark's seed and
    cut to ``max_per_task`` (then few-shot examples are drawn from that cut, as nanochat does)."""
    import yaml

    root = _bundle_dir(Path(path))
    spec = yaml.safe_load((root / "core.yaml").read_text(encoding="utf-8")) or {}
    baselines = {}
    meta = root / "eval_meta_data.csv"
    if not meta.is_file():
        raise CoreError(f"{meta} is missing: the random baselines of the tasks live there")
    with open(meta, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            baselines[row["Eval Task"]] = float(row["Random baseline"]) / 100.0  # stored in percent
    tasks = []
    for t in spec.get("icl_tasks", []):
        label, kind = t["label"], t["icl_task_type"]
        if kind not in FORMATS:
            raise CoreError(f"{root / 'core.yaml'}: task {label} has type {kind!r}; known: {', '.join(FORMATS)}")
        if label not in baselines:
            raise CoreError(f"{meta}: no random baseline for task {label}")
        shots = t.get("num_fewshot", [0])
        data = root / "eval_data" / t["dataset_uri"]
        if not data.is_file():
            raise CoreError(f"task {label}: {data} is missing; the bundle is incomplete")
        examples = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
        random.Random(1337).shuffle(examples)
        if max_per_task:
            examples = examples[:max_per_task]
        tasks.append(Task(label, kind, int(shots[0] if isinstance(shots, list) else shots),
                          t.get("continuation_delimiter", " "), baselines[label], examples))
    if not tasks:
        raise CoreError(f"{root / 'core.yaml'} lists no icl_tasks")
    return tasks


# ---------------------------------------------------------------------------------------------
# Prompts and the token spans that are scored.

def render_prompts(task: Task, i: int) -> list[str]:
    """The prompts of example i: one per choice (multiple_choice), one per context option (schema), or
    [context, context + continuation] (language_modeling)."""
    ex, d = task.examples[i], task.delimiter
    shots = []
    if task.shots:
        others = [j for j in range(len(task.examples)) if j != i]
        shots = [task.examples[j] for j in random.Random(1234 + i).sample(others, min(task.shots, len(others)))]
    if task.kind == "multiple_choice":
        prefix = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [f"{prefix}{ex['query']}{d}{choice}" for choice in ex["choices"]]
    if task.kind == "schema":
        prefix = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in shots)
        return [f"{prefix}{option}{d}{ex['continuation']}" for option in ex["context_options"]]
    prefix = "".join(f"{s['context'].strip()}{d}{s['continuation']}\n\n" for s in shots)
    # Stripped, so the context's trailing space does not tokenize differently from its use in the
    # full prompt: the context's tokens are then a prefix of the full prompt's.
    return [f"{prefix}{ex['context'].strip()}{d}".strip(), f"{prefix}{ex['context'].strip()}{d}{ex['continuation']}"]


def _common_length(seqs: list[list[int]], from_end: bool) -> int:
    n = min(len(s) for s in seqs)
    for k in range(n):
        idx = -1 - k if from_end else k
        if any(s[idx] != seqs[0][idx] for s in seqs):
            return k
    return n


def scored_rows(task: Task, prompts: list[str], encode, bos: int) -> list[tuple[list[int], int, int]]:
    """[(tokens, start, end)]: the rows to forward and the span [start, end) of each whose tokens are
    scored (each predicted from the position before it)."""
    rows = [[bos, *encode(p)] for p in prompts]
    if task.kind == "multiple_choice":  # the choices: everything after the prompts' shared prefix
        start = _common_length(rows, from_end=False)
        return [(r, start, len(r)) for r in rows]
    if task.kind == "schema":  # the shared continuation: the prompts' shared suffix
        n = _common_length(rows, from_end=True)
        return [(r, len(r) - n, len(r)) for r in rows]
    without, full = rows
    if full[: len(without)] != without or len(full) <= len(without):
        raise CoreError(f"task {task.label}: the context does not tokenize as a prefix of context + continuation")
    return [(full, len(without), len(full))]


def _fit_context(row: tuple[list[int], int, int], max_len: int) -> tuple[list[int], int, int]:
    """Keep a row's last max_len tokens (the scored span is at its end)."""
    tokens, start, end = row
    cut = max(0, len(tokens) - max_len)
    return tokens[cut:], max(1, start - cut), end - cut


# ---------------------------------------------------------------------------------------------
# Scoring.

def correct_answers(task: Task, rows: list[tuple[list[int], int, int]], losses: list[torch.Tensor],
                    predictions: list[torch.Tensor], example: dict) -> bool:
    """Whether the example was answered right, from each row's per-position losses and argmax
    predictions (position t scores token t + 1)."""
    if task.kind == "language_modeling":
        tokens, start, end = rows[0]
        return predictions[0][start - 1 : end - 1].tolist() == tokens[start:end]
    # An empty span (a choice that is a prefix of another) can never win.
    means = [loss[start - 1 : end - 1].double().mean().item() if end > start else float("inf")
             for loss, (_, start, end) in zip(losses, rows)]
    best = min(range(len(means)), key=lambda k: (means[k], k))  # ties: the lowest index, on every backend
    return best == int(example["gold"])


class DenseMaskScorer(torch.nn.Module):
    """The model with SDPA's dense masks whatever its runtime's backend. CORE's batches change shape
    from one to the next, and flex compiles its kernel per shape: on an H100 a 124M model's CORE run
    hit dynamo's recompile limit within a minute, fell back to flex's unfused path (full score
    matrices) and had not finished after 10 minutes."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs_BT: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_BT, ctx=self.model.context(inputs_BT, backend="sdpa"))


@torch.no_grad()
def forward_rows(model, rows: list[list[int]], *, device, batch_tokens: int, pad_id: int):
    """(losses, predictions) per row, each of the row's length (the last position's loss is NaN).
    Rows are sorted by length and forwarded in right-padded batches of at most batch_tokens tokens."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    losses: list[torch.Tensor | None] = [None] * len(rows)
    preds: list[torch.Tensor | None] = [None] * len(rows)
    i = 0
    while i < len(order):
        longest = len(rows[order[i]])
        j = i + 1
        while j < len(order):  # grow the batch while its padded size (the last row is the longest) fits
            width = len(rows[order[j]])
            if (j - i + 1) * width > batch_tokens:
                break
            longest, j = width, j + 1
        batch = order[i:j]
        inputs = torch.full((len(batch), longest), pad_id, dtype=torch.int64)
        for r, k in enumerate(batch):
            inputs[r, : len(rows[k])] = torch.tensor(rows[k])
        inputs = inputs.to(device)
        logits = model(inputs.to(torch.int32)).float()
        targets = torch.roll(inputs, -1, dims=1)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(len(batch), -1)
        pred = logits.argmax(-1)
        del logits
        loss, pred = loss.cpu(), pred.cpu()  # one copy per batch; scoring reads them row by row
        for r, k in enumerate(batch):
            n = len(rows[k])
            row_loss = loss[r, :n].clone()
            row_loss[-1] = float("nan")
            losses[k], preds[k] = row_loss, pred[r, :n]
        i = j
    return losses, preds


def evaluate_task(model, task: Task, encode, *, bos: int, device, max_len: int, batch_tokens: int) -> float:
    """The task's accuracy: every example's rows forwarded in batches, then scored by its format."""
    per_example = []
    flat: list[list[int]] = []
    for i in range(len(task.examples)):
        rows = [_fit_context(r, max_len) for r in scored_rows(task, render_prompts(task, i), encode, bos)]
        per_example.append((len(flat), rows))
        flat.extend(tokens for tokens, _, _ in rows)
    losses, preds = forward_rows(model, flat, device=device, batch_tokens=batch_tokens, pad_id=bos)
    correct = 0
    for i, (at, rows) in enumerate(per_example):
        n = len(rows)
        correct += correct_answers(task, rows, losses[at : at + n], preds[at : at + n], task.examples[i])
    return correct / max(1, len(task.examples))


def centered(accuracy: float, random_baseline: float) -> float:
    return (accuracy - random_baseline) / (1.0 - random_baseline)


def evaluate_core(model, tasks: list[Task], encode, *, bos: int, device, max_len: int,
                  batch_tokens: int = 32_768, print_fn=print) -> dict:
    """{"core": mean centered accuracy, "tasks": {label: {accuracy, centered, n, shots, kind, s}}}."""
    was_training = model.training
    model.eval()
    results = {}
    try:
        for task in tasks:
            t0 = time.perf_counter()
            acc = evaluate_task(model, task, encode, bos=bos, device=device, max_len=max_len,
                                batch_tokens=batch_tokens)
            results[task.label] = {"accuracy": acc, "centered": centered(acc, task.random_baseline),
                                   "n": len(task.examples), "shots": task.shots, "kind": task.kind,
                                   "s": round(time.perf_counter() - t0, 3)}
    finally:
        model.train(was_training)
    core = sum(r["centered"] for r in results.values()) / len(results)
    missing = sorted(set(CORE_TASKS) - set(results))
    out = {"core": core, "tasks": results, "complete": not missing}
    print_fn(format_core_table(out))
    if missing:
        print_fn(f"core: the bundle lacks {len(missing)} of CORE's 22 tasks ({', '.join(missing)}): "
                 f"the score is a mean over {len(results)} tasks, not CORE")
    return out


def format_core_table(out: dict) -> str:
    lines = [f"  {'task':<34} {'format':<17} {'shots':>5} {'n':>6} {'acc':>7} {'centered':>9} {'time':>7}"]
    for label, r in out["tasks"].items():
        lines.append(f"  {label:<34} {r['kind']:<17} {r['shots']:>5} {r['n']:>6} {r['accuracy']:>7.4f} "
                     f"{r['centered']:>9.4f} {r['s']:>6.1f}s")
    lines.append(f"  {'CORE':<34} {'':<17} {'':>5} {'':>6} {'':>7} {out['core']:>9.4f}")
    return "\n".join(lines)
