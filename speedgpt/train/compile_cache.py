"""The compile cache that travels (train.compile_cache): what torch.compile made for a config, kept in
a folder so that the next run of it, on this machine or on another with the same GPU and versions,
starts warm.

Two layers, both under one folder per (torch, Triton, Python, device, FP8 code) key:
- Inductor's and Triton's own on-disk caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR point there):
  a second run on the same machine finds its kernels without any help;
- torch's portable cache artifacts (`torch.compiler.save_cache_artifacts`, one file per config
  digest, written after the compile warmup), which `load_cache_artifacts` writes back into those
  caches on a fresh machine before the first compile. Under torchrun every rank writes and reads a
  file of its own: Inductor's cache keys hold the inputs' device, cuda:0 on rank 0 and cuda:r on
  rank r, so rank 0's file warms nobody else (wave 8: on 4 GPUs warm on rank 0 alone, its start
  waited ~90 s at the first collectives for ranks 1-3's cold compiles).
A file made by other versions or another device (copied in by hand, say) or one that does not read
back is ignored with one line: a cache can make a start faster, never fail a run.

With train.compile_precompile the file also holds dynamo's package (its traced code, guards and compiled
backends), which load_cache_artifacts writes into Inductor's folder as dynamo/<key>, keyed by the compiled
function (GPT.forward's name and first line), not by config or device. So that Inductor folder is the config's
and the rank's own (activate): another config's package there would be installed, its guards fail and the
retrace collide with the globals it installed (torch 2.13: "Name '__builtins_dict___1' already exists in
scope", a failed run; benchmarks/dynamo_precompile.py), and under torchrun a rank would install another rank's
backends, compiled for that rank's GPU.

The FP8 paths are custom torch.autograd.Functions. AOTAutograd's cache leaves out every graph with one
(its key does not cover the Function's Python code) unless torch's switch CUSTOM_FUNCTIONS_SWITCH is on:
without it every warm start traced and partitioned speedrun-124m's training graphs again, 15 s of its 27 s
compiling (one H200, docs/benchmarks.md). So the folder's key also holds a digest of the source of the modules that
define speedgpt's Functions (AUTOGRAD_FUNCTION_MODULES): an edit of one starts cold in a new folder, and
with that key in place the switch is on while a run with a cache compiles (with_custom_functions).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import atomic_write

FORMAT = "speedgpt.compile_cache/1"
# Keys of a config that change nothing torch.compile builds: a run of the same config under another
# name, seed, data or length reuses the first one's artifacts. The data keys past the files are the loader's
# alone (which tokens fill a row, not the rows' shape): an A/B of a loader switch starts its second arm warm
# (wave 22: arm B of data.mix_docs=8192 compiled 74 s cold beside arm A's artifacts). data.seq_len, val_seq_len and
# tokenizer stay in the digest, and data.val_tokens as the rows of validation's batches (below).
# The train keys: the run's length (train.steps and the budgets that set it; every schedule reaches the graphs as
# tensors, so one run's stages share its two graphs) and its cadences of logging and checkpoints. With train.steps in
# the digest a `--resume RUN --train.steps=N --extend` compiled cold again: 55.9 s of compiling where the run it
# extended had just saved its artifacts (2026-12-06, one H100, speedrun-latest with precompile).
# Validation reaches the graphs by the rows of each batch it scores alone, not by how many batches or how often (the
# warmup compiles its graphs whatever train.val_every is, and every run validates at its end): those rows stand in
# the digest for data.val_tokens (validation_shapes). With val_tokens and val_every in the digest an A/B validating
# every 25 steps on 1.5M tokens started 71.7 s cold beside the artifacts of a run that validated every 10 steps on
# 262K (wave 26, one H100, speedrun-latest).
# The optimizer and the lr schedule act outside the compiled model (only the model is compiled, train/compile.py; the
# schedule sets the param groups' lrs between steps): an A/B of --schedule.cooldown_frac=0.6 compiled its B arm 55.8 s
# cold beside A's artifacts of the same two graphs (2026-12-07, one H100, speedrun-latest). The schedule's window keys
# stay in the digest (they reach the model).
NOT_COMPILED = {"run": None,
                "optim": None,
                "schedule": ("kind", "warmup_frac", "cooldown_frac", "final_lr_frac"),
                "data": ("train_files", "val_files", "cache_dir", "local_max_tokens", "local_piece_chars", "packing",
                         "long_docs", "mix_docs", "max_doc_len", "continued_bos", "shuffle_first_epoch",
                         "on_bad_shard", "val_tokens"),
                "train": ("seed", "compile_cache", "compile_validation_ahead", "steps", "tokens_per_param", "val_every",
                          "flops_budget", "horizon", "time_budget_s", "log_every", "checkpoint_every",
                          "checkpoint_every_min", "save_final_checkpoint", "checkpoint_format", "keep_checkpoints",
                          "keep_checkpoint_every", "rollback_lr_factor", "max_rollbacks", "peak_flops")}
# The modules of speedgpt that define custom torch.autograd.Functions: the cache's folder is keyed on their source
# (tests/test_compile_cache.py fails when a Function subclass appears in a module missing here).
AUTOGRAD_FUNCTION_MODULES = ("speedgpt.model.fp8_linear", "speedgpt.model.fp8_head")
# torch._functorch.config's switch that lets AOTAutograd's cache keep graphs with custom autograd Functions
# (pytorch/pytorch#149751; in torch 2.11 and 2.13, off by default). Its env var
# TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD, when set, decides instead: torch reads it first.
CUSTOM_FUNCTIONS_SWITCH = "autograd_cache_allow_custom_autograd_functions"
UNREADABLE = "unreadable"  # the functions' digest when their source cannot be read: the switch then stays off


def default_root() -> Path:
    """$XDG_CACHE_HOME/speedgpt/compile (~/.cache when unset): read when a run starts, never at import."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "speedgpt" / "compile"


