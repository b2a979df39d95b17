"""The GPU fuzzer's wrong answers of 2026-11-27, and variants of each, each in its own process (GPU).

Runs each case with te_compile's default emission and, where a fix exists, without it:
* A: inverse causal ``kv_idx >= q_idx`` with a score_mod, L = S = 200, D 128 (mask first on the raw score; fixed:
  emitted after the score_mod);
* C: a gathered additive term with a large per-row part, rounded into a bf16 bias (fixed: rows shifted by their top);
* B: ``(kv_idx * kv_idx + q_idx) * 0.1 + score`` under ``(q_idx % 6) != (1 - kv_idx)``, GQA 4/1, L = S = 64: dQ inf;
* D: ``log(remainder(score + 2, 3))`` causal, L = 255, S = 128, DV 128: dQ and dK inf (seen on 9.27).
B and D have no fix yet: the variants say what they need.

    python3 bench/probes/diag_wrong.py [--jobs 6]
"""
import argparse
import concurrent.futures as cf
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from diag_broadcast import S, run  # noqa: E402

M = "def mask_mod(b, h, q_idx, kv_idx):\n    return {}\n"
COMMON = {"attn_mask": "", "autocast": False, "block": 128, "captured": [], "is_causal": False, "kind": "flex",
          "kv_batch1": False, "lse_loss": False, "mask": None, "no_grad": False, "noncontig": False, "peer": "",
          "return_lse": False, "scale": None}
A = {**COMMON, "B": 1, "D": 128, "DV": 128, "H": 4, "HKV": 4, "L": 200, "S": 200, "mask": M.format("(kv_idx >= q_idx)"),
     "return_lse": True, "score": S.format("(-0.5 + ((score * 0.5)).float())"), "seed": 11001000068}
B = {**COMMON, "B": 2, "D": 64, "DV": 64, "H": 4, "HKV": 1, "L": 64, "S": 64,
     "mask": M.format("((q_idx % 6) != (1 - kv_idx))"), "score": S.format("((kv_idx * kv_idx) + q_idx) * 0.1 + score"),
     "seed": 11003000205}
C = {**COMMON, "B": 2, "D": 64, "DV": 64, "H": 4, "HKV": 1, "L": 256, "S": 128, "block": 64, "seed": 11003000331,
     "captured": [{"dtype": "float32", "learned": False, "make": "rand", "name": "T0", "shape": ["H"]},
                  {"dtype": "float32", "learned": False, "make": "randn", "name": "T1", "shape": ["H", "L+S-1"]},
                  {"dtype": "int64", "learned": False, "make": "randint:0:8", "name": "T2", "shape": ["B"]}],
     "score": S.format("((torch.where((score >= 0.5), score, (score * 0.5)) + T1[h, q_idx - kv_idx + 127]) + "
                       "(torch.maximum(T2[b], q_idx + 7) * 1))")}
D = {**COMMON, "B": 1, "D": 64, "DV": 128, "H": 4, "HKV": 4, "L": 255, "S": 128, "block": 64,
     "mask": M.format("q_idx >= kv_idx"), "score": S.format("torch.log(torch.remainder((2.0 + score), 3.0))"),
     "seed": 12001000351}
VARIANTS = {
    "A as drawn": (A, []),
    "A mask first (old)": (A, ["mask_first_inverse=1"]),
    "A D = 64": ({**A, "D": 64, "DV": 64}, []),
    "A L = S = 128, old": ({**A, "L": 128, "S": 128}, ["mask_first_inverse=1"]),
    "C as drawn": (C, []),
    "B as drawn": (B, []),
    "B no GQA": ({**B, "HKV": 4}, []),
    "B no mask": ({**B, "mask": None}, []),
    "B L = S = 128": ({**B, "L": 128, "S": 128}, []),
    "B L = S = 200": ({**B, "L": 200, "S": 200}, []),
    "B terms * 0.001": ({**B, "score": S.format("((kv_idx * kv_idx) + q_idx) * 0.001 + score")}, []),
    "B no q term": ({**B, "score": S.format("(kv_idx * kv_idx) * 0.1 + score")}, []),
    "B no guard": (B, ["kv_guard=0"]),
    "B mask kv != 3": ({**B, "mask": M.format("kv_idx != 3")}, []),
    "D as drawn": (D, []),
    "D no mask": ({**D, "mask": None}, []),
    "D L = S = 128": ({**D, "L": 128, "S": 128}, []),
    "D DV = 64": ({**D, "DV": 64}, []),
    "D log(rem + 0.5)": ({**D, "score": S.format("torch.log(torch.remainder((2.0 + score), 3.0) + 0.5)")}, []),
    "D no grad": ({**D, "no_grad": True}, []),
}
#: the second round (--more): where B and D start to fail
MORE = {
    **{f"B L = S = {n}": ({**B, "L": n, "S": n}, []) for n in (32, 96, 127, 129)},
    "B L = 64, S = 200": ({**B, "S": 200}, []),
    "B L = 200, S = 64": ({**B, "L": 200}, []),
    "B terms * 0.01": ({**B, "score": S.format("((kv_idx * kv_idx) + q_idx) * 0.01 + score")}, []),
    "B terms * 0.03": ({**B, "score": S.format("((kv_idx * kv_idx) + q_idx) * 0.03 + score")}, []),
    "B kv * 6.0": ({**B, "score": S.format("kv_idx * 6.0 + score")}, []),
    "B no grad": ({**B, "no_grad": True}, []),
    **{f"D L = {n}, S = 128": ({**D, "L": n}, []) for n in (129, 200, 256)},
    "D L = S = 255": ({**D, "S": 255}, []),
    "D no guard": (D, ["kv_guard=0"]),
    "D log(|score| + 1e-30)": ({**D, "score": S.format("torch.log(torch.abs(score) + 1e-30)")}, []),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--more", action="store_true", help="the second round of B and D variants")
    a = ap.parse_args()
    todo = MORE if a.more else VARIANTS
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = {n: ex.submit(run, case, emits, True) for n, (case, emits) in todo.items()}
        for n in todo:
            print(f"{n:24s} {futs[n].result()}", flush=True)


if __name__ == "__main__":
    main()
