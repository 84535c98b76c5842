"""What a custom kernel module exports, and how `kernel=REF` finds it (`FILE.py:NAME` or `pkg.module:NAME`).

A kernel replaces the stock op at one named seam of the model (engine/levers.py: SEAMS), with the stock op's
signature at that seam (the backend documents each). `exact` claims bit-for-bit equality with stock: the
correctness check then demands equal outputs instead of a tolerance.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kerneltriage.core.errors import InputError
from kerneltriage.engine.levers import SEAMS


@dataclass(frozen=True)
class Kernel:
    """A custom kernel: the seam it replaces, the callable, and whether it claims to be exact."""

    seam: str
    fn: Callable[..., Any]
    exact: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if self.seam not in SEAMS:
            raise ValueError(f"kernel {self.name or self.fn!r}: seam {self.seam!r} not in {', '.join(SEAMS)}")
        if not callable(self.fn):
            raise ValueError(f"kernel {self.name}: fn is not callable")


def load_kernel(ref: str) -> Kernel:
    """The Kernel named by `FILE.py:NAME` or `pkg.module:NAME`; anything else is an InputError."""
    where, _, name = ref.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise InputError(f"kernel={ref}: no file {where}")
            spec = importlib.util.spec_from_file_location(f"kerneltriage_user_kernel_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as exc:
        raise InputError(f"kernel={ref}: cannot import {where} ({exc})") from None
    kernel = getattr(module, name, None)
    if not isinstance(kernel, Kernel):
        raise InputError(f"kernel={ref}: expected {name} to be a kerneltriage.engine.kernels.Kernel, "
                         f"got {type(kernel).__name__}")
    return kernel