def _module_source(name: str) -> bytes:
    """The source file of module `name`, found without importing it."""
    return Path(importlib.util.find_spec(name).origin).read_bytes()


def autograd_functions_digest() -> str:
    """12 hex digits of the source of AUTOGRAD_FUNCTION_MODULES (UNREADABLE when a file cannot be read)."""
    h = hashlib.sha256()
    try:
        for name in AUTOGRAD_FUNCTION_MODULES:
            h.update(name.encode() + b"\0" + _module_source(name) + b"\0")
    except Exception:  # noqa: BLE001: not found, no source file: the key cannot vouch for the Functions' code
        return UNREADABLE
    return h.hexdigest()[:12]


def _function_files() -> str:
    return ", ".join(name.replace(".", "/") + ".py" for name in AUTOGRAD_FUNCTION_MODULES)


def custom_functions_switch():
    """torch._functorch.config when this torch has CUSTOM_FUNCTIONS_SWITCH, else None."""
    try:
        from torch._functorch import config
    except ImportError:
        return None
    return config if hasattr(config, CUSTOM_FUNCTIONS_SWITCH) else None


def versions(device: torch.device) -> dict[str, str]:
    """What a compiled artifact depends on besides the config: torch, Triton, Python, the device and the code of
    speedgpt's custom autograd Functions (AOTAutograd's cache key does not cover it)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        device_name = f"{torch.cuda.get_device_name(device)} sm{major}{minor}"
    else:
        device_name = f"{device.type} {platform.machine()}"
    return {"torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
            "device": device_name, "autograd_functions": autograd_functions_digest()}


def folder_name(v: dict[str, str]) -> str:
    """A file-system-safe folder name for a versions dict (torch-2.13.0_triton-3.5_py-3.11.9_NVIDIA-H100..._fn-...)."""
    raw = f"torch-{v['torch']}_triton-{v['triton']}_py-{v['python']}_{v['device']}_fn-{v['autograd_functions']}"
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", raw)


def validation_shapes(cfg_dict: dict, world_size: int) -> list[list[int]]:
    """What validation brings to the graphs (NOT_COMPILED's note): each rank's row counts of the batches it scores,
    as Validator deals them (data.val_tokens in rows of data.val_seq_len, at the run's micro-batch). The rows are the
    config's; the val shards' size may cap them lower, as the val files themselves are not in the digest either."""
    from ..config import config_from_dict, micro_batch_rows
    from ..data.val import batch_rows

    cfg = config_from_dict(cfg_dict)
    rows = cfg.data.val_tokens // (cfg.data.val_seq_len or cfg.data.seq_len)
    micro_batch = micro_batch_rows(cfg, world_size)[0]  # the run's (RunPlan.micro_batch), which Validator batches with
    return [sorted({max(n, 1) for n in batch_rows(rows, world_size, micro_batch, rank)}) for rank in range(world_size)]


def config_digest(cfg_dict: dict, world_size: int) -> str:
    """16 hex digits naming a config's artifacts: the resolved config without the keys that change nothing
    torch.compile builds (NOT_COMPILED), validation's shapes, and the world size (each rank compiles its share's
    shapes)."""
    kept = {}
    for section, values in cfg_dict.items():
        dropped = NOT_COMPILED.get(section, ())
        if dropped is None:
            continue
        kept[section] = ({k: v for k, v in values.items() if k not in dropped} if isinstance(values, dict)
                         else values)
    blob = json.dumps({"config": kept, "validation": validation_shapes(cfg_dict, world_size),
                       "world_size": world_size}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class CompileCache:
    """One config's place in the cache: `folder` (the versions' folder) and `digest` (the config's file)."""

    folder: Path
    digest: str
    versions: dict[str, str]
    rank: int | None = None  # None: one process; else this rank's own file (see the module's docstring)
    precompile: bool = False  # train.compile_precompile: dynamo's package travels too (its own Inductor folder)
    loaded: frozenset | None = None  # the (kind, key) of each artifact load() read back; None when it read none

    @classmethod
    def for_run(cls, setting: str, cfg_dict: dict, world_size: int, device: torch.device,
                rank: int = 0, precompile: bool = False) -> CompileCache | None:
        """The cache of train.compile_cache = `setting` ("" the default folder, "off" none, else a folder)."""
        if setting == "off":
            return None
        v = versions(device)
        root = Path(setting).expanduser() if setting else default_root()
        return cls(root / folder_name(v), config_digest(cfg_dict, world_size), v,
                   rank if world_size > 1 else None, precompile)

    @property
    def artifacts(self) -> Path:
        return self.folder / f"artifacts-{self._name}.bin"

    @property
    def meta(self) -> Path:
        return self.folder / f"artifacts-{self._name}.json"

    @property
    def _name(self) -> str:
        return self.digest if self.rank is None else f"{self.digest}-rank{self.rank}"

    def activate(self) -> str:
        """Point Inductor's and Triton's on-disk caches into the folder (before the first compile); returns
        a line for the log. Set, not defaulted: Inductor sets both itself at its first compile, so a second
        run in one process (bench --ab) would otherwise keep the first's. train.compile_cache=off leaves them.
        Under torchrun each rank gets a Triton folder of its own, as torch's default layout keys it by device:
        ranks loading their artifacts into one folder raced to write the same kernels, and each loser logged
        "Directory ... is not empty - skipping!" and left its copy behind as a tmp.* folder (wave 9: 70 lines
        in one 4-GPU start)."""
        triton = "triton" if self.rank is None else f"triton/rank{self.rank}"
        # with precompile dynamo's packages live under Inductor's folder: one per config and rank (module docstring)
        inductor = f"inductor-precompile/{self._name}" if self.precompile else "inductor"
        for var, sub in (("TORCHINDUCTOR_CACHE_DIR", inductor), ("TRITON_CACHE_DIR", triton)):
            os.environ[var] = str(self.folder / sub)
        line = f"compile cache: {self.folder} (config {self.digest})"
        why_not = self._custom_functions_refused()
        if why_not:
            return f"{line}; AOTAutograd's cache skips the custom autograd Functions' graphs: {why_not}"
        return line

    def _custom_functions_refused(self) -> str | None:
        """Why AOTAutograd's cache may not keep the custom autograd Functions' graphs here; None when it may."""
        if self.versions["autograd_functions"] == UNREADABLE:
            return f"the source of {_function_files()} could not be read to key the cache on"
        if custom_functions_switch() is None:
            return f"this torch has no torch._functorch.config.{CUSTOM_FUNCTIONS_SWITCH}"
        return None

    def with_custom_functions(self, forward: Callable) -> Callable:
        """`forward` with AOTAutograd's cache open to graphs of custom autograd Functions (the FP8 paths) while it
        runs: the folder's key covers their code. Scoped, not process-wide: torch reads the switch only where a
        graph is compiled, when AOTAutograd computes its cache key at the graph's first call, in the thread that
        calls it (the lazily compiled backward, in autograd's thread, does not read it); the rest of the process
        (a run without a cache in the same `bench --ab`, say) keeps torch's setting. One patch object for all
        calls: entering it costs ~7 us a call, a new one each call ~40 us (2 shared vCPUs). Unchanged when this
        torch lacks the switch or the Functions' source could not be read (activate() says so)."""
        if self._custom_functions_refused():
            return forward
        patch = custom_functions_switch().patch(**{CUSTOM_FUNCTIONS_SWITCH: True})

        def call(*args, **kwargs):
            with patch:
                return forward(*args, **kwargs)

        return call

    def load(self) -> str:
        """Write this config's saved artifacts back into the local caches; returns a line for the log:
        what was loaded, that there was nothing yet, or why a file was ignored."""
        if not self.artifacts.exists():
            return "compile cache: nothing saved for this config yet (cold compile; saved after the warmup)"
        try:
            meta = json.loads(self.meta.read_text())
        except (OSError, ValueError):
            return f"compile cache: ignoring {self.artifacts.name}: its {self.meta.name} is missing or unreadable"
        if meta.get("format") != FORMAT or meta.get("versions") != self.versions:
            made = meta.get("versions", {})
            ours = self.versions["autograd_functions"]
            changed = ("" if made.get("autograd_functions", ours) == ours else
                       f"; the FP8 code changed: the custom autograd Functions of {_function_files()}")
            return (f"compile cache: ignoring {self.artifacts.name}: made with {_describe(made)}, "
                    f"this is {_describe(self.versions)}{changed} (cold compile; saved again after the warmup)")
        try:
            info = torch.compiler.load_cache_artifacts(self.artifacts.read_bytes())
        except Exception as e:  # noqa: BLE001: a broken cache must not fail the run it was meant to speed up
            return f"compile cache: ignoring {self.artifacts.name}: it does not load ({type(e).__name__}: {e})"
        if info is None:
            return f"compile cache: ignoring {self.artifacts.name}: it does not read back (corrupt or truncated)"
        self.loaded = _keys(info)
        return f"compile cache: loaded {_count(info)} artifact(s) from {self.artifacts}"

    def save(self, graphs_compiled: int | None = None) -> str | None:
        """Save what this process compiled (and loaded) as this config's artifacts; returns a line for the
        log, None when torch recorded nothing (a backend without caches, such as eager). `graphs_compiled`: the
        graphs this process compiled, where counted (CompileWatch); 0 keeps a file it loaded, as below."""
        try:
            saved = torch.compiler.save_cache_artifacts()
        except Exception as e:  # noqa: BLE001: e.g. a compiled backend that does not serialize (precompile)
            return (f"compile cache: nothing saved: torch could not serialize this run's artifacts "
                    f"({type(e).__name__}: {e})")
        if saved is None:
            return None
        data, info = saved
        if self.loaded is not None and (graphs_compiled == 0 or _keys(info) <= self.loaded):
            # A start warm from the file records only some of what it loaded: on a GPU, "loaded 78 artifact(s)" and
            # then 74 of 0.0 MiB written over the 234 MiB file, the compiled graphs' artifacts gone from what travels
            # (wave 26, one H100, 0 graphs compiled; on the CPU the warm save holds dynamo's package alone). The
            # machine's own Inductor folders stay warm either way; the file is what a fresh machine starts from. A
            # run that compiled something the file lacks (a graph, a new key) writes its own, as torch records it.
            return (f"compile cache: kept {self.artifacts.name} as loaded: this run compiled nothing it lacks "
                    f"({_count(info)} artifact(s) recorded, {len(data) / 2**20:.1f} MiB)")
        # The bytes first, then the metadata that vouches for them: a crash between the two leaves
        # a file that load() ignores rather than one it trusts.
        atomic_write(self.artifacts, data)
        atomic_write(self.meta, json.dumps({"format": FORMAT, "versions": self.versions, "bytes": len(data),
                                            "argv": sys.argv[1:]}, indent=1))
        return f"compile cache: saved {_count(info)} artifact(s), {len(data) / 2**20:.1f} MiB, to {self.artifacts}"


def _describe(v: dict) -> str:
    return (f"torch {v.get('torch', '?')}, triton {v.get('triton', '?')}, python {v.get('python', '?')} "
            f"on {v.get('device', '?')}, FP8 code {v.get('autograd_functions', '?')}")


def _count(info) -> int:
    """Artifacts in a torch CacheInfo (a list of keys per kind)."""
    return sum(len(keys) for keys in info.artifacts.values())


def _keys(info) -> frozenset:
    """The (kind, key) of each artifact in a torch CacheInfo."""
    return frozenset((kind, key) for kind, keys in info.artifacts.items() for key in keys)
