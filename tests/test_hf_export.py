"""`speedgpt export --format hf`: the folder transformers loads, with speedgpt's logits (issue 26).

The equal-logits tests run each preset's architecture scaled down (tests/hfkit.py) with random
weights: speedgpt's forward and the exported modeling file's, in fp32, with and without the KV cache,
and speedgpt reading the folder back."""

from __future__ import annotations

import ast
import dataclasses
import json

import pytest
import torch

from evalkit import make_run
from extraskit import need, requires_hf, requires_lm_eval
from hfkit import preset_run, scaled_model, text_rows
from speedgpt.cli import main
from speedgpt.config import ModelConfig, preset_names
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.hf import features
from speedgpt.hf.export import export_hf
from speedgpt.infer.load import load_model
from speedgpt.model.attention import KVCache

pytestmark = pytest.mark.usefixtures("one_thread", "hf_offline")


@pytest.fixture(scope="module")
def latest(tmp_path_factory):
    """speedrun-latest's architecture (every switch the presets have) scaled down: (run, fp32 folder)."""
    tmp = tmp_path_factory.mktemp("latest")
    run = preset_run(tmp, "speedrun-latest")
    return run, export_hf(run, tmp / "hf", dtype="fp32")[0]


def hf_model(folder):
    transformers = need("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True)


def batch(seed: int = 0, rows: int = 2, length: int = 64, doc_starts=(30,)) -> torch.Tensor:
    """Rows of GPT-2 ids that start with BOS; `doc_starts`: positions of a second document's BOS in row 1."""
    x = torch.randint(0, BOS_ID, (rows, length), generator=torch.Generator().manual_seed(seed))
    x[:, 0] = BOS_ID
    for t in doc_starts:
        x[1, t] = BOS_ID
    return x


# Presets whose [model] sections differ only in depth or training-only switches test the same code:
# one of each (d20/d26 are d12 deeper, speedrun-r28 is speedrun-124m without its FP8 switches).
def distinct_architectures() -> list[str]:
    seen, out = set(), []
    for name in preset_names():
        m = scaled_model(name)
        key = repr([(f.name, getattr(m, f.name)) for f in dataclasses.fields(m)
                    if f.name in features.ARCHITECTURE and f.name != "depth"])
        if key not in seen:
            seen.add(key)
            out.append(name)
    return out


def test_every_model_switch_is_classified():
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    assert features.ARCHITECTURE.isdisjoint(features.TRAINING_ONLY)
    assert names == features.ARCHITECTURE | set(features.TRAINING_ONLY)


def test_distinct_architectures_leave_out_only_deeper_or_fp8_twins():
    assert set(preset_names()) - set(distinct_architectures()) == {"d20", "d26", "speedrun-r28"}


@requires_hf
@pytest.mark.parametrize("preset", distinct_architectures())
def test_logits_equal_speedgpt_with_and_without_cache(tmp_path, preset, request, text_shards):
    from transformers import DynamicCache

    if preset == "speedrun-latest":
        run, out = request.getfixturevalue("latest")
    else:
        run = preset_run(tmp_path, preset)
        out, _ = export_hf(run, tmp_path / "hf", dtype="fp32")
    ref, cfg = load_model(run)
    hf = hf_model(out)
    single, multi = text_rows(text_shards)  # real text; `multi` has a document starting mid-row
    with torch.no_grad():
        want = ref(multi)
        assert want.std() > 0.3  # random weights: the comparison means something
        torch.testing.assert_close(hf(multi, use_cache=False).logits, want, rtol=0, atol=1e-5)
        # KV cache: a prefill, then one position per call, as speedgpt's cache does (single documents:
        # speedgpt's cache path does not mask documents)
        kv = KVCache(cfg.model.depth, 2, cfg.model.resolved_kv_heads(), 64, cfg.model.head_dim, torch.device("cpu"),
                     torch.float32)
        cache = DynamicCache()
        for a, b in [(0, 48)] + [(t, t + 1) for t in range(48, 53)]:
            want = ref(single[:, a:b], kv_cache=kv)
            torch.testing.assert_close(hf(single[:, a:b], cache=cache).logits, want, rtol=0, atol=1e-5)
        # speedgpt reads the folder back: the same model
        back, back_cfg = load_model(out)
        assert back_cfg.to_dict() == cfg.to_dict()
        assert torch.equal(back(multi), ref(multi))


@requires_hf
def test_cache_and_left_padding_equal_the_full_forward(latest):
    """What speedgpt's own cache does not do: documents inside a cached prompt, and padded batches."""
    from transformers import DynamicCache

    hf = hf_model(latest[1])
    x = batch(doc_starts=(20, 41))
    with torch.no_grad():
        full = hf(x).logits
        cache = DynamicCache()
        steps = [hf(x[:, :16], cache=cache).logits] + [hf(x[:, t:t + 1], cache=cache).logits for t in range(16, 24)]
        steps.append(hf(x[:, 24:48], cache=cache).logits)  # a chunk holding the third document's BOS
        torch.testing.assert_close(torch.cat(steps, 1), full[:, :48], rtol=0, atol=1e-5)
        cache.crop(-8)  # 48 -> 40, as assisted decoding rolls back rejected tokens: the history follows
        torch.testing.assert_close(hf(x[:, 40:], cache=cache).logits, full[:, 40:], rtol=0, atol=1e-5)
        short = x[1:, 30:64]  # row 1's tail, alone and left-padded next to a longer row
        pad = torch.cat([torch.full((1, 30), 7), short], 1)
        mask = torch.cat([torch.zeros(1, 30, dtype=torch.long), torch.ones_like(short)], 1)
        padded = hf(torch.cat([x[:1], pad]), attention_mask=torch.cat([torch.ones_like(mask), mask])).logits
        torch.testing.assert_close(padded[1:, 30:], hf(short).logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(padded[:1], full[:1], rtol=0, atol=1e-5)
        for kwargs, message in (({"input_ids": torch.full((1, 65), 7)}, "exceeds the model's context \\(64"),
                                ({"input_ids": x, "position_ids": torch.arange(64)[None]}, "drop position_ids"),
                                ({"inputs_embeds": torch.zeros(1, 4, 32)}, "inputs_embeds is not supported")):
            with pytest.raises(ValueError, match=message):
                hf(**kwargs)


@requires_hf
def test_greedy_generate_equals_speedgpt_sample(tmp_path, capsys):
    import transformers

    from speedgpt.infer.generate import encode_prompt, generate_batch

    run = preset_run(tmp_path, "speedrun-latest", tied=True)  # tied phase: the lookup reads the head
    assert main(["export", str(run), "--format", "hf", "--dtype", "fp32", "--out", str(tmp_path / "hf")]) == 0
    assert "note: dropped model.fp8_head=True" in capsys.readouterr().out
    hf = hf_model(tmp_path / "hf")
    # The tokenizer is a standard one: it loads without running the folder's code (transformers reads
    # config.json first, and asks about the code when trust_remote_code is not given)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=False)
    assert type(tok) is type(transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True))
    prompts = ["def fibonacci(n):", "import numpy as np\nx = np."]
    ref, _ = load_model(run)
    want = generate_batch(ref, [encode_prompt(p) for p in prompts], 8, temperature=0.0)
    for prompt, tokens in zip(prompts, want):
        enc = tok(prompt, return_tensors="pt")
        assert enc["input_ids"][0].tolist() == encode_prompt(prompt)  # BOS first, as speedgpt's prompts
        got = hf.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].size(1):].tolist()
        assert got[:len(tokens)] == tokens and got[len(tokens):] in ([], [BOS_ID])  # generate keeps the EOS
    tok.padding_side = "left"
    tok.pad_token = tok.eos_token
    enc = tok(prompts, return_tensors="pt", padding=True)
    got = hf.generate(**enc, max_new_tokens=8, do_sample=False)[:, enc["input_ids"].size(1):].tolist()
    assert [g[:len(w)] for g, w in zip(got, want)] == want  # a padded batch: each row as alone
    # beam search reorders the cache's rows, and their token history with them (_reorder_cache)
    enc = tok(prompts[0], return_tensors="pt")
    beams = [hf.generate(**enc, num_beams=3, max_new_tokens=6, do_sample=False, use_cache=c) for c in (True, False)]
    assert torch.equal(*beams)
    # `speedgpt sample --temperature 0`, from the run and from the folder (round trip)
    for source in (run, tmp_path / "hf"):
        assert main(["sample", str(source), "--prompt", prompts[0], "--temperature", "0", "--max-tokens", "8",
                     "--device", "cpu"]) == 0
        assert capsys.readouterr().out == prompts[0] + tok.decode(want[0]) + "\n"


