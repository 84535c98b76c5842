#!/usr/bin/env bash
# The issue's H200 record: pp512 and tg128 at depth 0 and 4096, kerneltriage beside HF eager (and HF
# static-cache generate, which compiles, at depth 0 only: a new depth means a new compile of ~1 min).
#
# Usage (from the repository root, on the GPU machine):
#   bash benchmarks/bench_h200.sh [smollm2|llama3-8b|all]     (default: all, ~7-8 min on an H200)
# Each part alone stays under ~4 min, so the two can run as two separate device calls.
#
# Writes to ${OUT:-benchmarks/results}: ceilings.txt, one JSON per bench invocation, and the ledger.
# KT_MODEL: the default model's GGUF when the machine cannot fetch it (no network): a path to
#   SmolLM2-135M-Instruct.Q4_1.gguf (98 MB). Default: 'default' (fetched into the user cache).
set -euo pipefail

OUT=${OUT:-benchmarks/results}
MODEL=${KT_MODEL:-default}
PART=${1:-all}
LEDGER="$OUT/ledger-h200.db"
mkdir -p "$OUT"
kt() { PYTHONPATH=src python -m kerneltriage "$@"; }

# Expectations (say them before measuring): copy ~4.2 TB/s, bf16 matmul ~780 TFLOP/s (MEASURING.md).
# SmolLM2 decode is launch-bound: eager kerneltriage and HF far below 1% of roofline at tg128, hf-static
# ~300 tok/s; llama3-8b decode reads 15.0 GB of bf16 weights per token: floor ~279 tok/s at 4.19 TB/s,
# HF static ~130 tok/s (~49%), HF eager 31-39 tok/s.
kt ceilings --refresh | tee "$OUT/ceilings-h200.txt"

smollm2() {
  # ~2 min: HF eager loads the GGUF itself (dequantized by transformers), 5 samples per test
  kt bench --model "$MODEL" -p 512 -n 128 -d 0,4096 -r 5 --peers hf --output json --ledger "$LEDGER" \
    > "$OUT/bench-smollm2-h200.json"
  # ~1.5 min: hf-static compiles its decode step on the warm-up (~55 s); decode only (its prefill is hf's)
  kt bench --model "$MODEL" -p 0 -n 128 -d 0 -r 3 --peers hf-static --output json --ledger "$LEDGER" \
    > "$OUT/bench-smollm2-hf-static-h200.json"
}

llama3_8b() {
  # ~2 min: random weights at Llama-3.1-8B shapes; HF gets OUR weights copied in (from_config), 32 GB total
  kt bench --model llama3-8b -p 512 -n 128 -d 0,4096 -r 3 --peers hf --output json --ledger "$LEDGER" \
    > "$OUT/bench-llama3-8b-h200.json"
  # ~2 min: the compile takes ~83 s at this size
  kt bench --model llama3-8b -p 0 -n 128 -d 0 -r 3 --peers hf-static --output json --ledger "$LEDGER" \
    > "$OUT/bench-llama3-8b-hf-static-h200.json"
}

case "$PART" in
  smollm2) smollm2 ;;
  llama3-8b) llama3_8b ;;
  all) smollm2; llama3_8b ;;
  *) echo "usage: $0 [smollm2|llama3-8b|all]" >&2; exit 2 ;;
esac

# A one-screen summary of every row for the note (tok/s, % of roofline, ratio to kerneltriage).
kt ledger export --format md --ledger "$LEDGER" > "$OUT/ledger-h200.md"
python - "$OUT" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench-*-h200.json")):
    for r in json.loads(path.read_text())["rows"]:
        if r["status"] != "ok":
            print(f"{path.stem:34} {r['engine']:13} {r['test']:16} {r['status']}")
            continue
        print(f"{path.stem:34} {r['engine']:13} {r['test']:16} {r['rate']:>10,.1f} tok/s "
              f"{r['roofline_pct']:6.2f}% roofline  x{r['ratio']:.2f} vs kerneltriage")
EOF
