"""Device and dtype choice on MLX: the GPU (Metal on a Mac, CUDA with `mlx[cuda13]`) in bf16 when there is one,
else the CPU in float32. MLX names two devices, "cpu" and "gpu"; what the GPU is comes from the build."""

from __future__ import annotations

import mlx.core as mx

from kerneltriage.core.errors import InputError
from kerneltriage.engine.preflight import MLX_GPU_NAMES as GPU_NAMES

# what --dtype accepts → the canonical name (`getattr(mx, name)` is the MLX dtype)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def gpu_type() -> str | None:
    """"metal" or "cuda" when this MLX build has a usable GPU, else None."""
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    return "cuda" if cuda is not None and cuda.is_available() else None


def resolve_device(name: str = "auto") -> str:
    """`auto` → "gpu" when MLX has one, else "cpu"; asking for a GPU MLX cannot use is an InputError."""
    if name == "auto":
        return "gpu" if gpu_type() else "cpu"
    if name == "cpu":
        return "cpu"
    if name not in GPU_NAMES:
        raise InputError(f"--device {name!r}: expected auto, cpu or (MLX) gpu, metal, cuda")
    found = gpu_type()
    if found is None or (name in ("metal", "cuda") and found != name) or (name == "cuda:0" and found != "cuda"):
        raise InputError(f"--device {name}: MLX {mx.__version__} sees no such GPU here "
                         f"({'it has ' + found if found else 'a CPU-only build or no GPU'})")
    return "gpu"


def device_type(device: str) -> str:
    """"cpu", "metal" or "cuda": what runs the runner's work."""
    return "cpu" if device == "cpu" else (gpu_type() or "cpu")


def mx_device(device: str) -> mx.Device:
    return mx.cpu if device == "cpu" else mx.gpu


def resolve_dtype(name: str | None, device: str) -> str:
    """Default bf16 on a GPU, float32 on the CPU; the canonical name ("bfloat16", "float32", "float16")."""
    if name is None or name == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    if name not in DTYPES:
        raise InputError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]
