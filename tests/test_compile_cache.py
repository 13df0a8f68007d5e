"""train.compile_cache (speedgpt/train/compile_cache.py): torch's portable cache artifacts written after the
warmup, read back into a fresh cache folder, and a foreign, unreadable or missing file ignored with one line.
No compile here: an artifact recorded through torch's own recorder stands in for a compiled graph's."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.compiler._cache import CacheArtifactManager

from speedgpt.config import Config, apply_overrides, load_preset
from speedgpt.train import compile_cache
from speedgpt.train.compile_cache import (CompileCache, config_digest, default_root, folder_name,
                                          validation_shapes, versions)
from test_fp8_linear import needs_rowwise  # torch._scaled_mm on a CPU with row-wise scales (2.13 on)

KEY = "speedgpt-test/kernel.best_config"  # an autotune entry: a JSON file under Inductor's cache dir


@pytest.fixture
def fresh_artifacts():
    """torch's artifact recorder emptied for the test, as a fresh process has it (its kinds registered, as
    Inductor's import registers them)."""
    import torch._inductor.runtime.autotune_cache  # noqa: F401

    with CacheArtifactManager.with_fresh_cache():
        yield


def cache_in(tmp_path: Path) -> CompileCache:
    return CompileCache.for_run(str(tmp_path / "cache"), Config().to_dict(), 1, torch.device("cpu"))


def test_artifacts_saved_then_loaded_into_a_fresh_machines_cache(tmp_path, monkeypatch, fresh_artifacts):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first"))
    cache = cache_in(tmp_path)
    assert cache.save() is None  # nothing compiled: nothing written
    assert not cache.artifacts.exists()
    CacheArtifactManager.record_artifact("autotune", KEY, {"XBLOCK": 64, "num_warps": 4})
    line = cache.save()
    assert "saved 1 artifact(s)" in line and cache.artifacts.exists()
    meta = json.loads(cache.meta.read_text())
    assert meta["versions"] == versions(torch.device("cpu")) and meta["versions"]["torch"] == torch.__version__
    # another machine: an empty Inductor cache, filled from the saved file
    fresh = tmp_path / "second"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))
    assert "loaded 1 artifact(s)" in cache.load()
    assert json.loads((fresh / KEY).read_text())["XBLOCK"] == 64


