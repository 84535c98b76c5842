"""MLX's dispatch gates, read from its source: which SDPA kernel an attention call gets and which quantized-matmul
kernel family a projection gets, on Metal, on CUDA and on the CPU.

Read from ml-explore/mlx at commit 846d176 (2026-08-22, version header 0.32.2, after the v0.32.1 tag), files
`mlx/backend/metal/scaled_dot_product_attention.cpp` (has_fused_kernel, use_fallback, the 2-pass routing),
`mlx/backend/cuda/scaled_dot_product_attention.{cpp,cu}` (supports_sdpa_cudnn, supports_sdpa_vector),
`mlx/backend/metal/quantized.cpp` (QuantizedMatmul::eval_gpu, get_qmv_batch_limit, dispatch_qmv),
`mlx/backend/cuda/quantized/{quantized.cpp,qmm/qmm.cu}` and `mlx/backend/cpu/quantized.cpp`. The installed MLX may
be newer (`SOURCE_NOTE` says so at run time): where MLX itself can answer on the device at hand (the SDPA gate,
through `force_fused=True`), `gates.py` asks it instead, and these rules cover the other devices.

Both GPU backends decide at graph-building time; Metal's qmv batch limit also depends on the GPU generation and
size, given here as `metal_arch` ("applegpu_g15s": generation 15, size s).
"""

from __future__ import annotations

import mlx.core as mx

SOURCE = "ml-explore/mlx 846d176 (0.32.2-dev)"
SOURCE_NOTE = (f"gate rules read from {SOURCE}; installed MLX {mx.__version__}"
               + ("" if mx.__version__.startswith("0.32.") else ": another minor version, the rules may have moved"))
METAL_FULL_DIMS = (64, 72, 80, 96, 128, 192, 256)  # sdpa_full: query length > 8
METAL_VECTOR_DIMS = (64, 96, 128, 192, 256)  # sdpa_vector: query length ≤ 8
CUDA_VECTOR_DIMS = (64, 96, 128)  # sdpa_vector on CUDA: query length < 4, no array mask
CUDA_DECODE_KEYS = 256  # cuDNN serves one-query calls from this many keys (mlx-lm's cache step) when k/v are slices


def metal_sdpa(q_len: int, keys: int, dim: int, gqa: int, array_mask: bool, causal: bool) -> tuple[str, str]:
    """(kernel, why) on Metal: "sdpa_full", "sdpa_vector", "sdpa_vector_2pass" or "unfused"."""
    if q_len > 8:
        if dim not in METAL_FULL_DIMS:
            return "unfused", f"the full attention kernel takes head dims {METAL_FULL_DIMS}, not {dim}"
        if causal and not array_mask and q_len > keys:
            return "unfused", "a causal full attention needs no more queries than keys"
        if dim in (192, 256):  # (NAX GPUs run head dim 256 fused for causal fp16/bf16 prompts ≥ 1024)
            return "unfused", f"MLX routes head dim {dim} past 8 queries to the unfused path (faster there)"
        return "sdpa_full", ""
    if dim not in METAL_VECTOR_DIMS:
        return "unfused", f"the vector attention kernel takes head dims {METAL_VECTOR_DIMS}, not {dim}"
    if q_len > keys:
        return "unfused", "the vector attention kernel needs no more queries than keys"
    if q_len * gqa > 32:
        return "unfused", f"the vector kernel needs query length × GQA factor ≤ 32, got {q_len} × {gqa}"
    if dim == 192:
        return "unfused", "MLX routes head dim 192 to the unfused path (faster there)"
    two_pass = gqa > 1 and keys >= 4096
    return ("sdpa_vector_2pass" if two_pass else "sdpa_vector"), ("" if two_pass else
                                                                 "2-pass from 1024 keys on GPUs of size d or s")


def cuda_sdpa(q_len: int, keys: int, dim: int, array_mask: bool, causal: bool, dtype: str) -> tuple[str, str]:
    """(kernel, why) on MLX's CUDA backend (Ampere or later): "cudnn", "sdpa_vector" or "unfused"."""
    cudnn = dim % 8 == 0 and dim <= 128 and dtype in ("float16", "bfloat16") and not (causal and q_len > keys)
    if q_len == 1:  # cuDNN decodes only from CUDA_DECODE_KEYS keys, unmasked, over slices of a fixed cache
        cudnn = cudnn and not array_mask and keys >= CUDA_DECODE_KEYS
    vector = dim in CUDA_VECTOR_DIMS and q_len < 4 and not array_mask
    if cudnn:
        return "cudnn", "" if q_len > 1 else "when k/v are slices of a preallocated cache (else sdpa_vector)"
    if vector:
        return "sdpa_vector", ""
    return "unfused", (f"cuDNN takes head dims ≤ 128 in multiples of 8 in fp16/bf16 (got {dim}, {dtype}); the vector "
                       f"kernel head dims {CUDA_VECTOR_DIMS} with < 4 queries and no mask array")


def metal_qmv_limit(k: int, n: int, arch: str) -> int:
    """Rows from which Metal's quantized matmul is a matrix kernel (get_qmv_batch_limit), by GPU generation."""
    gen, size = int("".join(c for c in arch if c.isdigit()) or 0), arch[-1:]
    tier = 0 if k <= 2048 and n <= 2048 else (1 if k <= 4096 and n <= 4096 else 2)
    if gen >= 17 and size != "d":
        return (33, 25, 13)[tier]
    if gen >= 15 and size != "d":
        return (13, 15, 13)[tier]
    if size == "d":
        return (32, 18, 12)[tier]
    return ((14, 10, 6) if gen >= 13 else (18, 12, 10))[tier]


def metal_qmm(m: int, k: int, n: int, bits: int, arch: str) -> str:
    """Metal's kernel family for x (M, K) · Wᵀ, W (N, K) quantized (affine, transposed, one batch)."""
    if m >= metal_qmv_limit(k, n, arch):
        return "qmm_splitk"
    if k in (64, 128):
        return "qmv_quad"
    gen = int("".join(c for c in arch if c.isdigit()) or 0)
    if m >= 2 and gen >= 15:
        return "qmv_wide"
    fast = n % 8 == 0 and k % ((32 // bits) * 2 * 32) == 0
    return "qmv_fast" if fast else "qmv"


def cuda_qmm(m: int, k: int, n: int, dtype: str) -> str:
    """MLX CUDA's kernel family on sm80/sm90 for GGUF's 32-value groups (qmm_sm90 needs one group per row)."""
    if n % 128 == 0 and k % 64 == 0 and dtype in ("float16", "bfloat16"):
        return "qmv" if m < 8 else "qmm_sm80"
    if k % 64 == 0:
        return "qmv" if m < 8 else "qmm_naive"
    return "qmv" if k % 8 == 0 else "none"


def cpu_qmm(bits: int, accelerate: bool) -> str:
    """The CPU's family: one loop per output row and input row (the same code at every M: its cost grows linearly
    with M, on one thread). Vectorized (`qmm_t_simd`) only where MLX is built with Accelerate (macOS on arm64:
    8 float lanes); elsewhere simd::max_size is 1 and it is the scalar loop `qmm_t`."""
    return "qmm_t_simd" if accelerate and 8 % (32 // bits) == 0 else "qmm_t"
