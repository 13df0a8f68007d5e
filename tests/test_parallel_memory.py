"""The per-device memory estimate against numbers computed by hand, and the strategy choice it drives."""

import pytest

from speedgpt.config import ConfigError, apply_overrides, load_preset
from speedgpt.parallel.memory import GIB, choose_strategy, estimate_memory, param_counts
from speedgpt.train.loop import train

# depth 2, width 64, head_dim 16 (4 heads), MLP 4x = 256, one value embedding, vocab 50257 padded to 50304
SMALL = ["--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
         "--data.seq_len=32", "--train.batch_tokens=256", "--train.device=cpu"]
VOCAB, DIM, HIDDEN = 50304, 64, 256
BLOCK = 3 * DIM * DIM + DIM * DIM + DIM * HIDDEN + HIDDEN * DIM  # qkv, out proj, fc, mlp proj = 49152
EMBEDS = 3 * VOCAB * DIM  # token embedding, value embedding, lm_head
SCALARS = 1 + 2 * 2 + 2 * 2  # one U-net skip weight, block lambdas and v lambdas (2 per layer)
TOTAL = EMBEDS + 2 * BLOCK + SCALARS


def small(*extra):
    return apply_overrides(load_preset("tiny-cpu"), SMALL + list(extra))


def test_param_counts_by_hand():
    c = param_counts(small())
    assert (c.total, c.muon, c.adam, c.largest_block) == (TOTAL, 2 * BLOCK, TOTAL - 2 * BLOCK, BLOCK)
    assert param_counts(small("--optim.kind=adamw")).muon == 0


def test_estimate_by_hand():
    cfg = small()
    # 8 rows per step over 2 ranks: 4 rows of 32 tokens per micro-batch, fp32 (4 bytes) on CPU
    tokens = 4 * 32
    # per layer: attention 8 widths (input, norm, q k v before and after norm/rotary, output), MLP 1 width + 2 hidden
    per_token = (2 * (9 * DIM + 2 * HIDDEN) + 2 * DIM) * 4 + 2 * 4 * VOCAB  # two layers, two embeddings, fp32 logits + grad
    optimizer = (8 * (TOTAL - 2 * BLOCK) + 4 * 2 * BLOCK) / 2  # Adam 2 moments, Muon 1 buffer, sharded over 2
    ddp = estimate_memory(cfg, "ddp", 2, dtype_bytes=4)
    assert (ddp.params, ddp.grads, ddp.optimizer, ddp.activations) == (4 * TOTAL, 4 * TOTAL, optimizer,
                                                                       tokens * per_token)
    fsdp = estimate_memory(cfg, "fsdp", 2, dtype_bytes=4)
    assert fsdp.params == 4 * TOTAL / 2 + 2 * 4 * BLOCK  # shard + two gathered blocks
    assert fsdp.grads == 4 * TOTAL / 2 + 4 * BLOCK  # shard + one block's unsharded gradients
    assert fsdp.optimizer == optimizer and fsdp.activations == ddp.activations
    # activation checkpointing keeps each block's input, plus one block's activations while recomputed
    ac = estimate_memory(small("--parallel.activation_checkpointing=true"), "ddp", 2, dtype_bytes=4)
    assert ac.activations == tokens * ((2 * DIM + (9 * DIM + 2 * HIDDEN) + 2 * DIM) * 4 + 2 * 4 * VOCAB)
    # grouped-query attention: k and v of 2 heads instead of 4 keep 3 x 2 heads x 16 fewer values per layer
    gqa = estimate_memory(small("--model.num_kv_heads=2"), "ddp", 2, dtype_bytes=4)
    assert ddp.activations - gqa.activations == tokens * 2 * (3 * 2 * 16) * 4
    assert "ddp on 2 rank(s), micro-batch 4" in ddp.describe()