def test_a_run_that_compiled_no_graph_keeps_the_file_it_loaded(tmp_path, monkeypatch, fresh_artifacts):
    """A warm run's save (0 graphs compiled, as CompileWatch counts them) keeps the file it loaded even where torch
    recorded a key the file lacks; one that compiled a graph writes what it recorded."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first"))
    CacheArtifactManager.record_artifact("autotune", KEY, {"XBLOCK": 64})
    assert "saved" in cache_in(tmp_path).save(graphs_compiled=3)
    cold = cache_in(tmp_path).artifacts.read_bytes()
    with CacheArtifactManager.with_fresh_cache():  # a second process
        cache = cache_in(tmp_path)
        assert "loaded 1 artifact(s)" in cache.load()
        CacheArtifactManager.record_artifact("autotune", KEY + "2", {"XBLOCK": 32})
        assert "kept" in cache.save(graphs_compiled=0) and cache.artifacts.read_bytes() == cold
        assert "saved" in cache.save(graphs_compiled=1) and cache.artifacts.read_bytes() != cold


def test_foreign_corrupt_or_missing_files_are_ignored_with_one_line(tmp_path, monkeypatch, fresh_artifacts):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first"))
    cache = cache_in(tmp_path)
    assert "nothing saved for this config yet" in cache.load()
    CacheArtifactManager.record_artifact("autotune", KEY, {"XBLOCK": 64})
    cache.save()
    fresh = tmp_path / "second"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))
    meta = json.loads(cache.meta.read_text())
    cache.meta.write_text(json.dumps({**meta, "versions": {**meta["versions"], "device": "NVIDIA H100 sm90"}}))
    line = cache.load()
    assert "ignoring" in line and "NVIDIA H100 sm90" in line and "\n" not in line
    assert not (fresh / KEY).exists()  # nothing of the foreign file was used
    cache.meta.write_text(json.dumps(meta))
    cache.artifacts.write_bytes(b"not an artifact file")
    line = cache.load()
    assert "ignoring" in line and "\n" not in line and not (fresh / KEY).exists()
    cache.meta.write_text("{")
    assert "missing or unreadable" in cache.load()


def test_cache_folder_and_config_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "speedgpt" / "compile"
    cpu = torch.device("cpu")
    default = CompileCache.for_run("", Config().to_dict(), 1, cpu)
    assert default.folder.parent == default_root() and torch.__version__.split("+")[0] in default.folder.name
    assert CompileCache.for_run("off", Config().to_dict(), 1, cpu) is None
    assert "/" not in folder_name({"torch": "2.13.0+cu130", "triton": "3.6", "python": "3.11", "device": "A/B C",
                                   "autograd_functions": "0123456789ab"})
    base = Config()
    same = apply_overrides(base, ["--run.name=other", "--train.seed=7", "--data.train_files=/elsewhere"])
    assert config_digest(same.to_dict(), 1) == config_digest(base.to_dict(), 1)
    deeper = apply_overrides(base, ["--model.depth=6"])
    assert config_digest(deeper.to_dict(), 1) != config_digest(base.to_dict(), 1)
    assert config_digest(base.to_dict(), 4) != config_digest(base.to_dict(), 1)
    # the loader's own switches (which tokens fill a row) share the artifacts; the rows' shapes do not
    loader = apply_overrides(base, ["--data.long_docs=mix", "--data.mix_docs=8192", "--data.max_doc_len=512",
                                    "--data.shuffle_first_epoch=true", "--data.continued_bos=false",
                                    "--data.on_bad_shard=skip", "--data.local_max_tokens=0"])
    assert config_digest(loader.to_dict(), 1) == config_digest(base.to_dict(), 1)
    for shape in ("--data.seq_len=512", "--data.val_seq_len=2048", "--data.val_tokens=65536"):
        assert config_digest(apply_overrides(base, [shape]).to_dict(), 1) != config_digest(base.to_dict(), 1), shape
    # validation's cadence and its batch count share the artifacts (the default's validation batches are 512 rows of
    # 1,024 tokens: twice the val tokens is twice the batches); a short last batch is a shape of its own
    for same_shapes in ("--train.val_every=10", "--train.val_every=0", "--data.val_tokens=2097152"):
        assert config_digest(apply_overrides(base, [same_shapes]).to_dict(), 1) == config_digest(base.to_dict(), 1)
    short_last = apply_overrides(base, ["--data.val_tokens=1572864"])  # 1,536 rows: batches of 512, 512, 512
    assert config_digest(short_last.to_dict(), 1) == config_digest(base.to_dict(), 1)
    assert config_digest(apply_overrides(base, ["--data.val_tokens=1310720"]).to_dict(), 1) != \
        config_digest(base.to_dict(), 1)  # 1,280 rows: 512, 512, 256
    # a rank's share decides its batches: 1,024 rows on 3 ranks of 1,024-row micro-batches are one batch of 342 /
    # 341 / 341 rows; on 4 ranks (micro-batches of 128 rows) two batches of 128 each
    three = apply_overrides(base, ["--train.batch_tokens=3145728"])
    assert validation_shapes(three.to_dict(), 3) == [[342], [341], [341]]
    assert validation_shapes(base.to_dict(), 4) == [[128]] * 4


# data keys whose value reaches what torch.compile builds: the rows' and validation batches' shapes, and the
# tokenizer (its folder is where a run takes its vocabulary from); data.val_tokens reaches the digest as the rows of
# validation's batches (validation_shapes)
COMPILED_DATA_KEYS = {"seq_len", "val_seq_len", "tokenizer"}
# train keys that may: the batch's and stages' shapes, the device and dtype, how it compiles, the warmup that compiles,
# and the non-finite policy (kept: it decides what the step reads back)
COMPILED_TRAIN_KEYS = {"batch_tokens", "micro_batch_size", "stages", "device", "dtype", "compile", "compile_scope",
                       "compile_backend", "compile_mode", "compile_precompile", "coordinate_descent_tuning",
                       "autotune_pointwise", "persistent_reductions_upto", "warmup_steps",
                       "on_nonfinite"}


def test_every_data_key_is_either_compiled_or_the_loaders_alone():
    """A new data key must be put on one side: in the digest (it changes a graph) or in NOT_COMPILED's data keys
    (a loader switch); left out of both, this fails."""
    from dataclasses import fields

    from speedgpt.config.sections import DataConfig
    from speedgpt.train.compile_cache import NOT_COMPILED

    keys = {f.name for f in fields(DataConfig)}
    dropped = set(NOT_COMPILED["data"])
    assert not dropped & COMPILED_DATA_KEYS
    assert keys == dropped | COMPILED_DATA_KEYS, keys ^ (dropped | COMPILED_DATA_KEYS)


def test_every_train_key_is_either_compiled_or_not():
    """As the data keys: a new train key must be put on one side (a key left in the digest that changes no graph costs
    a cold compile, as train.steps did on every --extend resume)."""
    from dataclasses import fields

    from speedgpt.config.sections import TrainConfig
    from speedgpt.train.compile_cache import NOT_COMPILED

    keys = {f.name for f in fields(TrainConfig)}
    dropped = set(NOT_COMPILED["train"])
    assert not dropped & COMPILED_TRAIN_KEYS
    assert keys == dropped | COMPILED_TRAIN_KEYS, keys ^ (dropped | COMPILED_TRAIN_KEYS)


def test_a_longer_run_of_a_preset_shares_its_digest():
    """`--resume RUN --train.steps=N --extend`, a sweep of lengths or an A/B arm of another length: the resolved plan
    of a stage-table preset differs only in train.steps (every schedule is a tensor to the graphs), so the
    artifacts are the same config's."""
    from speedgpt.planner import plan_run

    def digest(*overrides):
        cfg = apply_overrides(load_preset("speedrun-latest"), ["--train.device=cpu", *overrides])
        return config_digest(plan_run(cfg).cfg.to_dict(), 1)

    assert digest("--train.steps=30") == digest("--train.steps=40", "--train.log_every=1",
                                                  "--train.checkpoint_every=5", "--train.keep_checkpoints=0")
    assert digest("--train.steps=30") != digest("--train.steps=30", "--train.batch_tokens=131072")
    # validation's cadence and size (in whole batches of one 262,144-token row) compile nothing new: the warmup scores
    # one batch of each shape whatever val_every is (an A/B validating every 25 steps on 1.5M tokens started cold beside
    # a run's artifacts from every 10 steps on 262K: wave 26)
    assert digest("--train.steps=30") == digest("--train.steps=300", "--train.val_every=25",
                                                  "--data.val_tokens=1572864")
    assert digest("--train.steps=30") == digest("--train.steps=30", "--train.val_every=0")
    # the optimizer and the lr schedule act outside the compiled model: an A/B of either starts its B arm warm (the B
    # arm of --schedule.cooldown_frac=0.6 compiled 55.8 s cold beside A's artifacts: 2026-12-07)
    assert digest("--train.steps=30") == digest("--train.steps=30", "--schedule.cooldown_frac=0.6",
                                                  "--schedule.final_lr_frac=0.2", "--optim.muon_lr=0.03",
                                                  "--optim.adam_eps=1e-10")
    assert digest("--train.steps=30") != digest("--train.steps=30", "--schedule.short_window_frac=0.25")
    assert digest("--train.steps=30") != digest("--train.steps=30", "--data.val_seq_len=131072")


