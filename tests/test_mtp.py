"""Multi-token prediction (model/mtp.py): shapes, the weights-[1] case, a hand-checked k=1 case,
row ends and document boundaries as record #53 handles them, and no recompile when weights change."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from speedgpt.config import ModelConfig
from speedgpt.model.build import build_model
from speedgpt.model.mtp import multi_token_loss, shifted_targets


def test_shifted_targets_shapes_and_row_ends():
    targets = torch.arange(10).view(2, 5)
    shifted, valid = shifted_targets(targets, 3)
    assert shifted.shape == (2, 5, 3) and valid.shape == (5, 3)
    assert shifted[1, 1].tolist() == [6, 7, 8]  # position t scores targets t, t+1, t+2
    assert valid.tolist() == [[True, True, True], [True, True, True], [True, True, True],
                              [True, True, False], [True, False, False]]  # past the row's end: left out


def test_weights_one_is_the_plain_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11)
    targets = torch.randint(0, 11, (3, 7))
    plain = F.cross_entropy(logits.view(-1, 11), targets.view(-1))
    assert multi_token_loss(logits, targets, torch.tensor([1.0])) == pytest.approx(plain.item(), rel=1e-6)


def test_k1_by_hand():
    """Two tokens ahead with weights [1, 0.5], written out position by position."""
    torch.manual_seed(1)
    B, T, V = 2, 4, 5
    logits = torch.randn(B, T, V, dtype=torch.float64)
    targets = torch.randint(0, V, (B, T))
    total = 0.0
    for b in range(B):
        for t in range(T):
            logp = logits[b, t] - math.log(sum(math.exp(v) for v in logits[b, t].tolist()))
            total += -logp[targets[b, t]].item()
            if t + 1 < T:  # the last position of a row has no token two ahead
                total += 0.5 * -logp[targets[b, t + 1]].item()
    got = multi_token_loss(logits, targets, torch.tensor([1.0, 0.5]))
    assert got.item() == pytest.approx(total / (B * T), rel=1e-12)


def test_document_boundaries_inside_a_row_are_not_masked():
    """As in the record, only the row's end limits the offsets: next to a BOS the later offsets score
    the next document's tokens (the next-token loss scores the BOS itself the same way)."""
    V = 8
    logits = torch.zeros(1, 4, V)
    logits[0, :, 3] = 2.0  # the model's favourite token is 3
    targets = torch.tensor([[3, 0, 3, 3]])  # token 0 plays the next document's BOS
    ce_hit = math.log(7 + math.exp(2.0)) - 2.0  # cross-entropy of a target 3
    ce_miss = math.log(7 + math.exp(2.0))  # of a target 0
    by_hand = (ce_hit + ce_miss + ce_hit + ce_hit) + 0.5 * (ce_miss + ce_hit + ce_hit)
    got = multi_token_loss(logits, targets, torch.tensor([1.0, 0.5]))
    assert got.item() == pytest.approx(by_hand / 4, rel=1e-6)


def _tiny_model():
    cfg = ModelConfig(depth=2, model_dim=32, head_dim=16, value_embeds=1, vocab_size=256, vocab_pad_multiple=1)
    return build_model(cfg, 16, "cpu", seed=0)


def test_model_with_weights_one_equals_the_plain_loss_exactly():
    model = _tiny_model()
    inputs = torch.randint(0, 256, (2, 16))
    inputs[:, 0] = 0
    targets = torch.randint(0, 256, (2, 16))
    plain = model(inputs, targets)
    assert torch.equal(model(inputs, targets, mtp_weights=torch.tensor([1.0])), plain)
    mtp = model(inputs, targets, mtp_weights=torch.tensor([1.0, 0.5, 0.25]))
    assert mtp.shape == () and mtp > plain  # extra (positive) terms
    mtp.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    logits = model(inputs)  # the same logits score the MTP loss
    expected = multi_token_loss(logits, targets, torch.tensor([1.0, 0.5, 0.25]))
    assert mtp.item() == pytest.approx(expected.item(), rel=1e-6)


def test_changing_weight_values_does_not_recompile():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(multi_token_loss, backend="eager", dynamic=False)
    logits, targets = torch.randn(2, 8, 16), torch.randint(0, 16, (2, 8))
    for w in ([1.0, 0.5, 0.25], [1.0, 0.5, 0.125], [1.0, 0.25, 0.0]):
        weights = torch.tensor(w)
        assert fn(logits, targets, weights).item() == pytest.approx(
            multi_token_loss(logits, targets, weights).item(), rel=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    fn(logits, targets, torch.tensor([1.0, 0.5]))  # another count of weights is another shape
    assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()

