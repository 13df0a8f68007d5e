"""Run metrics: one JSON object per line in ``RUN_DIR/metrics.jsonl``, optionally mirrored to
TensorBoard and Weights & Biases.

metrics.jsonl is the source of truth (reports, resume checks and comparisons read it); the
external loggers are conveniences and are imported only when asked for, so a plain install
never needs them.

Record contract (one line each): always ``step`` (int), ``tokens`` (int, seen so far) and
``time_s`` (training wall time so far); then either training fields (``train_loss``, ``lr``,
``tok_per_s``, ``step_ms``, optionally ``peak_mem_gib``, ``mfu``) or eval fields (``val_loss``,
optionally ``val_bpb``, ``hellaswag_acc``); optionally ``event`` ("resume", "eval", ...).
Unknown keys are kept and ignored by readers.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable

METRICS_FILE = "metrics.jsonl"

# Fields that make a line an eval line; a line with val_loss is "the" eval line of its step.
EVAL_KEYS = ("val_loss", "val_bpb", "hellaswag_acc")


def _json_default(obj: Any) -> Any:
    # Be forgiving about 0-d tensors / numpy scalars slipping into a record: turning them into
    # Python numbers here is cheaper than a crash at the end of a long run.
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"metrics record value {obj!r} of type {type(obj).__name__} is not JSON-serializable")


def _numeric_fields(record: dict) -> dict[str, float]:
    """The fields worth a scalar chart: real numbers, not bools, not the step itself."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool):
            continue
        if hasattr(value, "item") and not isinstance(value, (int, float)):
            value = value.item()
        if isinstance(value, (int, float)):
            out[key] = value
    return out


class MetricsLogger:
    """Append-only metrics log for one run.

    ``enabled=False`` (every rank but 0) makes every method a no-op, so callers need no
    ``if rank == 0`` around logging.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: dict | None = None,
        enabled: bool = True,
    ):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._file = None
        self._tb = None
        self._wandb_run = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Open the optional backends first: if one is missing we fail before touching the log.
        if tensorboard:
            self._tb = _open_tensorboard(self.run_dir / "tb")
        if wandb:
            self._wandb_run = _open_wandb(
                project=wandb_project, name=run_name or self.run_dir.name, config=config, run_dir=self.run_dir
            )
        needs_newline = _ends_without_newline(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        if needs_newline:
            # A crash mid-write left a partial last line; start on a fresh line so the resumed
            # run's first record is not glued onto it (readers then drop only the partial line).
            self._file.write("\n")

    def log(self, record: dict) -> None:
        """Append one record (must carry an int ``step``) and flush it to the OS right away."""
        if not self.enabled:
            return
        if self._file is None:
            raise RuntimeError(f"MetricsLogger for {self.path} is closed; log before close()")
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"metrics record needs an int 'step', got {step!r} in {record!r}")
        # flush (not fsync): survives a crash of this process, costs no disk round trip per step.
        self._file.write(json.dumps(record, default=_json_default) + "\n")
        self._file.flush()
        scalars = _numeric_fields(record) if (self._tb or self._wandb_run) else {}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb_run is not None and scalars:
            self._wandb_run.log(scalars, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ends_without_newline(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _open_tensorboard(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(
            f"tensorboard logging needs the tensorboard package: pip install 'speedgpt[tensorboard]' ({e})"
        ) from e
    return SummaryWriter(log_dir=str(log_dir))


def _open_wandb(*, project: str | None, name: str, config: dict | None, run_dir: Path):
    try:
        import wandb
    except ImportError as e:
        raise ImportError(f"wandb logging needs the wandb package: pip install 'speedgpt[wandb]' ({e})") from e
    return wandb.init(project=project or "speedgpt", name=name, config=config or {}, dir=str(run_dir))


def record_kind(record: dict) -> str:
    """Which stream a line belongs to, for de-duplication: a train line and an eval line at the
    same step are both kept; two train lines at the same step (a resume replayed it) are not.
    A `speedgpt eval` line is a stream of its own: it took the place of training's final validation
    at its step, so the run read as unfinished (`train --resume` validated it again, ab and sweep
    passed it over)."""
    kind = _stream(record)
    return f"posthoc-{kind}" if record.get("event") == "eval" else kind


def _stream(record: dict) -> str:
    if "train_loss" in record:
        return "train"
    if "val_loss" in record:
        return "eval"
    eval_keys = [k for k in EVAL_KEYS if k in record]
    if eval_keys:  # e.g. a HellaSwag-only line: its own stream, so it cannot erase val_loss
        return "eval:" + "+".join(eval_keys)
    return f"event:{record.get('event', '')}"


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All records of a run, sorted by step, one per (step, kind) with the later line winning.

    Accepts the run dir or the metrics.jsonl path. Unparseable lines (a crash mid-write leaves a
    truncated last line) are skipped with a warning. A ``"event": "resume"`` line at step s
    marks everything logged earlier with a step > s as an abandoned timeline and drops it.
    """
    return _dedup(read_records(run_dir))