def test_each_rank_keeps_a_file_of_its_own(tmp_path):
    """Inductor keys a graph by its inputs' device (cuda:r on rank r): one rank's artifacts warm no other
    rank, so under torchrun every rank saves and loads its own file; one process keeps the plain name."""
    cpu, cfg = torch.device("cpu"), Config().to_dict()
    one = CompileCache.for_run(str(tmp_path), cfg, 1, cpu)
    r0, r1 = (CompileCache.for_run(str(tmp_path), cfg, 4, cpu, rank=r) for r in (0, 1))
    assert one.artifacts.name == f"artifacts-{one.digest}.bin"
    assert r0.digest == r1.digest and len({r0.artifacts, r1.artifacts, r0.meta, r1.meta}) == 4
    assert r1.artifacts.name == f"artifacts-{r1.digest}-rank1.bin" and r1.meta.name.endswith("-rank1.json")
    r0.folder.mkdir(parents=True)
    r0.artifacts.write_bytes(b"rank 0's")
    assert "nothing saved for this config yet" in r1.load()  # rank 1 never reads rank 0's file


def test_ranks_write_triton_kernels_into_folders_of_their_own(tmp_path, monkeypatch):
    """Ranks that loaded their artifacts into one Triton folder raced on the same kernels (wave 9)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))  # put back after the test
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    cfg, cpu = Config().to_dict(), torch.device("cpu")
    seen = set()
    for r in (0, 1):
        cache = CompileCache.for_run(str(tmp_path), cfg, 2, cpu, rank=r)
        cache.activate()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder / "inductor")  # shared: keys hold cuda:r
        seen.add(os.environ["TRITON_CACHE_DIR"])
    assert len(seen) == 2



def test_precompile_gives_each_config_and_rank_an_inductor_folder_of_its_own(tmp_path, monkeypatch):
    """Dynamo's package lands in Inductor's folder keyed by GPT.forward, not by config: a second config that found
    the first's died retracing (torch 2.13, benchmarks/dynamo_precompile.py: --data.seq_len=64)."""
    from speedgpt.train.compile import open_compile_cache
    from speedgpt.parallel.dist import DistInfo

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))  # put back after the test
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    base = ["--train.compile=true", f"--train.compile_cache={tmp_path}"]
    seen = {}
    for world, rank, extra in ((1, 0, []), (1, 0, ["--data.seq_len=64"]), (2, 0, []), (2, 1, [])):
        for precompile in (False, True):
            cfg = apply_overrides(Config(), [*base, *extra, f"--train.compile_precompile={str(precompile).lower()}"])
            dist = DistInfo(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))
            open_compile_cache(cfg, dist, lambda line: None)
            seen[precompile, world, rank, bool(extra)] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    shared = {v for (pre, *_), v in seen.items() if not pre}
    own = [v for (pre, *_), v in seen.items() if pre]
    assert len(shared) == 1 and shared.pop().endswith("/inductor")  # without it one folder (keys hold cuda:r)
    assert len(set(own)) == 4 and all("/inductor-precompile/" in v for v in own)

def test_a_run_opens_the_cache_only_where_code_is_compiled(tmp_path, monkeypatch):
    from speedgpt.parallel.dist import DistInfo
    from speedgpt.train.compile import open_compile_cache

    # set here so that monkeypatch puts back what the process had after the test (activate() sets both)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    dist = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    lines: list[str] = []
    on = apply_overrides(Config(), ["--train.compile=true", f"--train.compile_cache={tmp_path / 'c'}"])
    cache = open_compile_cache(on, dist, lines.append)
    assert cache.folder.parent == tmp_path / "c"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(cache.folder / "triton")
    assert any("nothing saved" in line for line in lines)
    # Config()'s warmup_steps is 0: the artifacts, saved after the warmup, would never be written; it says so
    assert any("saves nothing to it" in line for line in lines)
    lines.clear()
    open_compile_cache(apply_overrides(on, ["--train.warmup_steps=1"]), dist, lines.append)
    assert lines and not any("saves nothing" in line for line in lines)
    for extra in (["--train.compile_backend=eager"], ["--train.compile=false"], ["--train.compile_cache=off"]):
        assert open_compile_cache(apply_overrides(on, extra), dist, lines.append) is None


class Tiny(torch.nn.Module):
    """At module level: torch's package saves the class by its import path."""

    def __init__(self, attn_backend: str = "sdpa"):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.runtime = SimpleNamespace(attn_backend=attn_backend)  # what compiled_forward reads of a GPT

    def forward(self, inputs):
        return torch.relu(self.proj(inputs)).square().mean()


