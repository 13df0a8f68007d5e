"""Record #28's rows (``data.packing = "record28"``), as modded-nanogpt's ``find_batch_starts`` cuts them.

A row starts at the first BOS at or after the position and is the next ``seq_len + 1`` tokens,
whatever documents they hold; the next row starts at the first BOS at least ``seq_len`` tokens after
this row's start. What lies between is skipped: the tail of a document longer than a row, or of the
document the row's end cuts. At each optimizer step's start the record moves on to the next shard
when the current one has too few tokens left (``step_start``). Its later epochs permute whole shards
(the stream's ``shuffle="shards"``), since the shard changes follow the shard layout.
"""

from __future__ import annotations

from .stream import EpochStreams


class Record28Rows:
    def __init__(self, streams: EpochStreams):
        self.streams = streams

    def row(self, epoch: int, pos: int, row_len: int) -> tuple[list[tuple], int, int, int]:
        """(pieces, next epoch, next position, tokens cropped): one piece, starting at a BOS."""
        stream = self.streams.stream(epoch)
        start = stream.next_bos(pos) if pos < stream.total else stream.total
        cropped = start - pos
        if start + row_len > stream.total:
            cropped += max(stream.total - start, 0)
            epoch += 1
            stream = self.streams.stream(epoch)
            start = stream.next_bos(0)
            cropped += start
            if start + row_len > stream.total:
                raise ValueError(f"the data ({stream.total:,} tokens) holds no row of seq_len+1={row_len} tokens "
                                 f"starting at a BOS; use a smaller seq_len or more data")
        nxt = stream.next_bos(start + row_len - 1)
        return [(epoch, start, start + row_len, False)], epoch, nxt, cropped + max(nxt - start - row_len, 0)

    def step_start(self, epoch: int, pos: int, window: int) -> int:
        """Record #28's shard change, checked at each optimizer step's start: when the current shard has
        no more than `window` + 1 tokens left after `pos`, the step starts at the next shard."""
        stream = self.streams.stream(epoch)
        if pos >= stream.total:
            return pos
        k = stream._locate(pos)
        lo, hi = int(stream.starts[k]), int(stream.starts[k + 1])
        return hi if pos - lo + window + 1 >= hi - lo else pos
