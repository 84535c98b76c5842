#!/usr/bin/env bash
# Prepares, on a machine with network, what a GPU machine without network needs beside the tree (docs/remote-gpu.md):
# .whl/ (gguf, llguidance, pytest-xdist), .mlxwhl/ (mlx, mlx-lm), .devblob/1..4 (the default model, then MLX's CUDA
# build as xz, 50 MB parts), .llamasrc/ (llama.cpp's source), .devmeta/ (Gemma-3's metadata and vocabulary without
# weights). All git-ignored; each is skipped when present. Run from the repository root with the venv installed
# (make install); ~3 min, most of it xz.
#   bash benchmarks/tools/device_prep.sh          all of it
#   bash benchmarks/tools/device_prep.sh whl      only the wheels (enough for presets)
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || { echo "device_prep: $PY: not found; expected the venv (make install) or PY=python" >&2; exit 2; }
TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! ls .whl/gguf-0.19.0-*.whl .whl/llguidance-1.9.1-*.whl .whl/pytest_xdist-3.8.0-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q "${TARGET[@]}" --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0
  "$PY" -m pip download -q "${TARGET[@]}" --platform manylinux_2_31_x86_64 -d .whl llguidance==1.9.1
  "$PY" -m pip download -q "${TARGET[@]}" --platform manylinux_2_28_x86_64 -d .whl pytest-xdist==3.8.0 execnet==2.1.2
fi
echo ".whl: $(ls .whl | tr '\n' ' ')"
[ "${1:-}" = "whl" ] && exit 0

if ! ls .mlxwhl/mlx-0.32.4-*.whl .mlxwhl/mlx_lm-0.32.2-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q "${TARGET[@]}" --platform manylinux_2_35_x86_64 -d .mlxwhl mlx==0.32.4 mlx-lm==0.32.2
fi
echo ".mlxwhl: $(ls .mlxwhl | tr '\n' ' ')"

if [ ! -f .devblob/4/blobpart.3 ]; then
  model=$("$PY" -c "from kerneltriage.engine import fetch; print(fetch.default_model_path())")
  size=$(stat -c %s "$model")
  want=$(sed -n 's/^MODEL_BYTES=//p' benchmarks/device_env.sh)
  [ "$size" = "$want" ] || { echo "device_prep: $model is $size bytes; device_env.sh expects $want" >&2; exit 2; }
  "$PY" -m pip download -q "${TARGET[@]}" --platform manylinux_2_35_x86_64 -d "$tmp" mlx-cuda-13==0.32.4
  mkdir "$tmp/x" && (cd "$tmp/x" && unzip -q "$tmp"/mlx_cuda_13-0.32.4-*.whl && tar cf - . | xz -9e -T2 > "$tmp/mlx.xz")
  (cd "$tmp" && cat "$model" mlx.xz | split -b 50000000 -d -a 1 - blobpart.)
  [ -f "$tmp/blobpart.3" ] && [ ! -f "$tmp/blobpart.4" ] || { echo "device_prep: expected 4 parts" >&2; exit 1; }
  for n in 0 1 2 3; do mkdir -p .devblob/$((n + 1)) && mv "$tmp/blobpart.$n" .devblob/$((n + 1))/; done
fi
echo ".devblob: $(du -sh .devblob | cut -f1) in $(ls .devblob/*/blobpart.* | wc -l) parts"

if [ ! -f .llamasrc/llama.cpp.tar.xz ]; then
  "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" llama-cpp-python==0.3.36
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  mkdir -p .llamasrc
  tar cf - -C "$tmp/llama_cpp_python-0.3.36/vendor" --exclude=llama.cpp/models --exclude=llama.cpp/docs \
    --exclude=llama.cpp/media --exclude=llama.cpp/.github llama.cpp | xz -9 -T2 > .llamasrc/llama.cpp.tar.xz
fi
echo ".llamasrc: $(du -h .llamasrc/llama.cpp.tar.xz | cut -f1)"

# Gemma-3-270M's metadata and vocabulary without its weights (6.5 MB, not 238): `gguf write --like` makes a
# random-weight Gemma-3 with the real 262k vocabulary on the device (device_run.sh gguf with LIKE=...)
if [ ! -f .devmeta/gemma-3-270m.meta.gguf ]; then
  gemma=$("$PY" -c "from kerneltriage.engine import fetch as f; print(f.published_model_path(f.PUBLISHED['gemma3-270m']))" \
    | tail -1)
  mkdir -p .devmeta && "$PY" -m kerneltriage gguf meta "$gemma" .devmeta/gemma-3-270m.meta.gguf > /dev/null
fi
echo ".devmeta: $(ls .devmeta)"
