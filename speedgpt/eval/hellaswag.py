"""HellaSwag (validation split) as a 4-way completion task scored by the language model itself.

Each example: a context and 4 candidate endings. The model scores each ending by the
cross-entropy of the ending's tokens given the context; the lowest wins. ``acc`` compares summed
losses, ``acc_norm`` compares per-token (length-normalized) losses — the figure usually quoted
for small GPTs (GPT-2 124M ~0.29-0.30, chance 0.25). Endings get a leading space, as in the
standard eval, so they tokenize like a continuation of the context.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import torch
import torch.nn.functional as F

HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"


def download_hellaswag(dest_dir: str | os.PathLike, url: str = HELLASWAG_VAL_URL, *, timeout: float = 60.0) -> Path:
    """Fetch the file once into ``dest_dir`` (skipped when present); returns its path.
    Written to a temp file and renamed, so an interrupted download never looks complete."""
    dest_dir = Path(dest_dir)
    dest = dest_dir / Path(urllib.request.urlparse(url).path).name
    if dest.is_file():
        return dest
    from ..atomic import atomic_file

    dest_dir.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, atomic_file(dest) as f:
            while chunk := resp.read(1 << 20):
                f.write(chunk)
    except OSError as e:  # URLError, HTTPError and timeouts are all OSErrors
        raise RuntimeError(f"could not download {url} ({e}); fetch it by hand into {dest}") from e
    return dest


def load_examples(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """Examples from a HellaSwag jsonl file (``ctx``, 4 ``endings``, int ``label``; other keys kept)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no HellaSwag file at {path}: run speedgpt.eval.hellaswag.download_hellaswag() first")
    examples = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if limit is not None and len(examples) >= limit:
                break
            try:  # decoded here: a binary file (a .gz) was Python's "'utf-8' codec can't decode byte", no file named
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text; a HellaSwag file holds one JSON example per line "
                                 f"(hellaswag_val.jsonl, uncompressed), or pass --hellaswag download") from None
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except json.JSONDecodeError as e:  # was the bare "Expecting value: line 1 column 1 (char 0)"
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg}); a HellaSwag file holds one JSON example per "
                                 f"line (hellaswag_val.jsonl), or pass --hellaswag download") from None
            if not isinstance(ex, dict) or not isinstance(ex.get("ctx"), str) or len(ex.get("endings", ())) != 4 \
                    or str(ex.get("label")) not in ("0", "1", "2", "3"):
                raise ValueError(f"{path}:{lineno}: not a HellaSwag example (needs 'ctx', 4 'endings', 'label' 0-3)")
            ex["label"] = int(ex["label"])  # the HF copy stores it as a string
            examples.append(ex)
    if not examples:  # else "no HellaSwag example fits the model's context", which blamed the model
        raise ValueError(f"{path} holds no HellaSwag example; pass a hellaswag_val.jsonl, or --hellaswag download")
    return examples


def render_example(example: dict, tokenizer, *, bos: int | None = None):
    """-> (tokens_4xT int64, mask_4xT bool, label): row i = context + ending i, right-padded with 0;
    mask is True on ending tokens. ``bos``: an id to prepend (e.g. 50256 for models trained on
    BOS-aligned documents); None gives the standard llm.c-style eval."""
    ctx = ([bos] if bos is not None else []) + tokenizer.encode(example["ctx"])
    rows, masks = [], []
    for ending in example["endings"]:
        end = tokenizer.encode(" " + ending)
        rows.append(ctx + end)
        masks.append([False] * len(ctx) + [True] * len(end))
    T = max(len(r) for r in rows)
    tokens = torch.zeros(4, T, dtype=torch.int64)
    mask = torch.zeros(4, T, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m)
    return tokens, mask, int(example["label"])


def _argmin_first(values: list[float]) -> int:
    # Explicit tie rule (lowest index wins) so results do not depend on a backend's argmin.
    return min(range(len(values)), key=lambda i: (values[i], i))


@torch.no_grad()
def score_example(model, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[list[float], list[float]]:
    """Summed and mean cross-entropy of each row's masked tokens under ``model(tokens)->logits``."""
    logits = model(tokens).float()
    # Position t predicts token t+1: drop the last logit and the first target.
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    # Sum in float64: k equal float32 losses then sum to exactly k*x, so equal scores stay exact
    # ties (resolved by index) instead of being split by reduction-order rounding.
    losses = losses.double()
    m = mask[:, 1:].to(losses.dtype)
    sums = (losses.view(tokens.shape[0], -1) * m).sum(1)
    return sums.tolist(), (sums / m.sum(1)).tolist()


def evaluate_hellaswag(model, examples: list[dict], tokenizer, *, device, limit: int | None = None,
                       bos: int | None = None) -> dict:
    """-> dict(acc, acc_norm, n). Under torch.distributed each rank scores every world_size-th
    example and the counts are summed, so every rank gets the global figures."""
    examples = examples[:limit] if limit is not None else examples
    rank, world = 0, 1
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed:
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    was_training = model.training
    model.eval()
    counts = torch.zeros(3, dtype=torch.int64, device=device)  # [n, correct(sum), correct(mean)]
    try:
        for ex in examples[rank::world]:
            tokens, mask, label = render_example(ex, tokenizer, bos=bos)
            sums, means = score_example(model, tokens.to(device), mask.to(device))
            counts += torch.tensor([1, _argmin_first(sums) == label, _argmin_first(means) == label], device=device)
    finally:
        model.train(was_training)
    if distributed:
        torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.SUM)
    n, correct, correct_norm = counts.tolist()
    if n == 0:
        raise ValueError("evaluate_hellaswag got no examples: check the HellaSwag file and limit")
    return {"acc": correct / n, "acc_norm": correct_norm / n, "n": n}
