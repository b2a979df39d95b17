"""Recorded launches (te_compile.cudnn.flexlaunch) on the CPU, with Python functions standing in for the compiled
kernels: a replay with new operands computes what the recorded code computes on them, buffers are allocated again
(zeroed where asked), tensors of the plan are passed as they were, and anything else refuses to record."""

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


def _record(a, b, plan, wrap_extra=None):
    acc, fin = _kernels()
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
