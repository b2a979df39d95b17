"""CPU: the per-signature runner map, the decisions a runner makes once, the serialized plan the native call
path reads, and the native call path's fallback (off, with its reason; the ops' kernels swapped and back).

The cuDNN side of the runners and the C++ kernels run on the GPU (tests/test_cuda_native.py)."""

from __future__ import annotations

import struct

import pytest
import torch
import torch.nn.functional as F

from te_compile.runtime import kernels, ops
from te_compile import counters
from te_compile.cudnn import native, runners
from te_compile.cudnn.frontend_private import plan_blob
from te_compile.report import GraphReport, Report
from te_compile.spec import AttentionSpec


# --------------------------------------------------------------------------- the runner map

def _qkv(L=16, D=8, strides_like=None):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, L, D, generator=g) for _ in range(3)]


def test_one_runner_per_signature_and_eager_numbers():
    """The map builds a runner on a signature's first call and reuses it after; a new layout is a new signature.
    Every call agrees with eager SDPA."""
    kernels.clear_runners()
    spec = AttentionSpec(mask="causal", impl="reference").key()
    q, k, v = _qkv()
    for _ in range(3):
        out, lse = kernels.attn_fwd_cuda(q, k, v, None, [], spec)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert len(kernels._fwd) == 1
    entry = next(iter(kernels._fwd.values()))
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, BSHD strides: another signature
    out, _ = kernels.attn_fwd_cuda(qt, k, v, None, [], spec)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert len(kernels._fwd) == 2 and entry in kernels._fwd.values()
    assert out.stride() == qt.stride()  # the output follows q's layout on every path
    kernels.clear_runners()
    assert not kernels._fwd and not kernels._bwd


def test_backward_runner_per_signature_matches_eager_gradients():
    kernels.clear_runners()
    spec = AttentionSpec(impl="reference").key()
    q, k, v = (t.requires_grad_() for t in _qkv())
    out, lse = kernels.attn_fwd_cuda(q.detach(), k.detach(), v.detach(), None, [], spec)
    dout = torch.randn_like(out)
    for _ in range(2):
        dq, dk, dv, dbias = kernels.attn_bwd_cuda(dout, q.detach(), k.detach(), v.detach(), out, lse, None, [],
                                                  spec, False)
    F.scaled_dot_product_attention(q, k, v).backward(dout)
    for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        torch.testing.assert_close(got, want)
    assert dbias.numel() == 0 and len(kernels._bwd) == 1


def test_the_map_is_bounded(monkeypatch):
    kernels.clear_runners()
    monkeypatch.setattr(kernels, "MAX_RUNNERS", 3)
    spec = AttentionSpec(impl="reference").key()
    for L in (4, 8, 12, 16):
        q, k, v = _qkv(L)
        kernels.attn_fwd_cuda(q, k, v, None, [], spec)
    assert len(kernels._fwd) == 1  # full at the fourth signature: emptied, then the new one
    kernels.clear_runners()


def test_a_graph_leaving_the_cache_takes_only_its_own_runners(monkeypatch):
    """The graph cache evicts one graph at a time; the runners that run it go (here and in C++, by the graph's id),
    every other runner stays; emptying the cache empties the runner maps."""
    from types import SimpleNamespace
    from te_compile.cudnn import graphs
    forgotten = []
    monkeypatch.setattr(native, "forget", forgotten.append)
    kernels.clear_runners()
    cache = graphs.GraphCache(maxsize=2)
    cache.on_forget.append(kernels.forget_graph)
    built = {key: cache.get((key,), lambda key=key: SimpleNamespace(name=key)) for key in ("a", "b")}
    spec = AttentionSpec(impl="reference")
    for key, g in built.items():
        kernels._fwd[("fwd", key)] = kernels._Entry(spec, SimpleNamespace(launch=SimpleNamespace(built=g)))
        kernels._bwd[("bwd", key)] = kernels._Entry(spec, SimpleNamespace(launch=SimpleNamespace(built=g)))
    kernels._fwd[("fwd", "general")] = kernels._Entry(spec, SimpleNamespace())  # runs no cached graph of its own
    cache.get(("c",), lambda: SimpleNamespace(name="c"))  # "a", the least recently used, leaves
    assert forgotten == [id(built["a"])]
    assert set(kernels._fwd) == {("fwd", "b"), ("fwd", "general")} and set(kernels._bwd) == {("bwd", "b")}
    cache.clear()
    assert not kernels._fwd and not kernels._bwd