def test_auto_picks_fsdp_only_when_ddp_does_not_fit():
    import torch

    cpu = torch.device("cpu")
    ddp = estimate_memory(small(), "ddp", 2, dtype_bytes=4).total
    fsdp = estimate_memory(small(), "fsdp", 2, dtype_bytes=4).total
    assert fsdp < ddp
    between = (fsdp + ddp) / 2 / 0.9 / GIB  # the limit the 90% headroom applies to
    assert choose_strategy(small("--parallel.strategy=auto"), 2, cpu, dtype_bytes=4)[0] == "ddp"  # CPU: no limit
    pick = choose_strategy(small("--parallel.strategy=auto", f"--parallel.memory_limit_gib={between}"), 2, cpu,
                           dtype_bytes=4)[0]
    assert pick == "fsdp"
    with pytest.raises(ConfigError, match="parallel.strategy=fsdp"):
        choose_strategy(small(f"--parallel.memory_limit_gib={between}"), 2, cpu, dtype_bytes=4)  # ddp asked for
    with pytest.raises(ConfigError, match="micro_batch_size.*activation_checkpointing.*more GPUs"):
        choose_strategy(small("--parallel.strategy=auto", "--parallel.memory_limit_gib=0.01"), 2, cpu, dtype_bytes=4)


def test_train_fails_before_allocating(tmp_path):
    cfg = small("--parallel.memory_limit_gib=0.001", "--data.train_files=/nonexistent/*.bin")
    with pytest.raises(ConfigError, match="does not fit: ddp on 1 rank"):  # before the data is even looked at
        train(cfg, run_dir=tmp_path / "run", quiet=True)


@pytest.mark.parametrize("name,strategies", [("dense-1b", ("fsdp", "ddp")), ("moe-d12", ("ddp", "fsdp"))])
def test_preset_comments_state_the_estimate(name, strategies):
    """The memory figures in the large presets' comments are what the estimator says today."""
    from importlib import resources

    text = " ".join((resources.files("speedgpt") / "presets" / f"{name}.toml").read_text().split())
    cfg = load_preset(name)
    counts = param_counts(cfg)
    for strategy in strategies:
        gib = [estimate_memory(cfg, strategy, w, counts=counts).total / GIB for w in (1, 2, 8)]
        assert f"{strategy}: {gib[0]:.1f} GiB on 1 GPU, {gib[1]:.1f} on 2, {gib[2]:.1f} on 8" in text.replace("# ", "")
    assert f"Activations are {estimate_memory(cfg, 'ddp', 1, counts=counts).activations / GIB:.1f} GiB" in \
        text.replace("# ", "")


def test_a_cpu_run_larger_than_the_machine_is_refused_at_start(monkeypatch):
    """On a CPU the estimate had no limit: the built-in defaults' 278M model (512 GiB estimated) started on a 23 GiB
    machine and died of an allocation error. The host's memory is the limit now, for all its ranks together."""
    import torch

    from speedgpt.parallel import memory

    cpu = torch.device("cpu")
    est = estimate_memory(small(), "ddp", 2, dtype_bytes=4).total
    monkeypatch.setattr(memory, "host_memory", lambda: 2 * est - 1)  # one rank fits, two do not
    assert choose_strategy(small(), 1, cpu, dtype_bytes=4)[0] == "ddp"
    with pytest.raises(ConfigError, match=r"does not fit: .* x 2 ranks, more than this machine's .*--model.depth"):
        choose_strategy(small(), 2, cpu, dtype_bytes=4)
    monkeypatch.setattr(memory, "host_memory", lambda: None)  # an OS that does not say: no check
    assert choose_strategy(small(), 2, cpu, dtype_bytes=4)[0] == "ddp"


def test_dense_mask_bytes_are_the_masks_sdpa_builds():
    """The boolean masks the check counts are the bytes of the masks build_context makes for sdpa."""
    import torch

    from speedgpt.model.attention import build_context
    from speedgpt.parallel.memory import SdpaMasks

    inputs = torch.randint(0, 50, (3, 96))
    inputs[:, ::40] = 50  # documents (BOS 50)
    for keys in (("L",), ("L", "S"), ("L", "L2", "S", "S2")):
        ctx = build_context(inputs, backend="sdpa", windows=(64, 32), doc_masking=True, bos_id=50, patterns=keys,
                            block=16)
        built = sum(m.numel() * m.element_size() for m in ctx.masks.values())
        assert built == SdpaMasks(mask_keys=keys, layer_keys=keys).boolean_bytes(3, 96)


