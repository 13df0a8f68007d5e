"""The commit recorded with results is speedgpt's own source tree's (provenance.py), never the one of
a repository that merely surrounds an exported copy of the tree."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import speedgpt
from speedgpt.provenance import short_commit, source_version

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def outer_repo(root: Path) -> str:
    root.mkdir()
    git(root, "init", "-q")
    (root / "notes.txt").write_text("another project\n")
    git(root, "add", "notes.txt")
    git(root, "commit", "-q", "-m", "outer")
    return git(root, "rev-parse", "HEAD")


def test_an_exported_tree_inside_another_repo_does_not_take_its_commit(tmp_path):
    outer = outer_repo(tmp_path / "outer")
    tree = tmp_path / "outer" / "export"  # speedgpt copied without .git, inside the other checkout
    shutil.copytree(Path(speedgpt.__file__).parent, tree / "speedgpt",
                    ignore=shutil.ignore_patterns("__pycache__", "gpt2_bpe"))
    shutil.copytree(Path(speedgpt.__file__).parent / "data" / "gpt2_bpe", tree / "speedgpt" / "data" / "gpt2_bpe")
    probe = ("import json, torch; from speedgpt.rundir.env import environment_snapshot; "
             "print(json.dumps(environment_snapshot(torch.device('cpu'))['git']))")

    def snapshot_git():  # what a run started from the exported tree writes into env.json
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    got = snapshot_git()
    assert got["commit"] == "unknown" and "COMMIT" in got["source"]
    assert outer not in json.dumps(got)
    (tree / "COMMIT").write_text("0123456789abcdef0123456789abcdef01234567\n")  # written by the exporter
    got = snapshot_git()
    assert got["commit"] == "0123456789abcdef0123456789abcdef01234567" and got["source"].endswith("COMMIT")
    assert short_commit(got) == "0123456789"


def test_a_checkout_that_tracks_the_package_gives_its_head_and_dirtiness(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "speedgpt").mkdir()
    (repo / "speedgpt" / "__init__.py").write_text("")
    git(repo, "add", "speedgpt/__init__.py")
    git(repo, "commit", "-q", "-m", "package")
    head = git(repo, "rev-parse", "HEAD")
    version = source_version(repo / "speedgpt")
    assert version == {"commit": head, "dirty": False, "source": "git"}
    (repo / "speedgpt" / "__init__.py").write_text("x = 1\n")
    assert short_commit(source_version(repo / "speedgpt")) == head[:10] + "-dirty"


def test_unknown_is_stated_plainly(tmp_path):
    (tmp_path / "speedgpt").mkdir()
    version = source_version(tmp_path / "speedgpt")
    assert version["commit"] == "unknown" and short_commit(version) == "unknown"
    assert "neither tracked by a git repository nor has a COMMIT file" in version["source"]