# --------------------------------------------------------------------------- decisions taken once per runner

def test_rows_an_emitted_mask_empties_are_found_once_and_filled():
    spec = AttentionSpec(source="flex", mask_mod="(and (eq (rem kv_idx 2) 0) (ge q_idx 5))")
    rows = runners.static_empty_rows(spec, 8, 8, torch.device("cpu"))
    assert rows.tolist() == [[[True] * 5 + [False] * 3]]
    band = AttentionSpec(source="flex", mask_mod="(ge q_idx kv_idx)")  # a built-in band never empties a row
    assert runners.static_empty_rows(band, 8, 8, torch.device("cpu")) is None
    out, lse = torch.ones(1, 1, 8, 2), torch.zeros(1, 1, 8)
    bias = torch.zeros(8, 8)
    bias[6] = float("-inf")  # a bias row masked entirely
    runners.fill_empty_rows(out, lse, rows, bias)
    assert out[0, 0, :, 0].tolist() == [0.0] * 5 + [1.0, 0.0, 1.0]
    assert torch.isneginf(lse[0, 0]).tolist() == [True] * 5 + [False, True, False]


@pytest.mark.parametrize("score,empty,bias,looks", [("", False, True, False), ("(mul score 2.0)", False, True, True),
                                                    ("", True, True, True), ("(mul score 2.0)", False, False, False)])
def test_bias_rows_are_looked_for_only_where_cudnn_does_not_handle_them(score, empty, bias, looks):
    spec = AttentionSpec(source="flex", score=score, empty_rows=empty)
    assert runners.bias_rows_checked(spec, bias) is looks


def test_the_prefix_split_is_decided_per_signature():
    spec = AttentionSpec(source="flex", mask_mod="(or (lt kv_idx 300) (ge q_idx kv_idx))")
    sp = runners.prefix_split(spec, 1024, 1024, False)
    assert sp is not None and sp.keys == 300
    assert runners.prefix_split(spec, 1024, 1024, True) is None  # with a bias: one emitted graph
    assert runners.prefix_split(spec, 200, 200, False) is None  # the prefix covers every key


# --------------------------------------------------------------------------- the serialized plan

def _ub(x) -> bytes:
    """UBJSON as nlohmann::json::to_ubjson writes it (the subset the cuDNN frontend's blobs use)."""
    if x is None:
        return b"Z"
    if isinstance(x, bool):
        return b"T" if x else b"F"
    if isinstance(x, int):
        return b"L" + struct.pack(">q", x) if not -128 <= x < 128 else b"i" + struct.pack("b", x)
    if isinstance(x, float):
        return b"D" + struct.pack(">d", x)
    if isinstance(x, str):
        return b"S" + _ub(len(x.encode()))[0:] + x.encode()
    if isinstance(x, list):
        return b"[" + b"".join(_ub(e) for e in x) + b"]"
    if isinstance(x, dict):
        return b"{" + b"".join(_ub(len(k.encode())) + k.encode() + _ub(v) for k, v in x.items()) + b"}"
    raise TypeError(type(x))


def _blob(**over) -> bytes:
    j = {"cudnn_backend_data": '{"plan": 1}', "variant_pack_uids": [100, 3, 101, 400, 1, 2],
         "pass_by_values": {"7": {"index": 3, "value": "3E000000"}, "9": {"index": 0, "value": 5}},
         "workspace_modifications": {"8": [2, 65536, []]}, "fe_workspace_size": 66560,
         "variant_pack_replacements": [], "tensors_to_dump": []}
    j.update(over)
    return _ub(j)


def test_the_variant_pack_of_a_serialized_plan():
    vp = plan_blob.variant_pack(_blob())
    assert vp.plan_json == '{"plan": 1}' and vp.fe_workspace == 66560
    assert vp.uids == (1, 2, 3, 7, 8, 9, 100, 101, 400)
    kinds = dict(zip(vp.uids, vp.kinds))
    assert kinds[7] == kinds[9] == plan_blob.HOST and kinds[8] == plan_blob.WORKSPACE
    assert all(kinds[u] == plan_blob.OPERAND for u in (1, 2, 3, 100, 101, 400))
    payload = dict(zip(vp.uids, vp.payloads))
    assert struct.unpack("<f", payload[7])[0] == 0.125 and struct.unpack("<q", payload[9])[0] == 5
    assert dict(zip(vp.uids, vp.offsets))[8] == 65536


