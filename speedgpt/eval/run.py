"""`speedgpt eval`: validation loss, bits per byte and optionally HellaSwag for a trained model.

The loss is computed exactly as the trainer's validation does (the first N tokens of the split as
contiguous windows of the run's validation length), so numbers at the same step agree with the
run's own curve; bits per byte makes runs with different tokenizers or data comparable.
"""

from __future__ import annotations

import time
from pathlib import Path


EVAL_BATCH_TOKENS = 32_768


class EvalError(ValueError):
    """Evaluation data is missing or too small; the message says what to pass instead."""


def resolve_eval_files(cfg, data: str | None, split: str, run_dir=None) -> list[Path]:
    """Shards to score: `data` if given, else the run's own split as its training resolved it (a relative path
    of the run's config not found: the error names the directory it is relative to, when `run_dir` is given)."""
    from ..data.shards import find_shards, val_from_train_problem

    d = cfg.data
    problem = None if data or split != "val" else val_from_train_problem(d.train_files, d.val_files)
    if problem:  # a run from before training refused this: its "val" would be its training files
        raise EvalError(problem.replace("give --data.val_files=GLOB_OR_DIR", "pass --data GLOB_OR_DIR"))
    if data:
        where = data
    elif split == "val" and d.val_files:
        where = d.val_files
    elif d.train_files:
        where = d.train_files
    else:
        where = str(cfg.data.default_corpus_dir())
        if not Path(where).is_dir():
            raise EvalError(f"the run trained on the default local corpus, expected at {where}, which is gone; "
                            f"rebuild it with `speedgpt data local-python` or pass --data GLOB_OR_DIR")
    try:
        return find_shards(where, split)
    except FileNotFoundError as e:
        if data or run_dir is None:
            raise EvalError(str(e)) from None
        from ..rundir.env import with_start_dir

        raise EvalError(with_start_dir(str(e), run_dir, [where])) from None


def plan_batches(available: int, want: int, seq_len: int, max_rows: int) -> tuple[int, int]:
    """(tokens, rows per batch): at most `want` tokens (all that `available` allows, one kept back for
    the last target) as whole rows, with a batch size that divides the row count, so that
    val_batches' "multiple of batch_size * seq_len" holds without dropping more than a row's tail."""
    rows = min(want, available - 1) // seq_len
    if rows < 1:
        raise EvalError(f"{available:,} tokens cannot fill one row of {seq_len} tokens (+1 target); use more "
                        f"validation data")
    batch = max(b for b in range(1, min(rows, max_rows) + 1) if rows % b == 0)
    if batch * 4 < min(rows, max_rows):  # an awkward (e.g. prime) row count: drop a few rows instead
        batch = min(rows, max_rows)
        rows -= rows % batch
    return rows * seq_len, batch


