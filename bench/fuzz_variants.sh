#!/usr/bin/env bash
# Re-run fuzz cases (tab-separated "tag<TAB>case-json" lines) one by one with per-tensor errors.
while IFS=$'\t' read -r tag case; do
  echo "== $tag"
  python3 -m te_compile.testing.fuzz --device cuda --case "$case" -v 2>&1 | grep -E "^(pass|kept|wrong|invalid|---)|fuzz cuda" | cut -c1-300
done < "${1:-bench/fuzz_variants.txt}"
