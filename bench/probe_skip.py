"""Which placement of a mask inside score_mod lets cuDNN skip masked tiles? (fwd/bwd ms)

    python3 bench/probe_skip.py
"""

from __future__ import annotations

import statistics

import cudnn
import torch

import te_compile  # noqa: F401
from te_compile.cudnn import emit, graphs
from te_compile.spec import AttentionSpec

B, H, L, D = 2, 16, 4096, 128


def ms(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


ORIG = emit.Emitter.score_mod
ORIG_B = emit.Emitter.bprop


def pre_and_post(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    self.score = self._select(self.mask, score, self._const(float("-inf")))
    out = self._emit(self.score_expr)[0]
    return self._select(self.mask, out, self._const(float("-inf")))


def pre_only(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    self.score = self._select(self.mask, score, self._const(float("-inf")))
    return self._emit(self.score_expr)[0]


def pre_lowest(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    self.score = self._select(self.mask, score, self._const(-3.0e38))
    out = self._emit(self.score_expr)[0]
    return self._select(self.mask, out, self._const(float("-inf")))


def pbv(values):
    """route these constants through pass-by-value tensors too (not tensor_scalar)"""
    orig = emit.constants

    def constants(spec):
        return tuple(orig(spec)) + tuple(v for v in values if v not in orig(spec))
    graphs.constants = constants
    graphs._const_buffers.cache_clear()


def remask_fresh(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    s1 = self._select(self.mask, score, self._const(float("-inf")))
    self.score = s1
    out = self._emit(self.score_expr)[0]
    self.memo = {k: v for k, v in self.memo.items() if isinstance(k, tuple) and k[:1] == ("const",)}
    self.score = score
    out = self._select(self.mask, out, self._const(float("-inf")))
    self.score = s1
    return out


def remask_value(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    s1 = self._select(self.mask, score, self._const(float("-inf")))
    self.score = s1
    out = self._emit(self.score_expr)[0]
    keep = graph.cmp_gt(s1, self._const(float("-inf")), compute_data_type=emit._F32)
    keep.set_data_type(emit._BOOL)
    return self._f(graph.binary_select(out, self._const(float("-inf")), keep))


def select_first_only(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    return self._select(self.mask, score, self._const(float("-inf")))


def mask_f_min(self, graph, score):
    """select(score,-inf,m) -> f -> min(f, s1 + 1e30): exact, -inf where masked"""
    self.g, self.memo = graph, {}
    self.score = score
    s1 = self._select(self.mask, score, self._const(float("-inf")))
    self.score = s1
    out = self._emit(self.score_expr)[0]
    big = self._f(graph.add(s1, self._const(1e30), compute_data_type=emit._F32))
    return self._f(graph.min(out, big, compute_data_type=emit._F32))


def mask_f(self, graph, score):
    self.g, self.memo = graph, {}
    self.score = score
    s1 = self._select(self.mask, score, self._const(float("-inf")))
    self.score = s1
    return self._emit(self.score_expr)[0]


def bprop_nomask(self, graph, ds):
    return self._times(ds, self.deriv)


def bprop_raw(self, graph, ds):
    """ds * f'(raw score), fresh memo (forward intermediates were computed on the masked score)"""
    self.memo = {k: v for k, v in self.memo.items() if isinstance(k, tuple) and k[:1] == ("const",)}
    self.score = self.raw
    return self._times(ds, self.deriv)


def mask_f_min_raw(self, graph, score):
    self.raw = score
    return mask_f_min(self, graph, score)


def mask_f_raw(self, graph, score):
    self.raw = score
    return mask_f(self, graph, score)


def bprop_const_identity(self, graph, ds):
    t = self._times(ds, self.deriv)
    t = graph.identity(t, compute_data_type=emit._F32)
    t.set_data_type(emit._F32)
    return t


def bprop_const_rt(self, graph, ds):
    c = graph.tensor_scalar(float(self.deriv.value), cudnn.scalar_type.RUNTIME_PARAM)
    return self._f(graph.mul(ds, c, compute_data_type=emit._F32))


def mask_after(self, graph, score):
    """flex's order: the score_mod, then the mask select (te_compile's emission for other masks)"""
    self.g, self.memo = graph, {}
    self.score = score
    out = self._emit(self.score_expr)[0] if self.score_expr is not None else score
    return self._select(self.mask, out, self._const(float("-inf"))) if self.mask is not None else out


def bprop_masked(self, graph, ds):
    out = self._times(ds, self.deriv)
    return self._select(self.mask, out, self._const(0.0)) if self.mask is not None else out


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    soft = "(mul (tanh (div score 30.0)) 30.0)"
    causal = "(ge q_idx kv_idx)"
    qs, ks, vs, dos = (t[:, :2, :512] .contiguous() for t in (q, k, v, do))
    sp = AttentionSpec(source="flex", score=soft, mask_mod=causal)
    x2 = AttentionSpec(source="flex", score="(mul score 2.0)", mask_mod=causal)
    one = AttentionSpec(source="flex", score="(mul score 1.0)", mask_mod=causal)
    win = "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 1024))"
    sw = AttentionSpec(source="flex", score=soft, mask_mod=win)
    # (name, spec, score_mod emission, bprop emission or None); results: docs/cudnn-notes.md
    variants = [
        ("native causal (no score_mod)", AttentionSpec(mask="causal"), mask_after, None),
        ("causal in score_mod only, mask after x*1", one, mask_after, None),
        ("causal select-first only", one, select_first_only, None),
        ("softcap, no mask", AttentionSpec(source="flex", score=soft), mask_after, bprop_masked),
        ("softcap then mask (flex's order)", sp, mask_after, bprop_masked),
        ("mask, softcap, mask", sp, pre_and_post, bprop_masked),
        ("mask(lowest), softcap, mask", sp, pre_lowest, bprop_masked),
        ("mask, softcap, remask(fresh idx)", sp, remask_fresh, bprop_masked),
        ("mask, softcap, remask(s1 > -inf)", sp, remask_value, bprop_masked),
        ("mask, softcap (inexact values)", sp, pre_only, bprop_masked),
        ("A mask,softcap,min (bprop+mask)", sp, mask_f_min, bprop_masked),
        ("A' mask,softcap,min (bprop nomask)  <- te_compile", sp, mask_f_min, bprop_nomask),
        ("B mask,softcap no bprop (wrong g)", sp, mask_f, None),
        ("C mask,x2 (bprop+mask)", x2, mask_f, bprop_masked),
        ("C' mask,x2 (bprop nomask)", x2, mask_f, bprop_nomask),
        ("D mask,softcap (bprop nomask)", sp, mask_f, bprop_nomask),
        ("E softcap+causal min, bprop raw", sp, mask_f_min_raw, bprop_raw),
        ("F x2+causal, bprop identity", x2, mask_f, bprop_const_identity),
        ("G x2+causal, bprop runtime scalar", x2, mask_f, bprop_const_rt),
        ("I softcap+window min, bprop raw", sw, mask_f_min_raw, bprop_raw),
        ("J softcap+window, mask after", sw, mask_after, bprop_masked),
    ]
    for name, spec, sm, bp in variants:
        pbv([1e30])
        emit.Emitter.score_mod = sm
        emit.Emitter.bprop = bp or ORIG_B
        emit.Emitter.needs_bprop = property(lambda self, bp=bp: bp is not None)
        graphs.cache.clear()
        try:
            o, lse = graphs.forward(q, k, v, None, spec)
            f = ms(lambda: graphs.forward(q, k, v, None, spec))
            b = ms(lambda: graphs.backward(do, q, k, v, o, lse, None, spec, False))
            # numerics on a small slice vs the reference
            rs = AttentionSpec(source="flex", score=spec.score, mask_mod=spec.mask_mod, impl="reference")
            so, sl = graphs.forward(qs, ks, vs, None, spec)
            ro, rl = torch.ops.te_compile.attn_fwd(qs, ks, vs, None, [], rs.key())
            got = graphs.backward(dos, qs, ks, vs, ro, rl, None, spec, False)
            want = torch.ops.te_compile.attn_bwd(dos, qs, ks, vs, ro, rl, None, [], rs.key(), False)
            err_o = ((so.float() - ro.float()).abs().max() / ro.float().abs().max()).item()
            err_g = max(((a.float() - c.float()).abs().max() / c.float().abs().max()).item()
                        for a, c in zip(got[:3], want[:3]))
            print(f"{name:34s} fwd {f:6.3f} ms  bwd {b:6.3f} ms   err out {err_o:.1e} grads {err_g:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:34s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
    emit.Emitter.score_mod, emit.Emitter.bprop = ORIG, ORIG_B


if __name__ == "__main__":
    main()
