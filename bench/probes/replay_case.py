"""Replay one fuzz case's cuDNN forward call with variants of its operands (GPU machine).

    python bench/probes/replay_case.py '<case json>'

Captures the operands te_compile's op hands to cuDNN in the compiled run, then compares cuDNN with
the reference math on exactly those operands, and on variants (bias zeroed, inputs zeroed, bias
made per-head, ...) to isolate which part cuDNN gets wrong.
"""
from __future__ import annotations

import dataclasses
import sys

import torch

import te_compile
from te_compile.cudnn import graphs
from te_compile.reference import attention_forward
from te_compile.testing import fuzz

captured = []
_orig = graphs.forward


def spy(q, k, v, bias, spec, extra=()):
    if not captured:
        captured.append((q.clone(), k.clone(), v.clone(), None if bias is None else bias.clone(), spec,
                         [t.clone() for t in extra]))
    return _orig(q, k, v, bias, spec, extra)


def err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-3)).item()


def main():
    case = fuzz.Case.from_json(sys.argv[1])
    graphs.forward = spy
    fuzz._prepare("cuda")
    fuzz.run(case, "cuda", torch.bfloat16, compiled_with=te_compile.backend(inner="aot_eager", target="auto"))
    graphs.forward = _orig
    q, k, v, bias, spec, extra = captured[0]
    print("spec:", spec.describe(), "| bias", None if bias is None else (tuple(bias.shape), bias.stride()),
          "| inputs", [(tuple(t.shape), t.flatten()[:4].tolist()) for t in extra])

    def go(tag, bias_, extra_, spec_=spec):
        graphs.cache.clear()  # also forgets the call plans
        out, lse = graphs.forward(q, k, v, bias_, spec_, extra_)
        ro, rl = attention_forward(q, k, v, bias_, spec_, extra_)
        print(f"{tag:40s} out {err(out, ro):.3g} lse {err(lse, rl):.3g}")

    go("as captured", bias, extra)
    if bias is not None:
        go("bias zeroed", torch.zeros_like(bias), extra)
        go("bias per head (expand+clone)", bias.expand(q.shape[0], q.shape[1], *bias.shape[2:]).clone(), extra)
        go("bias / 10", bias / 10, extra)
        go("no bias", None, extra)
    if extra:
        go("inputs zeroed", bias, [torch.zeros_like(t) for t in extra])
        go("inputs * 0.01", bias, [t * 0.01 for t in extra])


if __name__ == "__main__":
    main()
