"""KV-cache generation against the full-sequence reference, ragged batches, streaming text."""

from __future__ import annotations

import pytest
import torch

from speedgpt.config import ModelConfig
from speedgpt.infer.generate import Utf8Stream, decode_steps, generate, generate_batch, pick_tokens, sample_texts
from speedgpt.model.build import build_model
from speedgpt.model.runtime import runtime_for

SEQ = 48
VOCAB = 512  # small head: the tests exercise the layers, not a 50K-way softmax (BOS-free prompts)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_cfg(**kw) -> ModelConfig:
    # Every feature the cache path has to get right: value embeddings (first and last layer), U-net
    # skips, x0 mixing, an attention-free layer, long and short windows both shorter than SEQ.
    base = dict(depth=4, model_dim=64, head_dim=16, value_embeds=1, unet_skips=True, x0_mixing=True,
                attn_free_layers=[2], window_pattern="LS", attn_gate=True, attn_gate_dim=8, vocab_size=VOCAB)
    base.update(kw)
    return ModelConfig(**base)


def make_model(randomize: bool, seed: int = 0, **kw):
    # Windows are whole blocks: blocks of 4 tokens make both windows (6 and 2 blocks) shorter than the
    # sequences below, so old keys must fall out of the window.
    cfg = tiny_cfg(**kw)
    model = build_model(cfg, SEQ, runtime_for(cfg, "cpu", window_block=4, windows=(24, 7)), seed=seed)
    if randomize:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim >= 2:
                    p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
                else:  # skip weights and lambdas: away from their identity-like init, so x0 and skips matter
                    p.copy_(torch.rand(p.shape, generator=g) * 0.8 + 0.2)
            # Init zeroes the head; a random one makes the greedy choice depend on every layer.
            model.lm_head.weight.mul_(4.0)
    model.eval()
    return model


def prompt_rows(lengths, seed=0):
    # No BOS inside a row: one document each, so document masking (full forward) and the cache agree.
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def run_rows(model, prompts, n, **kw):
    return generate_batch(model, prompts, n, stop_token=None, **kw)


@pytest.mark.parametrize("randomize", [False, True], ids=["init", "random-weights"])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, top_k=100, seed=3)],
                         ids=["greedy", "sampled"])
def test_cache_matches_full_forward(randomize, sampling):
    model = make_model(randomize)
    prompts = prompt_rows([9, 9, 9])
    n = SEQ - 9  # run to the end of the context, far past the short window
    cached = run_rows(model, prompts, n, use_cache=True, **sampling)
    full = run_rows(model, prompts, n, use_cache=False, **sampling)
    assert cached == full
    assert all(len(r) == n for r in cached)
    if randomize:  # the test is only meaningful if the rows differ and the tokens vary
        assert len({tuple(r) for r in cached}) == len(cached)
        assert len(set(cached[0])) > 5


def test_grouped_query_attention_cache_matches_full_forward():
    """Grouped-query attention (4 query heads sharing 2 key/value heads): the cache holds 2 heads."""
    model = make_model(True, num_kv_heads=2)
    assert model.blocks[0].attn.kv_w.shape == (2, 2 * 16, 64) and model.value_embeds[0].weight.shape[1] == 32
    prompts = prompt_rows([9, 9])
    n = SEQ - 9
    cached = run_rows(model, prompts, n, use_cache=True, temperature=0.0)
    assert cached == run_rows(model, prompts, n, use_cache=False, temperature=0.0)
    assert len(set(cached[0])) > 5


@pytest.mark.parametrize("kv_heads", [0, 2], ids=["mha", "gqa"])
def test_cache_logits_match_full_forward_closely(kv_heads):
    """Stronger than equal argmax: the cached logits at every step equal the full forward's."""
    model = make_model(True, num_kv_heads=kv_heads)
    seq = torch.tensor(prompt_rows([SEQ])[0])[None]
    full = model(seq)[0]
    from speedgpt.model.attention import KVCache

    cfg = model.cfg
    cache = KVCache(cfg.depth, 1, cfg.resolved_kv_heads(), SEQ, cfg.head_dim, torch.device("cpu"), torch.float32)
    parts = [model(seq[:, :5], kv_cache=cache)[0]]
    parts += [model(seq[:, t:t + 1], kv_cache=cache)[0] for t in range(5, SEQ)]
    torch.testing.assert_close(torch.cat(parts), full, rtol=1e-4, atol=1e-4)
    assert full.std() > 0.5  # not a degenerate model


