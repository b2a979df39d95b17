"""Is an op with no full [B, H, L, S] operand what crashed cuDNN (GPU)?

The GPU fuzzer (cuDNN 9.19, H200) drew one case that left the CUDA context unusable ("err 716", misaligned
address): ``sqrt(|score * 2 * T0[h] * (kv_idx - q_idx)| + 0.5)``, GQA 2/1, D 64, DV 128, L = S = 200, with grads.
Its derived backward has ``mul(T0[h], 2.0)``: an op on a captured input and a constant alone. This probe serves
variants of the case, each in its own process (a sticky CUDA error poisons the context), in three columns: as
emitted without the fix (``--emit full_inputs_where_needed=0 --emit keep_broadcast_only=0``), kept (the fix off,
the keep on), and te_compile's default (``EmitOptions.full_inputs_where_needed``: the inputs broadcast to the
score's shape first, so no such op is left). docs/cudnn-notes.md has the results.

    python3 bench/probes/diag_broadcast.py [--jobs 6]
"""
import argparse
import concurrent.futures as cf
import json
import subprocess
import sys

S = "def score_mod(score, b, h, q_idx, kv_idx):\n    return {}\n"
DRAWN = "torch.sqrt(torch.abs(((score * 2) * T0[h] * (kv_idx - q_idx))) + 0.5)"
BASE = {"B": 2, "D": 64, "DV": 128, "H": 2, "HKV": 1, "L": 200, "S": 200, "attn_mask": "", "autocast": False,
        "block": 128, "captured": [{"dtype": "float32", "learned": False, "make": "rand", "name": "T0", "shape": ["H"]}],
        "is_causal": False, "kind": "flex", "kv_batch1": False, "lse_loss": False, "mask": None, "no_grad": False,
        "noncontig": False, "peer": "", "return_lse": False, "scale": 0.3, "score": S.format(DRAWN), "seed": 9445}
VARIANTS = {
    "as drawn": {},
    "D = DV = 64": {"DV": 64},
    "no GQA (2/2)": {"HKV": 2},
    "L = S = 256": {"L": 256, "S": 256},
    "no grad": {"no_grad": True},
    "score * T0[h] * (kv - q)": {"score": S.format("(score * T0[h] * (kv_idx - q_idx))")},  # every op full
    "sqrt(|score * 2 * T0[h]|)": {"score": S.format("torch.sqrt(torch.abs(score * 2 * T0[h]) + 0.5)")},
    "fwd: score / (T0[h] * 2)": {"score": S.format("score / (T0[h] * 2)")},
    "fwd, no grad": {"score": S.format("score / (T0[h] * 2)"), "no_grad": True},
}


COLUMNS = {"as emitted": ["full_inputs_where_needed=0", "keep_broadcast_only=0"],
           "kept": ["full_inputs_where_needed=0"], "default (full inputs)": []}


def run(case: dict, emits: list, detail: bool = False) -> str:
    """The fuzzer's outcome for ``case`` in a process of its own (with ``detail``: and its error line)."""
    cmd = [sys.executable, "-m", "te_compile.testing.fuzz", "--device", "cuda", "--case", json.dumps(case), "-v"]
    for e in emits:
        cmd += ["--emit", e]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "timeout"
    text = p.stdout + p.stderr
    for line in text.splitlines():  # the outcome line first: a keep reason may name the crash it avoids
        if line.startswith(("pass", "kept", "invalid", "WRONG", "wrong", "--- ")):
            word = line.split(":")[0].split()[0 if not line.startswith("---") else 1][:12]
            return f"{word}  {line[:240]}" if detail and word != "pass" else word
    if any(w in text for w in ("err 716", "misaligned", "illegal memory access", "context was unusable")):
        return "CRASH"
    return f"rc{p.returncode}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=6)
    a = ap.parse_args()
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = {(n, c): ex.submit(run, {**BASE, **v}, e) for n, v in VARIANTS.items() for c, e in COLUMNS.items()}
        print(f"{'variant':28s}" + "".join(f"{c:>18s}" for c in COLUMNS), flush=True)
        for n in VARIANTS:
            print(f"{n:28s}" + "".join(f"{futs[(n, c)].result():>18s}" for c in COLUMNS), flush=True)


if __name__ == "__main__":
    main()
