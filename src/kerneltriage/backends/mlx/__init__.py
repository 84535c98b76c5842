"""The MLX backend: the torch engine's models, levers and probes on MLX (Metal, CUDA, the CPU).

float32 means float32 here, as on torch: MLX runs float32 matmuls as TF32 where the GPU has it (`MLX_ENABLE_TF32`,
default 1). On the H200 that put MLX's float32 reference ~8e-4 off and exact levers (packed projections) failed
`ab`'s float32 check against it. Unless the user set it, TF32 is off before MLX first computes anything."""

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")
