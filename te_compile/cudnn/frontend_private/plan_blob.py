"""A built cuDNN frontend graph's serialized form, read for the native call path.

``pygraph.serialize()`` (cuDNN frontend 1.32) writes UBJSON: the cuDNN backend's own JSON of the execution plan
(``cudnn_backend_data``) and what the frontend adds at execute time: the uids of the variant pack, the
constants it embedded (``pass_by_values``: an attention scale, a -inf fill), the tensors it keeps in its part of
the workspace (``workspace_modifications``, at the front of the workspace: ``fe_workspace_size`` bytes; each is
an operation, an offset and data: 0 copies host data there before each execute (ALiBi's slopes), 1 zeroes that
many bytes there, 2 only places the tensor) and pointer arithmetic between slots (``variant_pack_replacements``). ``variant_pack`` turns that into the slots
the native runner fills on every call, or says why it cannot (then Python keeps the signature).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Optional

#: UBJSON scalar markers -> (struct format, size)
_NUMBERS = {"i": ("b", 1), "U": ("B", 1), "I": (">h", 2), "l": (">i", 4), "L": (">q", 8), "u": (">H", 2),
            "m": (">I", 4), "M": (">Q", 8), "d": (">f", 4), "D": (">d", 8)}


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def marker(self) -> str:
        while True:
            m = chr(self.data[self.pos])
            self.pos += 1
            if m != "N":  # no-op
                return m

    def number(self, m: str) -> Any:
        fmt, n = _NUMBERS[m]
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return v

    def length(self) -> int:
        return int(self.number(self.marker()))

    def string(self) -> str:
        n = self.length()
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def value(self, m: Optional[str] = None) -> Any:
        m = m or self.marker()
        if m in _NUMBERS:
            return self.number(m)
        if m in "TF":
            return m == "T"
        if m == "Z":
            return None
        if m == "C":
            self.pos += 1
            return chr(self.data[self.pos - 1])
        if m in "SH":
            return self.string()
        if m in "[{":
            return self.container(m)
        raise ValueError(f"UBJSON marker {m!r} at byte {self.pos - 1}")

    def container(self, kind: str) -> Any:
        typ, count = None, None
        if chr(self.data[self.pos]) == "$":
            self.pos += 1
            typ = self.marker()
        if chr(self.data[self.pos]) == "#":
            self.pos += 1
            count = self.length()
        out: Any = [] if kind == "[" else {}
        i = 0
        while count is None or i < count:
            if count is None:
                m = self.marker()
                if m in "]}":
                    break
                self.pos -= 1
            if kind == "[":
                out.append(self.value(typ))
            else:
                key = self.string()
                out[key] = self.value(typ)
            i += 1
        return out


def decode(data: bytes) -> Any:
    """UBJSON (as the cuDNN frontend's JSON library writes it) -> Python values."""
    return _Reader(bytes(data)).value()


# --------------------------------------------------------------------------- the variant pack

#: the frontend's pass-by-value types, by variant index (graph_properties.h: int64, int32, half, float, double,
#: bfloat16) -> how the value is packed for the backend
_PBV = {0: "<q", 1: "<i", 2: "<e", 3: "<f", 4: "<d"}

#: slot kinds: the call's tensor or te_compile's constant; a constant embedded by the frontend (host bytes); a
#: place in the workspace; data the frontend copies into the workspace before each execute (the native runner
#: keeps it in a device buffer of its own, uploaded once: the plan only reads it); a place in the workspace that
#: is zeroed before each execute (payload: the byte count)
OPERAND, HOST, WORKSPACE, DATA, ZEROED = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class VariantPack:
    plan_json: str  # the cuDNN backend's JSON of the execution plan
    uids: tuple[int, ...]
    kinds: tuple[int, ...]  # OPERAND, HOST, WORKSPACE, DATA or ZEROED
    payloads: tuple[bytes, ...]  # HOST: the constant's bytes; DATA: the data's bytes; ZEROED: the byte count (int64)
    offsets: tuple[int, ...]  # WORKSPACE, ZEROED: byte offset into the frontend's part of the workspace
    fe_workspace: int  # bytes of the workspace the frontend keeps before the engine's


def _pbv_bytes(entry: dict) -> bytes:
    index, value = int(entry["index"]), entry["value"]
    if index in (3, 2, 5) and isinstance(value, str):  # float, half and bfloat16 travel as float32 bits in hex
        bits = int(value, 16)
        f32 = struct.pack("<I", bits)
        if index == 3:
            return f32
        if index == 5:
            return f32[2:]  # bfloat16: the high half of the float32 (exact for values that came from bfloat16)
        return struct.pack("<e", struct.unpack("<f", f32)[0])
    if index in _PBV:
        return struct.pack(_PBV[index], value)
    raise ValueError(f"a pass-by-value constant of variant index {index}")


def variant_pack(blob: bytes) -> "VariantPack | str":
    """The slots of a serialized plan's variant pack, or why the native runner cannot fill them."""
    try:
        why = _variant_pack(blob)
    except Exception as e:  # noqa: BLE001 - a plan the reader does not understand stays with Python, never fails a call
        why = f"unreadable serialized plan ({type(e).__name__}: {e})"
    if isinstance(why, str) and why.startswith(("unreadable", "the serialized plan has no")):
        # the serialized form is the frontend's own: name the version that wrote it
        from . import FRONTEND_CHECKED, version
        why += f" (cuDNN frontend {version()}; read as {', '.join(FRONTEND_CHECKED)} writes it)"
    return why


def _variant_pack(blob: bytes) -> "VariantPack | str":
    try:
        j = decode(blob)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        return f"unreadable serialized plan ({e})"
    if not isinstance(j, dict) or not isinstance(j.get("cudnn_backend_data"), str):
        return "the serialized plan has no cuDNN backend plan"
    if j.get("variant_pack_replacements"):
        return "the plan's variant pack has pointer replacements"
    pbv = {int(k): v for k, v in (j.get("pass_by_values") or {}).items()}
    ws = {int(k): v for k, v in (j.get("workspace_modifications") or {}).items()}
    unknown = sorted({int(v[0]) for v in ws.values()} - {0, 1, 2})
    if unknown:
        return f"the plan needs a workspace operation te_compile does not know (operation {unknown[0]})"
    uids = sorted(set(int(u) for u in j.get("variant_pack_uids", [])) | set(pbv) | set(ws))
    kinds, payloads, offsets = [], [], []
    for u in uids:
        if u in ws:
            op, offset, data = int(ws[u][0]), int(ws[u][1]), list(ws[u][2] or [])
            if op == 0:  # float32 values (bit patterns of int32 data too): bytes exactly as the frontend copies them
                try:  # each value as its float32 bits in hex (cuDNN frontend 1.32), or a number
                    raw = b"".join(struct.pack("<I", int(x, 16)) if isinstance(x, str) else struct.pack("<f", x)
                                   for x in data)
                except (TypeError, ValueError, struct.error):
                    return "the plan's workspace data is not a list of float32 values"
                if any(isinstance(x, float) and x != x for x in data):
                    return "the plan's workspace data holds a NaN bit pattern, which its serialized form may not keep"
                kinds.append(DATA)
                payloads.append(raw)
            elif op == 1:
                kinds.append(ZEROED)
                payloads.append(struct.pack("<q", int(data[0])))
            else:
                kinds.append(WORKSPACE)
                payloads.append(b"")
            offsets.append(offset)
        elif u in pbv:
            try:
                payloads.append(_pbv_bytes(pbv[u]))
            except (ValueError, struct.error) as e:
                return str(e)
            kinds.append(HOST)
            offsets.append(0)
        else:
            kinds.append(OPERAND)
            payloads.append(b"")
            offsets.append(0)
    return VariantPack(j["cudnn_backend_data"], tuple(uids), tuple(kinds), tuple(payloads), tuple(offsets),
                       int(j.get("fe_workspace_size", 0)))