def test_precompile_a_fresh_machines_start_traces_nothing(tmp_path, monkeypatch, fresh_artifacts):
    """train.compile_precompile: dynamo's traced code travels in the artifact file, so a fresh machine's
    compile loads it instead of tracing (Inductor on CPU, a one-layer module: a few seconds)."""
    from torch._dynamo.utils import counters

    from speedgpt.train.compile import compiled_forward

    x = torch.randn(4, 8)

    def start(precompile: bool, inductor_dir: str):
        """A process's start: empty dynamo, Inductor's cache dir, the artifacts loaded, one forward."""
        torch._dynamo.reset()
        counters.clear()
        # as a new process has it (the switch sets it; config.patch below restores it: monkeypatch would
        # delete a config module's entry on undo, since it is not in the module's __dict__)
        torch._dynamo.config.caching_precompile = False
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / inductor_dir))
        switch = f"--train.compile_precompile={str(precompile).lower()}"
        cfg = apply_overrides(Config(), ["--train.compile=true", switch,
                                         f"--train.compile_cache={tmp_path / ('cache-' + str(precompile))}"])
        cache = CompileCache.for_run(cfg.train.compile_cache, cfg.to_dict(), 1, torch.device("cpu"))
        cache.load()
        torch.manual_seed(0)
        loss = compiled_forward(cfg, Tiny(), "ddp", log=lambda line: None)(x)
        loss.backward()  # the backward is compiled at its first call; a package is saved with both
        return cache, loss, counters["stats"]["unique_graphs"], counters["dynamo_cache"]["dynamo_cache_hit"]

    try:
        with torch._dynamo.config.patch(caching_precompile=False):  # restored after the test
            # without the switch first: an installed package outlives torch._dynamo.reset() in one process
            for precompile in (False, True):
                cache, first, traced, hits = start(precompile, f"first-{precompile}")
                assert (traced, hits) == (1, 0) and "saved" in cache.save()
                _, again, traced, hits = start(precompile, f"second-{precompile}")  # another machine
                assert torch.equal(first, again)
                # with the switch nothing is traced (the package came with the artifacts); without it dynamo
                # traces again (Inductor's kernels still come from the cache)
                assert (traced, hits) == ((0, 1) if precompile else (1, 0))
    finally:
        torch._dynamo.reset()


class TinyKept(Tiny):
    """Code of its own: a package another test installed for Tiny's forward outlives torch._dynamo.reset()."""

    def forward(self, inputs):
        return torch.sigmoid(self.proj(inputs)).mean()


class TinyKeptOther(Tiny):
    def forward(self, inputs):
        return torch.tanh(self.proj(inputs)).mean()


def test_a_warm_start_keeps_the_artifact_file_it_started_from(tmp_path, monkeypatch):
    """A start warm from the artifact file compiles nothing, and torch then records only some of what it loaded
    (wave 26, one H100: "loaded 78 artifact(s)", then "saved 74 artifact(s), 0.0 MiB" over the 234 MiB file; on the
    CPU here dynamo's package alone, without the compiled graphs' artifacts). The file a fresh machine starts from
    stays as the cold start wrote it; a run that compiles something new writes its own."""
    from torch._dynamo.utils import counters

    from speedgpt.train.compile import compiled_forward

    x = torch.randn(4, 8)
    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true",
                                     f"--train.compile_cache={tmp_path / 'cache'}"])

    def machine(name: str, module: torch.nn.Module):
        """A fresh process on a fresh machine: empty dynamo, torch's recorder and Inductor folder; one step, then
        the save."""
        torch._dynamo.reset()
        counters.clear()
        torch._dynamo.config.caching_precompile = False  # as a new process has it (see the test above)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / name))
        with CacheArtifactManager.with_fresh_cache():
            cache = CompileCache.for_run(cfg.train.compile_cache, cfg.to_dict(), 1, torch.device("cpu"))
            cache.load()
            compiled_forward(cfg, module, "ddp", log=lambda line: None)(x).backward()
            return counters["stats"]["unique_graphs"], cache.save(), cache.artifacts.read_bytes()

    try:
        with torch._dynamo.config.patch(caching_precompile=False):
            traced, line, cold_file = machine("first", TinyKept())
            assert traced == 1 and "saved" in line
            traced, line, warm_file = machine("second", TinyKept())
            assert traced == 0 and "kept" in line and "\n" not in line, line
            assert warm_file == cold_file
            # a graph the file lacks (another module's code): its artifacts are new keys, written as recorded
            traced, line, new_file = machine("third", TinyKeptOther())
            assert traced == 1 and "saved" in line, line
            assert new_file != cold_file
    finally:
        torch._dynamo.reset()


def test_precompile_where_it_would_do_nothing_is_off_with_one_line():
    """A preset may turn precompile on (speedrun-latest): a run where it cannot apply (compile off, no compile cache,
    a backend that writes no artifacts, blocks compiled one by one) is not refused but runs without it, and says so
    in one line; torch's process-wide switch stays off."""
    from speedgpt.config.validate import check_config
    from speedgpt.model.build import build_model
    from speedgpt.train.compile import compiled_forward

    small = ["--model.depth=2", "--model.model_dim=64", "--model.head_dim=16"]  # blocks, for compile_scope=block
    on = [*small, "--train.compile=true", "--train.compile_precompile=true"]
    cases = {"train.compile is off": [*small, "--train.compile_precompile=true"],
             "train.compile_cache, which is off": [*on, "--train.compile_cache=off"],
             "which only the inductor backend uses": [*on, "--train.compile_backend=aot_eager"],
             "off with compile_scope=block": [*on, "--train.compile_scope=block"]}
    with torch._dynamo.config.patch(caching_precompile=True):
        for says, overrides in cases.items():
            cfg = apply_overrides(load_preset("tiny-cpu"), overrides)
            check_config(cfg)
            lines = []
            torch._dynamo.config.caching_precompile = True  # a run before this one had it on
            compiled_forward(cfg, build_model(cfg.model, 32, "cpu", seed=0), "ddp", log=lines.append)
            said = [line for line in lines if "compile_precompile" in line]
            assert len(said) == 1 and says in said[0], (overrides, lines)
            if cfg.train.compile:  # (without a compile nothing reads the switch)
                assert torch._dynamo.config.caching_precompile is False, overrides


