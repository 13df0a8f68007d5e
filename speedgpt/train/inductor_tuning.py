"""Inductor heuristics changed for this model's kernels, installed before the model compiles.

Persistent reductions: Inductor keeps a reduction's whole row in registers (one read of the row)
only when it is sure the reduction runs along contiguous memory and the row is at most 1024 long;
when a fused kernel mixes reductions (RMSNorm backward + the row max of an FP8 cast, say) its
first guess is "unknown" and the limit drops to 64, so the kernel loops over the row two or three
times. `persistent_reductions_upto(n)` makes every statically sized reduction of at most n
elements persistent.
"""

from __future__ import annotations


def _choices_class(max_numel: int):
    """The heuristic for one size, as a class registered in this module under a name of its own
    (PersistentUpTo1024, ...): the compile cache pickles the class by reference (torch 2.11, measured) or
    asks its uuid(), and either must name the size, else two sizes would share cached kernels."""
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    name = f"PersistentUpTo{max_numel}"
    if name in globals():
        return globals()[name]

    def should_use_persistent_reduction(features, cooperative_reduction: bool) -> bool:
        if not cooperative_reduction and V.graph.sizevars.statically_known_leq(features.reduction_numel, max_numel):
            return True
        return InductorChoices.should_use_persistent_reduction(features, cooperative_reduction)

    cls = type(name, (InductorChoices,), {
        "should_use_persistent_reduction": staticmethod(should_use_persistent_reduction),
        "uuid": lambda self: f"speedgpt-persistent-upto-{max_numel}",
        "__module__": __name__,
    })
    globals()[name] = cls
    return cls


def persistent_reductions_upto(max_numel: int) -> str | None:
    """Use the heuristic (max_numel > 0) or Inductor's own (0) for compiles from now on in this thread;
    returns a line for the log when the heuristic is on."""
    import torch._inductor.config as inductor_config
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    cls = _choices_class(max_numel) if max_numel else None
    # Inductor creates a thread's handler once, from the config, so both are set: the handler takes
    # effect, the config entry keys the compile cache (through uuid()).
    V.set_choices_handler(cls() if cls else InductorChoices())
    if hasattr(inductor_config, "inductor_choices_class"):
        inductor_config.inductor_choices_class = cls
    elif cls:  # older torch: the cache cannot tell the heuristics apart, so it is bypassed
        inductor_config.fx_graph_cache = False
        return f"inductor: persistent reductions up to {max_numel} elements (compile cache off: this torch cannot key it)"
    return f"inductor: persistent reductions up to {max_numel} elements" if cls else None


def apply_inductor_settings(t) -> str | None:
    """A train config's Inductor settings (coordinate descent, pointwise autotuning, persistent reductions), set for
    the compiles from now on, every one of them on every call: they are process-wide, and a second config in one
    process (bench --ab) must not inherit the first's. Returns persistent_reductions_upto's line for the log."""
    import torch._inductor.config as inductor_config

    inductor_config.coordinate_descent_tuning = t.coordinate_descent_tuning
    inductor_config.triton.autotune_pointwise = t.autotune_pointwise
    return persistent_reductions_upto(t.persistent_reductions_upto)
