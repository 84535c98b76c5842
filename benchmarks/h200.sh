#!/usr/bin/env bash
# This session's H200 records: `bash benchmarks/h200.sh STEP...` runs the steps in turn (each prints a line per
# sub-step with its exit status and seconds; results land in $OUT, packed into $OUT/0-STEP1-STEP2….tgz as well since a
# call returns at most 8 files, the first by name: the archive sorts first).
#   smoke           the CUDA code paths the CPU cannot run, on tiny shapes (~1 min)
#   8b              the lever table of the llama3-8b preset under the one verdict rule, then its triage (no default
#                   model needed); default: the same for the default model (needs both model parts)
#   gpu-tests       tests/test_gpu.py
#   probe           llama.cpp building in the background (from .llamasrc, ~5 min), meanwhile the quantized GEMV,
#                   prefill graphs and smoke tests on tiny models
#   distill-train   a 2-layer draft distilled from the default model (training only: may share the host)
#   llamacpp        the decode set beside llama.cpp on the same GGUF at depths 0, 2048, 4096 (waits for the build)
#   prefill-graphs  ab of prefill_graphs alone on the default model
#   fused-tests     tests/test_fused_layer.py on the GPU (the kernels compiled, not interpreted)
#   verify-tiles    the verify GEMVs' tile and pipelining candidates (benchmarks/verify_tiles_probe.py; no model needed)
#   verify-kernels  each kernel's µs in a plain step and in verifies, and candidates against the verify's extra time
#                   (CANDS: which of verify_kernels_probe.CANDIDATES, comma-separated; TAG suffixes the file)
#   verify-host     the host's share of a graphed verify step, call by call (no model needed)
#   spec-profile    where a speculative verify step's time goes (benchmarks/spec_profile.py), two prompt sets
#   quantized       ab of the quantized GEMV on the default model
#   kernels         kernel run of split_kv_attention and silu_gemv (IEEE float32; needs the model)
#   spec            suffix speculation vs the fused set on the four prompt sets and the held-out one (needs the model)
#   spec-shapes     ab of suffix:15 (one 16-row verify shape) against suffix (16 and 32 rows) on two sets
#   spec-gpu-tests  tests/test_gpu.py's speculation tests (graphed verifies, both padded shapes; needs the model)
#   cond-probe      one graph choosing a plain step or a 16-row verify through a CUDA SWITCH node (no model needed)
#   host-pace       the host's pace round by round in one process, by default, pinned to a core, without the GC
#   resident-tests  resident steps' tests on the GPU (tiny models; the real model's with both parts)
#   resident-profile  spec_profile.py with one_sync (resident steps) on repetitive and open_ended
#   resident-trace  every resident step of copy_heavy and repetitive (all prompts) and the texts the device wrote,
#                   then the replay over those texts (no CPU text in the way)
#   resident-passes copy_heavy and summarize timed 6 passes in a row on one runner (ab's samples), each pass's steps
#   resident-ab     host-fed against resident steps (the fused set without and with one_sync) on two sets
#   resident        the fused set against it + spec=suffix (resident steps), every prompt set; resident-float32
#                   the same in float32 on two sets (tokens identical)
#   spec-float32    suffix speculation in float32 on repetitive and copy_heavy (exactness: identical tokens)
#   ngram           n-gram lookup speculation on open_ended, repetitive, copy_heavy
#                   (spec, spec-float32, ngram and spec-profile name their files with $TAG, default "fused")
#   distill         ab of spec=draft:(the distilled draft) on the four prompt sets (trains it first if needed)
#   eagle-train     the EAGLE-style head trained on the default model (distill --eagle) into /tmp/kt-eagle.safetensors
#   eagle           ab of spec=eagle:(that head) on three prompt sets (trains it first if needed), auto depth and k=3
#   eagle-gpu-tests tests/test_gpu.py's EAGLE test (graphed prefill, plain steps and verifies feed the head)
#   sources         ab of spec=ngram and spec=draft:(the distilled draft) on copy_heavy and open_ended
#   mlx-tf32        mlx-lm's float16 decode with MLX_ENABLE_TF32 1 and 0 (needs all four parts)
#   mlx             MLX's CUDA backend: bench beside torch's best set, mlx-lm and llama.cpp (when built), then triage
#                   on MLX (needs the model and MLX's CUDA build: all four parts)
# Set-up here first (git-excluded, never committed): the gguf wheel the device lacks,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0
# and the default model and MLX's CUDA build in four parts under the carry limit (device_env.sh says how). A call
# carries .whl (.mlxwhl for mlx, .llamasrc for llamacpp) and one of .devblob/1..4 (earlier parts in earlier calls on
# the same warm machine)
# and runs `source benchmarks/device_env.sh; bash benchmarks/h200.sh STEP`.
set -uo pipefail
kt=(python3 -m kerneltriage)
L="$OUT/ledger-h200.db"
step() { local limit=$1; shift; local s=$SECONDS; timeout "$limit" "$@"; echo "[$? in $((SECONDS - s)) s] $*" | cut -c1-160 >&2; }
# Every lever alone against stock, then the best set; pp512 + tg16 and 16 pairs: triage's own lever settings on CUDA
# (the 2026-11-30 tables ran 8 pairs: benchmarks/results/).
# Triage's own levers first (its recommendations are compared with these rows), then the rest.
TABLE="levers=graphs|levers=last_logits|levers=one_sync|levers=packed_qkv|levers=packed_gate_up|levers=compile=default"
TABLE+="|levers=fused_norm|levers=sdpa_backend=flash|levers=sdpa_backend=efficient|levers=sdpa_fold|levers=flex_decode"
TABLE+="|levers=packed_qkv,packed_gate_up,last_logits,fused_norm,compile=default,graphs"
TRIAGED="levers=graphs|levers=last_logits|levers=one_sync|levers=packed_qkv|levers=packed_gate_up"
BEST=packed_qkv,packed_gate_up,last_logits,fused_norm,compile=default,graphs
# issue 13's set (bench-default-h200-llamacpp-pdl.json without prefill_graphs: 2,059 / 1,637 tok/s decode)
FUSED=packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs,prefill_graphs,one_sync
MLX_BEST=quantized,packed_qkv,packed_gate_up,last_logits,compile=default,one_sync
LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench
table() {  # model, folder[, candidates]
  step 560 python3 benchmarks/ab_levers.py --model "$1" --out "$OUT/$2" -p 512 -n 16 -r 16 --ledger "$L" \
    --candidates "${3:-$TABLE}"
}
triage() {  # model, name
  step 560 "${kt[@]}" triage --model "$1" --output json --html "$OUT/triage-$2-h200.html" --ledger "$L" \
    > "$OUT/triage-$2-h200.json"
}
run_step() {
case "$1" in
  smoke) step 300 python3 -m pytest -q -x tests/test_gpu_smoke.py ;;
  8b) table llama3-8b ab-llama3-8b; triage llama3-8b llama3-8b ;;
  8b-table) table llama3-8b ab-llama3-8b ;;
  8b-triaged) table llama3-8b ab-llama3-8b "$TRIAGED" ;;
  8b-triage) triage llama3-8b llama3-8b ;;
  default) table default ab-default; triage default default ;;
  default-table) table default ab-default ;;
  default-triaged) table default ab-default "$TRIAGED" ;;
  default-triage) triage default default ;;
  gpu-tests) step 560 python3 -m pytest -q tests/test_gpu.py ;;
  llamacpp-build)  # (skipped while `probe`'s background build runs: two cmakes in one folder would collide)
    kill -0 "$(cat /tmp/llama-build.pid 2> /dev/null)" 2> /dev/null && [ "$(cat /tmp/llama-build.pid)" != $$ ] && return
    [ -x "$LLAMA_BENCH" ] || step 420 bash -c "cmake -S /tmp/llama.cpp -B /tmp/llama.cpp/build -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
      > /tmp/llama-cmake.log && cmake --build /tmp/llama.cpp/build --target llama-bench -j 14 > /tmp/llama-build.log" ;;
  probe)  # llama.cpp building in its own session (it outlives this call: `llamacpp` waits for it), meanwhile the
    # CUDA paths on tiny models: quantized's GEMV, prefill graphs, the smoke tests (no default model needed)
    NO_TAR=1 setsid bash "$0" llamacpp-build > /tmp/llama-build.out 2>&1 < /dev/null &
    echo $! > /tmp/llama-build.pid
    step 240 python3 -m pytest -q tests/test_quant_gemv.py tests/test_prefill_graphs.py tests/test_gpu_smoke.py \
      > "$OUT/gpu-smoke-h200.txt" 2>&1 ;;
  wait-build)  # until the background build of `probe` has written llama-bench (or has stopped)
    step 420 bash -c "while [ ! -x $LLAMA_BENCH ] && kill -0 \$(cat /tmp/llama-build.pid 2> /dev/null) 2> /dev/null; do
      sleep 5; done" ;;
  distill-train)  # the drafter's training: no timing in it, so it may share the host with the build
    step 300 "${kt[@]}" distill --layers 2 --steps 600 --out /tmp/kt-draft --output json \
      > "$OUT/distill-default-h200.json" ;;
  llamacpp)  # issue 13's must: the decode set beside llama.cpp on the same GGUF at depths 0, 2048 and 4096
    run_step wait-build; run_step llamacpp-build
    step 260 "${kt[@]}" bench --levers "$FUSED" --peers llama.cpp --llama-bench "$LLAMA_BENCH" \
      -p 512 -n 128 -d 0,2048,4096 -r 5 --output json --ledger "$L" > "$OUT/bench-default-h200-llamacpp.json" ;;
  prefill-graphs)  # prefill_graphs alone on the real model (pdl alone: ab-default-h200-pdl.json, 2026-12-01)
    step 150 "${kt[@]}" ab --a "levers=${FUSED/,prefill_graphs/}" --b "levers=$FUSED" -p 512 -n 128 -r 8 \
      --output json --ledger "$L" > "$OUT/ab-default-h200-prefill-graphs.json" ;;
  cond-probe) step 240 python3 benchmarks/cond_step_probe.py --out "$OUT/cond-step-smollm2-preset-h200.json" ;;
  fused-tests) step 300 python3 -m pytest -q tests/test_fused_layer.py > "$OUT/gpu-fused-layer-h200.txt" 2>&1 ;;
  verify-tiles)
    step 400 python3 benchmarks/verify_tiles_probe.py --out "$OUT/verify-tiles-smollm2-preset-h200-split-gemv.json" ;;
  verify-kernels)  # each kernel's µs in a plain step and 9/16/32-row verifies, and candidates against the verify's
    # extra time (PDL, the L2 prefetch, tl.dot warps, a gathered embedding), interleaved in one process (no model needed)
    step 420 python3 benchmarks/verify_kernels_probe.py --out "$OUT/verify-kernels-smollm2-preset-h200${TAG:+-$TAG}.json" \
      ${CANDS:+--candidates "$CANDS"} ;;
  verify-host)  # the host's share of a graphed verify step, call by call (no model needed)
    step 120 python3 benchmarks/verify_host_probe.py --out "$OUT/verify-host-smollm2-preset-h200.json" ;;
  spec-profile)  # where a verify step's time goes: the decoder's calls on the host, the verify's kernels
    for set in repetitive open_ended; do
      step 120 python3 benchmarks/spec_profile.py --set $set --out "$OUT/spec-profile-$set-h200-${TAG:-fused}.json" \
        > /dev/null
    done ;;
  quantized)  # the quantized GEMV (the default GGUF is Q4_1) against the same stock-weight set
    step 150 "${kt[@]}" ab --a "levers=last_logits,fused_norm,graphs,one_sync" \
      --b "levers=quantized,last_logits,fused_norm,graphs,one_sync" -p 512 -n 128 -r 8 --output json --ledger "$L" \
      > "$OUT/ab-default-h200-quantized.json" ;;
  kernels)  # issue 13's ledger: the two tl.dot candidates again, IEEE float32 now (2026-11-30 they were invalid: TF32)
    for k in split_kv_attention:SPLIT_KV silu_gemv:SILU_GEMV; do
      step 200 "${kt[@]}" kernel run --kernel "kerneltriage.kernels.$k" --ledger "$L" > "$OUT/kernel-${k%%:*}.txt" 2>&1
    done ;;
  spec)  # issue 14: suffix speculation on the fused set, every prompt set (one_sync's loop is the decoder's under spec)
    for set in copy_heavy repetitive summarize open_ended copy_heavy_holdout; do
      step 140 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=suffix" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-suffix-${TAG:-fused}.json"
    done ;;
  spec-shapes)  # the 32-row verify shape alone: suffix:15 drafts at most what one 16-row shape holds
    for set in copy_heavy repetitive; do
      step 140 "${kt[@]}" ab --a "levers=${FUSED%,one_sync};spec=suffix:15" --b "levers=${FUSED%,one_sync};spec=suffix" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-shapes.json"
    done ;;
  spec-gpu-tests) step 300 python3 -m pytest -q tests/test_gpu.py -k speculation > "$OUT/gpu-spec-h200.txt" 2>&1 ;;
  host-pace)  # is the host's pace drift the process's or the machine's (host_pace_probe.py; no model): each variant
    # in its own process, alternately
    for n in 1 2; do for v in default pin no-gc; do
      flag=(); [ $v != default ] && flag=(--$v)
      step 60 python3 benchmarks/host_pace_probe.py "${flag[@]}" --out "$OUT/host-pace-$v-$n.json" > /dev/null
    done; done ;;
  resident-tests)  # resident steps: the draft and acceptance kernels compiled, tiny models in SWITCH graphs
    # (no model needed), then the real model's greedy tokens through them (needs the model)
    step 200 python3 -m pytest -q tests/test_spec_resident.py > "$OUT/gpu-resident-h200.txt" 2>&1
    [ -f "$KERNELTRIAGE_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] && \
      step 300 python3 -m pytest -q tests/test_gpu.py -k resident >> "$OUT/gpu-resident-h200.txt" 2>&1 ;;
  resident-profile)  # where a resident speculative step's time goes, beside the host-fed one (the same levers)
    for set in repetitive open_ended; do
      step 150 python3 benchmarks/spec_profile.py --config "levers=${FUSED/,prefill_graphs/};spec=suffix" --set $set \
        --out "$OUT/spec-profile-$set-h200-resident.json" > /dev/null
    done ;;
  resident-trace)  # per-step rows, match, seconds and limits of resident runs; the device's own greedy texts replayed
    for set in copy_heavy repetitive; do
      step 200 python3 benchmarks/spec_profile.py --config "levers=${FUSED/,prefill_graphs/};spec=suffix" --set $set \
        --per-set 16 --iters 50 --out "$OUT/spec-trace-$set-h200.json" --texts-out "/tmp/texts-$set.json" > /dev/null
      step 100 python3 benchmarks/draft_replay.py --texts "/tmp/texts-$set.json" --sets $set --sources suffix \
        --resident 1:1.02,16:1.29,32:1.63 --verify-costs 16:1.43,32:1.8 --host-gap 0.15 \
        --out "$OUT/draft-replay-h200-texts-$set.json" > /dev/null
    done ;;
  resident-passes)  # copy_heavy's two paces (round 12): the set timed 6 times in a row on one runner, as ab's
    # warm-up and 5 samples run B, every pass's steps, counts and host calls; the same for summarize
    for set in copy_heavy summarize; do
      step 200 python3 benchmarks/spec_profile.py --config "levers=${FUSED/,prefill_graphs/};spec=suffix" --set $set \
        --per-set 16 --iters 20 --passes 6 --out "$OUT/spec-passes-$set-h200${TAG:+-$TAG}.json" > /dev/null
    done ;;
  resident-ab)  # the change itself: host-fed verifies (the decoder's own loop) against resident ones (+ one_sync)
    for set in repetitive copy_heavy; do
      step 150 "${kt[@]}" ab --a "levers=${FUSED%,one_sync};spec=suffix" --b "levers=$FUSED;spec=suffix" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-resident-vs-host${TAG:+-$TAG}.json"
    done ;;
  resident)  # issue 14's table with resident steps: the best plain set, and the same set + spec=suffix
    for set in ${SETS:-repetitive copy_heavy copy_heavy_holdout summarize open_ended}; do
      step 150 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=$FUSED;spec=suffix" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-suffix-resident${TAG:+-$TAG}.json"
    done ;;
  resident-float32)  # exactness: resident in float32, tokens identical to plain decoding's
    for set in repetitive copy_heavy; do
      step 150 "${kt[@]}" ab --dtype float32 --a "levers=$FUSED" --b "levers=$FUSED;spec=suffix" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-suffix-resident-float32.json"
    done ;;
  spec-float32)  # issue 14's exactness: suffix in float32 (tokens identical to plain decode's) on two sets
    for set in repetitive copy_heavy; do
      step 150 "${kt[@]}" ab --dtype float32 --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=suffix" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-suffix-${TAG:-fused}-float32.json"
    done ;;
  ngram)  # issue 14's n-gram lookup (prompt lookup decoding) beside suffix, on the sets where they differ most
    for set in open_ended repetitive copy_heavy; do
      step 120 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=ngram" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-ngram-${TAG:-fused}.json"
    done ;;
  distill)  # issue 14's trained drafter (distill-train first), ab of spec=draft:it on every prompt set
    [ -d /tmp/kt-draft ] || run_step distill-train
    for set in copy_heavy repetitive summarize open_ended; do
      step 120 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=draft:/tmp/kt-draft" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-distilled-fused.json"
    done ;;
  eagle-train)  # issue 14's trained head: greedy and 3 sampled answers of 52 prompts, 128 tokens each
    step 400 "${kt[@]}" distill --eagle --samples 3 --continuation 128 --out /tmp/kt-eagle.safetensors --output json \
      > "$OUT/eagle-default-h200.json"
    cp /tmp/kt-eagle.safetensors "$OUT/" ;;  # the head (8 MB) comes back for the next machine: never committed
  eagle)  # ab of the head beside the fused set: auto depth on three sets, a fixed k = 3 on open_ended
    [ -f /tmp/kt-eagle.safetensors ] || cp .eaglehead/kt-eagle.safetensors /tmp/ 2>/dev/null || run_step eagle-train
    for set in open_ended summarize copy_heavy_holdout; do
      step 150 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=eagle:/tmp/kt-eagle.safetensors" \
        --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
        > "$OUT/spec-$set-h200-eagle.json"
    done
    step 150 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=eagle:/tmp/kt-eagle.safetensors;depth=3" \
      --prompts benchmarks/prompts/open_ended.jsonl -p 0 -n 64 -r 5 --output json --ledger "$L" \
      > "$OUT/spec-open_ended-h200-eagle-k3.json" ;;
  eagle-profile)  # where an eagle run's time goes (spec_profile.py: the decoder's calls, captures in timed runs)
    [ -f /tmp/kt-eagle.safetensors ] || cp .eaglehead/kt-eagle.safetensors /tmp/ 2>/dev/null || run_step eagle-train
    step 150 python3 benchmarks/spec_profile.py --config "levers=${FUSED%,one_sync};spec=eagle:/tmp/kt-eagle.safetensors" \
      --set open_ended --per-set 16 --out "$OUT/spec-profile-open_ended-h200-eagle.json" > /dev/null ;;
  eagle-gpu-tests) step 200 python3 -m pytest -q tests/test_gpu.py -k eagle > "$OUT/gpu-eagle-h200.txt" 2>&1 ;;
  sources)  # issue 14's per-source comparison on one copy-heavy and one open-ended set: n-gram lookup and the
    # distilled draft (trained first if needed) beside suffix (spec step)
    [ -d /tmp/kt-draft ] || run_step distill-train
    for set in copy_heavy open_ended; do
      for source in ngram draft:/tmp/kt-draft; do
        step 120 "${kt[@]}" ab --a "levers=$FUSED" --b "levers=${FUSED%,one_sync};spec=$source" \
          --prompts "benchmarks/prompts/$set.jsonl" -p 0 -n 64 -r 5 --output json --ledger "$L" \
          > "$OUT/spec-$set-h200-${source%%:*}-fused.json"
      done
    done ;;
  mlx-tf32)  # issue 15: did MLX_ENABLE_TF32=0 (set by our MLX backend) halve mlx-lm's float16 decode? one process each
    for v in 1 0; do step 120 env MLX_ENABLE_TF32=$v python3 benchmarks/mlx_tf32_probe.py >> "$OUT/mlx-tf32-probe-h200.jsonl"; done ;;
  mlx)  # MLX's CUDA backend beside torch's best set on the same GGUF (float16: quantized keeps the GGUF's fp16 scales)
    peers="torch:${BEST//,/+},mlx-lm"; llama=()
    [ -x "$LLAMA_BENCH" ] && peers+=",llama.cpp" && llama=(--llama-bench "$LLAMA_BENCH")
    step 300 "${kt[@]}" bench --backend mlx --device cuda --dtype float16 --levers "$MLX_BEST" --peers "$peers" \
      "${llama[@]}" -p 512 -n 128 -d 0,2048 -r 5 --output json --ledger "$L" > "$OUT/bench-default-h200-mlx.json"
    step 240 "${kt[@]}" triage --backend mlx --device cuda --dtype float16 --output json \
      --html "$OUT/triage-default-h200-mlx.html" --ledger "$L" > "$OUT/triage-default-h200-mlx.json" ;;
  *) echo "usage: bash benchmarks/h200.sh STEP... (steps: smoke 8b 8b-table 8b-triaged 8b-triage default default-table default-triaged default-triage gpu-tests fused-tests verify-tiles probe wait-build distill-train llamacpp-build llamacpp prefill-graphs spec-profile quantized kernels spec spec-shapes spec-gpu-tests spec-float32 host-pace resident-tests resident-profile resident-ab resident resident-float32 ngram distill sources mlx-tf32 mlx)" >&2
     exit 2 ;;
esac
}
[ $# -gt 0 ] || run_step usage
for name in "$@"; do run_step "$name"; done
[ -n "${NO_TAR:-}" ] || tar czf "$OUT/0-$(IFS=-; echo "$*").tgz" -C "$OUT" $(cd "$OUT" && ls -d ab-* bench-* triage-* spec-* fused-* host-* mlx-* kernel-* gpu-* distill-* verify-* ledger-h200.db 2>/dev/null) 2>/dev/null