class TinyFlex(Tiny):
    """flex attention on its GPU path (FUSED_FLEX_DEVICES + "cpu"), forward only: Inductor has no CPU flex
    backward."""

    def __init__(self):
        super().__init__("flex")
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, inputs):
        from speedgpt.model import attention

        q = self.proj(inputs).view(1, 128, 1, 16).transpose(1, 2)
        return attention.flex_attention_fused(q, q, q, None, 0.25).square().mean()


class TinyFlexTorchGuards(TinyFlex):
    """The same under a forward of its own: dynamo keys a package by the compiled function, and a package
    installed in this process outlives torch._dynamo.reset(), so each case compiles a function of its own."""

    def forward(self, inputs):
        return super().forward(inputs)


def start_as_a_new_process(monkeypatch, cfg: Config, inductor_dir: Path) -> CompileCache:
    """A process's start, in this one: dynamo emptied (its counters too), caching precompile off as a new process
    has it (the trainer's switch sets it; the tests restore it with config.patch), Inductor's cache dir, the run's
    compile cache opened and its artifacts loaded, the seed set."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.config.caching_precompile = False
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir))
    cache = CompileCache.for_run(cfg.train.compile_cache, cfg.to_dict(), 1, torch.device("cpu"))
    cache.load()
    torch.manual_seed(0)
    return cache


@pytest.mark.parametrize("fixed", [True, False])
def test_precompile_a_flex_models_fresh_start_restores_its_guards(tmp_path, monkeypatch, fresh_artifacts, fixed):
    """A flex model's package: torch alone unpickles its guards outside a trace and the fresh start dies
    ("CompilePackage is already initialized", pytorch/pytorch#187736); speedgpt unpickles them in a throwaway
    tracing context (precompile_guards.py), so nothing is traced and the output is the cold start's."""
    import torch._dynamo.package as package
    from torch._dynamo.utils import counters

    from speedgpt.model import attention
    from speedgpt.train import compile as compile_module

    monkeypatch.setattr(attention, "FUSED_FLEX_DEVICES", ("cuda", "cpu"))
    # torch's own, whatever an earlier test in this process left there (monkeypatch puts that back after)
    monkeypatch.setattr(package, "load_guards_state", inspect.unwrap(package.load_guards_state))
    if not fixed:
        monkeypatch.setattr(compile_module, "restore_guards_in_a_trace", lambda: True)  # precompile on, unfixed
    x = torch.randn(128, 16)
    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true",
                                     f"--train.compile_cache={tmp_path / 'cache'}"])

    def start(inductor_dir: str):
        cache = start_as_a_new_process(monkeypatch, cfg, tmp_path / inductor_dir)
        with torch.no_grad():
            model = TinyFlex() if fixed else TinyFlexTorchGuards()
            out = compile_module.compiled_forward(cfg, model, "ddp", log=lambda line: None, cache=cache)(x)
        return cache, out, counters["stats"]["unique_graphs"], counters["dynamo_cache"]["dynamo_cache_hit"]

    try:
        with torch._dynamo.config.patch(caching_precompile=False):
            cache, first, traced, hits = start("first")
            assert (traced, hits) == (1, 0) and "saved" in cache.save()
            if not fixed:
                try:
                    start("second")
                except Exception as e:  # noqa: BLE001: torch's own error type for it is an AssertionError today
                    assert "CompilePackage is already initialized" in str(e)
                    return
                pytest.skip("this torch restores a flex package's guards by itself: precompile_guards.py's wrap of "
                            "load_guards_state is no longer needed there")
            _, again, traced, hits = start("second")  # another machine
            assert (traced, hits) == (0, 1)
            assert torch.equal(first, again)
    finally:
        torch._dynamo.reset()


def test_precompile_is_off_with_flex_where_torch_has_no_guard_unpickling_to_wrap(monkeypatch):
    """A torch without torch._dynamo.package.load_guards_state: a flex model's fresh start would die, so the switch
    is off for it, with one line, and dynamo's setting untouched; other models keep it."""
    from speedgpt.train import compile as compile_module

    monkeypatch.setattr(compile_module, "restore_guards_in_a_trace", lambda: False)
    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true"])
    lines = []
    with torch._dynamo.config.patch(caching_precompile=False):
        for backend, on in (("flex", False), ("sdpa", True)):
            torch._dynamo.config.caching_precompile = False
            compile_module.compiled_forward(cfg, Tiny(backend), "ddp", log=lines.append)
            assert torch._dynamo.config.caching_precompile is on
    assert sum("compile_precompile is off with flex attention" in line for line in lines) == 1


def test_a_second_config_in_one_process_does_not_inherit_precompile():
    """torch's switch is process-wide: each compiled run sets it, off as well as on (bench --ab runs two configs in
    one process; the second, without precompile, kept the first's)."""
    from speedgpt.train.compile import compiled_forward

    on = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true"])
    off = apply_overrides(Config(), ["--train.compile=true"])
    with torch._dynamo.config.patch(caching_precompile=False):
        for cfg, expected in ((on, True), (off, False), (on, True)):
            compiled_forward(cfg, Tiny(), "ddp", log=lambda line: None)
            assert torch._dynamo.config.caching_precompile is expected


