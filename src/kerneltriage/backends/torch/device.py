"""Device and dtype choice (CUDA in bf16 when there is a GPU, else CPU in float32), and whether a model fits."""

from __future__ import annotations

import os

import torch

from kerneltriage.core.errors import InputError
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.memory import DTYPE_NAMES, host_available_bytes, require_fits

DTYPES = {alias: getattr(torch, name) for alias, name in DTYPE_NAMES.items()}


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` → cuda if visible, else cpu. Asking for cuda without a GPU is an InputError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cuda", "cpu") and not name.startswith("cuda:"):
        raise InputError(f"--device {name!r}: expected auto, cuda, cuda:N or cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {name}: no CUDA device is visible to torch {torch.__version__}")
    return torch.device(name)


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """Default bf16 on CUDA, float32 on CPU."""
    if name is None or name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise InputError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}") from None


def available_memory(device: torch.device) -> int | None:
    """Bytes free on `device` now (CUDA: the driver's free memory; CPU: the host's); None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return host_available_bytes()


def check_fits(config: ModelConfig, device: torch.device, dtype: torch.dtype, saved: int = 0) -> None:
    """InputError, before anything is allocated, when the model cannot fit on `device` in `dtype` (`saved`: bytes
    its weights take less than in `dtype`, those a lever keeps as blocks)."""
    require_fits(config, str(dtype).removeprefix("torch."), dtype.itemsize, str(device), available_memory(device),
                 saved)


def runs_triton(device: torch.device) -> bool:
    """Triton kernels run here: CUDA, or anywhere under Triton's interpreter (TRITON_INTERPRET=1, the CPU tests)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
