"""SFT (speedgpt/chat/sft.py) on a tiny base run: masked loss, warm start, exact resume, and the
command's handling of bad data."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import TINY_OVERRIDES
from extraskit import requires_hf

pytestmark = pytest.mark.usefixtures("one_thread")

SFT_OVERRIDES = ["--train.steps=4", "--train.val_every=0", "--train.log_every=2"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, text_shards):
    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.train.loop import train

    # One thread for this module's runs, then the count put back: a later test in this process that compares its
    # Inductor CPU kernels with a fresh process's (tests/test_validation_ahead.py) keys them by the thread count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = apply_overrides(load_preset("tiny-cpu"), TINY_OVERRIDES + [f"--data.train_files={text_shards}",
                                                                     "--train.steps=2", "--train.val_every=0"])
    out = tmp_path_factory.mktemp("base") / "run"
    train(cfg, run_dir=out, quiet=True)
    yield out
    torch.set_num_threads(threads)


def small_spec(base_run, **kw):
    from speedgpt.chat.sft import SFTSpec

    return SFTSpec(str(base_run), builtin_examples=200, eval_examples=0, heldout_examples=4, **kw)


def test_loss_ignores_all_but_assistant_tokens(base_run):
    """The gradient of the loss w.r.t. the logits is zero at every position whose next token is not the
    assistant's (user text, role tokens, padding) and non-zero at the assistant's."""
    from speedgpt.chat.pack import IGNORE, row_tensors
    from speedgpt.chat.sft import sft_config
    from speedgpt.chat.template import ChatTemplate
    from speedgpt.infer.load import load_model

    cfg, tok = sft_config(base_run, [])
    model, _ = load_model(base_run, device="cpu", cfg=cfg)
    t = ChatTemplate(tok)
    conv = t.render([{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}])
    inputs, targets = row_tensors([conv], [[0]], 33, t.bos)
    captured = {}

    def keep(module, args, out):
        out.retain_grad()
        captured["logits"] = out

    model.train()
    handle = model.lm_head.register_forward_hook(keep)
    model(inputs, targets, reduction="sum").backward()
    handle.remove()
    grad = captured["logits"].grad[0].abs().sum(-1)  # (T,)
    trained = targets[0] != IGNORE
    assert int(trained.sum()) == 2  # "4" and <|assistant_end|>
    assert torch.all(grad[~trained] == 0) and torch.all(grad[trained] > 0)


def test_sft_resume_is_bit_exact(base_run, tmp_path):
    from speedgpt.chat.sft import sft

    two = ["--train.steps=2", *SFT_OVERRIDES[1:]]
    whole = sft(base_run, tmp_path / "whole", two, spec=small_spec(base_run), quiet=True)
    half = tmp_path / "half"
    sft(base_run, half, ["--train.steps=1", *SFT_OVERRIDES[1:]], spec=small_spec(base_run), quiet=True)
    resumed = sft(base_run, half, ["--train.steps=2"], resume=True, quiet=True, extend=True)
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    def losses(d):  # {step: loss} of the logged steps
        return {r["step"]: r["train_loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
                if "train_loss" in r}
    assert losses(tmp_path / "whole")[2] == losses(half)[2]


@pytest.fixture(scope="module")
def sft_run(base_run, tmp_path_factory):
    from speedgpt.chat.sft import sft

    out = tmp_path_factory.mktemp("sft") / "run"
    return sft(base_run, out, SFT_OVERRIDES, spec=small_spec(base_run, load_optimizer=True), quiet=True)


def test_sft_lowers_heldout_loss_and_warm_starts(sft_run, base_run):
    first, last = sft_run.history[0]["heldout_loss"], sft_run.history[-1]["heldout_loss"]
    assert last < first
    assert json.loads((sft_run.run_dir / "sft.json").read_text())["base_run"] == str(base_run)
    # Each config.toml names its own run's directory: the SFT run's config came from the base run's, which names
    # the base run (rundir.with_run_dir)
    from speedgpt.rundir import RunDir

    assert RunDir(sft_run.run_dir).read_config().run.dir == str(sft_run.run_dir)
    assert RunDir(base_run).read_config().run.dir == str(base_run)


def test_chat_and_eval_commands_on_the_sft_run(sft_run, base_run, capsys, tmp_path):
    from speedgpt.cli import main

    run = str(sft_run.run_dir)
    assert main(["chat", run, "--prompt", "What is 1 + 1?", "--max-tokens", "4", "--seed", "0"]) == 0
    assert capsys.readouterr().out.endswith("\n")
    (tmp_path / "arc.jsonl").write_text('{"question": "2 + 2?", "choices": ["3", "4", "5", "6"], "answer": 1}\n')
    (tmp_path / "gsm.jsonl").write_text('{"question": "2 + 2?", "answer": "2 + 2 = 4\\n#### 4"}\n')
    assert main(["eval", run, "--chat", "--chat-examples", "2", "--chat-choice", str(tmp_path / "arc.jsonl"),
                 "--chat-exact", str(tmp_path / "gsm.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "arithmetic" in out and "ChatCORE" in out and "(chance 25%" in out and "gsm " in out
    record = json.loads((sft_run.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["event"] == "chat_eval" and {"acc_arc", "acc_gsm", "acc_spelling"} <= set(record)
    assert main(["chat", str(base_run), "--prompt", "hi"]) == 2  # a base model has no chat tokens
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "speedgpt sft" in err


@pytest.mark.parametrize("line, says", [
    ('{"text": "hi"}', "no 'messages' key"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}', "unknown role 'robot'"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]}', "empty content"),
    ('{"messages": [{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "x"}]}',
     "content of type list: it must be a string"),
    ('{"messages": [{"role": "user", "content": "' + "word " * 200 + '"}, {"role": "assistant", "content": "x"}]}',
     "more than the context"),
])
def test_bad_data_is_one_line_naming_file_and_line(base_run, tmp_path, capsys, line, says):
    from speedgpt.cli import main

    good = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
    data = tmp_path / "chats.jsonl"
    data.write_text(good + "\n" + line + "\n")
    assert main(["sft", str(base_run), "--data", str(data), "--run-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data} line 2" in err and says in err, err
    assert not (tmp_path / "out").exists()


def test_no_held_out_conversation_is_trained_on_whatever_the_weights_and_copies(tmp_path):
    """The held-out loss scores conversations the run never trains on: exact copies (within a file or across files)
    are dropped and counted, the held-out ones (the first of every 20 distinct) are chosen before the files'
    weights repeat the rest. A weight of 2 once held out 3 of 3 training conversations."""
    from speedgpt.chat.data import Source, mixture
    from speedgpt.chat.template import ChatTemplate
    from speedgpt.tokenizer.core import gpt2_tokenizer

    def conv(i):
        return json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                        {"role": "assistant", "content": f"answer {i}"}]})
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(conv(i) for i in [*range(30), 0]) + "\n")  # conversation 0 twice
    b.write_text("\n".join(conv(i) for i in range(20, 40)) + "\n")  # 20-29 are a's too
    mix = mixture([Source(a, 2.0), Source(b, 1.5)], ChatTemplate(gpt2_tokenizer()), max_len=256)
    held = {tuple(ids) for ids, _ in mix.heldout}
    trained = [tuple(ids) for ids, _ in mix.train]
    assert mix.duplicates == 11 and len(held) == len(mix.heldout) == 2  # distinct 0 and 20 of the 40
    assert not held & set(trained)
    assert len(set(trained)) == 38 and len(trained) == 28 * 2 + 10 + 5  # a twice; b's 10 new once and a half


@pytest.mark.parametrize("args, says", [
    (["--train.steps=0"], "config error: train.steps=0 must be at least 1"),  # was a ZeroDivisionError
    # not train's --overwrite, nor `sft --resume BASE`, which holds no SFT run
    (["--run-dir", "BASE"], "already holds a run of `speedgpt train`; pick a fresh --run-dir for the SFT run"),
    (["--resume"], "holds no SFT run (no sft.json)"),  # was [Errno 2] ... sft.json
])
def test_sft_refuses_in_one_line(base_run, tmp_path, capsys, args, says):
    from speedgpt.cli import main

    args = [str(base_run) if a == "BASE" else a for a in args]
    argv = ["sft", "--resume", str(base_run)] if args == ["--resume"] else ["sft", str(base_run), *args]
    if "--run-dir" not in argv and "--resume" not in argv:
        argv += ["--run-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", [["--data", "x.jsonl"], ["--load-optimizer"], ["--eval-examples", "3"],
                                  ["--run-dir", "elsewhere"]])
def test_sft_resume_refuses_a_new_runs_flags(tmp_path, capsys, flag):
    """--resume continues with the run's own sft.json: a new run's flags were silently ignored."""
    from speedgpt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["sft", "--resume", str(tmp_path), *flag])
    assert e.value.code == 2 and f"{flag[0]} belong to a new SFT run" in capsys.readouterr().err


def test_data_that_leaves_nothing_to_train_on_says_why(base_run, tmp_path, capsys):
    from speedgpt.cli import main

    data = tmp_path / "one.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    assert main(["sft", str(base_run), "--data", str(data), "--run-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "all held out" in err and "nothing to train on" in err, err
    assert not (tmp_path / "out").exists()


@requires_hf
def test_hf_export_of_the_sft_run_applies_the_same_template(sft_run, tmp_path, hf_offline):
    import transformers
    from speedgpt.chat.template import ChatTemplate
    from speedgpt.hf.export import export_hf
    from speedgpt.tokenizer.folder import run_tokenizer

    out, _ = export_hf(sft_run.run_dir, tmp_path / "hf", dtype="fp32")
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    messages = [{"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "7"}]
    ids = hf.apply_chat_template(messages, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    template = ChatTemplate(run_tokenizer(sft_run.run_dir))
    assert ids == template.render(messages)[0]
    # generation stops at the answer's end (it ran on past <|assistant_end|>), and the README's chat code runs
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [template.bos, template.assistant_end]
    readme = (out / "README.md").read_text()
    code = readme.split("A chat model")[1].split("```python\n")[1].split("```")[0]
    code = code.replace("max_new_tokens=64", "max_new_tokens=16")  # this model's context is 64 tokens
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
    namespace = {"tok": hf, "model": model, "print": lambda *a: None}
    exec(code, namespace)
    new_ids = namespace["out"][0, namespace["inputs"]["input_ids"].shape[1]:].tolist()
    assert template.assistant_end not in new_ids[:-1]  # nothing generated after the answer's end


def test_an_sft_run_split_the_old_way_is_not_resumed_on_other_conversations(base_run, tmp_path, capsys):
    """The held-out choice changed (data.mixture): a --data run saved before it would resume on other rows."""
    from speedgpt.cli import main

    run = tmp_path / "old"
    run.mkdir()
    (run / "sft.json").write_text(json.dumps({"base_run": str(base_run), "data": ["chats.jsonl"]}))
    (run / "config.toml").write_text((base_run / "config.toml").read_text())
    assert main(["sft", "--resume", str(run)]) == 2
    assert "chose its training and held-out conversations as speedgpt did before 2026-12-05" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["--model.depth=8", "--parallel.strategy=fsdp"])
def test_sft_refuses_model_and_parallel_overrides(base_run, tmp_path, capsys, override):
    """The model comes from the base run and sft runs in one process: --model.depth=8 was a weights mismatch (exit
    1, "the config was edited after training"), --parallel.strategy=fsdp silently ignored."""
    from speedgpt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["sft", str(base_run), "--run-dir", str(tmp_path / "out"), override])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{override.split('=')[0]}: sft fine-tunes the base run's model" in err, err
    assert not (tmp_path / "out").exists()


def test_a_broken_base_checkpoint_is_exit_2_naming_what_sft_can_do(base_run, tmp_path, capsys):
    """A truncated model.pt in the base run: exit 1 and "name another with --checkpoint STEP", a flag sft lacks."""
    import shutil

    from speedgpt.cli import main

    base = tmp_path / "base"
    shutil.copytree(base_run, base)
    model = sorted((base / "checkpoints").iterdir())[-1] / "model.pt"
    model.write_bytes(model.read_bytes()[:100])
    assert main(["sft", str(base), "--run-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--checkpoint" not in err, err
    assert "sft starts from the base run's latest checkpoint: move this one out" in err, err


def test_an_sft_run_stopped_in_its_last_step_is_resumed_to_its_final_evaluation(base_run, tmp_path):
    """A signal in the last step saves its checkpoint before the final evaluation (as in `train`): the resume then
    said "complete" and the run never got it. Here the stop is the same files (its last evaluation left out)."""
    from speedgpt.chat.sft import sft

    run = tmp_path / "run"
    two = ["--train.steps=2", *SFT_OVERRIDES[1:]]
    whole = sft(base_run, run, two, spec=small_spec(base_run), quiet=True)
    metrics = run / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records
                               if not (r.get("event") == "sft_eval" and r["step"] == 2)))
    resumed = sft(base_run, run, two, resume=True, quiet=True)
    assert [h["step"] for h in resumed.history] == [2]
    assert resumed.history[0]["heldout_loss"] == whole.history[-1]["heldout_loss"]  # the same model, scored again
    evals = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in evals if r.get("event") == "sft_eval"] == [0, 2]


def test_sft_resume_to_more_steps_needs_extend_as_train_does(sft_run, capsys):
    """`speedgpt train --resume` refuses another train.steps without --extend; sft's resume took it silently."""
    from speedgpt.cli import main

    run = str(sft_run.run_dir)
    before = (sft_run.run_dir / "metrics.jsonl").read_bytes()
    assert main(["sft", "--resume", run, "--train.steps=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.steps: checkpoint 4, config 6" in err and "add --extend" in err, err
    assert main(["sft", "--resume", run]) == 0  # finished: nothing to train, said as train says it
    out = capsys.readouterr().out
    assert "is complete (step 4 of 4)" in out and f"speedgpt sft --resume {run} --train.steps=N --extend" in out, out
    assert (sft_run.run_dir / "metrics.jsonl").read_bytes() == before
    with pytest.raises(SystemExit) as e:
        main(["sft", str(sft_run.run_dir), "--extend"])
    assert e.value.code == 2 and "--extend goes with --resume" in capsys.readouterr().err


def test_an_sft_run_stopped_before_its_first_checkpoint_starts_again_in_place(base_run, tmp_path, capsys):
    """Killed before its first checkpoint: --resume said "no checkpoint ... (`speedgpt train` can also replace this
    one: --overwrite)" and `sft BASE --run-dir RUN` said "continue ... with `speedgpt sft --resume RUN`": a loop."""
    import shutil

    from speedgpt.chat.sft import sft
    from speedgpt.cli import main

    run = tmp_path / "run"
    sft(base_run, run, ["--train.steps=1", *SFT_OVERRIDES[1:]], spec=small_spec(base_run), quiet=True)
    shutil.rmtree(run / "checkpoints")  # as if killed at step 1, before the save
    assert main(["sft", str(base_run), "--run-dir", str(run)]) == 2
    assert f"`speedgpt sft --resume {run}`" in capsys.readouterr().err
    assert main(["sft", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "has no checkpoint (stopped before its first): nothing to resume; started again from step 0" in out, out
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train_loss" in r]
    assert steps == [1]  # the stopped start's records replaced, not appended to


def test_sft_resumes_from_another_directory_without_the_base_run(base_run, tmp_path, capsys, monkeypatch):
    """sft.json kept "base" and "w/chats.jsonl" as typed: a resume from elsewhere said "--data w/chats.jsonl: no such
    file"; and a resume loaded the base run's weights only to replace them with the checkpoint's."""
    from speedgpt.cli import main

    (tmp_path / "w").mkdir()
    (tmp_path / "base").symlink_to(base_run)
    (tmp_path / "w" / "chats.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": f"a {i}"}]}) + "\n" for i in range(40)))
    monkeypatch.chdir(tmp_path)
    assert main(["sft", "base", "--data", "w/chats.jsonl:2", "--run-dir", "s", "--eval-examples", "0",
                 "--train.steps=1", "--train.val_every=0"]) == 0
    spec = json.loads((tmp_path / "s" / "sft.json").read_text())
    assert spec["base_run"] == str(tmp_path / "base") and spec["data"] == [str(tmp_path / "w" / "chats.jsonl") + ":2"]
    (tmp_path / "base").unlink()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["sft", "--resume", str(tmp_path / "s"), "--train.steps=2", "--extend"]) == 0, capsys.readouterr().err
    assert (tmp_path / "s" / "checkpoints" / "step_000002").is_dir()