def test_each_compiled_run_sets_inductor_pointwise_autotuning():
    """train.autotune_pointwise reaches Inductor's process-wide setting, set on every compiled run, so the second
    config of a bench --ab does not inherit the first's (it also keys Inductor's cache: its config is hashed)."""
    import torch._inductor.config as inductor_config

    from speedgpt.train.compile import compiled_forward

    one = apply_overrides(Config(), ["--train.compile=true", "--train.autotune_pointwise=false"])
    several = apply_overrides(Config(), ["--train.compile=true"])
    with inductor_config.patch({"triton.autotune_pointwise": True}):
        for cfg, expected in ((one, False), (several, True), (one, False)):
            compiled_forward(cfg, Tiny(), "ddp", log=lambda line: None)
            assert inductor_config.triton.autotune_pointwise is expected


def test_guards_are_restored_in_a_trace_once_a_process():
    import torch._dynamo.package as package

    from speedgpt.train.precompile_guards import PATCHED, restore_guards_in_a_trace

    before = package.load_guards_state
    torchs = inspect.unwrap(before)  # an earlier test in this process may have wrapped it already
    package.load_guards_state = torchs
    try:
        assert restore_guards_in_a_trace()
        wrapped = package.load_guards_state
        assert getattr(wrapped, PATCHED) and wrapped is not torchs and inspect.unwrap(wrapped) is torchs
        assert restore_guards_in_a_trace() and package.load_guards_state is wrapped  # not wrapped twice
    finally:
        package.load_guards_state = before


def test_a_save_that_torch_cannot_serialize_is_one_line_not_a_failed_run(tmp_path, monkeypatch, fresh_artifacts):
    def fails():
        raise RuntimeError("Failed to save package to xyz: cannot pickle 'FP8Op'")

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", fails)
    cache = cache_in(tmp_path)
    line = cache.save()
    assert line.startswith("compile cache: nothing saved: torch could not serialize") and "cannot pickle" in line
    assert not cache.artifacts.exists()


# ---- AOTAutograd's cache and the FP8 paths' custom autograd Functions --------------------------------------------

SWITCH = compile_cache.CUSTOM_FUNCTIONS_SWITCH


class Square(torch.autograd.Function):
    """A custom autograd Function, as the FP8 paths are (AOTAutograd's cache refuses these by default)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class WithFunction(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, inputs):
        return Square.apply(self.proj(inputs)).mean()


def test_a_run_with_a_cache_lets_aotautograds_cache_keep_custom_function_graphs(tmp_path, monkeypatch):
    """The graph of a model with a custom autograd Function, judged at its compile by the check that AOTAutograd's
    cache makes before it keys a graph: cacheable in a run with a cache, bypassed with train.compile_cache=off;
    torch's switch is on only while the compiled forward runs."""
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_cacheable

    from speedgpt.parallel.dist import DistInfo
    from speedgpt.train.compile import compiled_forward, open_compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))  # activate() sets both
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    verdicts = []

    def judging_backend(gm, example_inputs):
        try:
            check_cacheable(gm)
            verdicts.append("cached")
        except BypassAOTAutogradCache:
            verdicts.append("bypassed")
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, **{**kw, "backend": judging_backend}))
    dist = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    on = apply_overrides(Config(), ["--train.compile=true", f"--train.compile_cache={tmp_path / 'c'}"])
    config = torch._functorch.config
    try:
        for cfg in (on, apply_overrides(on, ["--train.compile_cache=off"])):
            torch._dynamo.reset()
            cache = open_compile_cache(cfg, dist, lambda line: None)
            forward = compiled_forward(cfg, WithFunction(), "ddp", lambda line: None, cache)
            forward(torch.randn(4, 8)).backward()
            assert getattr(config, SWITCH) is False  # scoped: torch's own setting outside the forward
    finally:
        torch._dynamo.reset()
    assert verdicts == ["cached", "bypassed"]


def test_a_torch_without_the_switch_changes_nothing_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setattr(compile_cache, "CUSTOM_FUNCTIONS_SWITCH", "no_such_switch_in_this_torch")
    cache = cache_in(tmp_path)
    line = cache.activate()
    assert "this torch has no torch._functorch.config.no_such_switch_in_this_torch" in line and "\n" not in line

    def forward(x):
        return x

    assert cache.with_custom_functions(forward) is forward


READ_SOURCE = compile_cache._module_source  # the reader itself, before any test patches it


def edited(target: str):
    """A source reader that sees module `target` edited and every other module as it is on disk."""
    return lambda name: READ_SOURCE(name) + (b"\n# edited\n" if name == target else b"")


def test_the_folder_follows_the_custom_functions_source_and_nothing_else(tmp_path, monkeypatch):
    cpu, cfg = torch.device("cpu"), Config().to_dict()
    read = []
    monkeypatch.setattr(compile_cache, "_module_source", lambda name: read.append(name) or READ_SOURCE(name))
    before = CompileCache.for_run(str(tmp_path), cfg, 1, cpu)
    assert tuple(read) == compile_cache.AUTOGRAD_FUNCTION_MODULES
    assert before.folder.name.endswith("_fn-" + before.versions["autograd_functions"])
    for module in compile_cache.AUTOGRAD_FUNCTION_MODULES:
        monkeypatch.setattr(compile_cache, "_module_source", edited(module))
        after = CompileCache.for_run(str(tmp_path), cfg, 1, cpu)
        assert after.folder != before.folder and after.digest == before.digest
    for module in ("speedgpt.model.gpt", "speedgpt.train.loop"):  # the rest of the model, the trainer
        monkeypatch.setattr(compile_cache, "_module_source", edited(module))
        assert CompileCache.for_run(str(tmp_path), cfg, 1, cpu).folder == before.folder


