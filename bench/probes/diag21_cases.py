"""Run each case of diag21_cases.jsonl in its own process (a sticky CUDA error poisons the context):
    python3 bench/probes/diag21_cases.py [NAME_PREFIX ...]   (LD_PRELOAD=$CUDNN_NEW for the new cuDNN)"""
import json, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "diag21_cases.jsonl"))]
want = sys.argv[1:]
for r in rows:
    if want and not any(r["name"].startswith(w) for w in want):
        continue
    p = subprocess.run([sys.executable, "-m", "te_compile.testing.fuzz", "--device", "cuda", "--case", json.dumps(r["case"]),
                        "-v"] + [x for e in os.environ.get("EMIT", "").split() for x in ("--emit", e)], capture_output=True, text=True, timeout=300)
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith(("pass", "kept", "invalid", "---", "fuzz cuda", "torch.", "RuntimeError", "cudnn"))]
    print(r["name"], "rc", p.returncode, "|", " | ".join(l[:250] for l in lines[:4]), flush=True)