def test_workspace_data_and_zeroed_regions_become_slots():
    """ALiBi's slopes (operation 0: copied into the workspace before each execute) become data the runner keeps;
    a region the frontend zeroes (operation 1) keeps its offset and byte count."""
    vp = plan_blob.variant_pack(_blob(workspace_modifications={"8": [0, 256, ["3F000000", 0.25]], "10": [1, 512, [64.0]],
                                                               "11": [2, 1024, []]}))
    slots = {u: (k, p, o) for u, k, p, o in zip(vp.uids, vp.kinds, vp.payloads, vp.offsets)}
    assert slots[8] == (plan_blob.DATA, struct.pack("<2f", 0.5, 0.25), 256)
    assert slots[10] == (plan_blob.ZEROED, struct.pack("<q", 64), 512)
    assert slots[11] == (plan_blob.WORKSPACE, b"", 1024)


@pytest.mark.parametrize("over,why", [
    ({"workspace_modifications": {"8": [7, 0, [64.0]]}}, "workspace operation te_compile does not know (operation 7)"),
    ({"workspace_modifications": {"8": [0, 0, [float("nan")]]}}, "NaN bit pattern"),
    ({"workspace_modifications": {"8": [0, 0, [None]]}}, "not a list of float32 values"),
    ({"workspace_modifications": {"8": [0]}}, "unreadable serialized plan (IndexError"),
    ({"variant_pack_replacements": [[5, [6, 16]]]}, "pointer replacements"),
    ({"cudnn_backend_data": None}, "no cuDNN backend plan"),
])
def test_plans_the_native_runner_cannot_fill_stay_with_python(over, why):
    assert why in plan_blob.variant_pack(_blob(**over))


def test_an_unreadable_blob_is_a_reason_not_a_crash():
    from te_compile.cudnn import frontend_private
    why = plan_blob.variant_pack(b"{i\x05ab")
    assert "unreadable" in why and f"cuDNN frontend {frontend_private.version()}" in why  # the version that wrote it


# --------------------------------------------------------------------------- the native call path's fallback

@pytest.fixture
def fresh_native(monkeypatch):
    monkeypatch.setattr(native, "_tried", False)
    yield
    native.disable()


def test_off_with_its_reason_where_it_cannot_build(fresh_native, monkeypatch):
    monkeypatch.setenv("TE_COMPILE_NATIVE", "0")
    assert native.enable() == "off: TE_COMPILE_NATIVE=0"
    assert not native.active()
    monkeypatch.delenv("TE_COMPILE_NATIVE")
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert native.enable() == "off: this torch has no CUDA"


def test_missing_headers_are_named(monkeypatch):
    monkeypatch.setattr(native, "_site_dirs", lambda: [])
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDNN_INCLUDE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(native, "_find_header", lambda name, where: None if name == "cudnn.h" else where[0])
    with pytest.raises(LookupError, match="cudnn.h not found"):
        native._includes()


def test_the_build_is_keyed_by_its_source_and_headers(tmp_path, monkeypatch):
    (tmp_path / "cudnn_version.h").write_text("#define CUDNN_MAJOR 9\n")
    a = native._fingerprint([str(tmp_path)], ["-O2"])
    (tmp_path / "cudnn_version.h").write_text("#define CUDNN_MAJOR 10\n")
    assert native._fingerprint([str(tmp_path)], ["-O2"]) != a
    assert native._fingerprint([str(tmp_path)], ["-O3"]) != native._fingerprint([str(tmp_path)], ["-O2"])


def test_the_report_names_the_call_path():
    rep = Report([GraphReport(1, [], "", None, "9.19", "off: no CUDA GPU")])
    assert rep.table().splitlines()[0].endswith("(cuDNN 9.19; native call path: off: no CUDA GPU)")


class _FakeExt:
    def __init__(self):
        self.calls = []

    def install(self, fwd, bwd, grad):
        self.calls.append(("install", fwd, bwd, grad))

    def uninstall(self):
        self.calls.append(("uninstall",))

    def register_forward(self, *args):
        self.calls.append(("register_forward", args))

    def clear(self):
        self.calls.append(("clear",))