def test_an_old_sft_json_with_relative_paths_says_where_they_are_relative_to(base_run, tmp_path, capsys):
    from speedgpt.cli import main

    run = tmp_path / "old"
    run.mkdir()
    (run / "sft.json").write_text(json.dumps({"base_run": str(base_run), "data": ["w/chats.jsonl"], "split": 2}))
    (run / "config.toml").write_text((base_run / "config.toml").read_text())
    assert main(["sft", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "names --data file w/chats.jsonl, a path relative to the directory it was " \
        "started in, which its env.json does not record" in err and "resume from that directory" in err, err


@pytest.mark.parametrize("text", ["", "{}", "[1]", '{"base_run": "/x", "data": [], "load_optim'])
def test_an_sft_json_emptied_or_cut_short_is_one_line_naming_it(base_run, tmp_path, capsys, text):
    """(audit 29) `sft --resume` of a run whose sft.json was emptied said "error: Expecting value: line 1 column 1
    (char 0)", naming neither the file nor the fix; `{}` or a list was a TypeError, exit 1."""
    from speedgpt.cli import main

    run = tmp_path / "cut"
    run.mkdir()
    (run / "sft.json").write_text(text)
    (run / "config.toml").write_text((base_run / "config.toml").read_text())
    assert main(["sft", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run / 'sft.json'} is unreadable" in err and "restore it" in err, err


@pytest.mark.parametrize("argv", [["--resume", "RUN"], ["--resume", "RUN", "--train.steps=6", "--extend"],
                                  ["--auto-resume", "--run-dir", "RUN"], ["--run-dir", "RUN"]])
def test_train_resume_of_an_sft_run_points_to_sft_resume(sft_run, tmp_path, capsys, argv):
    """`train --resume` of an SFT run was called complete (exit 0) with `--extend` as the advice, and with it failed
    after building the model ("loader state has format None"): it is refused first, naming `sft --resume`."""
    import shutil

    from speedgpt.cli import main

    run = tmp_path / "sft"
    shutil.copytree(sft_run.run_dir, run)
    before = sorted(p.name for p in (run / "checkpoints").iterdir()), (run / "metrics.jsonl").read_text()
    assert main(["train", *[str(run) if a == "RUN" else a for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"continue it with `speedgpt sft --resume {run}`" in err, err
    assert (sorted(p.name for p in (run / "checkpoints").iterdir()), (run / "metrics.jsonl").read_text()) == before


def test_sft_eval_examples_beyond_the_held_out_set_are_refused(base_run, tmp_path, capsys):
    """The built-in tasks hold out 100 questions each: --eval-examples 1000 scored 100 while sft.json recorded 1000
    (as `eval --chat --chat-examples` refuses more than 100)."""
    from speedgpt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["sft", str(base_run), "--eval-examples", "1000", "--run-dir", str(tmp_path / "out"),
              *SFT_OVERRIDES])
    assert e.value.code == 2 and "--eval-examples 1000: must be 0..100" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "inf"])
def test_a_data_weight_that_is_no_positive_number_is_named(tmp_path, weight):
    """`--data f.jsonl:inf` said "weight inf must be > 0", which it is: the line now says finite."""
    from speedgpt.chat.data import ChatDataError, parse_source

    f = tmp_path / "chats.jsonl"
    f.write_text("")
    with pytest.raises(ChatDataError, match=r"must be a finite number > 0 \(e\.g\. chats\.jsonl:2\)$"):
        parse_source(f"{f}:{weight}")


def test_a_non_finite_loss_stops_sft_before_it_is_applied_or_saved(base_run, tmp_path, capsys):
    """SFT had no numerics guard: learning rates that blow up trained on NaN weights, saved them in every later
    checkpoint and said "done", exit 0 (and `chat` answered from them). Now: exit 3, one line naming the step and the
    last good checkpoint, and no checkpoint holds a non-finite number."""
    from speedgpt.cli import main
    from speedgpt.rundir.checkpoint import load_checkpoint, list_checkpoints

    out = tmp_path / "out"
    lrs = [f"--optim.{k}=1e30" for k in ("muon_lr", "embed_lr", "value_embed_lr", "head_lr", "scalar_lr")]
    assert main(["sft", str(base_run), "--run-dir", str(out), "--eval-examples", "0", "--train.steps=4",
                 "--train.checkpoint_every=1", "--train.val_every=0", *lrs]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "non-finite loss or gradient at SFT step" in err, err
    found = list_checkpoints(out / "checkpoints")
    assert found and f"the last good checkpoint is {found[-1]}" in err
    for path in found:
        model, _, _ = load_checkpoint(path, "cpu")
        assert all(torch.isfinite(t).all() for t in model.values() if t.is_floating_point()), path


def test_data_that_is_not_utf8_names_its_file_and_line(base_run, tmp_path, capsys):
    """A Latin-1 JSONL (or a .gz) was Python's bare "'utf-8' codec can't decode byte 0xe9 in position 97", naming
    neither the file nor the line; so was a chat task file of `eval --chat`."""
    from speedgpt.chat.evaluate import read_choice_file
    from speedgpt.cli import main

    good = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    data = tmp_path / "chats.jsonl"
    data.write_bytes(good + good.replace(b"hello", b"caf\xe9"))
    assert main(["sft", str(base_run), "--data", str(data), "--run-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data} line 2: not UTF-8 text; save it as UTF-8 JSONL" in err, err
    assert not (tmp_path / "out").exists()
    task = tmp_path / "arc.jsonl"
    task.write_bytes(b'{"question": "caf\xe9?", "choices": ["3", "4"], "answer": 1}\n')
    with pytest.raises(ValueError, match=f"{task} line 1: not UTF-8 text; save it as UTF-8 JSONL, one task example"):
        read_choice_file(task)


@pytest.mark.parametrize("weight", ["1e30", "1e6"])
def test_a_weight_too_large_to_hold_is_named(tmp_path, weight):
    """`--data f.jsonl:1e30` was an OverflowError (exit 1) and a weight of 1e9 a list of billions built in memory:
    the epoch is held whole. A weight that puts more than MAX_EPOCH_CONVERSATIONS in it is one line naming it."""
    from speedgpt.chat.data import MAX_EPOCH_CONVERSATIONS, ChatDataError, mixture, parse_source
    from speedgpt.chat.template import ChatTemplate
    from speedgpt.tokenizer.core import gpt2_tokenizer

    f = tmp_path / "chats.jsonl"
    f.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant",
                                                                                         "content": f"a {i}"}]}) + "\n"
                         for i in range(30)))
    assert 29 * float(weight) > MAX_EPOCH_CONVERSATIONS
    with pytest.raises(ChatDataError, match=re.escape(f"--data {f}:{float(weight):g}: the weight makes ") +
                       ".* more than 10,000,000; lower it"):
        mixture([parse_source(f"{f}:{weight}")], ChatTemplate(gpt2_tokenizer()), max_len=256)