def test_unreadable_function_source_keeps_the_switch_off(tmp_path, monkeypatch):
    def unreadable(name):
        raise OSError("no source")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setattr(compile_cache, "_module_source", unreadable)
    cache = cache_in(tmp_path)
    assert cache.versions["autograd_functions"] == compile_cache.UNREADABLE
    assert "could not be read" in cache.activate()

    def forward(x):
        return x

    assert cache.with_custom_functions(forward) is forward


def test_artifacts_of_other_fp8_code_are_ignored_with_one_line(tmp_path, monkeypatch, fresh_artifacts):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first"))
    old = cache_in(tmp_path)
    CacheArtifactManager.record_artifact("autotune", KEY, {"XBLOCK": 64})
    old.save()
    monkeypatch.setattr(compile_cache, "_module_source", edited(compile_cache.AUTOGRAD_FUNCTION_MODULES[0]))
    new = cache_in(tmp_path)
    assert "nothing saved for this config yet" in new.load()  # a folder of its own: a cold compile
    new.folder.mkdir(parents=True)
    for path in (old.artifacts, old.meta):  # the old files copied in by hand
        (new.folder / path.name).write_bytes(path.read_bytes())
    fresh = tmp_path / "second"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))
    line = new.load()
    assert line.startswith("compile cache: ignoring") and "the FP8 code changed" in line and "\n" not in line
    assert "speedgpt/model/fp8_linear.py" in line and not (fresh / KEY).exists()


FUNCTION_BASES = {"torch.autograd.Function", "autograd.Function", "torch.autograd.function.Function",
                  "autograd.function.Function", "Function"}


def autograd_function_classes(source: str) -> list[str]:
    """Classes in `source` that subclass torch.autograd.Function (as torch.autograd.Function, autograd.Function,
    or a `Function` imported from torch.autograd)."""
    import ast

    tree = ast.parse(source)
    imported = any(isinstance(node, ast.ImportFrom) and node.module in ("torch.autograd", "torch.autograd.function")
                   and any(alias.name == "Function" for alias in node.names) for node in ast.walk(tree))
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(ast.unparse(base) in FUNCTION_BASES and (ast.unparse(base) != "Function" or imported)
                    for base in node.bases)]


def test_every_custom_autograd_function_is_in_a_module_the_cache_is_keyed_on():
    """A new torch.autograd.Function subclass in speedgpt outside AUTOGRAD_FUNCTION_MODULES would be cached by
    AOTAutograd with no key on its code: the tuple must name its module."""
    assert autograd_function_classes("import torch\nclass A(torch.autograd.Function): pass\n"
                                      "from torch.autograd import Function\nclass B(Function): pass\n"
                                      "class C(torch.nn.Module): pass") == ["A", "B"]
    assert autograd_function_classes("class Function: pass\nclass B(Function): pass") == []
    root = Path(compile_cache.__file__).parents[1]
    found = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        classes = autograd_function_classes(text) if "Function" in text else []  # parse only the candidates
        if classes:
            found[".".join(path.relative_to(root.parent).with_suffix("").parts)] = classes
    assert set(found) == set(compile_cache.AUTOGRAD_FUNCTION_MODULES), found


