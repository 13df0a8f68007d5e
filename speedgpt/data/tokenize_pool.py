"""The worker side of tokenizing (data/tokenize.py drives it): documents cut into chunks in input
order, each encoded by a pool of spawned processes with the build's tokenizer, results handed back in
input order with a bounded number in flight; a dead worker fails the build (WorkerDied), never hangs it.
The split key of a document is a stable hash of its text (doc_hash)."""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from .corpus import Source, doc_hash
from .tokenizer import get_tokenizer

if TYPE_CHECKING:
    from ..tokenizer.core import Tokenizer

CHUNK_CHARS = 1 << 20  # ~1 MB of text per worker task: big enough to amortize IPC, small enough to balance
CHUNK_DOCS = 512


class TokenizeError(ValueError):
    """A build that would produce nothing usable (no documents, or no val split when one was asked)."""


class WorkerDied(TokenizeError):
    """A tokenizer worker process ended in the middle of the build (the OOM killer, kill -9)."""


# A worker process's trained tokenizer (None: GPT-2), or the error loading it gave: raised by the first
# task, since an initializer that raises breaks the pool and would read as a dead worker (WorkerDied).
_worker_tokenizer: Tokenizer | None = None
_worker_error: Exception | None = None


def encode_chunk(texts: list[str], tok: Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(all tokens, per-document lengths, per-document hashes); each document is [BOS, *tokens].
    ``tok``: the tokenizer (speedgpt.tokenizer); None: the worker's (init_worker), else GPT-2's."""
    from ..tokenizer.core import gpt2_tokenizer

    if _worker_error is not None:
        raise _worker_error
    tok = tok or _worker_tokenizer or gpt2_tokenizer()
    encoded = [tok.encode_to_numpy(t) for t in texts]
    lengths = np.fromiter((len(ids) + 1 for ids in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.empty(int(lengths.sum()), dtype=tok.token_dtype)
    pos, bos = 0, tok.bos_id
    for ids in encoded:
        tokens[pos] = bos
        tokens[pos + 1 : pos + 1 + len(ids)] = ids
        pos += 1 + len(ids)
    return tokens, lengths, [doc_hash(t) for t in texts]


def init_worker(folder: str | None = None, sha256: str | None = None) -> None:
    # Ctrl-C reaches the whole process group; the parent decides what an interrupt means and
    # shuts the pool down cleanly, so a worker must not die mid-task (that breaks the pool: WorkerDied).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _worker_tokenizer, _worker_error
    if folder is None:
        get_tokenizer()  # build the BPE table once per process, before the first task
        return
    from ..tokenizer.folder import TokenizerError, load_folder

    try:
        tok = load_folder(folder)
        if tok.sha256 != sha256:
            raise TokenizerError(f"tokenizer folder {folder} was changed during the build; tokenize again")
        _worker_tokenizer = tok
    except Exception as e:  # noqa: BLE001 (raised again by the first task)
        _worker_error = e


# ----------------------------------------------------------------------------- main side


def document_chunks(sources: Sequence[Source]) -> Iterator[tuple[tuple[list[int], list], list[str]]]:
    """((source indices, split keys), texts) in input order, cut into ~CHUNK_CHARS pieces."""
    idx: list[int] = []
    keys: list[int | None] = []
    texts: list[str] = []
    chars = 0
    for s, source in enumerate(sources):
        for doc_id, text in source.documents():
            idx.append(s)
            keys.append(source.split_key(doc_id))
            texts.append(text)
            chars += len(text)
            if chars >= CHUNK_CHARS or len(texts) >= CHUNK_DOCS:
                yield (idx, keys), texts
                idx, keys, texts, chars = [], [], [], 0
    if texts:
        yield (idx, keys), texts


@contextmanager
def ordered_results(chunks: Iterable, workers: int, tok: Tokenizer | None = None):
    """Yield (meta, encode_chunk(texts, tok)) in input order, with at most 2 * workers chunks in flight.

    A worker process that dies (the OOM killer, kill -9) raises WorkerDied: concurrent.futures marks
    every task of a pool that lost a worker as failed (BrokenProcessPool), where multiprocessing.Pool
    replaces the worker and waits forever for the lost task's result.

    Shutdown, also after an early stop (max_tokens) or an error in the consumer: stop submitting,
    wait for the chunks already submitted, then shut the pool down. Nothing is terminated with a
    task in flight (a task larger than a pipe holds, still being written, once hung a terminated
    multiprocessing.Pool); once every submitted task has returned, the shutdown cannot block.
    """
    if workers <= 1:
        yield ((meta, encode_chunk(texts, tok)) for meta, texts in chunks)
        return
    # spawn, not fork: forking a multi-threaded parent (numpy's BLAS pool, torch, CUDA, a
    # prefetch thread) can deadlock the child on a lock held at fork time. Start-up costs
    # ~0.5 s per worker (plus re-importing the caller's main module), paid once per build.
    # Workers load a trained tokenizer from its folder once (a pickled one would travel with every task).
    init_args = (None, None) if tok is None else (str(tok.folder), tok.sha256)
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=init_worker,
                               initargs=init_args)
    pending: deque = deque()

    def gen():
        for meta, texts in chunks:
            pending.append((meta, pool.submit(encode_chunk, texts)))
            if len(pending) >= 2 * workers:  # bounded: the input may be far larger than memory
                meta0, future = pending.popleft()
                yield meta0, future.result()
        while pending:
            meta0, future = pending.popleft()
            yield meta0, future.result()

    try:
        yield gen()
    except BrokenProcessPool:
        raise WorkerDied(f"a tokenizer worker process died mid-task (killed by the OOM killer or a signal?); "
                         f"nothing was kept: retry with fewer workers (--workers, were {workers}) or more memory") from None
    finally:
        # At most 2 * workers chunks (a second or two of work) are still out: let them finish
        # (a broken pool has already failed them all).
        wait([future for _, future in pending])
        pending.clear()
        pool.shutdown(wait=True)
