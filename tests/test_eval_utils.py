import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from speedgpt.eval import bpb as bpb_mod
from speedgpt.eval import hellaswag as hs
from speedgpt.eval.bpb import evaluate_loss_and_bpb, token_byte_lengths

FIXTURE = Path(__file__).parent / "fixtures" / "hellaswag_mini.jsonl"
EOT = 50256
V_PADDED = 50304


@pytest.fixture
def enc(monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/work/shared/tiktoken_cache")
    import tiktoken

    return tiktoken.get_encoding("gpt2")


class UniformLM(nn.Module):
    """Equal logits for every token: loss is exactly ln(vocab) per position."""

    def __init__(self, vocab=V_PADDED):
        super().__init__()
        self.vocab, self.modes = vocab, []

    def forward(self, inputs, targets=None, reduction="mean"):
        self.modes.append(self.training)
        logits = torch.zeros(*inputs.shape, self.vocab)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction,
                               ignore_index=-1).view(targets.shape)


class TableLM(UniformLM):
    """Next-token logits from fixed random low-rank weights of the current token: non-uniform."""

    def __init__(self, vocab=V_PADDED):
        super().__init__(vocab)
        g = torch.Generator().manual_seed(0)
        self.emb, self.proj = torch.randn(vocab, 8, generator=g), torch.randn(8, vocab, generator=g)

    def logits(self, inputs):
        return self.emb[inputs] @ self.proj

    def forward(self, inputs, targets=None, reduction="mean"):
        logits = self.logits(inputs)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction,
                               ignore_index=-1).view(targets.shape)


def _batches(enc, n=3, B=2, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, enc.n_vocab - 1, (B, T + 1), generator=g)
        x[:, 0] = EOT
        x[0, 5] = EOT  # a document boundary inside the window: its byte length is 0
        out.append((x[:, :-1].clone(), x[:, 1:].clone()))
    out[0][1][1, 3] = -1  # an ignored target
    return out


def _expected_counts(enc, batches):
    """Independently of token_byte_lengths: decode each target id."""
    n_tok = n_counted = n_bytes = 0
    for _, y in batches:
        for t in y.flatten().tolist():
            if t < 0:
                continue
            n_tok += 1
            if t != EOT:
                n_counted += 1
                n_bytes += len(enc.decode_single_token_bytes(t))
    return n_tok, n_counted, n_bytes


# ---------------------------------------------------------------------------------------- bpb


