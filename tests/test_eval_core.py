"""CORE: prompts, scored spans and the scoring of each format against hand-checked cases (fake
models whose token losses are set by hand), batching, the bundle download against a local
stand-in server, and `speedgpt eval --core` end to end."""

from __future__ import annotations

import io
import json
import math
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from evalkit import make_run
from speedgpt.cli import main
from speedgpt.data.tokenizer import BOS_ID, get_tokenizer
from speedgpt.eval.core import (CoreError, Task, centered, download_bundle, evaluate_core, evaluate_task,
                                forward_rows, load_bundle, render_prompts, scored_rows)

pytestmark = pytest.mark.usefixtures("one_thread")
V = 50304


def enc(text: str) -> list[int]:
    return get_tokenizer().encode_ordinary(text)


def tok(text: str) -> int:
    (t,) = enc(text)
    return t


class Bigram(torch.nn.Module):
    """Logits at a position depend only on that position's token: -log p(next | token) set by hand.
    Tokens without an entry use `default`; probabilities not given go to token 0."""

    def __init__(self, table: dict[int, dict[int, float]], default: dict[int, float] | None = None):
        super().__init__()
        self.rows = {prev: self._row(nll) for prev, nll in table.items()}
        self.default = self._row(default or {})

    @staticmethod
    def _row(nll: dict[int, float]) -> torch.Tensor:
        row = torch.full((V,), -1e4)
        rest = 1.0 - sum(math.exp(-v) for v in nll.values())
        row[0] = math.log(rest)
        for t, v in nll.items():
            row[t] = -v
        return row

    def forward(self, inputs):
        flat = [self.rows.get(int(t), self.default) for t in inputs.flatten()]
        return torch.stack(flat).view(*inputs.shape, V)


def mc_task(examples, shots=0):
    return Task("mc", "multiple_choice", shots, " ", 0.25, examples)


def test_prompts_with_shots_follow_the_benchmark_seeds():
    ex = [{"query": f"Q{i}:", "choices": [f"a{i}", f"b{i}"], "gold": i % 2} for i in range(4)]
    import random

    shot = random.Random(1234 + 0).sample([1, 2, 3], 2)
    want = "".join(f"{ex[j]['query']} {ex[j]['choices'][ex[j]['gold']]}\n\n" for j in shot)
    assert render_prompts(mc_task(ex, shots=2), 0) == [want + "Q0: a0", want + "Q0: b0"]
    schema = Task("s", "schema", 1, " ", 0.5, [{"context_options": ["A1", "A2"], "continuation": "c", "gold": 1},
                                                 {"context_options": ["B1", "B2"], "continuation": "d", "gold": 0}])
    assert render_prompts(schema, 0) == ["B1 d\n\nA1 c", "B1 d\n\nA2 c"]
    lm = Task("l", "language_modeling", 0, " ", 0.0, [{"context": "The sky is ", "continuation": "blue"}])
    assert render_prompts(lm, 0) == ["The sky is", "The sky is blue"]


def test_scored_spans_of_each_format():
    rows = scored_rows(mc_task([]), ["Is it red apple", "Is it red pear"], enc, BOS_ID)
    # the shared prefix (BOS, "Is", " it", " red") is context; only " apple" / " pear" are scored
    assert [(r[s:e]) for r, s, e in rows] == [[tok(" apple")], [tok(" pear")]]
    schema = Task("s", "schema", 0, " ", 0.5, [])
    rows = scored_rows(schema, ["The cat sat down", "A dog sat down"], enc, BOS_ID)
    assert [r[s:e] for r, s, e in rows] == [enc(" sat down")] * 2
    lm = Task("l", "language_modeling", 0, " ", 0.0, [])
    ((r, s, e),) = scored_rows(lm, ["The sky is", "The sky is blue sky"], enc, BOS_ID)
    assert r[s:e] == enc(" blue sky") and r[0] == BOS_ID


def test_multiple_choice_picks_the_lowest_mean_loss():
    # " red apple" costs 1 + 3 = 4 over 2 tokens (mean 2.0); " blue" costs 2.5 in 1 token. Mean picks
    # the first, a summed score would pick the second.
    model = Bigram({}, default={tok(" red"): 1.0, tok(" apple"): 3.0, tok(" blue"): 2.5})
    ex = [{"query": "Is it", "choices": [" red apple", " blue"], "gold": 0},
          {"query": "Is it", "choices": [" red apple", " blue"], "gold": 1},
          {"query": "Is it", "choices": [" blue", " red apple"], "gold": 1}]
    task = Task("mc", "multiple_choice", 0, "", 0.25, ex)
    assert evaluate_task(model, task, enc, bos=BOS_ID, device="cpu", max_len=64, batch_tokens=1024) == 2 / 3


