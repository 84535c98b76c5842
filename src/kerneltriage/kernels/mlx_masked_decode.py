"""Masked decode attention for MLX's CUDA backend, the `attn.decode` seam, through `mx.fast.cuda_kernel`.

Why: a compiled MLX decode step (`compile=default`) attends over a fixed window of its static cache under a mask
array, and MLX's CUDA attention takes a one-query call with a mask array in neither of its fused kernels (cuDNN
decodes only unmasked slices of a cache; `sdpa_vector` refuses any mask array: `kernel_rules.cuda_sdpa`): each
layer's decode attention then runs as composed ops over the whole window. Metal's vector kernel takes the mask, so
this is a CUDA candidate only; elsewhere `mx.fast.cuda_kernel` refuses to run and the lever says so.

The kernel is MLX's own vector-attention design (one block per query row: 32 warps take keys in turn, each lane holds
D/32 of q and of the output, an online softmax per warp, the warps combined at the end), reading k and v in place
through their strides (the window is a slice of the cache) and skipping masked keys. Arithmetic in float32, the
output rounded once to the input dtype; the scale 1/√D as the model's attention passes it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable, cast

import mlx.core as mx

from kerneltriage.engine.kernels import Kernel

WARPS = 32  # warps per query row (1,024 threads), as MLX's sdpa_vector
SOURCE = """
    constexpr int PER_LANE = D / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rows = q_shape[2], heads = q_shape[1], keys = k_shape[2];
    const int t = blockIdx.x % rows, h = (blockIdx.x / rows) % heads, b = blockIdx.x / (rows * heads);
    const int hk = h / (heads / k_shape[1]);  // GQA: query head h reads KV head h / group
    const T* q_row = q + b * q_strides[0] + h * q_strides[1] + t * q_strides[2];
    const T* k_head = k + b * k_strides[0] + hk * k_strides[1];
    const T* v_head = v + b * v_strides[0] + hk * v_strides[1];
    float qv[PER_LANE], acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) {
        qv[i] = static_cast<float>(q_row[(lane * PER_LANE + i) * q_strides[3]]) * scale[0];
        acc[i] = 0.0f;
    }
    float m = KT_NEG_INF, l = 0.0f;
    for (int s = warp; s < keys; s += WARPS) {
        MASK_CHECK
        const T* k_row = k_head + s * k_strides[2];
        float dot = 0.0f;
        for (int i = 0; i < PER_LANE; ++i) {
            dot += qv[i] * static_cast<float>(k_row[(lane * PER_LANE + i) * k_strides[3]]);
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            dot += __shfl_xor_sync(0xffffffff, dot, offset);
        }
        const float m_new = fmaxf(m, dot), correction = expf(m - m_new), p = expf(dot - m_new);
        const T* v_row = v_head + s * v_strides[2];
        l = l * correction + p;
        for (int i = 0; i < PER_LANE; ++i) {
            acc[i] = acc[i] * correction + p * static_cast<float>(v_row[(lane * PER_LANE + i) * v_strides[3]]);
        }
        m = m_new;
    }
    __shared__ float warp_max[WARPS], warp_sum[WARPS], warp_acc[WARPS][D];
    if (lane == 0) {
        warp_max[warp] = m;
        warp_sum[warp] = l;
    }
    for (int i = 0; i < PER_LANE; ++i) {
        warp_acc[warp][lane * PER_LANE + i] = acc[i];
    }
    __syncthreads();
    if (threadIdx.x < D) {
        float top = KT_NEG_INF, total = 0.0f, value = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
            top = fmaxf(top, warp_max[w]);
        }
        for (int w = 0; w < WARPS; ++w) {
            const float c = warp_max[w] == KT_NEG_INF ? 0.0f : expf(warp_max[w] - top);
            total += warp_sum[w] * c;
            value += warp_acc[w][threadIdx.x] * c;
        }
        out[blockIdx.x * D + threadIdx.x] = static_cast<T>(value / total);
    }
"""
HEADER = f"constexpr int WARPS = {WARPS};\n#define KT_NEG_INF (-cuda::std::numeric_limits<float>::infinity())\n"
MASK_CHECK = "if (!mask[t * mask_strides[0] + s * mask_strides[1]]) continue;  // warp-uniform: s is the warp's"


@lru_cache(maxsize=None)
def _kernel(masked: bool) -> Callable[..., Any]:
    """The kernel with or without its mask input (compiled once per dtype and head dim, on first use)."""
    kernel = mx.fast.cuda_kernel(name="kt_masked_decode" if masked else "kt_decode",
                                 input_names=["q", "k", "v", "scale"] + (["mask"] if masked else []),
                                 output_names=["out"], header=HEADER, ensure_row_contiguous=False,
                                 source=SOURCE.replace("MASK_CHECK", MASK_CHECK if masked else ""))
    return cast(Callable[..., Any], kernel)


def masked_decode(q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None) -> mx.array:
    """q (B, H, T, D), k and v (B, Hkv, S, D) (strided: a window of the cache), mask (T, S) bool or None →
    (B, H, T, D) in q's dtype. D a multiple of 32, at most 1,024."""
    batch, heads, rows, dim = q.shape
    scale = mx.array([1.0 / math.sqrt(dim)], dtype=mx.float32)
    inputs = [q, k, v, scale] + ([mask] if mask is not None else [])
    (out,) = _kernel(mask is not None)(inputs=inputs, template=[("T", q.dtype), ("D", dim)],
                                       grid=(batch * heads * rows * WARPS * 32, 1, 1), threadgroup=(WARPS * 32, 1, 1),
                                       output_shapes=[q.shape], output_dtypes=[q.dtype])
    return out


MASKED_DECODE = Kernel("attn.decode", masked_decode, name="mlx_masked_decode")
