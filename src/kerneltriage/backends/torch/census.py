"""An op census of the token loop and of a prefill: every aten op the runner dispatches, seen through a
TorchDispatchMode, counted by what it costs beyond its arithmetic.

- readbacks: the host reads a device value (`.item()`, `int(t)`, a blocking copy to the CPU). On a GPU each
  one is a host↔device sync; on the CPU none is, but it marks where a GPU run would wait. Call sites kept.
- casts: dtype conversions; non-contiguous copies: `contiguous()`/`clone()`/`copy_` of a strided source.
- CPU ops: ops whose tensors all live on the CPU while the model runs on a GPU (call sites kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine import census as counts
from kerneltriage.engine.census import Census

READBACK_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
COPY_OPS = frozenset({"aten::copy_", "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous"})
# Ops that touch no data (views, metadata), never counted as CPU work.
FREE_OPS = frozenset({"aten::view", "aten::_unsafe_view", "aten::alias", "aten::detach", "aten::t",
                      "aten::transpose", "aten::slice", "aten::select", "aten::expand", "aten::unsqueeze",
                      "aten::squeeze", "aten::as_strided", "aten::permute", "aten::split", "aten::lift_fresh"})
_SKIPPED = (str(Path(torch.__file__).parent), __file__)  # call sites are outside torch and this file


class _Counting(TorchDispatchMode):
    def __init__(self, census: Census, model_device: torch.device) -> None:
        super().__init__()
        self.census, self.gpu = census, model_device.type != "cpu"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name  # 'aten::mm'
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        self._count(name, func, args, kwargs, out, tensors)
        return out

    def _count(self, name: str, func: Any, args: tuple, kwargs: dict, out: Any, tensors: list) -> None:
        census = self.census
        census.ops += 1
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in READBACK_OPS and (source is None or source.device.type != "cpu" or not self.gpu):
            census.readbacks[counts.call_site(_SKIPPED)] += 1
        elif self.gpu and tensors and name not in FREE_OPS and all(t.device.type == "cpu" for t in tensors):
            census.cpu_ops[f"{name} @ {counts.call_site(_SKIPPED)}"] += 1
        if name not in COPY_OPS or source is None:
            return
        if name == "aten::copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            source, target = args[1], args[0]
            if self.gpu and target.device.type == "cpu" and source.device.type != "cpu" \
                    and not kwargs.get("non_blocking", args[2] if len(args) > 2 else False):
                census.readbacks[counts.call_site(_SKIPPED)] += 1  # a blocking device→host copy
        elif not isinstance(out, torch.Tensor) or _same_memory(out, source):
            return  # a no-op conversion: nothing was copied
        else:
            target = out
        if isinstance(target, torch.Tensor) and target.dtype != source.dtype:
            census.casts[f"{_dtype(source)}→{_dtype(target)}"] += 1
        elif not source.is_contiguous():
            census.strided_copies += 1


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


@torch.inference_mode()
def census_prefill(runner: Runner, prompt: Sequence[int]) -> Census:
    """The census of one prefill of `prompt` at depth 0."""
    return counts.census_prefill(runner, prompt, lambda census: _Counting(census, runner.device))


@torch.inference_mode()
def census_decode(runner: Runner, prefix: Sequence[int], tokens: int) -> Census:
    """The census of `tokens` tokens of the runner's token loop (the first, from the prefill, excluded)."""
    return counts.census_decode(runner, prefix, tokens, lambda census: _Counting(census, runner.device))


@torch.inference_mode()
def per_unit(runner: Runner, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int) -> dict[str, Any]:
    """The census per prefill or per decode token (engine/census.py: per_unit)."""
    return counts.per_unit(runner, phase, prefix, tokens, lambda census: _Counting(census, runner.device))
