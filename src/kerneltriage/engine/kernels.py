"""What a custom kernel module exports, and how `kernel=REF` finds it (`FILE.py:NAME` or `pkg.module:NAME`).

A kernel replaces the stock op at one named seam of the model (engine/levers.py: SEAMS). It is called with the
stock op's inputs and an output buffer to write every element of, `fn(*inputs, out=out)` (the check poisons `out`
before each call: an element left unwritten is caught). `exact` claims bit-for-bit equality with stock: the
correctness check then demands equal outputs instead of a tolerance. The inputs at each wired seam (`SEAM_INPUTS`):
shapes are (B, T, ·) for activations, the model's own for weights.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kerneltriage.core import integrity
from kerneltriage.core.errors import InputError
from kerneltriage.engine.levers import SEAMS
from kerneltriage.engine.quality import Quality


SEAM_INPUTS: dict[str, tuple[str, ...]] = {
    "norm": ("x (B, T, D)", "weight (D,)", "eps (float)"),  # RMSNorm: x / rms(x) · weight, normalised in float32
    "gate_up": ("x (B, T, H)", "w_gate (I, H)", "w_up (I, H)"),  # SiLU(x w_gateᵀ) · (x w_upᵀ): (B, T, I)
    "attn.decode": ("q (B, Hq, T, D)", "k (B, Hkv, S, D)", "v (B, Hkv, S, D)", "mask (T, S) bool or None"),
    "attn.prefill": ("q (B, Hq, T, D)", "k (B, Hkv, S, D)", "v (B, Hkv, S, D)", "mask (T, S) bool or None"),
    "lm_head": ("hidden (T, H)", "weight (V, H)"),  # hidden · weightᵀ: (T, V)
    "linear.gemv": ("x (T, K)", "weight (N, K)"),  # every projection called with at most GEMV_ROWS rows
}
READS_PROJECTIONS = frozenset({"gate_up", "linear.gemv"})  # the seams given a layer projection's weight (what
# `quantized` keeps as blocks: a kernel there is refused beside it; attention, the norms and the head read none of it)
GEMV_ROWS = 16  # linear.gemv: calls with this many rows or fewer (decode and verify); larger ones stay stock
DECODE_ROWS = 16  # query rows up to which a masked attention call is a decode-path call (a verify), as in flex_decode
# (rows, keys, first position) → the (T, S) bool mask of `rows` queries after `start` cached positions
CausalFn = Callable[[int, int, int], Any]


@dataclass(frozen=True)
class Kernel:
    """A custom kernel: the seam it replaces, the callable, and whether it claims to be exact — or, for one that
    approximates on purpose (sparse-V), the quality metrics that judge it in `ab` instead of a logit tolerance."""

    seam: str
    fn: Callable[..., Any]
    exact: bool = False
    name: str = ""
    quality: str | None = None

    def __post_init__(self) -> None:
        if self.seam not in SEAMS:
            raise ValueError(f"kernel {self.name or self.fn!r}: seam {self.seam!r} not in {', '.join(SEAMS)}")
        if not callable(self.fn):
            raise ValueError(f"kernel {self.name}: fn is not callable")
        if self.quality is not None:
            Quality.parse_all(self.quality)


def load_kernel(ref: str) -> Kernel:
    """The Kernel named by `FILE.py:NAME` or `pkg.module:NAME`; anything else is an InputError. What its import
    changed of the judge's clocks and flags shows in `core.integrity.broken()`."""
    where, _, name = ref.rpartition(":")
    integrity.seal()  # the clocks and flags the judge relies on, recorded before any of the candidate's code runs
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise InputError(f"kernel={ref}: no file {where}")
            spec = importlib.util.spec_from_file_location(f"kerneltriage_user_kernel_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise InputError(f"kernel={ref}: {where} cannot be loaded as a Python module")
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


def seam_attention(inner: Callable[..., Any], call: Callable[..., Any], decode: bool, causal: CausalFn
                   ) -> Callable[..., Any]:
    """A model attention function that sends the calls of its path to the kernel `call(q, k, v, mask)` and the
    others to `inner`: `attn.decode` (`decode`) takes one-row calls and masked calls of up to DECODE_ROWS rows
    (verifies under a static cache), `attn.prefill` the rest. Eager rows after a cache get their causal mask."""

    def attention(q: Any, k: Any, v: Any, pos: Any, **kwargs: Any) -> Any:
        rows = q.shape[2]
        if (rows == 1 if pos.mask is None else rows <= DECODE_ROWS) != decode:
            return inner(q, k, v, pos, **kwargs)
        mask = pos.mask
        if mask is None and rows > 1:  # eager rows after `start` cached positions (0 for a fresh prompt)
            mask = causal(rows, k.shape[2], pos.start or 0)  # (T, S)
        return call(q, k, v, mask)

    return attention
