"""A model trained on a tokenizer of its own, end to end on CPU: `speedgpt train` takes the vocabulary
and BOS id from the shards and keeps the tokenizer in the run; sampling, eval (bits per byte over the
text's true UTF-8 bytes), export and the report use it."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY_OVERRIDES
from extraskit import requires_hf
from speedgpt.cli import main
from tokkit import corpus_docs, train_small, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run dir, tokenizer, data dir, stdout of `speedgpt train`)."""
    tmp = tmp_path_factory.mktemp("tokrun")
    tok = train_small(tmp)
    data = write_jsonl(tmp / "multi.jsonl", corpus_docs(40))
    assert main(["data", "tokenize", str(data), "--out", str(tmp / "shards"), "--tokenizer", str(tok.folder),
                 "--workers", "1", "--val-fraction", "0.1"]) == 0
    run = tmp / "run"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["train", "--preset", "tiny-cpu", *TINY_OVERRIDES, "--train.steps=4", "--train.val_every=0",
                     "--data.val_tokens=1024", f"--data.train_files={tmp / 'shards'}", "--run-dir", str(run),
                     "--run.sample_tokens=6", "--run.sample_prompt=机器学习"])
    assert code == 0, out.getvalue()
    return run, tok, tmp / "shards", out.getvalue()


def test_train_takes_vocab_and_bos_from_the_shards_and_keeps_the_tokenizer(trained):
    from speedgpt.config import load_toml
    from speedgpt.report.runs import load_runs
    from speedgpt.report.tokenizers import tokenizer_table
    from speedgpt.tokenizer.folder import run_tokenizer

    run, tok, shards, stdout = trained
    cfg = load_toml(run / "config.toml")
    assert (cfg.model.vocab_size, cfg.model.bos_id) == (512, 511)  # the preset said 50257, 50256
    assert cfg.data.tokenizer == str(shards / "tokenizer")
    assert "model.vocab_size=512 and model.bos_id=511 from the shards" in stdout
    assert run_tokenizer(run).sha256 == tok.sha256  # RUN_DIR/tokenizer/
    assert "sample:\n机器学习" in stdout
    rec = next(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"tokenizer"' in line)
    assert rec["event"] == "tokenizer" and rec["vocab_size"] == 512 and rec["tokenizer_id"] == tok.short_id
    assert rec["bytes_per_token"] > 1 and rec["gpt2_bytes_per_token"] > 1
    headers, lines = tokenizer_table(load_runs([run]))
    assert lines[0][1] == f"tok ({tok.short_id})" and lines[0][2] == "512"


def test_a_run_that_lost_its_tokenizer_is_refused_not_read_as_gpt2(trained, tmp_path):
    from speedgpt.tokenizer.folder import TokenizerError, run_tokenizer

    run, _, _, _ = trained
    (tmp_path / "config.toml").write_bytes((run / "config.toml").read_bytes())  # the run without tokenizer/
    with pytest.raises(TokenizerError, match=r"GPT-2 \(no tokenizer/ folder\).*restore the run's tokenizer/ folder"):
        run_tokenizer(tmp_path)


def test_sample_and_export_use_the_runs_tokenizer(trained, tmp_path, capsys):
    run, tok, _, _ = trained
    assert main(["sample", str(run), "--prompt", "今日は", "--max-tokens", "5", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("今日は")
    assert main(["export", str(run), "--out", str(tmp_path / "export"), "--dtype", "fp32"]) == 0
    assert (tmp_path / "export" / "tokenizer" / "tokenizer.json").is_file()
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "export"), "--prompt", "今日は", "--max-tokens", "5", "--seed", "3"]) == 0
    assert capsys.readouterr().out == text  # the same weights and tokenizer: the same sample