@pytest.mark.parametrize("use_cache", [True, False])
def test_ragged_batch_equals_each_prompt_alone(use_cache):
    model = make_model(True)
    prompts = prompt_rows([3, 11, 6, 20], seed=1)
    n = 12
    together = run_rows(model, prompts, n, temperature=0.0, use_cache=use_cache)
    alone = [run_rows(model, [p], n, temperature=0.0, use_cache=use_cache)[0] for p in prompts]
    assert together == alone
    assert [len(r) for r in together] == [n] * 4


def test_cached_path_feeds_one_position_per_step():
    """Cost per new token must not grow with the prompt: after the prefill, every forward sees one position."""
    model = make_model(True)
    seen: list[int] = []
    handle = model.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1]))
    try:
        for lengths in ([4], [30], [4, 30]):
            seen.clear()
            run_rows(model, prompt_rows(lengths), 10, temperature=0.0, use_cache=True)
            steps = max(lengths) - min(lengths) + 10 - 1  # forced prompt tail + new tokens, minus the last
            assert seen == [min(lengths)] + [1] * steps, (lengths, seen)
            seen.clear()
            run_rows(model, prompt_rows(lengths), 10, temperature=0.0, use_cache=False)
            assert seen[-1] == max(lengths) + 9  # the reference re-reads everything: the contrast
    finally:
        handle.remove()


def test_generate_keeps_its_interface():
    model = make_model(True)
    prompt = torch.tensor(prompt_rows([5, 5]))
    toks = list(generate(model, prompt, 6, temperature=0.0))
    assert len(toks) == 6 and all(t.shape == (2, 1) for t in toks)
    ref = run_rows(model, prompt.tolist(), 6, temperature=0.0)
    assert torch.cat(toks, 1).tolist() == ref
    # The context bounds the length: a prompt of SEQ-2 tokens leaves room for 2 new ones.
    assert len(list(generate(model, torch.tensor(prompt_rows([SEQ - 2])), 10, temperature=0.0))) == 2
    with pytest.raises(ValueError, match="does not fit"):
        list(generate(model, torch.tensor(prompt_rows([SEQ])), 1))


def test_stop_token_ends_each_row_separately():
    model = make_model(True)
    prompts = prompt_rows([4, 8], seed=2)
    free = run_rows(model, prompts, 10, temperature=0.0)
    stop = free[0][3]  # a token row 0 makes at its 4th step
    got = generate_batch(model, prompts, 10, temperature=0.0, stop_token=stop)
    assert got[0] == free[0][:free[0].index(stop)]
    second = free[1][:free[1].index(stop)] if stop in free[1] else free[1]
    assert got[1] == second


def test_batch_stops_early_when_all_rows_are_done():
    model = make_model(True)
    prompts = prompt_rows([4], seed=2)
    free = run_rows(model, prompts, 10, temperature=0.0)[0]
    k = free.index(free[3])  # the stop token's first appearance
    calls = []
    handle = model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        assert generate_batch(model, prompts, 10, temperature=0.0, stop_token=free[3]) == [free[:k]]
        assert len(calls) == k + 1  # prefill + one forward per kept token, none after the stop
    finally:
        handle.remove()


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    model = make_model(True)
    prompts = prompt_rows([6])
    a = run_rows(model, prompts, 15, temperature=1.0, seed=5)
    b = run_rows(model, prompts, 15, temperature=1.0, seed=5)
    c = run_rows(model, prompts, 15, temperature=1.0, seed=6)
    assert a == b and a != c


