"""A test that needs an optional extra skips without it, with the install line as its reason (issue 37):
every test file is read for imports of an extra (or of a speedgpt module that imports one) that would
fail instead of skipping in a `.[test]`-only environment."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import extraskit
from speedgpt.config.files import tomllib


def scan(source: str) -> list[str]:
    return extraskit.unguarded_imports(textwrap.dedent(source), "t.py", extraskit.package_modules_needing_extras())[1]


def test_every_test_skips_without_the_extras_it_imports():
    needing = extraskit.package_modules_needing_extras()
    problems = [line for path in extraskit.test_files()
                for line in extraskit.unguarded_imports(path.read_text(), path.name, needing)[1]]
    assert problems == [], "\n".join(problems)


def test_the_scan_finds_each_import_that_fails_without_its_extra():
    assert scan("""
        import transformers
        from speedgpt.hf import modeling_speedgpt

        def helper():
            pytest.importorskip("lm_eval")

        def test_a():
            from transformers import DynamicCache

        @requires_lm_eval
        def test_b():
            from speedgpt.hf.configuration_speedgpt import SpeedGPTConfig
        """) == [
        "t.py:2: imports transformers at module level: collection fails without transformers; "
        "import it in a test marked @requires('transformers')",
        "t.py:3: imports speedgpt.hf.modeling_speedgpt at module level: collection fails without transformers; "
        "import it in a test marked @requires('transformers')",
        "t.py:6: pytest.importorskip('lm_eval') skips without the install line: use extraskit.need()",
        "t.py:9: test_a imports transformers without @requires('transformers') or extraskit.need('transformers') "
        "first",
        "t.py:13: test_b imports speedgpt.hf.configuration_speedgpt without @requires('transformers') or "
        "extraskit.need('transformers') first",
    ]
    assert scan("""
        pytestmark = [pytest.mark.usefixtures("x"), extraskit.requires("wandb")]

        def hf_model():
            transformers = need("transformers")
            from transformers import DynamicCache

        @requires_hf
        class TestHF:
            def test_a(self):
                import transformers
                from speedgpt.hf import export, modeling_speedgpt

        def test_wandb():
            import wandb

        def test_core():
            import torch
            from speedgpt.hf import export
        """) == []


def test_every_distribution_of_every_extra_is_known():
    """A new extra in pyproject.toml, or a new package in one, needs its import name in EXTRA_MODULES."""
    project = tomllib.loads((Path(extraskit.PACKAGE).parent / "pyproject.toml").read_text())["project"]
    extras = {(extra, canonicalize_name(Requirement(r).name))
              for extra, reqs in project["optional-dependencies"].items() if extra != "test" for r in reqs}
    assert extras == {(extra, canonicalize_name(dist)) for extra, dist in extraskit.EXTRA_MODULES.values()}


def test_the_skip_reason_is_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # an import of it now fails, as if not installed
    with pytest.raises(pytest.skip.Exception, match=r'^needs lm_eval: pip install -e "\.\[test,hf\]"$'):
        extraskit.need("lm_eval")
    monkeypatch.setattr(extraskit.importlib.util, "find_spec", lambda name, *a: None)
    mark = extraskit.requires("wandb").mark
    assert mark.args == (True,) and mark.kwargs == {"reason": 'needs wandb: pip install -e ".[test,wandb]"'}
