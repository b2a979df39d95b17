"""The differential fuzzer's bug classes on cuDNN: bf16 against eager fp32, with the fuzzer's
tolerance (max(3 x eager-bf16 error, 1e-2) per tensor, at most tools.fuzz.BF16_CAP), at lengths that are not
tile multiples.

Run on the GPU machine:  python3 -m pytest -q -m cuda tests/test_cuda_fuzz_classes.py
"""

import math

import pytest
import torch

import te_compile
from te_compile.reasons import category
from tools import fuzz

from fuzz_regressions import CUDA_KEPT, KEPT_WITHOUT_INTERVAL_KERNELS, cases

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]

CASES = cases(cuda=True)


def _interval_kernels() -> bool:
    if not torch.cuda.is_available():
        return False
    from te_compile.cudnn import flexkernel

    t = torch.empty(2, 2, 128, 64, dtype=torch.bfloat16, device="cuda")
    return flexkernel.unavailable(t, t, t) is None


KEPT = {**CUDA_KEPT, **({} if _interval_kernels() else KEPT_WITHOUT_INTERVAL_KERNELS)}
SERVED = set(CASES) - set(KEPT)


#: kept by te_compile, and plain torch.compile is off eager too (its flex backward recomputes the scores as well):
#: the case checks that te_compile keeps the site, not torch.compile's answer
KEPT_OFF_EAGER = {"singular_derivative"}


@pytest.fixture(scope="module")
def backend():
    return fuzz._prepare("cuda")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fuzz_class_on_cudnn(name, backend):
    outcome, detail, decisions = fuzz.compare(CASES[name], "cuda", backend)
    reasons = [d.reason for d in decisions if not d.rewrite]
    if name in SERVED:
        assert outcome == "pass", f"{name}: {outcome}: {detail}; {reasons}"
        assert decisions and all(d.rewrite and d.runs_on == "cudnn" for d in decisions), (name, reasons)
    else:
        assert outcome in (("kept_mismatch", "kept") if name in KEPT_OFF_EAGER else ("kept",)), (name, outcome, detail)
        assert decisions and {category(r) for r in reasons} == {KEPT[name]} and not any(d.rewrite for d in decisions), (
            name, reasons)


def test_inf_input_gives_nan_rows_as_eager():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=g).cuda().bfloat16() for _ in range(3))
    k[0, :, :64, 0], k[0, :, 64:, 0] = 1.0, -1.0
    q[0, 0, 1, 0] = math.inf
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    got = torch.compile(fn, backend="te_compile")(q, k, v)
    want = fn(q, k, v)
    assert torch.isnan(want[0, 0, 1]).all()
    assert torch.equal(torch.isnan(got), torch.isnan(want))


def test_a_learned_bias_cudnn_cannot_build_is_kept_not_run_on_the_fallback(backend):
    """Learned [L] and [S] tables (the peer pt_distinct_learned) at L 129, S 300 under a causal BlockMask: cuDNN's
    validator accepts the backward graph with dBias, yet no engine builds a plan for it (9.19 and 9.27, H200), and
    a site served on it ran the reference math at every backward call, in bf16, a little past the tolerance. The
    compile-time check builds the plans on the GPU: the site is kept with that reason, or served and run on cuDNN
    (no call in te_compile.runtime_fallbacks()) where a cuDNN builds it."""
    case = fuzz.Case(seed=104151, B=2, H=4, HKV=4, L=129, S=300, D=64, DV=64, block=128,
                     score="def score_mod(score, b, h, q_idx, kv_idx):\n    return score + bias1[q_idx] + bias2[kv_idx]\n",
                     mask="def mask_mod(b, h, q_idx, kv_idx):\n    return q_idx >= kv_idx\n",
                     captured=[{"name": "bias1", "shape": ["L"], "make": "randn", "dtype": "float32", "learned": True},
                               {"name": "bias2", "shape": ["S"], "make": "randn", "dtype": "float32", "learned": True}])
    calls = lambda: sum(r["calls"] for r in te_compile.runtime_fallbacks())  # noqa: E731
    before = calls()
    outcome, detail, decisions = fuzz.compare(case, "cuda", backend)
    assert calls() == before, te_compile.runtime_fallbacks()
    if any(d.rewrite for d in decisions):
        assert outcome == "pass", detail
    else:
        assert outcome == "kept", detail
        assert any("builds no backward plan" in d.reason for d in decisions), [d.reason for d in decisions]