def read_records(run_dir: str | os.PathLike) -> list[dict]:
    """Every readable record of a run in file order, abandoned timelines included (read_metrics keeps
    the last word on each step; a resumed run's replayed steps need both, tools/fault_runs.py)."""
    path = Path(run_dir)
    if path.is_dir() or path.suffix != ".jsonl":
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no metrics file at {path}: pass a run directory written by `speedgpt train` (it holds {METRICS_FILE})"
        )
    # Bytes, decoded line by line: a damaged byte spoils its line only, skipped with the others' warning (the whole
    # file was one bare UnicodeDecodeError, every reader's command failing without naming a fix).
    return _parse_lines(path, path.read_bytes().splitlines())


def _parse_lines(path: Path, lines: Iterable[bytes]) -> list[dict]:
    records, bad = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            bad.append(lineno)
            continue
        step = rec.get("step") if isinstance(rec, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            bad.append(lineno)
            continue
        records.append(rec)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        warnings.warn(f"{path}: skipped {len(bad)} unreadable line(s) (line {shown}); likely a crash mid-write")
    return records


def _dedup(records: list[dict]) -> list[dict]:
    latest: dict[tuple[int, str], tuple[int, dict]] = {}
    for order, rec in enumerate(records):
        if rec.get("event") == "resume":
            # Steps past the resume point were recomputed (or never will be): drop the old ones.
            latest = {k: v for k, v in latest.items() if k[0] <= rec["step"]}
        latest[(rec["step"], record_kind(rec))] = (order, rec)
    # Sort by step, then by file order, so a step's train line precedes its eval line as logged.
    return [rec for _, (_, rec) in sorted(latest.items(), key=lambda kv: (kv[0][0], kv[1][0]))]


TIME_BUDGET_EVENT = "time_budget"  # logged by the trainer at the step train.time_budget_s stopped it
SFT_EVAL_EVENT = "sft_eval"  # chat/sft.py's evaluation record (its held-out loss and scores)
ENDED_BY_STEPS, ENDED_BY_TIME_BUDGET = "steps", "time budget"


def ended_by(records: list[dict], steps: int) -> str | None:
    """How a run ended, from its records (read_metrics): "steps" when training's final validation
    of its configured `steps` is there; "time budget" when train.time_budget_s stopped it and its
    final validation at that step is there (a finished run too, with fewer steps); None when it
    has not finished (it crashed, was stopped, or runs still). Used by `sweep` and `ab` alike."""
    val_steps = {r["step"] for r in records if "val_loss" in r and r.get("event") != "eval"}
    if steps in val_steps:
        return ENDED_BY_STEPS
    last = max((r["step"] for r in records if r.get("event") != "eval"), default=None)
    if last in val_steps and any(r.get("event") == TIME_BUDGET_EVENT and r["step"] == last for r in records):
        return ENDED_BY_TIME_BUDGET
    return None


def finite(value: Any) -> bool:
    """True for a real, finite number (readers use it to skip NaN losses and missing fields)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