def test_eval_reads_the_folder_back(tmp_path):
    from speedgpt.eval.run import evaluate_run

    run = make_run(tmp_path)
    out, _ = export_hf(run, tmp_path / "hf", dtype="fp32")
    a = evaluate_run(run, tokens=640, log=False, print_fn=lambda *_: None)
    b = evaluate_run(out, tokens=640, log=False, print_fn=lambda *_: None)
    assert b["val_loss"] == a["val_loss"] and b["val_bpb"] == a["val_bpb"]
    assert b["step"] == 2 and b["checkpoint"] == str(out)
    assert main(["eval", str(out), "--tokens", "640"]) == 0  # nothing to log into: an export


@requires_hf
def test_bf16_folder_equals_speedgpt_in_bf16(tmp_path, latest):
    from safetensors import safe_open

    run = latest[0]
    out, _ = export_hf(run, tmp_path / "hf")  # bf16 by default; scalars stay fp32 in the file
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes["model.blocks.0.attn.qkv_w"] == "BF16" and dtypes["lm_head.weight"] == "BF16"
    assert dtypes["model.block_lambdas"] == "F32" and dtypes["model.bigram.lambdas"] == "F32"
    hf = hf_model(out)
    assert hf.dtype == torch.bfloat16
    ref, _ = load_model(out, dtype=torch.bfloat16)
    fp32, _ = load_model(run)
    x = batch()
    with torch.no_grad():
        got = hf(x).logits
        assert torch.equal(got, ref(x))
        want = fp32(x)
        assert (got - want).abs().max() < 0.1 * want.abs().max()


