"""Every config key has exactly one description, in speedgpt/config_docs.py (what `speedgpt config` prints)."""

from speedgpt.config import load_preset, preset_names
from speedgpt.config_docs import DESCRIPTIONS, config_keys, describe_config, stage_keys


def test_every_config_key_has_a_description():
    keys = [key for key, _ in config_keys()] + stage_keys()  # a train.stages row's keys too
    missing = [key for key in keys if not DESCRIPTIONS.get(key, "").strip()]
    assert not missing, f"add a line for these keys to speedgpt/config_docs.py: {missing}"
    stale = sorted(set(DESCRIPTIONS) - set(keys))
    assert not stale, f"descriptions of keys that no longer exist: {stale}"


def test_describe_config_shows_every_key_of_every_preset():
    for name in preset_names():
        cfg = load_preset(name)
        text = describe_config(cfg)
        for key, _ in config_keys(cfg):
            assert f"\n{key} = " in f"\n{text}"


def test_keep_checkpoints_says_that_0_keeps_all():
    # A new-user audit: the help said "checkpoints kept on disk (older ones are deleted)", so 0 read as "keep none"
    # (rundir/checkpoint.py checkpoints_to_delete: 0 deletes nothing; docs/reliability.md says so too).
    from speedgpt.config import Config

    text = describe_config(Config())
    assert "\ntrain.keep_checkpoints = 2\n    checkpoints kept on disk: the newest this many" in f"\n{text}"
    assert DESCRIPTIONS["train.keep_checkpoints"].endswith("0: keep all")
