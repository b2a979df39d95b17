"""te_compile/runtime/stale_outputs.py: under CUDA graphs an overwritten CUDA-graph output reaching a kernel raises torch's
RuntimeError instead of killing the process (the end-to-end check is tests/test_cuda_generate.py on the GPU)."""

import pytest
import torch

from te_compile.runtime import stale_outputs

MSG = "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run. Stack trace: x"
POINTER = "Pointer argument must be either uint64 or have data_ptr method"


class _Overwritten(torch.Tensor):
    """Stands in for a CUDA-graph output whose storage the tree freed (its data_ptr raises, as torch's does)."""

    def data_ptr(self):  # noqa: D102
        raise RuntimeError(MSG)


def _overwritten():
    return torch.Tensor._make_subclass(_Overwritten, torch.ones(3))


def _raises(exc):
    def compiled(*args):
        raise exc
    return compiled


def test_static_launcher_turned_off_unless_the_user_set_it():
    import torch._inductor.config as ic
    assert hasattr(ic, stale_outputs.STATIC_LAUNCHER)
    assert stale_outputs.without_static_launcher(None) == {stale_outputs.STATIC_LAUNCHER: False}
    cfg = {"triton.cudagraphs": True}
    out = stale_outputs.without_static_launcher(cfg)
    assert out == {"triton.cudagraphs": True, stale_outputs.STATIC_LAUNCHER: False} and cfg == {"triton.cudagraphs": True}
    assert stale_outputs.without_static_launcher({stale_outputs.STATIC_LAUNCHER: True}) == {
        stale_outputs.STATIC_LAUNCHER: True}


@pytest.mark.parametrize("boxed", [False, True])
def test_pointer_type_error_on_an_overwritten_input_becomes_torchs_runtime_error(boxed):
    args = (torch.ones(2), _overwritten(), 3)
    run = stale_outputs.raising_on_overwritten(_raises(TypeError(POINTER)))
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run") as info:
        run(list(args)) if boxed else run(*args)
    assert isinstance(info.value.__cause__, TypeError)


def test_other_errors_pass_through_unchanged():
    ow = _overwritten()
    with pytest.raises(TypeError, match="unrelated"):  # not the launcher's pointer error
        stale_outputs.raising_on_overwritten(_raises(TypeError("unrelated")))(ow)
    with pytest.raises(TypeError, match="Pointer argument"):  # the pointer error, but no overwritten input
        stale_outputs.raising_on_overwritten(_raises(TypeError(POINTER)))(torch.ones(2))
    with pytest.raises(ValueError):
        stale_outputs.raising_on_overwritten(_raises(ValueError("v")))(ow)


def test_results_and_attributes_pass_through():
    def compiled(*args):
        return sum(a.sum() for a in args)
    compiled._boxed_call = False
    run = stale_outputs.raising_on_overwritten(compiled)
    assert run(torch.ones(2), torch.ones(3)).item() == 5.0
    assert run._boxed_call is False and run.__wrapped__ is compiled


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA (only ``compile_graph``'s device check reads it)."""

    @property
    def is_cuda(self):  # noqa: D102
        return True


@pytest.mark.parametrize("mode,cuda,guarded", [("reduce-overhead", True, True), ("reduce-overhead", False, False),
                                               (None, True, False), ("max-autotune-no-cudagraphs", True, False)])
def test_compile_graph_guards_cuda_graph_graphs_only(monkeypatch, mode, cuda, guarded):
    """A graph with CUDA inputs compiled under CUDA graphs gets the static launcher off and the re-raising
    wrapper; CPU graphs and graphs without CUDA graphs compile exactly as before."""
    import importlib
    B = importlib.import_module("te_compile.backend")  # the module (te_compile.backend is also a function)

    seen = {}

    def inner(name, gm, ex, config=None):
        seen["config"] = config
        return gm.forward
    monkeypatch.setattr(B, "_inner_compile", inner)
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    x = torch.ones(3)
    ex = [torch.Tensor._make_subclass(_OnCuda, x) if cuda else x]
    compiled = B.compile_graph(gm, ex, B.Options(inner="inductor", target="reference"), mode=mode)
    off = (seen["config"] or {}).get(stale_outputs.STATIC_LAUNCHER) is False
    assert off == guarded and (getattr(compiled, "__wrapped__", None) is not None) == guarded
    assert torch.equal(compiled(x), x * 2)
