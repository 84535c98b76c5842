# Source at the start of every call on a GPU machine without network: installs the carried wheels, then joins the
# default model (and, for MLX on CUDA, MLX's CUDA build) from the parts carried beside the tree. docs/remote-gpu.md
# says how to prepare them on a machine with network (benchmarks/tools/device_prep.sh does it); all git-excluded:
#   .whl/      the gguf wheel the device lacks (pip download --no-deps --only-binary=:all: --python-version 3.12
#              --implementation cp --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0), and llguidance's for
#              constrained decoding (the same with --platform manylinux_2_31_x86_64 llguidance==1.9.1), and
#              pytest-xdist 3.8.0 with execnet 2.1.2 for device_run.sh gpu-tests' workers
#   .mlxwhl/   mlx 0.32.4 (cp312) and mlx-lm 0.32.2 (pip download --no-deps), for MLX only
#   .devblob/N/blobpart.(N-1)  the cached default model followed by mlx-cuda-13's wheel contents as an xz tar, split
#              in 50 MB parts (four):
#     (cd /tmp/x && unzip -q mlx_cuda_13-0.32.4-*.whl && tar cf - . | xz -9e > /tmp/mlxcuda.tar.xz)
#     cat ~/.cache/kerneltriage/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/mlxcuda.tar.xz \
#       | split -b 50000000 -d -a 1 - blobpart.
#   .llamasrc/llama.cpp.tar.xz  llama.cpp's source (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp without
#              models/, docs/, media/, .github/; 8.8 MB), for the llama.cpp peer
# A call may carry 64 MB with the tree: one 50 MB part and the tree fit; the wheels and llama.cpp's source go in the
# first call, which carries no part (a warm machine keeps them). Parts are kept outside the tree
# while the machine stays warm: the model is whole after parts 0 and 1, MLX after part 3. Then run
# `source benchmarks/device_env.sh; bash benchmarks/tools/device_run.sh STEP...`.
MODEL_BYTES=98362432
# the wheels once: a warm machine keeps /tmp/site, so a later call may leave .whl behind for a larger part
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
fi
[ -d /tmp/site/gguf ] || { echo "device_env: no wheels in .whl/ or /tmp/site (carry .whl)" >&2; return 1; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export KERNELTRIAGE_CACHE=/tmp/ktcache
mkdir -p /tmp/ktparts "$KERNELTRIAGE_CACHE/models"
cp .devblob/*/blobpart.* /tmp/ktparts/ 2>/dev/null
model="$KERNELTRIAGE_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$model" ] && [ -f /tmp/ktparts/blobpart.0 ] && [ -f /tmp/ktparts/blobpart.1 ]; then
  cat /tmp/ktparts/blobpart.0 /tmp/ktparts/blobpart.1 | head -c $MODEL_BYTES > "$model.part" && mv "$model.part" "$model"
fi
[ -f "$model" ] && echo "default model ready: $(md5sum < "$model")" || echo "default model not yet complete"
# MLX's CUDA build beside torch's own CUDA 13 libraries (libmlx.so finds them through its RPATH ../../nvidia/...).
# Only once every part is here (parts arrive in any order) and only from carried wheels: a half-joined stream would
# unpack half a library.
if [ "$(ls /tmp/ktparts/blobpart.[0-3] 2>/dev/null | wc -l)" = 4 ] && ls .mlxwhl/*.whl > /dev/null 2>&1 \
  && ! python3 -c "import mlx.core" 2>/dev/null; then
  site=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .mlxwhl/*.whl \
    && cat /tmp/ktparts/blobpart.[0-3] | tail -c +$((MODEL_BYTES + 1)) \
       | xz -d | tar x -C "$site" \
    && echo "mlx: $(python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device(), mx.cuda.is_available())' \
                    2>&1 | tail -1)"
fi
# llama.cpp's source, unpacked once (device_run.sh llama-build builds llama-bench from it)
if [ -f .llamasrc/llama.cpp.tar.xz ] && [ ! -d /tmp/llama.cpp ]; then tar xJf .llamasrc/llama.cpp.tar.xz -C /tmp; fi