class TinyFP8(torch.nn.Module):
    """The hidden linears' FP8 path (model/fp8_linear.py's custom autograd Function, row-wise), which torch 2.13
    runs on a CPU. At module level: torch's package saves the class by its import path."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 16) * 0.1)
        self.runtime = SimpleNamespace(attn_backend="sdpa")

    def forward(self, inputs):
        from speedgpt.model.fp8_linear import fp8_linear_dynamic

        return fp8_linear_dynamic(inputs, self.w, "rowwise").float().square().mean()


class TinyFP8WithoutCache(TinyFP8):
    """The same, compiled without the run's cache: a package installed in this process outlives
    torch._dynamo.reset(), so each case compiles a function of its own."""

    def forward(self, inputs):
        return super().forward(inputs)


@needs_rowwise
@pytest.mark.parametrize("with_cache", [True, False])
def test_precompile_an_fp8_models_fresh_start_traces_nothing(tmp_path, monkeypatch, fresh_artifacts, with_cache):
    """The FP8 Function's package (issue 33's warm start, GPU presets): with the run's cache (its scoped switch lets
    AOTAutograd keep custom Functions' graphs) a fresh machine traces nothing and gives the cold start's loss and
    gradient; without it the package has no backend for the graph ("Backend not found") and dynamo traces again."""
    from torch._dynamo.utils import counters

    from speedgpt.train.compile import compiled_forward

    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true",
                                     f"--train.compile_cache={tmp_path / 'cache'}"])

    def start(inductor_dir: str):
        cache = start_as_a_new_process(monkeypatch, cfg, tmp_path / inductor_dir)
        model = TinyFP8() if with_cache else TinyFP8WithoutCache()
        loss = compiled_forward(cfg, model, "ddp", log=lambda line: None, cache=cache if with_cache else None)(x)
        loss.backward()  # the backward compiles at its first call; the package is saved with both
        return cache, (loss, model.w.grad), counters["stats"]["unique_graphs"], \
            counters["dynamo_cache"]["dynamo_cache_hit"]

    try:
        with torch._dynamo.config.patch(caching_precompile=False):
            cache, first, traced, hits = start("first")
            assert (traced, hits) == (1, 0) and "saved" in cache.save()
            _, again, traced, hits = start("second")  # another machine: only the artifact file
            assert all(torch.equal(a, b) for a, b in zip(first, again))
            assert (traced, hits) == ((0, 1) if with_cache else (1, 1))
    finally:
        torch._dynamo.reset()


def test_precompile_is_off_on_a_torch_older_than_the_one_it_works_on(monkeypatch):
    """Below the oldest torch a fresh start from the package was seen to work on (2.11, with the guard sources'
    pickling mended), the switch is off, with one line, and the run traces; from it on the switch stays on."""
    from speedgpt.train import compile as compile_module

    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true"])
    lines = []
    with torch._dynamo.config.patch(caching_precompile=False):
        monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
        compile_module.compiled_forward(cfg, Tiny("sdpa"), "ddp", log=lines.append)
        assert torch._dynamo.config.caching_precompile is False
        assert any("compile_precompile is off on torch 2.10.0+cu128 (needs 2.11 or later)" in line for line in lines)
        monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
        compile_module.compiled_forward(cfg, Tiny("sdpa"), "ddp", log=lines.append)
        assert torch._dynamo.config.caching_precompile is True


def derived_source_class(name: str, init_fields_only: bool):
    """A new guard source class with a derived field (as DefaultsSource has), pickled as torch 2.13 pickles every
    Source (`init_fields_only`: the constructor's fields) or as torch 2.11 does (all its fields, the derived one too).
    Made anew for each use, since a class stays mended once mended; the test puts it at module level under `name`,
    so that pickle finds it."""
    import dataclasses

    from torch._guards import Source

    @dataclasses.dataclass(frozen=True)
    class DerivedSource(Source):
        label: str
        shouted: str = dataclasses.field(init=False, repr=False, compare=False)

        def __post_init__(self):
            object.__setattr__(self, "shouted", self.label.upper())

        def __reduce__(self):  # torch's (torch/_guards.py, dataclass_with_cached_hash)
            fields = [f for f in dataclasses.fields(self) if f.init or not init_fields_only]
            return (self.__class__, tuple(getattr(self, f.name) for f in fields))

    DerivedSource.__name__ = DerivedSource.__qualname__ = name
    return DerivedSource


@pytest.fixture
def torchs_own_source_pickling(monkeypatch):
    """DefaultsSource as this torch made it, whatever an earlier test in this process mended (a mend is not undone:
    the trainer's lasts the process), so that a test sees the trainer mend it."""
    from torch._dynamo.source import DefaultsSource

    for name in ("__init__", "__reduce__"):  # mended ones keep torch's own as __wrapped__
        monkeypatch.setattr(DefaultsSource, name, inspect.unwrap(getattr(DefaultsSource, name)))


def test_guard_sources_with_derived_fields_unpickle_once_mended(monkeypatch):
    """Wave 17 on torch 2.11: a package's DefaultsSource guard could not be unpickled ("takes from 3 to 4 positional
    arguments but 6 were given"). Mended, such a source pickles its constructor's fields only, and a pickle made
    before the mend (every field) loads too; a source that pickles right is left alone."""
    import pickle

    from torch._dynamo.source import DefaultsSource, LocalSource

    from speedgpt.train.precompile_guards import mend_source_pickling

    broken, right = derived_source_class("BrokenSource", False), derived_source_class("RightSource", True)
    monkeypatch.setitem(globals(), "BrokenSource", broken)
    monkeypatch.setitem(globals(), "RightSource", right)
    old_pickle, right_reduce = pickle.dumps(broken("kv")), vars(right)["__reduce__"]
    with pytest.raises(TypeError, match="positional argument"):
        pickle.loads(old_pickle)
    mended = mend_source_pickling()
    assert "BrokenSource" in mended and "RightSource" not in mended
    assert not hasattr(right.__init__, "__wrapped__") and vars(right)["__reduce__"] is right_reduce  # untouched
    again = pickle.loads(pickle.dumps(broken("kv")))
    assert again == broken("kv") and again.shouted == "KV"
    assert pickle.loads(old_pickle) == broken("kv")  # saved before the mend
    assert "BrokenSource" not in mend_source_pickling()  # mended, it pickles right: passed by
    # this torch's own, mended or not
    source = DefaultsSource(LocalSource("fn"), "scale", is_kw=True)
    assert pickle.loads(pickle.dumps(source)).name == source.name


def scaled(x, *, factor=0.5):
    """A keyword-only default: dynamo guards it, through a DefaultsSource, whatever its value."""
    return x * factor


class TinyDefaults(Tiny):
    def forward(self, inputs):
        return scaled(torch.relu(self.proj(inputs))).square().mean()


def test_precompile_a_package_guarding_a_default_installs_on_a_fresh_start(tmp_path, monkeypatch, fresh_artifacts,
                                                                             torchs_own_source_pickling):
    """The guard wave 17's fresh start died of on torch 2.11 (a function's default): the package installs, nothing
    is traced and the loss is the cold start's (on a torch whose Source pickling is right this holds unmended)."""
    from torch._dynamo.utils import counters

    from speedgpt.train.compile import compiled_forward

    x = torch.randn(4, 8)
    cfg = apply_overrides(Config(), ["--train.compile=true", "--train.compile_precompile=true",
                                     f"--train.compile_cache={tmp_path / 'cache'}"])

    def start(inductor_dir: str):
        cache = start_as_a_new_process(monkeypatch, cfg, tmp_path / inductor_dir)
        loss = compiled_forward(cfg, TinyDefaults(), "ddp", log=lambda line: None, cache=cache)(x)
        loss.backward()
        return cache, loss, counters["stats"]["unique_graphs"], counters["dynamo_cache"]["dynamo_cache_hit"]

    try:
        with torch._dynamo.config.patch(caching_precompile=False):
            cache, first, traced, hits = start("first")
            assert (traced, hits) == (1, 0) and "saved" in cache.save()
            _, again, traced, hits = start("second")  # another machine
            assert (traced, hits) == (0, 1)
            assert torch.equal(first, again)
    finally:
        torch._dynamo.reset()