def test_the_ops_kernels_swap_to_native_and_back():
    """Turning the native path on hands the ops' CUDA / Autograd keys to the extension with the Python kernels as
    its miss handlers; turning it off restores the Python kernels, and the ops still compute on every device."""
    ext = _FakeExt()
    ops.use_native_kernels(ext)
    try:
        assert ext.calls[0] == ("install", kernels.attn_fwd_cuda, kernels.attn_bwd_cuda, ops._native_grad_forward)
        assert ops._py_lib is None
    finally:
        ops.use_python_kernels()
    assert ext.calls[-1] == ("uninstall",) and ops._py_lib is not None
    q, k, v = (t.requires_grad_() for t in _qkv())
    out, _ = torch.ops.te_compile.attn_fwd(q, k, v, None, [], AttentionSpec(mask="causal").key())
    out.sum().backward()
    q2 = q.detach().requires_grad_()
    F.scaled_dot_product_attention(q2, k.detach(), v.detach(), is_causal=True).sum().backward()
    torch.testing.assert_close(q.grad, q2.grad)


def test_register_decodes_the_plan_and_records_what_it_declines(monkeypatch):
    ext = _FakeExt()
    monkeypatch.setattr(native, "_ext", ext)
    monkeypatch.setattr(counters, "declined", {})
    q, k, v = _qkv()
    info = {"plan": _blob(), "owner": 7, "n_inputs": 0, "consts": [], "out_shape": [1, 2, 16, 8], "out_stride": [256, 128, 8, 1],
            "bias_shape": [], "bias_copy": False, "rows": None, "bias_rows": False, "block": False}
    native.register("forward", (q, k, v, None, [], "spec"), info)
    (name, args), = ext.calls
    assert name == "register_forward" and args[6] == 7  # the graph's id: forget(7) drops the runner
    assert args[7] == '{"plan": 1}' and args[8] == [1, 2, 3, 7, 8, 9, 100, 101, 400]
    native.register("forward", (q, k, v, None, [], "spec"), dict(info, plan=_blob(variant_pack_replacements=[[1, 2]])))
    assert len(ext.calls) == 1
    assert list(counters.declined) == ["forward: the plan's variant pack has pointer replacements"]


def test_a_runner_without_a_loadable_plan_is_counted_with_its_kind(monkeypatch):
    monkeypatch.setattr(counters, "declined", {})
    monkeypatch.setattr(native, "_ext", _FakeExt())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    class PrefixLike:
        def native_info(self):
            return None
    kernels._offer_native(kernels._Entry(AttentionSpec(mask="causal"), PrefixLike()), "backward", ())
    assert counters.declined == {"backward: PrefixLike has no cuDNN plan the native path can load": 1}


