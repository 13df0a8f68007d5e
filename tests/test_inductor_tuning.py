"""train/inductor_tuning.py: the persistent-reduction heuristic is installed and removed, keys the compile
cache, and decides by the reduction's size."""

from types import SimpleNamespace

import pytest
import sympy

pytest.importorskip("torch._inductor.choices")

from torch._inductor.virtualized import V  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402

from speedgpt.train.inductor_tuning import persistent_reductions_upto  # noqa: E402


@pytest.fixture
def restore():
    yield
    persistent_reductions_upto(0)


def test_install_and_remove(restore):
    assert "1024" in persistent_reductions_upto(1024)
    assert type(V.choices).__name__ == "PersistentUpTo1024"
    if hasattr(inductor_config, "inductor_choices_class"):
        # the compile cache key names the heuristic and its size, so switching it recompiles
        assert inductor_config.save_config_portable()["inductor_choices_class"] == "speedgpt-persistent-upto-1024"
        persistent_reductions_upto(2048)
        assert inductor_config.save_config_portable()["inductor_choices_class"] == "speedgpt-persistent-upto-2048"
    assert persistent_reductions_upto(0) is None
    assert type(V.choices).__name__ == "InductorChoices"
    if hasattr(inductor_config, "inductor_choices_class"):
        assert inductor_config.inductor_choices_class is None


class _Features:
    def __init__(self, n):
        self.reduction_numel = sympy.Integer(n)

    def get_reduction_hint(self, tiling_scores=None):
        from torch._inductor.runtime.hints import ReductionHint
        return ReductionHint.DEFAULT  # "unknown": Inductor's own limit is 64 then


def _graph():
    from torch._inductor.sizevars import SizeVarAllocator

    return SimpleNamespace(sizevars=SizeVarAllocator())  # all the heuristic asks of a graph


def test_decides_by_size(restore):
    persistent_reductions_upto(1024)
    with V.set_graph_handler(_graph()):
        assert V.choices.should_use_persistent_reduction(_Features(768), cooperative_reduction=False)
        assert V.choices.should_use_persistent_reduction(_Features(1024), cooperative_reduction=False)
        assert not V.choices.should_use_persistent_reduction(_Features(3072), cooperative_reduction=False)
        persistent_reductions_upto(0)
        assert not V.choices.should_use_persistent_reduction(_Features(768), cooperative_reduction=False)


def test_heuristic_pickles_by_reference_and_names_its_size(restore):
    """What the compile cache needs to key it (torch versions without uuid() keys pickle the class)."""
    import pickle

    from speedgpt.train import inductor_tuning

    persistent_reductions_upto(1024)
    cls = type(V.choices)
    assert pickle.loads(pickle.dumps(cls)) is cls is inductor_tuning.PersistentUpTo1024
    persistent_reductions_upto(512)
    assert type(V.choices) is not cls and pickle.dumps(type(V.choices)) != pickle.dumps(cls)
