"""Recorded launches (te_compile.cudnn.flexlaunch) on the CPU, with Python functions standing in for the compiled
kernels: a replay with new operands computes what the recorded code computes on them, buffers are allocated again
(zeroed where asked), tensors of the plan are passed as they were, and anything else refuses to record. The form the
native call path loads (``native_form``) against a stand-in for TVM-FFI: every argument's kind and value, a tuple of
the plan's tensors as one Array, and the kernels that have no C form refused."""

import inspect
import sys
import types

import pytest
import torch

from te_compile.cudnn import flexlaunch


def _kernels():
    def accumulate(x, ws, plan_tuple, scale, unused):  # ws += x * scale + plan[0]; the ws must start at zero
        assert unused is None
        ws.add_(x * scale + plan_tuple[0])

    def finish(ws, y, out, rows):
        out.copy_(ws[:rows] + y[:rows])

    return accumulate, finish


def _record(a, b, plan, wrap_extra=None, kernels=None):
    acc, fin = kernels or _kernels()
    ws = torch.empty(4, 3)
    out = torch.empty(4, 3)
    plan2 = plan * 2

    def run(log):
        ws.zero_()  # what the frontend does to the buffers it zeroes, outside the kernels
        log.wrap(acc)(a.detach(), ws, (plan, plan2), 3.0, None)
        if wrap_extra is not None:
            log.wrap(fin)(ws, wrap_extra, out, 4)
        else:
            log.wrap(fin)(ws, b, out, 4)

    buffers = [(ws, flexlaunch.Buffer.like(ws, True)), (out, flexlaunch.Buffer.like(out, False))]
    rep = flexlaunch.record(run, (a, b), buffers, [plan, plan2], outputs=(3,))
    return rep, out


def test_replay_computes_what_the_recorded_code_computes_on_new_operands():
    plan = torch.randn(4, 3)
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)
    rep, out = _record(a, b, plan)
    torch.testing.assert_close(out, a.detach() * 3 + plan + b)
    for _ in range(3):  # the zeroed buffer is zero on every call, not only the first
        a2, b2 = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)
        junk = torch.full((4, 3), float("nan"))  # memory the next buffer of this size is likely to get
        del junk
        (got,) = rep(a2, b2)
        torch.testing.assert_close(got, a2.detach() * 3 + plan + b2)
    assert [len(subs) for _, _, subs in rep.calls] == [2, 3]


def test_buffers_are_new_each_call_and_zeroed_only_where_asked():
    z = flexlaunch.Buffer((2, 3), (3, 1), torch.float32, True)
    t = z.new("cpu")
    assert t.shape == (2, 3) and t.stride() == (3, 1) and not t.any()
    assert z.new("cpu").data_ptr() != t.data_ptr()
    e = flexlaunch.Buffer((2, 3), (1, 2), torch.float16, False).new("cpu")
    assert e.stride() == (1, 2) and e.dtype == torch.float16


def test_a_tensor_that_is_not_an_operand_buffer_or_plan_tensor_refuses_to_record():
    plan = torch.randn(4, 3)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(flexlaunch.NoReplay, match="argument 1"):
        _record(a, b, plan, wrap_extra=torch.randn(4, 3))  # a tensor made inside the frontend's code


def test_nothing_launched_refuses_to_record():
    with pytest.raises(flexlaunch.NoReplay, match="no kernel"):
        flexlaunch.record(lambda log: None, (torch.zeros(1),), [], [], outputs=(0,))


# --------------------------------------------------------------------------- the C form, against a TVM-FFI stand-in

class _Function:
    """tvm_ffi.Function: a handle."""

    _next = [100]

    def __init__(self):
        _Function._next[0] += 1
        self.handle = _Function._next[0]

    def __chandle__(self):
        return self.handle


class _Array(_Function):
    def __init__(self, items):
        super().__init__()
        self.items = items


class _Kernel(_Function):
    """A compiled kernel that is a positional TVM-FFI function (TVMFFIJitCompiledFunction)."""

    def __init__(self, fn, pointer_args=False):
        super().__init__()
        self.fn = fn
        self.execution_args = types.SimpleNamespace(has_pointer_address_arg_specs=pointer_args)

    def __call__(self, *args):
        return self.fn(*args)


class _KeywordKernel:
    """A compiled kernel behind TVM-FFI's keyword wrapper (TVMFFIJitCompiledFunctionWithKwargs)."""

    def __init__(self, fn, params):
        self.fn, self.target = fn, _Function()
        self.execution_args = types.SimpleNamespace(has_pointer_address_arg_specs=False)
        self._kwargs_wrapper = lambda *a: fn(*a)
        self._kwargs_wrapper.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in params])

    def __tvm_ffi_object__(self):
        return self.target

    def __call__(self, *args):
        return self._kwargs_wrapper(*args)


@pytest.fixture
def ffi(monkeypatch):
    mod = types.ModuleType("tvm_ffi")
    mod.Function, mod.Array = _Function, _Array
    mod.convert = lambda x: _Array(list(x)) if isinstance(x, tuple) else x
    monkeypatch.setitem(sys.modules, "tvm_ffi", mod)
    return mod