def test_sdpa_mask_bytes_by_hand():
    """On a CPU each sdpa call copies its mask to the compute dtype, which training keeps for every attention layer
    (one at a time under activation checkpointing) and validation one at a time; on CUDA only the boolean masks
    count."""
    import torch

    from speedgpt.parallel.memory import SdpaMasks

    # two layers of rows of 100, one paired-head layer of 200; an attention-free layer's key S builds a mask too
    masks = SdpaMasks(mask_keys=("L", "S", "S2"), layer_keys=("L", "S2", "L"))
    held = 3 * (100 ** 2 + 100 ** 2 + 200 ** 2)  # one mask a key, 3 rows
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert masks.peak_bytes(3, 100, cuda, training=True) == held
    assert masks.peak_bytes(3, 100, cpu, training=True) == held + 4 * 3 * (2 * 100 ** 2 + 200 ** 2)
    assert masks.peak_bytes(3, 100, cpu, training=False) == held + 4 * 3 * 200 ** 2
    bf16_checkpointed = SdpaMasks(mask_keys=("L", "S", "S2"), layer_keys=("L", "S2", "L"), copy_bytes=2,
                                  checkpointed=True)
    assert bf16_checkpointed.peak_bytes(3, 100, cpu, training=True) == held + 2 * 3 * 200 ** 2


def test_sdpa_masks_past_the_limit_are_refused_by_name(monkeypatch):
    """Wave 24: speedrun-latest under sdpa stopped at its first forward with a CUDA out-of-memory naming no fix (its
    validation rows of 262,144 need 64 GiB a dense mask). Each row shape's masks are checked against the limit; on a
    CPU the host's memory is shared by its ranks."""
    import torch

    from speedgpt.parallel import memory
    from speedgpt.parallel.memory import SdpaMasks, check_dense_masks

    cpu, masks = torch.device("cpu"), SdpaMasks(mask_keys=("L", "S"), layer_keys=("L", "S"))
    need = masks.peak_bytes(2, 4096, cpu, training=False)
    shapes = [("data.seq_len", 1, 1024, True), ("data.val_seq_len", 2, 4096, False)]
    check_dense_masks(shapes, masks, cpu, small(f"--parallel.memory_limit_gib={need / 0.9 / GIB * 1.001}"), 1)
    with pytest.raises(ConfigError, match=r"sdpa builds dense attention masks: 2 row\(s\) of 4,096 tokens "
                                          r"\(data.val_seq_len\).*--model.attn_backend=flex.*shorter rows"):
        check_dense_masks(shapes, masks, cpu, small(f"--parallel.memory_limit_gib={need / 0.9 / GIB * 0.999}"), 1)
    monkeypatch.setattr(memory, "host_memory", lambda: need / 0.9 * 1.5)  # one rank fits, two do not
    check_dense_masks(shapes, masks, cpu, small(), 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="for 2 ranks, more than 90% of this machine's"):
        check_dense_masks(shapes, masks, cpu, small(), 1)


def test_validation_largest_batch_rows():
    """The rows of the largest validation batch any rank scores, as rank_val_batches deals them."""
    from types import SimpleNamespace

    from speedgpt.train.validation import Validator

    def largest(rows, world_size, micro_batch):
        stub = SimpleNamespace(tokens=rows * 8, seq_len=8, micro_batch=micro_batch,
                               dist=SimpleNamespace(world_size=world_size))
        return Validator.largest_batch_rows.fget(stub)

    assert largest(10, 4, 2) == 2  # ranks of 3, 3, 2, 2 rows in batches of 2
    assert largest(10, 4, 8) == 3
    assert largest(3, 4, 2) == 1  # one rank holds no row: it scores a one-row batch
    assert largest(40, 1, 16) == 16


def test_a_run_whose_sdpa_masks_cannot_fit_stops_before_training(tiny_cfg, tmp_path, monkeypatch):
    """The check runs in the trainer's setup, with validation's largest batch (here one row of 32,768: 1 GiB a mask
    and its float32 copy 4 GiB); on a CPU without it the kernel killed such a run (exit 137, no message)."""
    from speedgpt.train import loop

    def past_the_check(*args):  # the next step of the setup: a run that gets here would go on to an sdpa forward
        raise AssertionError("the setup went past the dense-mask check")

    monkeypatch.setattr(loop, "fallback_notes", past_the_check)
    cfg = apply_overrides(tiny_cfg, ["--model.attn_backend=sdpa", "--data.val_seq_len=32768", "--data.val_tokens=32768",
                                     "--parallel.memory_limit_gib=4"])
    with pytest.raises(ConfigError, match=r"1 row\(s\) of 32,768 tokens \(data.val_seq_len\) need 5.0 GiB"):
        train(cfg, run_dir=tmp_path / "run", quiet=True)