def test_token_byte_lengths(enc):
    tb = token_byte_lengths(enc, V_PADDED)
    assert tb.shape == (V_PADDED,) and tb.dtype == torch.int64
    assert tb[EOT] == 0 and (tb[enc.n_vocab:] == 0).all()
    assert int((tb == 0).sum()) == 1 + (V_PADDED - enc.n_vocab)  # GPT-2 has one special token
    (the,) = enc.encode(" the")
    assert tb[the] == 4
    assert tb[enc.encode("é")].sum() == 2  # multi-byte UTF-8 counts bytes, not characters
    ids = torch.randint(0, EOT, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    assert tb[ids].tolist() == [len(enc.decode_single_token_bytes(i)) for i in ids]
    with pytest.raises(ValueError, match="vocab_size 1000 is smaller"):
        token_byte_lengths(enc, 1000)


def test_uniform_model_loss_is_ln_v_and_bpb_matches(enc):
    batches = _batches(enc)
    model = UniformLM().train()
    out = evaluate_loss_and_bpb(model, batches, token_byte_lengths(enc, V_PADDED), device="cpu")
    n_tok, n_counted, n_bytes = _expected_counts(enc, batches)
    assert out["tokens"] == n_tok and out["bytes"] == n_bytes
    assert out["loss"] == pytest.approx(math.log(V_PADDED), rel=1e-6)
    assert out["bpb"] == pytest.approx(math.log(V_PADDED) * n_counted / (math.log(2) * n_bytes), rel=1e-6)
    assert model.modes and not any(model.modes) and model.training  # eval() during, restored after


def test_nonuniform_model_against_direct_computation(enc):
    batches = _batches(enc, n=2, seed=3)
    model = TableLM()
    tb = token_byte_lengths(enc, V_PADDED)
    out = evaluate_loss_and_bpb(model, iter(batches), tb, device="cpu")
    losses, counted, nbytes = [], [], 0
    for x, y in batches:
        logp = torch.log_softmax(model.logits(x).double(), dim=-1)
        for (b, t), target in zip(torch.cartesian_prod(torch.arange(y.shape[0]), torch.arange(y.shape[1])).tolist(),
                                  y.flatten().tolist()):
            if target < 0:
                continue
            losses.append(-logp[b, t, target].item())
            if target != EOT:
                counted.append(losses[-1])
                nbytes += len(enc.decode_single_token_bytes(target))
    assert out["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert out["bpb"] == pytest.approx(sum(counted) / (math.log(2) * nbytes), rel=1e-5)


def test_max_batches_and_empty(enc):
    tb = token_byte_lengths(enc, V_PADDED)
    batches = _batches(enc, n=3)
    one = evaluate_loss_and_bpb(UniformLM(), batches, tb, device="cpu", max_batches=1)
    assert one["tokens"] == _expected_counts(enc, batches[:1])[0]
    with pytest.raises(ValueError, match="no batches"):
        evaluate_loss_and_bpb(UniformLM(), [], tb, device="cpu")


def test_bpb_sums_across_ranks(enc, monkeypatch):
    calls = []

    def fake_all_reduce(t, op=None):  # as if a second rank saw identical batches
        calls.append(op)
        t.mul_(2)

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    batches = _batches(enc)
    out = evaluate_loss_and_bpb(TableLM(), batches, token_byte_lengths(enc, V_PADDED), device="cpu")
    monkeypatch.undo()
    single = evaluate_loss_and_bpb(TableLM(), batches, token_byte_lengths(enc, V_PADDED), device="cpu")
    assert calls == [torch.distributed.ReduceOp.SUM]
    assert (out["tokens"], out["bytes"]) == (2 * single["tokens"], 2 * single["bytes"])
    assert out["loss"] == pytest.approx(single["loss"]) and out["bpb"] == pytest.approx(single["bpb"])


# ----------------------------------------------------------------------------------- hellaswag


def test_load_examples(tmp_path):
    exs = hs.load_examples(FIXTURE)
    assert len(exs) == 5 and [e["label"] for e in exs] == [0, 1, 2, 3, 0]
    assert all(len(e["endings"]) == 4 and e["ctx"] and "activity_label" in e for e in exs)
    assert len(hs.load_examples(FIXTURE, limit=2)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(FIXTURE.read_text().splitlines()[0] + "\n" + json.dumps({"ctx": "x", "endings": ["a"], "label": 0}))
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a HellaSwag example"):
        hs.load_examples(bad)
    with pytest.raises(FileNotFoundError, match="download_hellaswag"):
        hs.load_examples(tmp_path / "missing.jsonl")
    # A compressed copy was Python's bare "'utf-8' codec can't decode byte 0x8b in position 1", no file or fix named
    gz = tmp_path / "hellaswag_val.jsonl.gz"
    gz.write_bytes(__import__("gzip").compress(FIXTURE.read_bytes()))
    with pytest.raises(ValueError, match=r"hellaswag_val.jsonl.gz:1: not UTF-8 text; a HellaSwag file holds one JSON"):
        hs.load_examples(gz)


def test_render_example(enc):
    ex = hs.load_examples(FIXTURE)[2]
    tokens, mask, label = hs.render_example(ex, enc)
    assert label == 2 and tokens.dtype == torch.int64 and mask.dtype == torch.bool
    assert tokens.shape == mask.shape and tokens.shape[0] == 4
    n_ctx = len(enc.encode(ex["ctx"]))
    for i, ending in enumerate(ex["endings"]):
        n_end = len(enc.encode(" " + ending))
        assert enc.decode(tokens[i, : n_ctx + n_end].tolist()) == ex["ctx"] + " " + ending
        assert mask[i].nonzero().flatten().tolist() == list(range(n_ctx, n_ctx + n_end))
        assert (tokens[i, n_ctx + n_end:] == 0).all()
    with_bos, mask_bos, _ = hs.render_example(ex, enc, bos=EOT)
    assert (with_bos[:, 0] == EOT).all() and torch.equal(with_bos[:, 1:], tokens)
    assert torch.equal(mask_bos[:, 1:], mask)


def test_score_example_scores_exactly_the_ending_tokens(enc):
    ex = hs.load_examples(FIXTURE)[0]
    tokens, mask, _ = hs.render_example(ex, enc)
    model = TableLM()
    sums, means = hs.score_example(model, tokens, mask)
    n_ctx = len(enc.encode(ex["ctx"]))
    for i, ending in enumerate(ex["endings"]):
        end = enc.encode(" " + ending)
        # Token at position p is predicted by the logits at p - 1.
        ces = [F.cross_entropy(model.logits(tokens[i, p - 1])[None].double(), tokens[i, p][None]).item()
               for p in range(n_ctx, n_ctx + len(end))]
        assert sums[i] == pytest.approx(sum(ces), rel=1e-5)
        assert means[i] == pytest.approx(sum(ces) / len(end), rel=1e-5)


class OracleLM(nn.Module):
    """Causal by construction: at each position it looks up the prefix so far; if it is a prefix of
    a known correct (context + ending) sequence, it puts a large logit on that sequence's next token."""

    def __init__(self, correct_rows, vocab=V_PADDED):
        super().__init__()
        self.vocab = vocab
        self.next = {tuple(r[: t + 1]): r[t + 1] for r in correct_rows for t in range(len(r) - 1)}

    def forward(self, inputs):
        logits = torch.zeros(*inputs.shape, self.vocab)
        for b, row in enumerate(inputs.tolist()):
            for t in range(len(row)):
                nxt = self.next.get(tuple(row[: t + 1]))
                if nxt is not None:
                    logits[b, t, nxt] = 30.0
        return logits


def test_oracle_model_scores_perfectly(enc):
    exs = hs.load_examples(FIXTURE)
    rows = [(ex["ctx"] + " " + ex["endings"][ex["label"]]) for ex in exs]
    model = OracleLM([enc.encode(ex["ctx"]) + enc.encode(" " + ex["endings"][ex["label"]]) for ex in exs])
    assert len(set(rows)) == 5
    out = hs.evaluate_hellaswag(model, exs, enc, device="cpu")
    assert out == {"acc": 1.0, "acc_norm": 1.0, "n": 5}
    assert hs.evaluate_hellaswag(model, exs, enc, device="cpu", limit=2)["n"] == 2


def test_wrong_oracle_scores_zero(enc):
    # Believes ending (label+1)%4 is right: catches an inverted argmin or a mask off by one.
    exs = hs.load_examples(FIXTURE)
    model = OracleLM([enc.encode(ex["ctx"]) + enc.encode(" " + ex["endings"][(ex["label"] + 1) % 4]) for ex in exs])
    out = hs.evaluate_hellaswag(model, exs, enc, device="cpu")
    assert out["acc"] == 0.0 and out["acc_norm"] == 0.0


def test_uniform_model_ties_break_to_the_first_ending(enc):
    exs = hs.load_examples(FIXTURE)
    out = hs.evaluate_hellaswag(UniformLM(), exs, enc, device="cpu")
    # Every ending's mean loss is ln V: all tie, ending 0 is picked, so acc_norm = share of label 0.
    assert out["acc_norm"] == sum(ex["label"] == 0 for ex in exs) / 5 == 0.4
    # Summed loss = length * ln V: the shortest ending (first among equals) is picked.
    lens = [[len(enc.encode(" " + e)) for e in ex["endings"]] for ex in exs]
    shortest = [ls.index(min(ls)) for ls in lens]
    assert any(ls.count(min(ls)) > 1 for ls in lens)  # the fixture exercises a tie on length too
    assert out["acc"] == sum(s == ex["label"] for s, ex in zip(shortest, exs)) / 5


def test_hellaswag_shards_examples_across_ranks(enc, monkeypatch):
    reduced = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, op=None: reduced.append(t.tolist()))
    out = hs.evaluate_hellaswag(UniformLM(), hs.load_examples(FIXTURE), enc, device="cpu")
    assert out["n"] == 2 and reduced[0][0] == 2  # rank 1 of 2 scores examples 1 and 3


def test_download_is_atomic_and_cached(tmp_path):
    src = tmp_path / "hellaswag_val.jsonl"
    src.write_text(FIXTURE.read_text())
    dest_dir = tmp_path / "data"
    got = hs.download_hellaswag(dest_dir, url=src.as_uri())
    assert got == dest_dir / "hellaswag_val.jsonl" and got.read_text() == FIXTURE.read_text()
    src.write_text("changed")
    assert hs.download_hellaswag(dest_dir, url=src.as_uri()).read_text() == FIXTURE.read_text()  # cached
    with pytest.raises(RuntimeError, match="fetch it by hand"):
        hs.download_hellaswag(tmp_path / "d2", url=(tmp_path / "nope.jsonl").as_uri())
    assert list((tmp_path / "d2").iterdir()) == []  # no partial file left behind


def test_import_does_no_work():
    assert hs.HELLASWAG_VAL_URL.startswith("https://raw.githubusercontent.com/rowanz/hellaswag/")
    assert hs.HELLASWAG_VAL_URL.endswith("/data/hellaswag_val.jsonl")
    assert callable(bpb_mod.evaluate_loss_and_bpb)


@pytest.mark.parametrize("text, message", [
    ("hello\n", "not JSON (Expecting value); a HellaSwag file holds one JSON example per line"),  # was bare json's
    ("5\n", "not a HellaSwag example"),  # was AttributeError: 'int' object has no attribute 'get', exit 1
    ("\n", "holds no HellaSwag example"),  # was "no HellaSwag example ... fits the model's context"
])
def test_a_file_that_is_no_hellaswag_is_one_line_naming_it(tmp_path, text, message):
    bad = tmp_path / "x.jsonl"
    bad.write_text(text)
    with pytest.raises(ValueError) as e:
        hs.load_examples(bad)
    assert message in str(e.value) and str(bad) in str(e.value)
