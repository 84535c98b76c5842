"""The judge's seal: the clocks and numeric flags a verdict relies on, as they were before any candidate code ran,
and which of them a candidate has changed since.

A kernel under judgement runs in the judge's process (it must: `ab` times it inside the model), so nothing stops its
import from rebinding `time.perf_counter` to a clock that runs slow, `torch.cuda.Event.elapsed_time` to one that
divides by 100, `torch.cuda.synchronize` to a no-op, or `torch.backends.cuda.matmul.allow_tf32` so that the float32
reference becomes as coarse as the kernel (GPU MODE reference-kernels #162; KernelArena's field guide). The seal
keeps the first value seen of each watched attribute — kerneltriage seals before it executes any candidate code
(`engine/kernels.load_kernel`), a backend seals its own at import — and `broken()` names every one that is no longer
the sealed object (callables: identity; flags: equality), and every watched callable not defined in its owner's
package (a rebinding made before the seal was taken). Backends register what they watch with `watch()`.

What it cannot do: code in the same process can forge a function's module or reach the seal itself. It catches the
documented methods; the judge's own wall clock is bound here at import (`wall`), so a rebinding the seal missed
still moves no measurement the kernel path takes.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterable

STDLIB = ("time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.monotonic_ns", "time.time",
          "time.process_time")
CALL = "()"  # a watched name ending so is called and its value sealed (a flag behind a getter)
_WATCHED: list[str] = []
_SEALED: dict[str, Any] = {}
_wall: Callable[[], float] = time.perf_counter  # bound at import, before any candidate code can run


def wall() -> float:
    """The judge's wall clock (perf_counter as it was when kerneltriage was imported)."""
    return _wall()


def watch(names: Iterable[str]) -> None:
    """Add `names` (dotted attribute paths, `()` for a getter) to what the seal guards, and seal them now."""
    for name in names:
        if name not in _WATCHED:
            _WATCHED.append(name)
    seal()


def seal() -> None:
    """Record the current value of every watched name not sealed yet whose module is imported."""
    for name in _WATCHED:
        if name not in _SEALED:
            found, value = _resolve(name)
            if found:
                _SEALED[name] = value


def broken() -> list[str]:
    """What no longer is as sealed, one line each ("time.perf_counter replaced by …"); empty when all hold."""
    problems = []
    for name in _WATCHED:
        found, value = _resolve(name)
        if not found:
            continue
        if name in _SEALED and not _same(name, value, _SEALED[name]):
            problems.append(f"{name} {_change(name, _SEALED[name], value)}")
        elif not name.endswith(CALL) and callable(value) and not _owned(name, value):
            problems.append(f"{name} is {_describe(value)}, not {name.split('.')[0]}'s own")
    return problems


def _resolve(name: str) -> tuple[bool, Any]:
    path = name.removesuffix(CALL).split(".")
    module = sys.modules.get(path[0])
    if module is None:
        return False, None  # not imported: nothing can have replaced it through the module yet
    value: Any = module
    for part in path[1:]:
        try:
            value = getattr(value, part)
        except (AttributeError, RuntimeError):  # e.g. a CUDA flag on a build without CUDA
            return False, None
    return True, (value() if name.endswith(CALL) else value)


def _same(name: str, now: Any, sealed: Any) -> bool:
    return now == sealed if name.endswith(CALL) or not callable(sealed) else now is sealed


def _change(name: str, sealed: Any, now: Any) -> str:
    if name.endswith(CALL) or not callable(sealed):
        return f"changed from {sealed!r} to {now!r}"
    return f"replaced by {_describe(now)}"


def _module_of(value: Any) -> str:
    owner = getattr(value, "__objclass__", None) or getattr(value, "__self__", None)
    module = getattr(value, "__module__", None) or getattr(owner, "__module__", None)
    return module or getattr(owner, "__name__", "") or ""


def _owned(name: str, value: Any) -> bool:
    return _module_of(value).split(".")[0] == name.split(".")[0]


def _describe(value: Any) -> str:
    code = getattr(value, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(value, '__qualname__', type(value).__name__)} from {_module_of(value) or '?'}{where}"


watch(STDLIB)
