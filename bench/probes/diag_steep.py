"""The GPU fuzzer's wrong answer at seed 14001 (class E), class B below 64 keys, and variants, each in its own
process (GPU).

* E: ``exp(|2 score| ** 2.25 / 8)`` under ``q_idx - kv_idx <= 10``, L = S = 200, lse in the loss: dQ, dK, dV 30%
  off (eager bf16 is 1% off). Is it the steepness of the score_mod (the backward recomputes the scores, and a
  score_mod with a derivative in the millions turns the recomputation's rounding into a different softmax)?
  Column "kept": the same case with every site kept (what plain torch.compile gives).
* B: ``(kv_idx * kv_idx + q_idx) * 0.1 + score`` at S < 64 keys with the 64-key keep off: where does dQ inf start?

    python3 bench/probes/diag_steep.py [--jobs 8]
"""
import argparse
import concurrent.futures as cf
import json
import subprocess
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from diag_broadcast import S  # noqa: E402
from diag_wrong import B, COMMON, M  # noqa: E402

E = {**COMMON, "B": 2, "D": 64, "DV": 64, "H": 4, "HKV": 4, "L": 200, "S": 200, "lse_loss": True,
     "return_lse": True, "mask": M.format("(q_idx - kv_idx <= 10)"),
     "score": S.format("torch.exp((torch.abs((score * 2)) ** 1.5 ** 2) / 8.0)"), "seed": 14001000305}
NO_SHORT = "import te_compile.cudnn.check as c; c.SHORT_KEYS = 0; "
KEEP_ALL = ("import te_compile.cudnn.check as c; from te_compile.reasons import Reason, NOT_EXACT; "
            "c.check = lambda *a, **k: Reason('probe: kept', NOT_EXACT); ")


def sm(body: str) -> str:
    return S.format(body)


E_FORMS = {
    "as drawn": E["score"],
    "exp(score)": sm("torch.exp(score)"),
    "exp(2 * score)": sm("torch.exp(score * 2)"),
    "exp(4 * score)": sm("torch.exp(score * 4)"),
    "exp(score * score)": sm("torch.exp(score * score)"),
    "exp(score*score / 4)": sm("torch.exp(score * score / 4)"),
    "(2 score) ** 4": sm("(score * 2) ** 4"),
    "score * 50": sm("score * 50"),
    "exp(exp(score))": sm("torch.exp(torch.exp(score))"),
    "tanh(exp(score*score))": sm("torch.tanh(torch.exp(score * score))"),
}
VARIANTS = {
    **{f"E {n}": ({**E, "score": s}, "") for n, s in E_FORMS.items()},
    **{f"E {n} | kept": ({**E, "score": s}, KEEP_ALL) for n, s in E_FORMS.items()},
    "E no mask": ({**E, "mask": None}, ""),
    "E no lse loss": ({**E, "lse_loss": False}, ""),
    "E no grad": ({**E, "no_grad": True}, ""),
    "E L = S = 128": ({**E, "L": 128, "S": 128}, ""),
    **{f"B L = S = {n}, no keep": ({**B, "L": n, "S": n}, NO_SHORT) for n in (16, 33, 40, 48, 56, 63, 64)},
    "B L = 200, S = 48, no keep": ({**B, "L": 200, "S": 48}, NO_SHORT),
}


def run(case: dict, pre: str) -> str:
    code = pre + "import runpy; runpy.run_module('te_compile.testing.fuzz', run_name='__main__')"
    cmd = [sys.executable, "-c", code, "--device", "cuda", "--case", json.dumps(case), "-v"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "timeout"
    text = p.stdout + p.stderr
    for line in text.splitlines():
        if line.startswith(("pass", "kept", "invalid", "WRONG", "wrong", "crash", "--- ")):
            return line[:260]
    tail = [x for x in text.splitlines() if "nanobind" not in x and "leaked" not in x][-4:]
    return f"rc{p.returncode} " + " | ".join(tail)[-400:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--only", default="", help="variants whose name contains one of these ','-separated words")
    a = ap.parse_args()
    todo = [n for n in VARIANTS if not a.only or any(w in n for w in a.only.split(","))]
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = {n: ex.submit(run, *VARIANTS[n]) for n in todo}
        for n in todo:
            print(f"{n:32s} {futs[n].result()}", flush=True)


if __name__ == "__main__":
    main()