def evaluate_run(source: str | Path, *, data: str | None = None, split: str = "val", tokens: int | None = None,
                 hellaswag: str | None = None, limit: int | None = None, device: str = "auto",
                 checkpoint: str | int | None = None, batch_rows: int | None = None, log: bool = True,
                 core: str | None = None, core_limit: int | None = None, print_fn=print) -> dict:
    """Evaluate a run (or export) directory; returns the eval record. For a run directory the record
    is appended to its metrics.jsonl (unless `log=False`). `core`: a CORE bundle directory, or
    "download" (fetched once into the cache; also used when it is already there)."""
    from ..data.val import check_val_ids, val_batches
    from ..data.shards import read_header
    from ..infer.load import load_model
    from ..plan import RunPlan
    from ..rundir import RunDir
    from ..rundir.weights import locate
    from ..tokenizer.folder import run_tokenizer
    from ..tokenizer.shards import describe_stamp, shards_stamp, stamp_of
    from .bpb import evaluate_loss_and_bpb, token_byte_lengths

    if split not in ("val", "train"):
        raise EvalError(f"--split {split}: use val or train")
    src = locate(source, checkpoint)
    model, cfg = load_model(source, device=device, checkpoint=checkpoint)
    dev = next(model.parameters()).device
    files = resolve_eval_files(cfg, data, split, run_dir=src.root if src.kind == "run" else None)
    seq = cfg.data.val_seq_len or cfg.data.seq_len
    available = sum(read_header(f) for f in files)  # a damaged shard is named here, before anything else
    tok = run_tokenizer(source, cfg)  # bits per byte counts the bytes its tokens stand for
    data_stamp = shards_stamp(files)
    if data_stamp != stamp_of(tok):
        raise EvalError(f"the shards in {files[0].parent} come from {describe_stamp(data_stamp)}, the model "
                        f"from {tok.describe()}; score data tokenized with the run's tokenizer")
    want = tokens if tokens is not None else cfg.data.val_tokens
    if want < seq:
        raise EvalError(f"--tokens {want} is less than one row of {seq} tokens; ask for at least {seq}")
    # The training micro-batch fits, but an eval forward also holds fp32 logits for every position
    # (tokens x 50K vocab): cap a batch at EVAL_BATCH_TOKENS unless told otherwise.
    train_tokens = RunPlan.of(cfg).micro_batch * cfg.data.seq_len
    max_rows = batch_rows or max(1, min(train_tokens, EVAL_BATCH_TOKENS) // seq)
    n_tokens, rows = plan_batches(available, want, seq, max_rows)
    if n_tokens < want:
        print_fn(f"eval: scoring {n_tokens:,} tokens (asked {want:,}; the {split} shards hold {available:,})")

    check_val_ids(files, n_tokens + 1, cfg.model.vocab_size)  # an id past the vocabulary: named, not an IndexError
    t0 = time.perf_counter()
    batches = val_batches(files, seq_len=seq, batch_size=rows, max_tokens=n_tokens, device=dev)
    res = evaluate_loss_and_bpb(model, batches, token_byte_lengths(tok.encoding, cfg.model.padded_vocab()), device=dev)
    record = {"step": src.step if src.step is not None else 0, "tokens": src.tokens or 0,
              "time_s": src.train_time_s or 0.0, "event": "eval", "val_loss": res["loss"], "val_bpb": res["bpb"]}
    if hellaswag:
        record.update(_hellaswag(model, cfg, hellaswag, limit, tok.encoding, dev, tok.bos_id, print_fn))
    if core:
        record.update(_core(model, cfg, core, core_limit, tok.encoding, dev, tok.bos_id, print_fn))
    record.update({"eval_tokens": res["tokens"], "eval_data": str(data or files[0].parent), "eval_split": split,
                   "checkpoint": src.weights.name if src.kind == "run" else str(src.root),
                   "eval_s": round(time.perf_counter() - t0, 3)})
    print_fn(format_table(record))
    if log and src.kind == "run":
        run = RunDir(src.root)
        with run.metrics_logger() as metrics:
            metrics.log(record)
        print_fn(f"eval: appended to {run.metrics_path}")
    return record


def _hellaswag(model, cfg, where: str, limit, tok, dev, bos: int, print_fn) -> dict:
    from .hellaswag import download_hellaswag, evaluate_hellaswag, load_examples, render_example

    if where == "download":
        path = download_hellaswag(cfg.data.cache_root() / "hellaswag")
    else:
        path = Path(where)
        if not path.is_file():
            what = "a folder, not a file" if path.is_dir() else "no such file"
            raise EvalError(f"--hellaswag {where}: {what}; pass a hellaswag_val.jsonl or 'download'")
    examples = load_examples(path, limit)
    # Rows longer than the model's context cannot be scored (no positions for them): skip and say so.
    ctx = model.rotary.max_seq_len
    fits = [ex for ex in examples if render_example(ex, tok, bos=bos)[0].size(1) <= ctx]
    if len(fits) < len(examples):
        print_fn(f"eval: skipped {len(examples) - len(fits)} HellaSwag example(s) longer than the "
                 f"{ctx}-token context")
    if not fits:
        raise EvalError(f"no HellaSwag example in {path} fits the model's {ctx}-token context")
    # bos: the model was trained on documents that start with BOS, so a context is a document start.
    hs = evaluate_hellaswag(model, fits, tok, device=dev, bos=bos)
    # acc_norm (length-normalized) is the figure usually quoted for small GPTs; the summed one is kept too.
    return {"hellaswag_acc": hs["acc_norm"], "hellaswag_acc_sum": hs["acc"], "hellaswag_n": hs["n"]}


def _core(model, cfg, where: str, limit, tok, dev, bos: int, print_fn) -> dict:
    from .core import DenseMaskScorer, download_bundle, evaluate_core, load_bundle

    path = download_bundle(cfg.data.cache_root() / "core") if where == "download" else Path(where)
    tasks = load_bundle(path, limit)
    t0 = time.perf_counter()
    out = evaluate_core(DenseMaskScorer(model), tasks, tok.encode_ordinary, bos=bos, device=dev,
                        max_len=model.rotary.max_seq_len, batch_tokens=EVAL_BATCH_TOKENS, print_fn=print_fn)
    return {"core": out["core"], "core_tasks": len(out["tasks"]), "core_complete": out["complete"],
            "core_examples": sum(r["n"] for r in out["tasks"].values()), "core_s": round(time.perf_counter() - t0, 3)}


def format_table(record: dict) -> str:
    rows = [("checkpoint", str(record.get("checkpoint", ""))), ("step", f"{record['step']:,}"),
            ("tokens trained", f"{record['tokens']:,}"),
            ("data", f"{record.get('eval_data', '')} ({record.get('eval_split', '')})"),
            ("tokens scored", f"{record.get('eval_tokens', 0):,}"),
            ("val loss", f"{record['val_loss']:.4f}"), ("val bpb", f"{record['val_bpb']:.4f}")]
    if "hellaswag_acc" in record:
        rows.append(("hellaswag acc_norm", f"{record['hellaswag_acc']:.4f} (n={record['hellaswag_n']})"))
        rows.append(("hellaswag acc", f"{record['hellaswag_acc_sum']:.4f}"))
    if "core" in record:
        rows.append(("CORE" if record["core_complete"] else f"CORE-like ({record['core_tasks']} tasks)",
                     f"{record['core']:.4f} ({record['core_examples']:,} examples, {record['core_s']:.1f}s)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