def test_native_form_names_every_argument(ffi):
    acc, fin = (_Kernel(f) for f in _kernels())
    plan = torch.randn(4, 3)
    rep, _ = _record(torch.randn(4, 3), torch.randn(4, 3), plan, kernels=(acc, fin))
    form, keep = flexlaunch.native_form(rep)
    funcs, kinds, ints, floats, consts, shapes, strides, dtypes, zero, n_operands, outputs = form
    assert funcs == [acc.handle, fin.handle]
    arrays = [x for x in keep if isinstance(x, _Array)]
    assert len(arrays) == 1 and arrays[0].items[0] is plan  # the plan's tuple, converted once
    S, A, F, N, I = flexlaunch._SLOT, flexlaunch._ARRAY, flexlaunch._FLOAT, flexlaunch._NONE, flexlaunch._INT
    # accumulate(x=operand 0, ws=buffer 0 (slot 2), plan tuple, 3.0, None); finish(ws, y=operand 1, out (slot 3), 4)
    assert kinds == [[S, S, A, F, N], [S, S, S, I]]
    assert ints == [[0, 2, arrays[0].handle, 0, 0], [2, 1, 3, 4]]
    assert floats[0][3] == 3.0
    assert consts == [] and n_operands == 2 and outputs == [3]
    assert shapes == [[4, 3], [4, 3]] and strides == [[3, 1], [3, 1]] and zero == [True, False]
    assert [d.dtype for d in dtypes] == [torch.float32, torch.float32]
    assert acc in keep and fin in keep


def test_native_form_calls_a_keyword_wrapped_kernel_through_its_function_when_every_argument_is_positional(ffi):
    acc, fin = _kernels()
    plan = torch.randn(4, 3)
    k_acc = _KeywordKernel(acc, ["x", "ws", "plan", "scale", "unused"])
    rep, _ = _record(torch.randn(4, 3), torch.randn(4, 3), plan, kernels=(k_acc, _Kernel(fin)))
    form, keep = flexlaunch.native_form(rep)
    assert form[0][0] == k_acc.target.handle and k_acc.target in keep
    short = _KeywordKernel(acc, ["x", "ws", "plan", "scale", "unused", "defaulted"])  # a parameter left to its default
    rep, _ = _record(torch.randn(4, 3), torch.randn(4, 3), plan, kernels=(short, _Kernel(fin)))
    with pytest.raises(flexlaunch.NoReplay, match="6 parameters, 5 were passed"):
        flexlaunch.native_form(rep)


def test_native_form_refuses_what_has_no_c_form(ffi):
    acc, fin = _kernels()
    plan = torch.randn(4, 3)
    rep, _ = _record(torch.randn(4, 3), torch.randn(4, 3), plan, kernels=(_Kernel(acc, pointer_args=True), _Kernel(fin)))
    with pytest.raises(flexlaunch.NoReplay, match="pointer"):
        flexlaunch.native_form(rep)
    rep, _ = _record(torch.randn(4, 3), torch.randn(4, 3), plan, kernels=(acc, _Kernel(fin)))  # a plain callable
    with pytest.raises(flexlaunch.NoReplay, match="no TVM-FFI function"):
        flexlaunch.native_form(rep)
    rep = flexlaunch.record(lambda log: log.wrap(_Kernel(lambda s: None))("mode"), (torch.zeros(1),), [], [],
                            outputs=(0,))
    with pytest.raises(flexlaunch.NoReplay, match="no C form"):
        flexlaunch.native_form(rep)


def test_the_native_call_path_gets_a_call_only_in_the_form_the_kernels_read(ffi):
    """flexkernel hands C++ the launches of a call whose operands the kernels read as they are; a mask that reads
    tensors (document ids) registers again for new ids; a copied operand, inference ids or launches that were not
    recorded stay with Python, with the reason."""
    from te_compile.cudnn import flexkernel

    acc, fin = (_Kernel(f) for f in _kernels())
    rep, _ = _record(torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3), kernels=(acc, fin))
    p = flexkernel._Plan(None, True, None)
    p.launches["key"] = rep
    q = torch.randn(2, 8, 4, 16).transpose(1, 2)  # [B, H, L, D] viewed from [B, L, H, D], as models make it
    info = flexkernel._native_form(flexkernel._Served(p, "key", [], (q, q, q)))
    assert isinstance(info, dict) and info["again"] is False and info["data"] == [] and info["rows"] is None
    ids = torch.zeros(2, 8, dtype=torch.long)
    info = flexkernel._native_form(flexkernel._Served(p, "key", [ids], (q, q, q)))
    assert info["again"] is True and info["data"][0] is ids
    broadcast = torch.randn(2, 1, 8, 16).expand(2, 4, 8, 16)  # a zero stride: the kernels read a copy
    assert "copied" in flexkernel._native_form(flexkernel._Served(p, "key", [], (q, broadcast, q)))
    with torch.inference_mode():
        frozen = torch.zeros(2, 8, dtype=torch.long)
    assert "inference" in flexkernel._native_form(flexkernel._Served(p, "key", [frozen], (q, q, q)))
    assert "not recorded" in flexkernel._native_form(flexkernel._Served(p, "other key", [], (q, q, q)))
    assert flexkernel._native_form(None) is None