def test_top_k_one_is_greedy():
    model = make_model(True)
    prompts = prompt_rows([6, 6])
    assert run_rows(model, prompts, 8, temperature=1.0, top_k=1, seed=0) == run_rows(model, prompts, 8, temperature=0.0)


def test_bad_prompts_are_rejected():
    model = make_model(False)
    with pytest.raises(ValueError, match="at least one token"):
        generate_batch(model, [[1], []], 3)
    assert generate_batch(model, [[1]], 0) == [[]]


def test_utf8_stream_holds_back_split_characters():
    from speedgpt.data.tokenizer import get_tokenizer

    enc = get_tokenizer()
    text = "naïve café — 東京 🚀 done"
    ids = enc.encode_ordinary(text)
    pieces: list[str] = []
    stream = Utf8Stream(enc, pieces.append)
    for t in ids:
        stream(t)
    stream.flush()
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > len(text.split())  # some characters really span several tokens


def test_sample_texts_streams_the_single_prompt():
    model = make_model(True, vocab_size=50257)  # real tokenizer ids
    pieces: list[str] = []
    (text,) = sample_texts(model, ["def f(x):"], max_new_tokens=8, temperature=0.0, stream=pieces.append)
    assert text == "def f(x):" + "".join(pieces)
    batch = sample_texts(model, ["def f(x):", "a much longer prompt, with more tokens in it"], max_new_tokens=8,
                         temperature=0.0)
    assert batch[0] == text
    with pytest.raises(ValueError, match="single prompt"):
        sample_texts(model, ["a", "b"], stream=print)


def test_decode_steps_flags_forced_prompt_tokens():
    model = make_model(True)
    prompts = prompt_rows([3, 6])
    flags = [(pos, g.tolist()) for pos, _, g in decode_steps(model, prompts, 2, temperature=0.0)]
    # Row 0 samples from position 3; row 1 is fed its prompt up to position 5, then samples.
    assert flags == [(3, [True, False]), (4, [True, False]), (5, [True, False]), (6, [True, True]),
                     (7, [True, True])]


def test_sampling_an_sft_model_prints_its_chat_tokens_by_name(monkeypatch):
    """An SFT model's vocabulary ends in the chat specials, which the tokenizer has no bytes for: `speedgpt sample`
    died of a KeyError the first time one came ('50260'). Streamed and returned, they read as their names."""
    from types import SimpleNamespace

    from speedgpt.chat.template import ChatTemplate, chat_vocab_size
    from speedgpt.infer import generate as gen
    from speedgpt.tokenizer.core import gpt2_tokenizer

    tok = gpt2_tokenizer()
    end = ChatTemplate(tok).assistant_end
    hello = tok.encode(" hello")

    def fake_generate(model, ids, max_new_tokens, on_token=None, **kw):
        for t in [*hello, end]:
            if on_token is not None:
                on_token(0, t)
        return [[*hello, end] for _ in ids]

    monkeypatch.setattr(gen, "generate_batch", fake_generate)
    model = SimpleNamespace(vocab_size=chat_vocab_size(tok))
    pieces: list[str] = []
    assert gen.sample_texts(model, ["Hi"], stream=pieces.append) == ["Hi hello<|assistant_end|>"]
    assert "".join(pieces) == " hello<|assistant_end|>"
    assert gen.sample_texts(model, ["Hi", "Yo"]) == ["Hi hello<|assistant_end|>", "Yo hello<|assistant_end|>"]


def test_a_tiny_temperature_samples_the_likeliest_token():
    """logits / 1e-37 overflowed to inf and softmax gave nan: torch's "probability tensor contains either `inf`,
    `nan` or element < 0" (`speedgpt sample --temperature 1e-39` on a small model; larger logits fail sooner)."""
    logits = torch.tensor([[100.0, 50.0, -3.0], [-7.0, 20.0, 19.5]])
    gen = torch.Generator().manual_seed(0)
    for temperature in (1e-37, 2.0 ** -126):
        assert pick_tokens(logits, temperature, None, gen).tolist() == [[0], [1]]
        assert pick_tokens(logits, temperature, 2, gen).tolist() == [[0], [1]]
