"""What a run's rows do to the data: packing_stats (the share cropped by a packing) and
check_capacity (enough tokens for one optimizer step)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from .bestfit import DEFAULT_BUFFER_DOCS, BestFitPacker, BestFitState
from .greedy import GreedyRows
from .loader import _resolve
from .record28 import Record28Rows
from .shards import claimed_tokens, read_header
from .stream import EpochStreams, ShardCache
from .tokenizer import BOS_ID


def packing_stats(files: list[Path] | str, *, seq_len: int, bos_id: int = BOS_ID, packing: str = "greedy",
                  buffer_docs: int = DEFAULT_BUFFER_DOCS, long_docs: str = "split", max_doc_len: int = 0) -> dict:
    """What one epoch of TokenLoader rows of ``seq_len`` does to the data (for docs/data.md).

    Greedy and record28: rows, total tokens, tokens cropped (skipped tails of documents, plus the
    epoch's last partial row with ``long_docs="crop"``), inserted BOS tokens (pieces that continue a
    document) and the cropped fraction. All packings: ``cropped_share``, the loader's running figure
    (cropped / (cropped + row tokens)) over the rows that consume one epoch's worth of tokens
    (best-fit reads ahead by its buffer, so "until the data's end" would stop early).
    """
    streams = EpochStreams(ShardCache(_resolve(files, "train"), bos_id), seed=0)
    total = streams.shards.total
    if packing == "bestfit":
        packer = BestFitPacker(streams, buffer_docs, split=long_docs == "split")
        state, rows = BestFitState(0, 0, ()), 0
        while state.cropped + state.row_tokens < total:
            _, state = packer.plan(state, 1, seq_len + 1)
            rows += 1
        return {"seq_len": seq_len, "packing": packing, "rows": rows, "total_tokens": total,
                "cropped_tokens": state.cropped, "cropped_share": state.cropped / (state.cropped + state.row_tokens)}
    # record28: its rows, without the per-step shard change (that depends on the batch, not the data)
    if packing == "record28":
        next_row = partial(Record28Rows(streams).row, row_len=seq_len + 1)
    else:
        next_row = partial(GreedyRows(streams, long_docs).row, row_len=seq_len + 1, max_doc=max_doc_len)
    epoch, pos, rows, cropped, inserted = 0, 0, 0, 0, 0
    while True:
        before = pos
        pieces, epoch, pos, crop = next_row(epoch, pos)
        if pieces[-1][0] > 0:  # the row reaches into the next epoch: one epoch is used up
            if pieces[0][0] > 0:
                cropped += max(total - before, 0)  # the epoch's last, partial row, skipped
            else:
                rows += 1
                inserted += sum(bool(p[3]) for p in pieces if p[0] == 0)
            break
        rows += 1
        cropped += crop
        inserted += sum(bool(p[3]) for p in pieces)
    return {
        "seq_len": seq_len,
        "packing": packing,
        "rows": rows,
        "total_tokens": total,
        "cropped_tokens": cropped,
        "inserted_bos": inserted,
        "cropped_fraction": cropped / total,
        "cropped_share": cropped / (cropped + rows * (seq_len + 1)),
    }


def check_capacity(files: list[Path] | str, *, seq_len: int, batch_size: int, world_size: int, grad_accum: int,
                   lenient: bool = False) -> None:
    """Raise a one-line ValueError when the data cannot fill one optimizer step without repeating.
    `lenient` (data.on_bad_shard=skip): count the sizes headers claim, leaving bad files to the loader."""
    files = _resolve(files, "train")
    total = sum(claimed_tokens(f) if lenient else read_header(f) for f in files)
    need = world_size * grad_accum * batch_size * (seq_len + 1)
    if total < need:
        raise ValueError(
            f"the training data has {total:,} tokens in {len(files)} shards, but one optimizer step needs "
            f"world_size*grad_accum*batch_size*(seq_len+1) = {world_size}*{grad_accum}*{batch_size}*{seq_len + 1} "
            f"= {need:,}; use more data or a smaller batch_size/seq_len"
        )
