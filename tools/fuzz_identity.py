"""Compare two fuzzer runs case by case (``python -m tools.fuzz ... --json A`` before a change,
``--json B`` after): outcome, kept reasons, and per site the spec and the cuDNN emission digest. A refactor
that means to change nothing must print "identical".

    python3 tools/fuzz_identity.py before.jsonl after.jsonl [--common]

``--common`` compares only the cases both runs reached (for runs cut off by a time limit).
"""

import json
import sys


def _load(path: str) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out[(r["seed"], r["peer"])] = (r["outcome"], r.get("kept_reasons"), r.get("sites"))
    return out


def main(a: str, b: str, common: bool = False) -> int:
    x, y = _load(a), _load(b)
    if common:
        both = x.keys() & y.keys()
        print(f"comparing the {len(both)} cases both reached ({len(x)} in {a}, {len(y)} in {b})")
        x = {k: v for k, v in x.items() if k in both}
        y = {k: v for k, v in y.items() if k in both}
    if x.keys() != y.keys():
        print(f"different cases: {len(x.keys() - y.keys())} only in {a}, {len(y.keys() - x.keys())} only in {b}")
        return 1
    diff = [k for k in x if x[k] != y[k]]
    for k in diff[:20]:
        print(f"seed {k[0]} {k[1] or ''}:\n  {x[k]}\n  {y[k]}")
    print("identical" if not diff else f"{len(diff)} of {len(x)} cases differ")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3], common="--common" in sys.argv[3:]))