@pytest.mark.parametrize("override", ["--data.train_files=chats.jsonl", "--data.val_tokens=4096"])
def test_sft_refuses_data_overrides_it_would_not_read(base_run, tmp_path, capsys, override):
    """SFT reads conversations from --data FILE, not shards: `--data.train_files=chats.jsonl` was written into
    config.toml and ignored, and the run fine-tuned on the built-in tasks, exit 0."""
    from speedgpt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["sft", str(base_run), "--run-dir", str(tmp_path / "out"), override])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{override.split('=')[0]}: sft reads conversations from --data FILE, not the shards" in err, err
    assert not (tmp_path / "out").exists()


def test_sft_clips_the_gradients_as_optim_grad_clip_says(base_run, tmp_path, monkeypatch):
    """optim.grad_clip (the base run's, or an override) was written into the SFT run's config.toml and never applied:
    SFT stepped on unclipped gradients. Each step now clips to it before the optimizers read the gradients."""
    from speedgpt.cli import main
    from speedgpt.parallel import ddp

    clip = ddp.clip_grad_norm_
    norms_after = []

    def clip_and_measure(optimizers, max_norm):
        norm = clip(optimizers, max_norm)
        grads = [p.grad for opt in optimizers for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norms_after.append((max_norm, float(torch.linalg.vector_norm(torch.stack([gr.norm() for gr in grads])))))
        return norm

    monkeypatch.setattr(ddp, "clip_grad_norm_", clip_and_measure)
    assert main(["sft", str(base_run), "--run-dir", str(tmp_path / "out"), "--eval-examples", "0",
                 "--train.steps=2", "--train.val_every=0", "--optim.grad_clip=0.01"]) == 0
    assert [m for m, _ in norms_after] == [0.01, 0.01]
    assert all(after <= 0.01 * 1.001 for _, after in norms_after), norms_after


@pytest.mark.parametrize("override, says", [
    ("--train.time_budget_s=60", "sft does not apply it"), ("--train.compile=false", "sft does not apply it"),
    ("--train.on_nonfinite=skip", "sft does not apply it"), ("--train.checkpoint_every_min=5", "sft does not apply it"),
    ("--run.dir=elsewhere", "takes its directory from --run-dir"), ("--run.wandb=true", "sft writes no report"),
])
def test_sft_refuses_train_and_run_overrides_it_would_not_apply(base_run, tmp_path, capsys, override, says):
    """`sft BASE --train.time_budget_s=60` was written into config.toml and ignored: every step trained, exit 0; so was
    any run.* key (`--run.dir=X` trained into the default directory)."""
    from speedgpt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["sft", str(base_run), "--run-dir", str(tmp_path / "out"), override])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{override.split('=')[0]}: " in err and says in err, err
    assert not (tmp_path / "out").exists()


def test_every_train_key_is_applied_by_sft_or_refused():
    """A new train key must be put on one side: read by SFT, or refused as an override (UNREAD_TRAIN_KEYS)."""
    from dataclasses import fields

    from speedgpt.chat.sft import UNREAD_TRAIN_KEYS
    from speedgpt.config.sections import TrainConfig

    applied = {"steps", "batch_tokens", "micro_batch_size", "val_every", "log_every", "checkpoint_every",
               "keep_checkpoints", "seed", "device", "dtype", "stages"}
    assert not applied & set(UNREAD_TRAIN_KEYS)
    assert {f.name for f in fields(TrainConfig)} == applied | set(UNREAD_TRAIN_KEYS)
