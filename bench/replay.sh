#!/usr/bin/env bash
while IFS=$'\t' read -r tag case; do echo "== $tag"; python3 bench/replay_case.py "$case" 2>&1 | grep -v "Warn\|leaked\|nanobind\|^ - \|_warn_once\|^$\|SOLUTION\|torch.nn.attention\|This will\|If you want"; done < "${1:-bench/replay.txt}"
