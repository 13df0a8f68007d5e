"""Rendered conversations packed into rows for SFT: each row starts with a conversation's BOS, holds
whole conversations only (none is ever split or cropped, unlike the pretraining loaders of data/,
which crop documents to fill rows), and is padded to its length with BOS tokens whose targets are
ignored. Rows are filled best-fit: the longest buffered conversation that still fits, again and
again, so little is padding.

A row of T + 1 tokens gives inputs row[:-1] and targets row[1:]; a target is IGNORE where the mask
of the token it predicts is 0 (user text, role tokens, padding), so the loss is the assistant's alone.
"""

from __future__ import annotations

import bisect
import random
from typing import Sequence

import torch

IGNORE = -100  # F.cross_entropy's ignore_index, and the fused softcapped CE's (model/kernels/softcap_ce.py)

Rendered = tuple[list[int], list[int]]  # (ids, mask)


def pack_rows(convs: Sequence[Rendered], row_len: int, buffer: int = 1000) -> list[list[int]]:
    """Indices of `convs` per row, best-fit over a moving buffer of `buffer` conversations in the given
    order. Every conversation lands in exactly one row; a longer one than `row_len` is a ValueError."""
    lengths = [len(ids) for ids, _ in convs]
    for i, n in enumerate(lengths):
        if n > row_len:
            raise ValueError(f"conversation {i} has {n} tokens, more than a row's {row_len} (data.seq_len + 1); "
                             f"give --data.seq_len={n - 1} or more")
    rows: list[list[int]] = []
    pending: list[tuple[int, int]] = []  # (length, index), sorted
    nxt = 0
    while nxt < len(convs) or pending:
        row, room = [], row_len
        while True:
            while nxt < len(convs) and len(pending) < buffer:  # the buffer refills as it is taken from
                bisect.insort(pending, (lengths[nxt], nxt))
                nxt += 1
            k = bisect.bisect_right(pending, (room, len(convs))) - 1  # the longest that fits
            if k < 0:
                break
            n, i = pending.pop(k)
            row.append(i)
            room -= n
        rows.append(sorted(row))  # reading order inside a row: the conversations' own
    return rows


def epoch_rows(convs: Sequence[Rendered], row_len: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch's rows: the conversations shuffled by (seed, epoch), then packed; the rows shuffled too
    (best fit leaves the short leftovers at the end)."""
    order = list(range(len(convs)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    rows = [[order[i] for i in row] for row in pack_rows([convs[i] for i in order], row_len)]
    random.Random(seed * 1_000_003 + epoch + 1).shuffle(rows)
    return rows


def row_tensors(convs: Sequence[Rendered], rows: Sequence[Sequence[int]], row_len: int, pad_id: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (len(rows), row_len - 1): conversations back to back, BOS padding, and
    IGNORE where the predicted token is not the assistant's."""
    ids = torch.full((len(rows), row_len), pad_id, dtype=torch.long)
    keep = torch.zeros((len(rows), row_len), dtype=torch.bool)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            conv_ids, mask = convs[i]
            ids[r, at:at + len(conv_ids)] = torch.tensor(conv_ids)
            keep[r, at:at + len(conv_ids)] = torch.tensor(mask, dtype=torch.bool)
            at += len(conv_ids)
    targets = ids[:, 1:].masked_fill(~keep[:, 1:], IGNORE)
    return ids[:, :-1].contiguous(), targets.contiguous()


class ConversationLoader:
    """Steps of `rows` packed rows, epoch after epoch; its position is (epoch, next row), so
    `state_dict` resumes exactly (an epoch's rows are a pure function of the seed and the epoch)."""

    def __init__(self, convs: Sequence[Rendered], row_len: int, rows: int, seed: int, pad_id: int,
                 device: torch.device | str = "cpu"):
        if not convs:
            raise ValueError("no conversations to train on")
        self.convs, self.row_len, self.rows, self.seed, self.pad_id = convs, row_len, rows, seed, pad_id
        self.device = torch.device(device)
        self.epoch, self.pos = 0, 0
        self._rows = epoch_rows(convs, row_len, seed, 0)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        picked: list[list[int]] = []
        while len(picked) < self.rows:
            if self.pos >= len(self._rows):
                self.epoch, self.pos = self.epoch + 1, 0
                self._rows = epoch_rows(self.convs, self.row_len, self.seed, self.epoch)
            picked.append(self._rows[self.pos])
            self.pos += 1
        inputs, targets = row_tensors(self.convs, picked, self.row_len, self.pad_id)
        return inputs.to(self.device), targets.to(self.device)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "row": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["row"])
        self._rows = epoch_rows(self.convs, self.row_len, self.seed, self.epoch)
