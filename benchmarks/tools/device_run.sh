#!/usr/bin/env bash
# Measurement steps on a GPU machine (or any machine), every result written under $OUT with its provenance.
#
#   OUT=DIR bash benchmarks/tools/device_run.sh STEP...        (from the repository root; --help: this text)
#
# Each sub-step runs under a time limit and prints one line to stderr: "[exit status in N s] command". Nothing
# here times anything itself: every number comes from `kerneltriage` or a tool in benchmarks/tools/, which record
# the git sha, dirty flag, diff hash and command in each file. On a machine without network, source
# benchmarks/device_env.sh first (docs/remote-gpu.md says how the model and wheels get there).
#
# Steps:
#   smoke       tests/test_gpu_smoke.py: the CUDA-only code paths on tiny shapes (~1 min; run it first)
#   gpu-tests   the whole GPU suite (`pytest -m gpu`: the smoke, the real model's levers, speculation and probes, the
#               CUDA cheats, the Triton kernels' tests compiled), split in two: the untimed tests over $WORKERS pytest
#               processes sharing the GPU (pytest-xdist, one test at a time each), then the tests that time something
#               (the probes and the CUDA cheats) in one process with the GPU to themselves; each line stamped with
#               the seconds since the start, so a run cut short by LIMIT_S still says where the time went
#               -> gpu-tests-$DEV.txt
#   ceilings    kerneltriage ceilings --refresh                 -> ceilings-$DEV.txt
#   triage      kerneltriage triage on $MODEL                   -> triage-$NAME-$DEV.json, .html
#   climb       triage on $MODEL, then ab of $HAND against its final set (triage_vs_hand.py)
#               -> triage-$NAME-$DEV.json, .html, .log, ab-$NAME-$DEV-hand-vs-triage.json
#   levers      each lever alone against stock (ab_levers.py)   -> ab-$NAME-$DEV$TAG/ab-*.json
#   bench       bench of $LEVERS beside $PEERS                  -> bench-$NAME-$DEV$TAG.json
#   ab          ab of $A against $B                             -> ab-$NAME-$DEV$TAG.json
#   spec        ab of $LEVERS against $LEVERS;spec=$SPEC, each prompt set of $SETS -> spec-SET-$DEV$TAG.json
#   spec-profile  where a speculative step's time goes (spec_profile.py), each of $SETS
#               -> spec-profile-SET-$DEV$TAG.json
#   delete      issue 33's delete levers on $MODEL, ab at each depth of $DEPTHS (5 pairs): sparse_v's split design
#               on the set without graphs, sparse_v's fused kernel against split-KV under graphs, vocab_compact on a
#               JSON-schema workload (benchmarks/schemas/records.json) on $LEVERS  -> delete-$NAME-$DEV/ab-*.json
#   gguf        write a GGUF of preset $PRESET's shapes with random $QTYPE blocks at /tmp/$PRESET-$QTYPE.gguf (for
#               MODEL=/tmp/...: the same quantized file for kerneltriage and llama.cpp; ~10 s for an 8B); with
#               LIKE=FILE.meta.gguf (`gguf meta`'s copy, e.g. .devmeta/gemma-3-270m.meta.gguf) that model's shapes
#               and real vocabulary instead, at /tmp/NAME-$QTYPE.gguf
#   gemv        each projection shape's GEMV at M = 1 under $LEVERS, GB/s against the copy ceiling (gemv_sweep.py)
#               (and with each of $GEMV_TILES: the quantized GEMV's tiles, BN:VALUES:WARPS:STAGES)
#               -> gemv-$NAME-$DEV$TAG.json
#   kernels     kerneltriage kernel run for each of $KERNELS   -> kernel-NAME-$DEV.txt
#   fused-tiles $LEVERS' decode (tg128) with each of $FUSED_SETS' fused_layer constants, e.g. "QUANT_BK=1024
#               QUANT_BK=1024,BN=8" (the defaults first; fused_tiles.py)    -> fused-tiles-$NAME-$DEV$TAG.json
#   llama-build build llama.cpp's llama-bench from $LLAMA_SRC (CUDA, for $LLAMA_ARCH only; ~5 min for all) for
#               PEERS=llama.cpp
#   index       benchmarks/tools/results_index.py over $OUT    -> $OUT/INDEX.md
#   placeholders  the machine's own paths in $OUT's .json/.txt/.md files written as $KERNELTRIAGE_CACHE, $OUT, the
#               tree's folder name, $VENV, $TMPDIR and ~ (run it last: results are committed without machine paths)
#
# Settings (environment; defaults in brackets):
#   OUT [benchmarks/results]  MODEL [default]  NAME [$MODEL]  DEV [the GPU's short name, e.g. h200; else cpu]
#   LEVERS [the fastest CUDA set below]  PEERS [llama.cpp when $LLAMA_BENCH exists, else none]  SPEC [suffix]
#   SETS [repetitive copy_heavy copy_heavy_holdout summarize open_ended]  PAIRS [5]  TAG [""; e.g. -float32]
#   WORKERS [6: gpu-tests' processes]  A, B [levers= / levers=$LEVERS]  KERNELS [kerneltriage.kernels.rmsnorm:RMSNORM]
#   LIMIT_S [560 per sub-step; past it, SIGABRT: Python prints where each thread was]
#   EXTRA [more flags for every kerneltriage call, e.g. "--dtype float32"]  LLAMA_SRC [llama.cpp's source folder]
#   PRESET, QTYPE, LIKE [llama3-8b, Q4_0, none: the gguf step]  LEDGER [$OUT/ledger-$DEV.db]  DEPTHS [512 4096 7936]
#   HAND [$LEVERS: the best set found by hand, for climb]  LLAMA_ARCH [native: the GPU's own; llama-build]
#   UNGRAPHED, GRAPHED [delete's sets: the best set without graphs, fused_layer and pdl; and with graphs]
set -uo pipefail
if [ $# -eq 0 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0
fi

OUT=${OUT:-benchmarks/results}
MODEL=${MODEL:-default}
NAME=${NAME:-$MODEL}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DEV=${DEV:-$( [ -n "$gpu" ] && echo "${gpu##* }" | tr '[:upper:]' '[:lower:]' || echo cpu)}
LEVERS=${LEVERS:-packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs,prefill_graphs,one_sync}
SPEC=${SPEC:-suffix}
SETS=${SETS:-repetitive copy_heavy copy_heavy_holdout summarize open_ended}
PAIRS=${PAIRS:-5}
WORKERS=${WORKERS:-6}
TAG=${TAG:-}
LIMIT_S=${LIMIT_S:-560}
LLAMA_SRC=${LLAMA_SRC:-/tmp/llama.cpp}
LLAMA_BENCH=${LLAMA_BENCH:-$LLAMA_SRC/build/bin/llama-bench}
LEDGER=${LEDGER:-$OUT/ledger-$DEV.db}
read -r -a extra <<< "${EXTRA:-}"
mkdir -p "$OUT"

kt=(python3 -m kerneltriage)
# a step past LIMIT_S gets SIGABRT, on which Python's faulthandler prints every thread's stack: a hang says where
export PYTHONFAULTHANDLER=1
step() {
  local s=$SECONDS; timeout -s ABRT -k 15 "$LIMIT_S" "$@"; echo "[$? in $((SECONDS - s)) s] $*" | cut -c1-160 >&2
}
peers() { [ -n "${PEERS:-}" ] && echo "$PEERS" || { [ -x "$LLAMA_BENCH" ] && echo llama.cpp; }; }

run_step() {
  case "$1" in
    smoke) step python3 -m pytest -q -x tests/test_gpu_smoke.py ;;
    gpu-tests) local timed=(tests/test_gpu_probes.py tests/cheats/test_cheats_gpu.py) t0=$SECONDS
      { step python3 -m pytest -v -rs -m gpu -p no:cacheprovider --durations=25 -n "$WORKERS" --dist load \
          "${timed[@]/#/--ignore=}" tests
        step python3 -m pytest -v -m gpu -p no:cacheprovider --durations=10 "${timed[@]}"
        echo "gpu-tests: both parts in $((SECONDS - t0)) s"; } 2>&1 \
        | while IFS= read -r line; do printf "%4d s  %s\n" $((SECONDS - t0)) "$line"; done > "$OUT/gpu-tests-$DEV.txt"
      tail -2 "$OUT/gpu-tests-$DEV.txt" >&2 ;;
    ceilings) step "${kt[@]}" ceilings --refresh "${extra[@]}" > "$OUT/ceilings-$DEV.txt" ;;
    triage) step "${kt[@]}" triage --model "$MODEL" "${extra[@]}" --output json --html "$OUT/triage-$NAME-$DEV.html" \
              --ledger "$LEDGER" > "$OUT/triage-$NAME-$DEV.json" ;;
    climb) step python3 benchmarks/tools/triage_vs_hand.py --model "$MODEL" --hand "${HAND:-$LEVERS}" --out "$OUT" \
             --tag "$NAME-$DEV" --pairs 8 ${extra[@]:+-- "${extra[@]}"} ;;
    levers) step python3 benchmarks/tools/ab_levers.py --model "$MODEL" --out "$OUT/ab-$NAME-$DEV$TAG" \
              -p 512 -n 16 -r 16 --ledger "$LEDGER" ;;
    bench) local p llama=(); p=$(peers); [ -x "$LLAMA_BENCH" ] && llama=(--llama-bench "$LLAMA_BENCH")
      step "${kt[@]}" bench --model "$MODEL" --levers "$LEVERS" ${p:+--peers "$p"} "${llama[@]}" "${extra[@]}" \
        -p 512 -n 128 -d 0,2048,4096 -r 5 --output json --ledger "$LEDGER" > "$OUT/bench-$NAME-$DEV$TAG.json" ;;
    ab) step "${kt[@]}" ab --model "$MODEL" --a "${A:-levers=}" --b "${B:-levers=$LEVERS}" "${extra[@]}" -p 512 -n 128 \
          -r 8 --output json --ledger "$LEDGER" > "$OUT/ab-$NAME-$DEV$TAG.json" ;;
    spec) for set in $SETS; do
        step "${kt[@]}" ab --model "$MODEL" --a "levers=$LEVERS" --b "levers=$LEVERS;spec=$SPEC" "${extra[@]}" \
          --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r "$PAIRS" --output json --ledger "$LEDGER" \
          > "$OUT/spec-$set-$DEV$TAG.json"
      done ;;
    spec-profile) for set in $SETS; do
        step python3 benchmarks/tools/spec_profile.py --model "$MODEL" --config "levers=$LEVERS;spec=$SPEC" \
          --set "$set" --out "$OUT/spec-profile-$set-$DEV$TAG.json" > /dev/null
      done ;;
    delete) local d dir="$OUT/delete-$NAME-$DEV" split=kerneltriage.kernels.split_kv_attention:SPLIT_KV
      local sparse=kerneltriage.kernels.sparse_v_attention:SPARSE_V; mkdir -p "$dir"
      # the split design syncs the host each layer: no graphs beside it; the fused kernel replaces attention, which
      # fused_layer would take over: neither fused_layer nor pdl beside it
      local nographs=${UNGRAPHED:-packed_qkv,packed_gate_up,last_logits,fused_norm,prefill_graphs,one_sync}
      local graphed=${GRAPHED:-packed_qkv,packed_gate_up,last_logits,fused_norm,graphs,prefill_graphs,one_sync}
      for d in ${DEPTHS:-512 4096 7936}; do
        # eager steps that sync the host each layer: 32 tokens a sample (128 ran past 140 s on the H200)
        step "${kt[@]}" ab --model "$MODEL" --a "levers=$nographs" --b "levers=$nographs,sparse_v" "${extra[@]}" \
          -d "$d" -p 64 -n 32 -r 5 --output json --ledger "$LEDGER" > "$dir/ab-sparse-v-split-d$d.json"
        step "${kt[@]}" ab --model "$MODEL" --a "levers=$graphed,kernel=$split" --b "levers=$graphed,kernel=$sparse" \
          "${extra[@]}" -d "$d" -p 64 -n 128 -r 5 --output json --ledger "$LEDGER" > "$dir/ab-sparse-v-fused-d$d.json"
        step "${kt[@]}" ab --model "$MODEL" --json-schema benchmarks/schemas/records.json --a "levers=$LEVERS" \
          --b "levers=$LEVERS,vocab_compact" "${extra[@]}" -d "$d" -p 64 -n 128 -r 5 --output json \
          --ledger "$LEDGER" > "$dir/ab-vocab-compact-records-d$d.json"
      done ;;
    gguf) local base; if [ -n "${LIKE:-}" ]; then base=$(basename "$LIKE" .gguf); base=${base%.meta}; else
        base=${PRESET:-llama3-8b}; fi
      [ -f "/tmp/$base-${QTYPE:-Q4_0}.gguf" ] || step "${kt[@]}" gguf write \
        $([ -n "${LIKE:-}" ] && echo --like "$LIKE" || echo --preset "$base") --type "${QTYPE:-Q4_0}" \
        "/tmp/$base-${QTYPE:-Q4_0}.gguf" ;;
    gemv) local t tiles=(); for t in ${GEMV_TILES:-}; do tiles+=(--tiles "$t"); done
      step python3 benchmarks/tools/gemv_sweep.py --model "$MODEL" --levers "$LEVERS" "${tiles[@]}" "${extra[@]}" \
        --out "$OUT/gemv-$NAME-$DEV$TAG.json" ;;
    fused-tiles) local t sets=(--set ""); for t in ${FUSED_SETS:-}; do sets+=(--set "$t"); done
      step python3 benchmarks/tools/fused_tiles.py --model "$MODEL" --levers "$LEVERS" "${sets[@]}" "${extra[@]}" \
        --out "$OUT/fused-tiles-$NAME-$DEV$TAG.json" ;;
    kernels) for k in ${KERNELS:-kerneltriage.kernels.rmsnorm:RMSNORM}; do
        local short=${k%%:*}; short=${short##*.}
        step "${kt[@]}" kernel run --kernel "$k" --model "$MODEL" "${extra[@]}" --ledger "$LEDGER" \
          > "$OUT/kernel-$short-$DEV.txt" 2>&1
      done ;;
    llama-build) [ -x "$LLAMA_BENCH" ] || step bash -c "cmake -S '$LLAMA_SRC' -B '$LLAMA_SRC/build' -DGGML_CUDA=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=${LLAMA_ARCH:-native} > /dev/null \
        && cmake --build '$LLAMA_SRC/build' --target llama-bench -j $(nproc) > /dev/null" ;;
    index) step python3 benchmarks/tools/results_index.py --dir "$OUT" --write ;;
    placeholders) local f venv out; venv=$(python3 -c 'import sys; print(sys.prefix)'); out=$(realpath "$OUT")
      for f in "$OUT"/*.json "$OUT"/*.txt "$OUT"/*.md; do
        [ -f "$f" ] || continue
        sed -i -e "${KERNELTRIAGE_CACHE:+s#$KERNELTRIAGE_CACHE#\$KERNELTRIAGE_CACHE#g}" \
          -e "s#$out#\$OUT#g" -e "s#$venv#\$VENV#g" -e "s#$PWD#$(basename "$PWD")#g" \
          -e "s#${TMPDIR:-/tmp}/#\$TMPDIR/#g" -e "s#$HOME/#~/#g" "$f"
      done ;;
    *) echo "device_run.sh: unknown step '$1' (bash benchmarks/tools/device_run.sh --help lists them)" >&2; exit 2 ;;
  esac
}

for name in "$@"; do run_step "$name"; done
