"""Download the speedrun's GPT-2-tokenized FineWeb10B shards from the Hugging Face Hub.

The dataset repo ``kjj0/fineweb10B-gpt2`` holds ``fineweb_val_000000.bin`` (the
validation shard) and ``fineweb_train_000001.bin`` … ``fineweb_train_000103.bin``
(~100M tokens each), already in our shard format (docs/format.md), so no tokenizing.

Interrupted transfers: huggingface_hub resumes a broken connection within a call
(HTTP Range). Across calls, files that are already complete (valid header, right
size) are kept and not fetched again; anything else is (re)downloaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .shards import ShardError, read_header

FINEWEB_REPO_ID = "kjj0/fineweb10B-gpt2"
FINEWEB_TRAIN_SHARDS = 103  # in FINEWEB_REPO_ID: train shards are numbered 1..103; 0 is val


def fineweb_filenames(num_train_shards: int) -> list[str]:
    """The val shard plus the first ``num_train_shards`` train shards, in download order."""
    return ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin" for i in range(1, num_train_shards + 1)]


def _quiet_tqdm():
    from huggingface_hub.utils import tqdm  # hub's own bar class: no extra dependency

    class Quiet(tqdm):  # hands huggingface_hub a progress bar that never draws
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet


class HubUnreachable(ConnectionError):
    """The Hub endpoint did not answer; the message names it and how to use another."""


@contextlib.contextmanager
def _quiet_hub_logs() -> Iterator[None]:
    """huggingface_hub logs every retry of a failed request as a warning ("Retrying in 2s [Retry 2/5]"):
    ten lines of noise before its own error. Errors still pass; the retries themselves still happen."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _unreachable(error: Exception, endpoint: str) -> HubUnreachable | None:
    """The one-line error for a download that failed because `endpoint` could not be reached: the Hub
    library's LocalEntryNotFoundError ("... check your connection ..."), caused by a network error."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not isinstance(error, LocalEntryNotFoundError):
        return None
    cause: BaseException = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    reason = str(cause).splitlines()[0] if cause is not error and str(cause) else "no answer"
    return HubUnreachable(f"cannot reach the Hugging Face Hub at {endpoint} ({reason}); check the network, or "
                          f"use a mirror you can reach: set HF_ENDPOINT=URL (or pass --endpoint URL)")


def endpoint_problem(endpoint: str | None) -> str | None:
    """Why the Hub endpoint the download would use (`endpoint`, else $HF_ENDPOINT) is not a URL it can reach,
    or None. Checked before anything is made: httpx's own "UnsupportedProtocol" came as exit 1, naming no flag."""
    from urllib.parse import urlsplit

    name, value = ("--endpoint", endpoint) if endpoint is not None else ("HF_ENDPOINT", os.environ.get("HF_ENDPOINT"))
    if value is None or (name == "HF_ENDPOINT" and value == ""):  # unset: huggingface.co
        return None
    url = urlsplit(value)
    if url.scheme not in ("http", "https") or not url.netloc:
        return f"{name} {value!r} is not a URL; give one starting with http:// or https:// (e.g. https://huggingface.co)"
    return None


def _drop_new_cache(cache: Path) -> None:
    """Remove huggingface_hub's bookkeeping folder (OUT/.cache/huggingface) that a failed download made: left
    behind, it made `ls OUT` look empty while later commands refused OUT as "not empty". Kept when it holds a
    partly downloaded file (*.incomplete), which the next call resumes from instead of starting over."""
    import shutil

    if any(f.stat().st_size > 0 for f in cache.rglob("*.incomplete") if f.is_file()):
        return
    shutil.rmtree(cache, ignore_errors=True)


def _discard(out_dir: Path, name: str) -> None:
    """Remove a bad file and huggingface_hub's record of it, so the next call downloads it again."""
    (out_dir / name).unlink(missing_ok=True)
    (out_dir / ".cache" / "huggingface" / "download" / f"{name}.metadata").unlink(missing_ok=True)


