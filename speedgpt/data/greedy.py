"""Greedy rows: documents packed back to back in stream order (``data.packing = "greedy"``).

A row is ``seq_len + 1`` tokens made of *pieces*, each ``(epoch, start, end, bos)``: the stream
span ``[start, end)`` of that epoch, with a BOS put in front when ``bos`` (a piece that continues a
document begins with one, so the attention masks see it as a document of its own). Planning is a
pure function of the position ``(epoch, pos)``, so the loader's state stays two numbers.

``long_docs`` says what happens to the tokens a row cannot take whole:

* ``"split"`` (the default): no token is skipped. A document longer than the stage's
  ``max_doc_len`` goes on as further pieces of at most that many tokens, and the document the row's
  end cuts goes on at the next row's start; the epoch's last tokens start the row that the next
  epoch fills. ``continued_bos=False`` puts no BOS before a continuing piece: it then attends back
  to the piece before it where both share a row (in stream order that is the same document).
* ``"crop"``: the speedrun records' rows. With ``max_doc_len`` a row is whole documents cut to
  that many tokens, their tails skipped, and the document the row's end cuts is skipped too
  (record #29 on); without it the document cut by the row's end loses its tail (the next row starts
  at the next BOS) unless it is longer than a row, which is split; the epoch's last partial row
  is skipped.

Each call also returns the tokens it skipped (``cropped``: always 0 with ``"split"``).
"""

from __future__ import annotations

from .stream import EpochStreams

LONG_DOCS = ("split", "crop")


class GreedyRows:
    def __init__(self, streams: EpochStreams, long_docs: str = "split", continued_bos: bool = True):
        if long_docs not in LONG_DOCS:
            raise ValueError(f"long_docs={long_docs!r} must be one of {', '.join(LONG_DOCS)}")
        self.streams, self.long_docs, self.continued_bos = streams, long_docs, continued_bos

    def row(self, epoch: int, pos: int, row_len: int, max_doc: int = 0) -> tuple[list[tuple], int, int, int]:
        """(pieces, next epoch, next position, tokens cropped) for a row starting at (epoch, pos)."""
        if self.long_docs == "split":
            return self._split(epoch, pos, row_len, max_doc)
        if max_doc:
            return self._capped(epoch, pos, row_len, max_doc)
        return self._cropped(epoch, pos, row_len)

    def _split(self, epoch: int, pos: int, row_len: int, max_doc: int):
        pieces: list[tuple] = []
        filled = 0
        while filled < row_len:
            stream = self.streams.stream(epoch)
            if row_len > stream.total:  # a row would hold some tokens twice
                raise ValueError(
                    f"the data ({stream.total:,} tokens in {len(self.streams.shards.files)} shards) is shorter "
                    f"than one row of seq_len+1={row_len} tokens; use a smaller seq_len or more data")
            if pos >= stream.total:
                epoch, pos = epoch + 1, 0
                continue
            bos = self.continued_bos and not stream.is_bos(pos)
            room = row_len - filled - bos
            if room == 0:
                # Only a continuation's BOS fits: it closes the row, and the piece starts the next one.
                pieces.append((epoch, pos, pos, True))
                break
            end = min(stream.next_bos(pos + 1), pos + room)
            if max_doc:
                end = min(end, pos + max(max_doc - bos, 1))
            pieces.append((epoch, pos, end, bos))
            filled += bos + end - pos
            pos = end
        return pieces, epoch, pos, 0

    def _capped(self, epoch: int, pos: int, row_len: int, max_doc: int):
        """Whole documents cut to at most `max_doc` tokens each; every piece starts at a BOS."""
        pieces: list[tuple] = []
        filled = cropped = wraps = 0
        while filled < row_len:
            stream = self.streams.stream(epoch)
            start = stream.next_bos(pos) if pos < stream.total else stream.total
            cropped += start - pos
            if start >= stream.total:  # the epoch is used up: the next pass begins
                epoch, pos, wraps = epoch + 1, 0, wraps + 1
                if wraps > 2:
                    if stream.next_bos(0) >= stream.total:
                        raise ValueError(f"the data ({stream.total:,} tokens) holds no BOS token, so no document "
                                         f"starts a row; tokenize it with speedgpt data tokenize")
                    raise ValueError(f"the data ({stream.total:,} tokens) has too few documents for a row of "
                                     f"{row_len} tokens when each is cut to {max_doc} tokens; use "
                                     f"long_docs='split' (keeps every token) or more documents")
                continue
            doc_end = stream.next_bos(start + 1)
            end = min(doc_end, start + max_doc, start + row_len - filled)
            pieces.append((epoch, start, end, False))
            filled += end - start
            cropped += doc_end - end
            pos = doc_end
        return pieces, epoch, pos, cropped

    def _cropped(self, epoch: int, pos: int, row_len: int):
        """Consecutive tokens from (epoch, pos); the document the row's end cuts loses its tail unless
        it is longer than a row (then the next row continues it after a BOS)."""
        stream = self.streams.stream(epoch)
        cropped = 0
        continued = pos < stream.total and not stream.is_bos(pos)
        if pos + row_len - continued > stream.total:
            # The rest of this epoch cannot fill a row: it is cropped and the next pass begins.
            cropped = max(stream.total - pos, 0)
            epoch, pos = epoch + 1, 0
            stream = self.streams.stream(epoch)
            continued = not stream.is_bos(0)
            if row_len - continued > stream.total:
                raise ValueError(
                    f"the data ({stream.total:,} tokens in {len(self.streams.shards.files)} shards) is shorter "
                    f"than one row of seq_len+1={row_len} tokens; use a smaller seq_len or more data"
                )
        end = pos + row_len - continued
        if end == stream.total or stream.is_bos(end):
            nxt = end  # the row ends exactly at a document boundary
        else:
            b = stream.last_bos_between(pos, end)
            if b < 0:
                nxt = end  # the row lies inside one long document: continue it in the next row
            else:
                doc_end = stream.next_bos(end)
                if doc_end - b > row_len:
                    nxt = end  # longer than a row: split it rather than drop its tail
                else:
                    nxt = doc_end  # crop the tail of the last document, next row starts at a BOS
                    cropped += doc_end - end
        return [(epoch, pos, end, continued)], epoch, nxt, cropped