def test_schema_scores_the_shared_continuation_under_each_context():
    # after " cat", " sat" costs 1; after " dog", 2; " down" after " sat" costs 1 either way:
    # means 1.0 (cat) vs 1.5 (dog): the cat context wins wherever it is listed
    model = Bigram({tok(" cat"): {tok(" sat"): 1.0}, tok(" dog"): {tok(" sat"): 2.0},
                    tok(" sat"): {tok(" down"): 1.0}})
    ex = [{"context_options": ["The cat", "The dog"], "continuation": "sat down", "gold": 0},
          {"context_options": ["The dog", "The cat"], "continuation": "sat down", "gold": 1},
          {"context_options": ["The dog", "The cat"], "continuation": "sat down", "gold": 0}]
    task = Task("s", "schema", 0, " ", 0.5, ex)
    assert evaluate_task(model, task, enc, bos=BOS_ID, device="cpu", max_len=64, batch_tokens=1024) == 2 / 3


def test_language_modeling_needs_every_token_greedy():
    # greedy after " is" is " blue", after " blue" is " sky" (p = 0.6 beats the rest, which goes to token 0 = 0.4)
    model = Bigram({tok(" is"): {tok(" blue"): -math.log(0.6)}, tok(" blue"): {tok(" sky"): -math.log(0.6)}})
    ex = [{"context": "The sky is", "continuation": " blue sky"},   # both tokens greedy: correct
          {"context": "The sky is", "continuation": " blue sea"},   # second token not greedy: wrong
          {"context": "The sea is", "continuation": " blue"}]       # one token, greedy: correct
    task = Task("l", "language_modeling", 0, "", 0.0, ex)
    assert evaluate_task(model, task, enc, bos=BOS_ID, device="cpu", max_len=64, batch_tokens=1024) == 2 / 3


def test_centered_accuracy_and_core_mean():
    assert centered(0.5, 0.25) == pytest.approx(1 / 3)
    assert centered(0.25, 0.25) == 0.0
    model = Bigram({}, default={tok(" red"): 1.0, tok(" blue"): 2.0})
    tasks = [Task("a", "multiple_choice", 0, "", 0.5, [{"query": "x", "choices": [" red", " blue"], "gold": 0}]),
             Task("b", "multiple_choice", 0, "", 0.25, [{"query": "x", "choices": [" red", " blue"], "gold": 1}])]
    out = evaluate_core(model, tasks, enc, bos=BOS_ID, device="cpu", max_len=64, print_fn=lambda s: None)
    assert out["tasks"]["a"]["centered"] == 1.0 and out["tasks"]["b"]["centered"] == pytest.approx(-1 / 3)
    assert out["core"] == pytest.approx((1.0 - 1 / 3) / 2) and not out["complete"]


def test_padded_batches_equal_rows_alone():
    from evalkit import randomize
    from speedgpt.config import ModelConfig
    from speedgpt.model.build import build_model

    model = build_model(ModelConfig(depth=2, model_dim=64, head_dim=16, value_embeds=1), 64, "cpu")
    randomize(model)
    model.eval()
    rows = [[BOS_ID, *enc("def f(x): return x" * k)][:40] for k in (1, 2, 3)] + [[BOS_ID, 11, 12]]
    batched = forward_rows(model, rows, device="cpu", batch_tokens=4096, pad_id=BOS_ID)
    for i, row in enumerate(rows):
        alone = forward_rows(model, [row], device="cpu", batch_tokens=4096, pad_id=BOS_ID)
        assert torch.allclose(batched[0][i][:-1], alone[0][0][:-1], atol=1e-5)
        assert torch.equal(batched[1][i], alone[1][0]) and batched[0][i].shape == (len(row),)


# ---------------------------------------------------------------------------------------------
# The bundle.