def download_fineweb(
    out_dir: str | os.PathLike,
    num_train_shards: int,
    *,
    repo_id: str = FINEWEB_REPO_ID,
    endpoint: str | None = None,
    revision: str = "main",
    progress: bool = True,
) -> list[Path]:
    """``speedgpt data fineweb``: fetch the val shard and ``num_train_shards`` train shards into ``out_dir``.

    Each file is checked with ``read_header`` (magic, version, size) after download; a
    corrupt file is deleted and raises ShardError naming it. ``endpoint`` overrides the
    Hub URL (a mirror; tests use a local server; default $HF_ENDPOINT, else huggingface.co); one that
    does not answer raises HubUnreachable naming it, one that is no http(s) URL ValueError. A failed call
    removes the `.cache` folder it made (huggingface_hub's records) unless a partial file there can be
    resumed. Returns the local paths, val first.
    Train shards for a run: ``find_shards(out_dir, "train")``; val: ``find_shards(out_dir, "val")``.
    """
    if num_train_shards < 0:
        raise ValueError(f"num_train_shards={num_train_shards} must be >= 0")
    if repo_id == FINEWEB_REPO_ID and num_train_shards > FINEWEB_TRAIN_SHARDS:
        raise ValueError(
            f"num_train_shards={num_train_shards}, but {repo_id} has {FINEWEB_TRAIN_SHARDS} train shards "
            f"(~100M tokens each); use at most {FINEWEB_TRAIN_SHARDS}"
        )
    problem = endpoint_problem(endpoint)
    if problem:
        raise ValueError(problem)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = out_dir / ".cache"  # where huggingface_hub keeps its records of a local_dir download
    had_cache = cache.exists() or cache.is_symlink()
    try:
        return _download(out_dir, num_train_shards, repo_id, endpoint, revision, progress)
    except BaseException:
        if not had_cache:  # only a folder this call made: never one that was there before
            _drop_new_cache(cache)
        raise


def _download(out_dir: Path, num_train_shards: int, repo_id: str, endpoint: str | None, revision: str,
              progress: bool) -> list[Path]:
    """download_fineweb's files, one by one (see there)."""
    from huggingface_hub import constants, hf_hub_download  # imported on use: nothing happens at import

    names = fineweb_filenames(num_train_shards)
    tqdm_class = None if progress else _quiet_tqdm()
    # Named here (not left to the library) so an error can say which endpoint did not answer.
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    paths = []
    for i, name in enumerate(names, 1):
        path = out_dir / name
        if path.is_file():
            try:
                n = read_header(path)
            except ShardError:
                _discard(out_dir, name)  # a broken leftover (e.g. from a killed copy): fetch again
            else:
                _say(progress, f"[{i}/{len(names)}] {name}: present ({n:,} tokens)")
                paths.append(path)
                continue
        start = time.perf_counter()
        try:
            with _quiet_hub_logs():
                local = Path(hf_hub_download(repo_id=repo_id, filename=name, repo_type="dataset", revision=revision,
                                             local_dir=out_dir, endpoint=endpoint, tqdm_class=tqdm_class))
        except Exception as e:
            unreachable = _unreachable(e, endpoint)
            if unreachable is None:
                raise
            raise unreachable from None
        try:
            n = read_header(local)
        except ShardError as e:
            _discard(out_dir, name)
            raise ShardError(
                f"{name} downloaded from {repo_id}@{revision} is not a valid shard ({e}); it was deleted: "
                "run the download again, and if it repeats, check the repo_id/endpoint"
            ) from None
        seconds = time.perf_counter() - start
        size_mb = local.stat().st_size / 1e6
        _say(progress, f"[{i}/{len(names)}] {name}: {n:,} tokens, {size_mb:.0f} MB in {seconds:.1f} s")
        paths.append(local)
    return paths


def _say(enabled: bool, message: str) -> None:
    if enabled:
        print(message, file=sys.stderr, flush=True)
