"""One backend callable per set of options: compiling block after block with te_compile.backend(...)
must not recompile per block (Dynamo guards on the backend's identity)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import te_compile


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(2, 8, 4, 8).transpose(1, 2)
        return x + F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(2, 8, 32)


def test_same_options_give_the_same_backend():
    assert te_compile.backend(target="reference") is te_compile.backend(target="reference")
    assert te_compile.backend(target="reference") is not te_compile.backend(target="reference", verify=True)


def _run_blocks(make):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    blocks = [Block() for _ in range(10)]
    compiled = [make(b) for b in blocks]
    x = torch.randn(2, 8, 32)
    want = x
    for b in blocks:
        want = b(want)
    got = x
    with te_compile.report.record_reports() as reps:
        for c in compiled:
            got = c(got)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return counters["stats"]["unique_graphs"], reps


def _plain_graphs() -> int:
    """What plain torch.compile compiles for the ten blocks (2: the first block's input does not
    require grad, the others' do)."""
    return _run_blocks(lambda b: torch.compile(b, backend="eager"))[0]


def test_ten_blocks_compile_once_with_backend_per_block():
    want = _plain_graphs()
    graphs, reps = _run_blocks(lambda b: torch.compile(b, backend=te_compile.backend(target="reference")))
    # before: one recompile per block (BACKEND_MATCH), and blocks past the recompile limit ran eagerly
    assert graphs == want, (graphs, want)
    assert {d.runs_on for r in reps for d in r.decisions} == {"reference"}


def test_ten_blocks_compile_once_with_te_compile_compile_per_block():
    want = _plain_graphs()
    graphs, _ = _run_blocks(lambda b: te_compile.compile(b, target="reference"))
    assert graphs == want, (graphs, want)