def bundle_zip() -> bytes:
    """A small bundle in the DCLM/nanochat layout, one task of each format."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("eval_bundle/core.yaml", (
            "icl_tasks:\n"
            "- label: copa\n  dataset_uri: copa.jsonl\n  num_fewshot: [0]\n  icl_task_type: multiple_choice\n"
            "- label: winograd\n  dataset_uri: winograd.jsonl\n  num_fewshot: [0]\n  icl_task_type: schema\n"
            "- label: lambada_openai\n  dataset_uri: lambada.jsonl\n  num_fewshot: [1]\n"
            "  icl_task_type: language_modeling\n"))
        zf.writestr("eval_bundle/eval_meta_data.csv", "Eval Task,Task Category,Random baseline\n"
                                                      "copa,commonsense,50\nwinograd,lm,50\nlambada_openai,lm,0\n")
        mc = [{"query": "It rained, so", "choices": [" we stayed in", " we swam"], "gold": 0}] * 3
        sc = [{"context_options": ["The cat", "The dog"], "continuation": "sat down", "gold": 1}] * 2
        lm = [{"context": "def f", "continuation": "(x):"}, {"context": "import", "continuation": " os"}]
        for name, rows in (("copa", mc), ("winograd", sc), ("lambada", lm)):
            zf.writestr(f"eval_bundle/eval_data/{name}.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    return buf.getvalue()


class StandIn:
    """Serves fixed bytes per path on 127.0.0.1 and counts requests."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.hits = files, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.hits.append(self.path)
                data = server.files.get(self.path)
                self.send_response(200 if data is not None else 404)
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                self.wfile.write(data or b"")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_download_unpacks_once_and_loads(tmp_path):
    with StandIn({"/eval_bundle.zip": bundle_zip(), "/broken.zip": b"not a zip"}) as srv:
        path = download_bundle(tmp_path / "cache", url=srv.url + "/eval_bundle.zip")
        assert path == tmp_path / "cache" / "eval_bundle" and (path / "core.yaml").is_file()
        assert download_bundle(tmp_path / "cache", url=srv.url + "/eval_bundle.zip") == path
        assert srv.hits == ["/eval_bundle.zip"]  # the second call used the unpacked copy
        with pytest.raises(CoreError, match="could not download the CORE bundle .*404"):
            download_bundle(tmp_path / "other", url=srv.url + "/missing.zip")
        with pytest.raises(CoreError, match="did not return a zip archive"):
            download_bundle(tmp_path / "other", url=srv.url + "/broken.zip")
        assert not (tmp_path / "other" / "eval_bundle").exists()  # nothing half-written left behind
    tasks = load_bundle(path)
    assert [(t.label, t.kind, t.shots, t.random_baseline) for t in tasks] == [
        ("copa", "multiple_choice", 0, 0.5), ("winograd", "schema", 0, 0.5), ("lambada_openai", "language_modeling", 1, 0.0)]
    assert len(load_bundle(path.parent, max_per_task=2)[0].examples) == 2  # the parent directory works too
    with pytest.raises(CoreError, match="no core.yaml"):
        load_bundle(tmp_path)


def test_eval_cli_core_end_to_end(tmp_path, capsys):
    run = make_run(tmp_path)
    (tmp_path / "b").mkdir()
    zipfile.ZipFile(io.BytesIO(bundle_zip())).extractall(tmp_path / "b")
    assert main(["eval", str(run), "--tokens", "640", "--core", "--core-bundle", str(tmp_path / "b")]) == 0
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["core_tasks"] == 3 and rec["core_examples"] == 7 and rec["core_complete"] is False
    assert -1.0 <= rec["core"] <= 1.0
    out = capsys.readouterr().out
    assert "copa" in out and "winograd" in out and "lambada_openai" in out and "CORE-like (3 tasks)" in out
    assert "lacks 19 of CORE's 22 tasks" in out
    assert main(["eval", str(run), "--core", "--core-bundle", str(tmp_path / "nothing")]) == 2
    assert "no core.yaml" in capsys.readouterr().err


def test_core_scores_with_dense_masks_whatever_the_backend(monkeypatch):
    """CORE's batches change shape every time: a flex model is scored through SDPA's dense masks
    (flex would compile per shape), with the same losses as the model on the SDPA backend."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from speedgpt.eval.core import DenseMaskScorer
    from speedgpt.model import attention
    from speedgpt.model.build import build_model
    from speedgpt.model.runtime import runtime_for
    from test_model import tiny_model_cfg

    cfg = tiny_model_cfg("--model.window_pattern=LS")
    runtime = runtime_for(cfg, "cpu", window_block=32)
    sdpa = build_model(cfg, 128, runtime, seed=0)
    flex = build_model(cfg, 128, runtime.replace(attn_backend="flex"), seed=0)
    torch.nn.init.normal_(sdpa.lm_head.weight, std=0.02)
    flex.load_state_dict(sdpa.state_dict())
    monkeypatch.setattr(attention, "flex_attention_fused", lambda *a, **k: pytest.fail("flex ran"))
    # one row of exactly two blocks: on its own backend the flex model would run flex for it
    rows = [[BOS_ID, *enc("def f(x): return x")], [BOS_ID, *range(100, 163)], [BOS_ID, *enc("a = 1; b = 2; c = 3")]]
    want, _ = forward_rows(sdpa, rows, device="cpu", batch_tokens=64, pad_id=BOS_ID)
    got, _ = forward_rows(DenseMaskScorer(flex), rows, device="cpu", batch_tokens=64, pad_id=BOS_ID)
    for a, b in zip(want, got):
        assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))


def test_scoring_builds_no_autograd_graph():
    # forward_rows scores under no_grad (a graph per CORE batch would hold every activation), and
    # DenseMaskScorer stays a Module class (a no_grad decorator on it turned it into a function).
    from speedgpt.config import ModelConfig
    from speedgpt.eval.core import DenseMaskScorer
    from speedgpt.model.build import build_model

    assert isinstance(DenseMaskScorer, type)
    model = build_model(ModelConfig(depth=1, model_dim=32, head_dim=16, value_embeds=0), 16, "cpu")
    with torch.enable_grad():
        losses, _ = forward_rows(DenseMaskScorer(model), [[BOS_ID, 11, 12, 13]], device="cpu", batch_tokens=64,
                                 pad_id=BOS_ID)
    assert not losses[0].requires_grad
