#!/usr/bin/env bash
# The H200 records for the issues, in two device calls (the default model arrives in two parts):
#   bash benchmarks/h200_final.sh a    ceilings, triage of llama3-8b and hd320-1b, bench llama3-8b with HF eager
#   bash benchmarks/h200_final.sh b    lever sets, triage, bench with HF peers and speculation on the default model
# Source benchmarks/device_env.sh first. Writes into $OUT; each step has its own time limit so one stuck step
# cannot take the rest with it.
set -uo pipefail
kt=(python3 -m kerneltriage)
L="$OUT/ledger-h200.db"
step() { local limit=$1; shift; local s=$SECONDS; timeout "$limit" "$@"; echo "[$? in $((SECONDS - s)) s] $*" | cut -c1-160 >&2; }

a() {
  step 60 "${kt[@]}" ceilings --refresh > "$OUT/ceilings-h200.txt"
  step 200 "${kt[@]}" triage --model llama3-8b --output json --html "$OUT/triage-llama3-8b-h200.html" --ledger "$L" \
    > "$OUT/triage-llama3-8b-h200.json"
  step 120 "${kt[@]}" triage --model hd320-1b -d 4096 -n 64 --output json --html "$OUT/triage-hd320-h200.html" \
    --ledger "$L" > "$OUT/triage-hd320-h200.json"
  step 200 "${kt[@]}" bench --model llama3-8b -p 512 -n 128 -d 0,4096 -r 3 --peers hf --output json --ledger "$L" \
    > "$OUT/bench-llama3-8b-h200.json"
}

b() {
  step 130 python3 benchmarks/decode_levers.py --model default -r 3 --out "$OUT" --sets \
    "none;graphs;packed_qkv,packed_gate_up,last_logits,graphs;packed_qkv,packed_gate_up,last_logits,compile=default,graphs"
  step 90 "${kt[@]}" triage --output json --html "$OUT/triage-default-h200.html" --ledger "$L" > "$OUT/triage-default-h200.json"
  step 240 "${kt[@]}" bench -p 512 -n 128 -d 0,4096 -r 3 --peers hf,hf-static --output json --ledger "$L" \
    > "$OUT/bench-default-h200.json"
  step 200 python3 benchmarks/spec_prompts.py --out "$OUT" -n 96 --per-set 4 --configs \
    "levers=|levers=graphs|levers=packed_qkv,packed_gate_up,last_logits,graphs|spec=ngram|spec=ngram;levers=packed_qkv,packed_gate_up,last_logits"
}

"$@"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("triage-*.json")):
    try:
        print(path.name, *json.loads(path.read_text()).get("headlines", []), sep="\n  ")
    except ValueError:
        print(path.name, "unreadable")
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench-*.json")):
    try:
        rows = json.loads(path.read_text())["rows"]
    except (ValueError, KeyError):
        print(path.name, "unreadable"); continue
    for r in rows:
        print(path.name, {k: r.get(k) for k in ("engine", "test", "status", "rate", "roofline_pct", "bound", "ratio")})
PY
