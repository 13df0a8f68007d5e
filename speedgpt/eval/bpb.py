"""Validation loss and bits per byte.

Loss per token depends on the tokenizer; bits per byte does not, so it compares runs with
different vocabularies (or a padded vs unpadded one). bpb = sum of the loss (nats) over tokens
that stand for real text / (ln 2 · number of UTF-8 bytes those tokens decode to). Special tokens
(<|endoftext|> as BOS) and padding ids have 0 bytes and are left out of both sums.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch


def token_byte_lengths(tokenizer, vocab_size: int) -> torch.Tensor:
    """int64 (vocab_size,): UTF-8 byte length of each token id; 0 for special tokens and for ids
    past the tokenizer's vocabulary (the model's vocab is often padded, e.g. 50257 -> 50304)."""
    n_vocab = tokenizer.n_vocab
    if vocab_size < n_vocab:
        raise ValueError(
            f"model vocab_size {vocab_size} is smaller than the tokenizer's {n_vocab} ids: "
            f"set model.vocab_size >= {n_vocab}"
        )
    special = {tokenizer.encode_single_token(s) for s in tokenizer.special_tokens_set}
    lengths = torch.zeros(vocab_size, dtype=torch.int64)
    for i in range(n_vocab):
        if i in special:
            continue
        try:
            lengths[i] = len(tokenizer.decode_single_token_bytes(i))
        except KeyError:  # some encodings have unused ids between ordinary and special tokens
            pass
    return lengths


@torch.no_grad()  # not inference_mode: inference tensors trip torch.compile'd models into recompiles
def evaluate_loss_and_bpb(model, batches: Iterable, token_bytes: torch.Tensor, *, device,
                          max_batches: int | None = None) -> dict:
    """Mean loss (nats/token) and bits per byte over ``batches`` of ``(inputs_BT, targets_BT)``.

    Uses ``model(inputs, targets, reduction="none") -> loss_BT``. Targets < 0 are ignored
    (the usual ignore_index). Sums stay on the device and are read once at the end: no host
    sync per batch. Under torch.distributed every rank passes its own batches and gets the
    global result. Returns ``dict(loss, bpb, tokens, bytes)``.
    """
    token_bytes = token_bytes.to(device)
    # [sum loss, n tokens, sum loss over byte-bearing tokens, n bytes]; float64 so that
    # billions of tokens sum exactly enough and one all_reduce carries everything.
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        for i, (inputs, targets) in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = model(inputs, targets, reduction="none").double()
            valid = targets >= 0
            nbytes = torch.where(valid, token_bytes[targets.clamp(min=0)], 0)
            loss = torch.where(valid, loss, 0.0)  # an ignored position may hold nan/garbage
            sums += torch.stack([loss.sum(), valid.sum().double(),
                                 loss[nbytes > 0].sum(), nbytes.sum().double()])
    finally:
        model.train(was_training)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums, op=torch.distributed.ReduceOp.SUM)
    loss_sum, n_tokens, bpb_loss_sum, n_bytes = sums.tolist()
    if n_tokens == 0:
        raise ValueError("evaluate_loss_and_bpb saw no target tokens: the val loader yielded no batches "
                         "(check the val shards and max_batches)")
    return {
        "loss": loss_sum / n_tokens,
        "bpb": bpb_loss_sum / (math.log(2) * n_bytes) if n_bytes else float("nan"),
        "tokens": int(n_tokens),
        "bytes": int(n_bytes),
    }
