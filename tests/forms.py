"""The SDPA forms te_compile serves, as small runnable cases shared by CPU and GPU tests."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Form:
    name: str
    is_causal: bool = False
    mask: Optional[str] = None  # None | "bool" | "float"
    bias_shape: str = "1HLS"  # for float masks: "1HLS", "11LS", "BHLS", "LS", "1H1S"
    learned: bool = False
    hk: Optional[int] = None  # kv heads (GQA) when set
    scale: Optional[float] = None
    s: Optional[int] = None  # kv length when != L
    bshd: bool = False  # q/k/v as transposed views of [B, S, H, D] storage
    bias_fp32: bool = False


FORMS = [
    Form("none"),
    Form("causal", is_causal=True),
    Form("bool_mask", mask="bool"),
    Form("float_bias_frozen", mask="float"),
    Form("float_bias_learned", mask="float", learned=True),
    Form("float_bias_11LS_learned", mask="float", bias_shape="11LS", learned=True),
    Form("float_bias_BHLS_learned", mask="float", bias_shape="BHLS", learned=True),
    Form("float_bias_LS_fp32_learned", mask="float", bias_shape="LS", learned=True, bias_fp32=True),
    Form("float_bias_1H1S_frozen", mask="float", bias_shape="1H1S"),
    Form("gqa_causal", is_causal=True, hk=1),
    Form("gqa_causal_2kv", is_causal=True, hk=2),  # 2 kv heads of 2 queries each: h // 2 and h % 2 differ
    Form("gqa_bias_learned", mask="float", hk=2, learned=True),
    Form("custom_scale", scale=0.3),
    Form("cross_attention", s=96),
    Form("cross_causal", is_causal=True, s=160),
    Form("bshd_causal", is_causal=True, bshd=True),
]
FORMS_BY_NAME = {f.name: f for f in FORMS}


def _bias_shape(code: str, B: int, H: int, L: int, S: int) -> tuple[int, ...]:
    return {"1HLS": (1, H, L, S), "11LS": (1, 1, L, S), "BHLS": (B, H, L, S), "LS": (L, S),
            "1H1S": (1, H, 1, S)}[code]


def make_inputs(form: Form, device: str, dtype: torch.dtype, B: int = 2, H: int = 4, L: int = 64,
                D: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random (never zero) inputs for ``form``; q/k/v always require grad."""
    g = torch.Generator().manual_seed(seed)
    S = form.s or L
    hk = form.hk or H

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    if form.bshd:
        q = rnd(B, L, H, D).to(device, dtype).transpose(1, 2)
        k = rnd(B, S, hk, D).to(device, dtype).transpose(1, 2)
        v = rnd(B, S, hk, D).to(device, dtype).transpose(1, 2)
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    else:
        q = rnd(B, H, L, D).to(device, dtype).requires_grad_()
        k = rnd(B, hk, S, D).to(device, dtype).requires_grad_()
        v = rnd(B, hk, S, D).to(device, dtype).requires_grad_()
    out = {"q": q, "k": k, "v": v}
    if form.mask == "bool":
        m = rnd(L, S) > -0.5  # ~70% attend
        m[3, :] = False  # a fully-masked row: output 0, never NaN
        out["mask"] = m.to(device)
    elif form.mask == "float":
        bdt = torch.float32 if form.bias_fp32 else dtype
        b = (rnd(*_bias_shape(form.bias_shape, B, H, L, S)) * 0.5).to(device, bdt)
        out["mask"] = b.requires_grad_(form.learned)
    return out


def make_fn(form: Form) -> Callable:
    """The user function: plain SDPA with the form's arguments."""
    kw: dict = {}
    if form.is_causal:
        kw["is_causal"] = True
    if form.hk is not None:
        kw["enable_gqa"] = True
    if form.scale is not None:
        kw["scale"] = form.scale

    if form.mask is None:
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    else:
        def fn(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    return fn


def grad_inputs(inputs: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, t in inputs.items() if t.requires_grad]


def run(fn: Callable, inputs: dict[str, torch.Tensor], dout: Optional[torch.Tensor] = None,
        upcast: Optional[torch.dtype] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and the grads of every input that requires grad (inputs are cloned, leaf)."""
    args = {}
    for n, t in inputs.items():
        c = t.detach()
        if upcast is not None and c.is_floating_point():
            c = c.to(upcast)
        args[n] = c.requires_grad_(t.requires_grad)
    out = fn(**args)
    if dout is None:
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    out.backward(dout.to(out.dtype))
    return out.detach(), {n: args[n].grad for n in grad_inputs(inputs)}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


#: the per-row error (``rows_err``) a bf16 run may reach against eager float32. Measured on an H100 (cuDNN 9.19,
#: 2026-11-28): eager bf16 itself reaches 0.044 in dQ of a causal ALiBi call (L = 512), cuDNN 0.052-0.058 in dQ of
#: causal calls; a wrong row (a mask or bias applied to the wrong keys) is off by its whole scale, ~1.0.
ROWS_TOL = 0.1


def rows_err(a: torch.Tensor, b: torch.Tensor, floor: float = 0.05) -> float:
    """The largest error of any row (the last dim), relative to that row's own scale: an error confined to a few
    rows (a ragged last tile, the rows a mask empties) is not diluted by the global maximum. A row below ``floor``
    of the tensor's scale is measured against that floor instead: its values are differences of near-equal terms
    (dQ of a causal mask's first rows is exactly 0 in eager), which bf16 rounding moves by a large part of the
    row."""
    a, b = a.double().flatten(0, -2), b.double().flatten(0, -2)
    scale = b.abs().amax(dim=-1).clamp_min(floor * b.abs().max().item() + 1e-12)
    return ((a - b).abs().amax(dim=-1) / scale).max().item()