@requires_hf
@pytest.mark.usefixtures("hf_offline")
def test_hf_export_carries_the_runs_tokenizer_and_bos(trained, tmp_path):
    """--format hf of a run with its own tokenizer: the folder's AutoTokenizer encodes as the run's
    tokenizer does (BOS 511 first), config.json's BOS is the run's (its documents' boundary), and the
    transformers model gives speedgpt's logits on a row holding two documents."""
    import transformers

    from speedgpt.hf.export import export_hf
    from speedgpt.infer.load import load_model
    from speedgpt.tokenizer.folder import run_tokenizer

    run, tok, _, _ = trained
    out, _ = export_hf(run, tmp_path / "hf", dtype="fp32")
    assert json.loads((out / "config.json").read_text())["bos_token_id"] == tok.bos_id == 511
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 511
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in ["def f(x):\n    return x", "机器学习 and 今日は", ""]:
        assert hf_tok(text)["input_ids"] == [511, *tok.encode(text)]
        assert hf_tok.decode(hf_tok(text)["input_ids"], skip_special_tokens=True) == text
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()
    ref, _ = load_model(run, device="cpu", dtype=torch.float32)
    ids = [511, *tok.encode("print('a')"), 511, *tok.encode("x = 1")]
    row = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model(row, use_cache=False).logits, ref(row), rtol=0, atol=1e-5)
    # speedgpt reads the folder back with the run's tokenizer (it once took GPT-2's and refused the folder)
    assert run_tokenizer(out).sha256 == tok.sha256
    assert main(["sample", str(out), "--prompt", "今日は", "--max-tokens", "3"]) == 0


@requires_hf
def test_hf_export_ships_the_tokenizer_its_identity_covers(trained, tmp_path):
    """The folder's tokenizer.json is outside the identity check (ranks, pattern, specials): a changed or foreign
    one there must not ship. The export makes it again from the verified ranks."""
    import shutil

    from speedgpt.hf.tokenizer_files import write_tokenizer_files
    from speedgpt.tokenizer.folder import load_folder

    _, tok, _, _ = trained
    (tmp_path / "good").mkdir()
    (tmp_path / "out").mkdir()
    write_tokenizer_files(tmp_path / "good", tok, model_max_length=64)
    copy = tmp_path / "tok"
    shutil.copytree(tok.folder, copy)
    changed = json.loads((copy / "tokenizer.json").read_text())
    vocab = changed["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids: the same BOS, another tokenizer
    (copy / "tokenizer.json").write_text(json.dumps(changed))
    write_tokenizer_files(tmp_path / "out", load_folder(copy), model_max_length=64)
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (tmp_path / "good" / "tokenizer.json").read_text()


def test_bits_per_byte_counts_the_texts_true_bytes(trained, capsys, text_shards):
    """The bytes bpb divides by are the UTF-8 bytes the scored target tokens decode to (BOS excluded),
    counted independently here; and eval refuses data from another tokenizer."""
    from speedgpt.data.val import val_batches
    from speedgpt.eval.bpb import evaluate_loss_and_bpb, token_byte_lengths
    from speedgpt.infer.load import load_model
    from speedgpt.tokenizer.folder import run_tokenizer

    run, _, shards, _ = trained
    assert main(["eval", str(run), "--no-log"]) == 0
    assert "val bpb" in capsys.readouterr().out
    model, cfg = load_model(run, device="cpu")
    tok = run_tokenizer(run, cfg)
    batches = list(val_batches(shards, seq_len=64, batch_size=2, max_tokens=1024))
    res = evaluate_loss_and_bpb(model, batches, token_byte_lengths(tok.encoding, cfg.model.padded_vocab()),
                                device=torch.device("cpu"))
    targets = torch.cat([t.flatten() for _, t in batches]).tolist()
    true_bytes = sum(len(tok.decode_bytes([t])) for t in targets if t != tok.bos_id)
    text_bytes = len(tok.decode_bytes([t for t in targets if t != tok.bos_id]))
    assert res["bytes"] == true_bytes == text_bytes > res["tokens"]
    assert main(["eval", str(run), "--data", str(text_shards), "--no-log"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "come from gpt2" in err[0] and f"tok (vocab 512, id {tok.short_id})" in err[0]


def test_resume_on_data_re_tokenized_with_another_tokenizer_says_so(trained, tmp_path, capsys):
    """The run's data folder re-tokenized in place with another tokenizer: the resume blamed model.vocab_size; it
    names the two tokenizers now, before anything is built."""
    import shutil

    run, _, shards, _ = trained
    copy, data = tmp_path / "run", tmp_path / "shards"
    shutil.copytree(run, copy)
    other = train_small(tmp_path, vocab_size=600, name="other")
    assert main(["data", "tokenize", str(write_jsonl(tmp_path / "m.jsonl", corpus_docs(40))), "--out", str(data),
                 "--tokenizer", str(other.folder), "--workers", "1", "--val-fraction", "0.1"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(copy), "--train.steps=8", "--extend", f"--data.train_files={data}",
                 f"--data.tokenizer={data / 'tokenizer'}"]) == 2
    err = capsys.readouterr().err
    assert "the training shards carry other (vocab 600" in err and "was trained with its own" in err, err