def test_folder_layout_and_config(latest):
    out = latest[1]
    assert sorted(p.name for p in out.iterdir()) == sorted([
        ".speedgpt-export.json", "config.json", "configuration_speedgpt.py", "generation_config.json", "merges.txt", "model.safetensors",
        "modeling_speedgpt.py", "README.md", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.json"])
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_speedgpt.SpeedGPTForCausalLM"
    assert config["layer_windows"] == "LSSSLSSLSSSL" and config["attention_windows"] == [48, 16]
    assert config["paired_head_layers"] == [1, 3, 6, 10] and config["attention_free_layers"] == [7]
    assert config["query_scale"] > 1.0  # YaRN's state after the window grew 16 -> 32 -> 48
    notes = config["speedgpt"]["export"]["dropped"]
    assert config["speedgpt"]["export"]["step"] == 2 and config["speedgpt"]["export"]["embed_tied"] is False
    assert any("mimetic" in n for n in notes) and any("fp8_mlp" in n for n in notes)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["suppress_tokens"] == list(range(50257, 50304)) and gen["eos_token_id"] == BOS_ID
    # The modeling files need no speedgpt: they import torch, transformers and each other only
    imported = set()
    for name in ("configuration_speedgpt.py", "modeling_speedgpt.py"):
        for node in ast.walk(ast.parse((out / name).read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or "").split(".")[0])
    assert imported == {"__future__", "torch", "transformers", ".configuration_speedgpt"}


@requires_hf
def test_fresh_model_from_a_config_runs():
    """from_config (no export): speedgpt's rotary frequencies from rope_base, and every parameter initialized."""
    from speedgpt.hf.configuration_speedgpt import SpeedGPTConfig
    from speedgpt.hf.modeling_speedgpt import SpeedGPTForCausalLM, default_frequencies
    from speedgpt.model.rotary import Rotary

    for half in (True, False):
        config = SpeedGPTConfig(head_dim=16, rope_half_truncate=half)
        assert torch.equal(default_frequencies(config), Rotary(16, 8, 1024.0, half).frequencies())
    config = SpeedGPTConfig(vocab_size=512, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, head_dim=16,
                            intermediate_size=64, max_position_embeddings=32, value_embed_slots=[0, None, None, 0],
                            num_value_embeds=1, attn_gate=True, smear=True, skip_gates=True, moe_experts=4,
                            moe_hidden=16, bos_token_id=1, eos_token_id=1)
    model = SpeedGPTForCausalLM(config).eval()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with torch.no_grad():
        logits = model(torch.randint(0, 512, (2, 16))).logits
    assert logits.shape == (2, 16, 512) and torch.isfinite(logits).all() and logits.std() > 0


def test_tokenizer_matches_speedgpt_encoding(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from speedgpt.data.tokenizer import get_tokenizer
    from speedgpt.hf.tokenizer_files import write_tokenizer_files
    from speedgpt.tokenizer.core import gpt2_tokenizer

    names = write_tokenizer_files(tmp_path, gpt2_tokenizer(), model_max_length=64)
    assert sorted(names) == sorted(p.name for p in tmp_path.iterdir())
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    enc = get_tokenizer()
    for text in ["Hello world", "  two  spaces\n\n\ttab", "déjà vu 😀 — 中文 123456 it's", "x" * 300, ""]:
        assert tok.encode(text).ids == [BOS_ID] + enc.encode_ordinary(text)
        assert tok.encode(text, add_special_tokens=False).ids == enc.encode_ordinary(text)
        assert tok.decode(tok.encode(text).ids) == text


def test_bad_input_is_one_line(tmp_path, capsys):
    run = make_run(tmp_path)
    cases = []
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    cases.append(([str(run), "--out", str(tmp_path / "busy")], "holds files that no speedgpt export wrote"))
    cases.append(([str(run), "--out", str(run)], "is the source directory itself"))
    cases.append(([str(tmp_path / "data")], "neither config.toml"))
    cases.append(([str(tmp_path / "missing")], "does not exist"))
    capsys.readouterr()
    for args, message in cases:
        assert main(["export", *args, "--format", "hf"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    import shutil

    shutil.rmtree(run / "checkpoints")
    assert main(["export", str(run), "--format", "hf"]) == 2
    assert "has no checkpoint" in capsys.readouterr().err


def test_reexport_replaces_and_default_out(tmp_path, capsys):
    run = make_run(tmp_path)
    assert main(["export", str(run), "--format", "hf"]) == 0
    assert "-> " + str(run / "export-hf") in capsys.readouterr().out
    (run / "export-hf" / "model.safetensors").write_bytes(b"stale")
    (run / "export-hf" / "notes.txt").write_text("mine")  # a user's file beside the export
    assert main(["export", str(run), "--format", "hf", "--dtype", "fp32"]) == 0
    assert json.loads((run / "export-hf" / "config.json").read_text())["dtype"] == "float32"
    assert (run / "export-hf" / "notes.txt").read_text() == "mine"
    manifest = json.loads((run / "export-hf" / ".speedgpt-export.json").read_text())
    assert manifest["format"] == "hf" and manifest["complete"] and "notes.txt" not in manifest["files"]
    load_model(run / "export-hf")


def test_unsupported_switch_is_refused(tmp_path, monkeypatch, capsys, latest):
    run = latest[0]
    monkeypatch.setattr(features, "ARCHITECTURE", features.ARCHITECTURE - {"smear"})  # as if added after the writer
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err == ("speedgpt export: model.smear=True is not supported by --format hf (modeling_speedgpt.py does not "
                   "implement it); export with --format speedgpt instead\n")
    assert not (tmp_path / "hf").exists()


def test_export_without_transformers_says_what_loading_needs(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "transformers" else real(name, *a, **k))
    run = make_run(tmp_path)
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert "note: loading this folder needs transformers: pip install 'speedgpt[hf]'" in capsys.readouterr().out
    assert (tmp_path / "hf" / "modeling_speedgpt.py").is_file()


@requires_lm_eval
def test_lm_eval_scores_the_folder_as_speedgpt_does(tmp_path):
    """lm-evaluation-harness's hf backend on a local multiple-choice task (no download): its
    log-likelihoods are speedgpt's own."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from speedgpt.data.tokenizer import get_tokenizer

    run = make_run(tmp_path)
    out, _ = export_hf(run, tmp_path / "hf", dtype="fp32")
    rows = [{"query": f"The {a} is an", "choices": ["animal", "number", "colour"], "gold": 0}
            for a in ("cat", "dog", "owl", "ant")]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny_mc.yaml").write_text(
        f"task: speedgpt_tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={out},trust_remote_code=True,dtype=float32",
                                  tasks=["speedgpt_tiny_mc"], device="cpu", batch_size=4, log_samples=True,
                                  task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False))
    assert res["results"]["speedgpt_tiny_mc"]["acc,none"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    ref, _ = load_model(run)
    enc = get_tokenizer()
    for sample in res["samples"]["speedgpt_tiny_mc"]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            # lm-eval encodes with the tokenizer's defaults, which put BOS first, as speedgpt's documents
            ctx = [BOS_ID] + enc.encode_ordinary(context)
            ids = [BOS_ID] + enc.encode_ordinary(context + continuation)
            with torch.no_grad():
                logp = torch.log_softmax(ref(torch.tensor([ids[:-1]])), dim=-1)[0]
            want = sum(logp[t - 1, ids[t]].item() for t in range(len(ctx), len(ids)))
            assert resp[0][0] == pytest.approx(want, abs=1e-4)