def test_interval_runners_register_their_launches_and_again_for_new_mask_inputs(monkeypatch):
    """An interval runner's launches go to C++ with TVM-FFI's functions set once; a runner whose launches hold for one
    set of mask inputs (document ids) stays pending, so the next call Python serves (new ids) registers again; a
    reason instead of launches, or a C++ refusal, is recorded as declined."""
    ext = _FakeExt()
    ext.ok = True
    ext.set_tvm_ffi = lambda *a: ext.calls.append(("set_tvm_ffi", a))
    ext.register_interval_forward = lambda *a: ext.calls.append(("register_interval_forward", a)) or ext.ok
    monkeypatch.setattr(native, "_ext", ext)
    monkeypatch.setattr(native, "_ffi_set", False)
    monkeypatch.setattr(counters, "declined", {})
    monkeypatch.setattr(native.atexit, "register", lambda f: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    q, k, v = _qkv()
    ids = torch.zeros(1, 16, dtype=torch.long)

    class IntervalLike:
        info = None

        def native_info(self):
            return self.info

    r = IntervalLike()
    r.info = {"interval": ("form",), "keep": [], "ffi": lambda: (1, 2, 3, 4, 5), "rows": None, "data": [ids],
              "again": True, "out_stride": [256, 128, 8, 1]}
    entry = kernels._Entry(AttentionSpec(mask="causal"), r)
    args = (q, k, v, None, [ids], "spec")
    kernels._offer_native(entry, "forward", args)
    kernels._offer_native(entry, "forward", args)
    assert [c[0] for c in ext.calls] == ["set_tvm_ffi", "register_interval_forward", "register_interval_forward"]
    assert ext.calls[0][1] == (1, 2, 3, 4, 5)
    reg = ext.calls[1][1]
    assert reg[:6] == (q, k, v, None, [ids], "spec") and reg[6] == ("form",) and reg[7] == [256, 128, 8, 1]
    assert reg[9] == [ids] and entry.native_pending
    r.info = dict(r.info, again=False)
    kernels._offer_native(entry, "forward", args)
    assert not entry.native_pending and not counters.declined
    ext.ok = False  # a C++ launch failed before: no new runner
    kernels._offer_native(kernels._Entry(AttentionSpec(mask="causal"), r), "forward", args)
    r.info = "cuDNN's interval kernels: an operand is copied before the kernels read it"
    kernels._offer_native(kernels._Entry(AttentionSpec(mask="causal"), r), "forward", args)
    assert counters.declined == {"forward: cuDNN's interval kernels: a C++ launch failed before": 1,
                               "forward: cuDNN's interval kernels: an operand is copied before the kernels read it": 1}


def test_one_counters_object_reads_every_count(monkeypatch):
    """te_compile.counters.snapshot(): the compile phases, the reference fallbacks kernels counts, the signatures the
    native path declines (recorded through native.decline) and the native path's own counts, in one dict."""
    import warnings

    for name, empty in (("fallbacks", counters.collections.Counter()), ("fallback_reasons", {}), ("declined", {}),
                        ("_phases", {})):
        monkeypatch.setattr(counters, name, empty)
    key = AttentionSpec(mask="causal").key()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels._warn_fallback(key, "forward", "no engine (test)")
        kernels._warn_fallback(key, "forward", "no engine (test)")
    native.decline("backward", "a test reason")
    with counters.timed("decide"):
        pass
    snap = counters.snapshot()
    assert snap["fallbacks"] == {f"{key} forward": 2}
    assert snap["declined"] == {"backward: a test reason": 1}
    assert snap["phases"]["decide"]["count"] == 1
    assert snap["native"] == {k: v for k, v in native.stats().items() if k != "declined"}  # {}: the path is off
    assert kernels.runtime_fallbacks()[0]["calls"] == 2 and kernels.runtime_fallbacks()[0]["reason"] == "no engine (test)"


@pytest.mark.parametrize("engine,blob,why", [
    ("sdpa_fwd_prefill_sm90", b"plan", "the frontend runs this graph on its Python engine sdpa_fwd_prefill_sm90"),
    (None, None, "the frontend cannot serialize this graph's plan"),
    (None, b"plan", None),
])
def test_a_graph_runner_says_why_cpp_cannot_load_its_plan(engine, blob, why):
    """A graph the frontend runs on one of its Python engines (CuTe DSL kernels, where the DSL is importable), or whose
    plan it cannot serialize, stays with Python with that reason (recorded as declined); a runner without a launch
    (an operand copied each call, a dlse) says so too."""
    from te_compile.cudnn import graphs

    class Graph:
        selected_engine = None if engine is None else type("Engine", (), {"name": engine})()

        def serialize(self, as_bytes=True):
            if blob is None:
                raise RuntimeError("no serialization for this plan")
            return blob

    built = graphs._Built(Graph(), 0, (1, 2, 3, 100, 101))
    spec = AttentionSpec(mask="causal")
    info = runners.GraphForward(spec, None, False, graphs.Launch(built, (), True, out_shape=(1, 1, 4, 8),
                                                                 out_stride=(32, 32, 8, 1))).native_info()
    if why is None:
        assert info["plan"] == b"plan" and info["owner"] == id(built)
    else:
        assert isinstance(info, str) and info.startswith(why), info
    assert "copies or casts" in runners.GraphForward(spec, None, False, None).native_info()
    assert "gradient through lse" in runners.GraphBackward(spec, False, False, None).native_info()


def test_a_graph_runner_hands_cpp_its_row_fill_and_lse_guard():
    """What C++ does after cuDNN's execute is what the runner decided: the rows an emitted mask empties, the bias's -inf
    rows looked for per call, the lse guard of the backward (without them C++ returns cuDNN's garbage in rows that
    must be 0 / -inf, and NaN gradients)."""
    import torch
    from te_compile.cudnn import graphs

    class Graph:
        selected_engine = None

        def serialize(self, as_bytes=True):
            return b"plan"

    built = graphs._Built(Graph(), 0, (1, 2, 3, 100, 101))
    spec = AttentionSpec(mask="causal")
    rows = torch.tensor([[[True, False]]])
    fwd = runners.GraphForward(spec, rows, True, graphs.Launch(built, (), True, out_shape=(1, 1, 2, 8),
                                                             out_stride=(16, 16, 8, 1))).native_info()
    assert fwd["rows"] is rows and fwd["bias_rows"] is True and fwd["guard_lse"] is False
    bwd = runners.GraphBackward(spec, False, True, graphs.Launch(built, (), True, grad_strides=((16, 16, 8, 1),) * 3)
                                ).native_info()
    assert bwd["guard_lse"] is True and bwd["rows"] is None and bwd["bias_rows"] is False
