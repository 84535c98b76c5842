"""Dispatch gates at the model's real shapes: which SDPA backend each attention call gets, and torch's own
reasons for refusing the others (the projections' gates are swept in `msweep.py`).

Attention calls are recorded as the model makes them (`record_sdpa_calls`), then replayed on random data of
the same shapes: `torch.backends.cuda.can_use_*(SDPAParams, debug=True)` says which fused backend accepts
each call and, through its warnings, why one refuses; each usable backend is timed pinned with `sdpa_kernel`.
All timing is CUDA-event timing on a GPU. On the CPU torch has its own flash/math kernels: the chosen one
is reported, without timing claims.
"""

from __future__ import annotations

import statistics
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.engine.probes import EXPANDED, GateRow, SdpaCall


# (backend name, SDPBackend member, the capability probe's name in torch.backends.cuda)
FUSED = (("flash", "FLASH_ATTENTION", "can_use_flash_attention"),
         ("efficient", "EFFICIENT_ATTENTION", "can_use_efficient_attention"),
         ("cudnn", "CUDNN_ATTENTION", "can_use_cudnn_attention"))
SDPA_WARMUPS, SDPA_SAMPLES, SDPA_CALLS = 3, 5, 10


@contextmanager
def record_sdpa_calls() -> Iterator[list[SdpaCall]]:
    """Record every F.scaled_dot_product_attention call made inside the block."""
    calls: list[SdpaCall] = []
    original = F.scaled_dot_product_attention

    def recording(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                  dropout_p: float = 0.0, is_causal: bool = False, *args: Any, **kwargs: Any) -> torch.Tensor:
        mask = None if attn_mask is None else tuple(attn_mask.shape)
        causal = None if attn_mask is None else _mask_is_causal(attn_mask, query.shape[-2], key.shape[-2])
        calls.append(SdpaCall(tuple(query.shape), tuple(key.shape), _dtype(query), mask, bool(is_causal),
                              bool(kwargs.get("enable_gqa", False)), causal))
        return original(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)

    F.scaled_dot_product_attention = recording
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = original


def _mask_is_causal(mask: torch.Tensor, queries: int, keys: int) -> bool | None:
    if queries != keys or queries < 2 or tuple(mask.shape[-2:]) != (queries, keys):
        return None
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    causal = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril()
    return bool((allowed == causal).all())


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def random_inputs(call: SdpaCall, device: torch.device, expand: bool = False) -> dict[str, Any]:
    dtype = getattr(torch, call.dtype)
    q = torch.randn(call.q, device=device, dtype=dtype)
    k, v = (torch.randn(call.k, device=device, dtype=dtype) for _ in range(2))
    mask = None
    if call.mask is not None:  # an explicit mask: a causal one of the recorded shape
        rows, cols = call.mask[-2:]
        mask = torch.ones(rows, cols, dtype=torch.bool, device=device).tril(cols - rows)
    groups = call.q[1] // call.k[1]
    if expand and groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return {"query": q, "key": k, "value": v, "attn_mask": mask, "is_causal": call.is_causal,
            "enable_gqa": call.enable_gqa and not (expand and groups > 1)}


def _params(inputs: dict[str, Any]) -> Any:
    args = (inputs["query"], inputs["key"], inputs["value"], inputs["attn_mask"], 0.0, inputs["is_causal"])
    try:
        return torch.backends.cuda.SDPAParams(*args, inputs["enable_gqa"])
    except TypeError:  # torch before enable_gqa
        return torch.backends.cuda.SDPAParams(*args)


def probe(probe_name: str, inputs: dict[str, Any]) -> tuple[bool, list[str]]:
    """Does this fused backend take the call? With torch's own reasons (its debug warnings) when not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = bool(getattr(torch.backends.cuda, probe_name)(_params(inputs), True))
    return usable, [str(w.message).strip() for w in caught]


def default_backend(inputs: dict[str, Any]) -> str:
    """The backend torch's dispatcher would pick for these inputs."""
    args = (inputs["query"], inputs["key"], inputs["value"], inputs["attn_mask"], 0.0, inputs["is_causal"])
    try:
        choice = torch._fused_sdp_choice(*args, scale=None, enable_gqa=inputs["enable_gqa"])
    except TypeError:
        choice = torch._fused_sdp_choice(*args)
    name = SDPBackend(choice).name
    names = {member: short for short, member, _ in FUSED} | {"MATH": "math"}
    return names.get(name, name.lower())


def _attention(inputs: dict[str, Any], backend: str | None, groups: int = 1) -> Callable[[], Any]:
    """A call of F.scaled_dot_product_attention on `inputs`, pinned to `backend` (None: torch's choice);
    with `groups` > 1, K/V are repeated to every query head inside the call (the expansion is part of its cost)."""

    def run() -> Any:
        key, value = inputs["key"], inputs["value"]
        if groups > 1:
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(**(inputs | {"key": key, "value": value}))

    if backend is None:
        return run
    member = getattr(SDPBackend, {short: name for short, name, _ in FUSED}.get(backend, "MATH"))

    def pinned() -> Any:
        with sdpa_kernel([member]):
            return run()
    return pinned


def event_seconds(fn: Callable[[], Any], calls: int, samples: int, warmups: int) -> float:
    """Median seconds per call of `fn` on the current CUDA stream: `samples` CUDA-event samples of `calls` calls."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)  # elapsed_time is in ms
    return statistics.median(times)


def graph_seconds(fn: Callable[[], Any], calls: int, samples: int, warmups: int) -> float:
    """Median seconds per call of `fn` as the GPU runs it: `calls` calls captured in one CUDA graph, replayed
    `samples` times between CUDA events. Timing eager launches would time the host wherever it launches slower
    than the GPU runs the kernels (a ~20 µs launch against a ~10 µs GEMV on a slow host)."""
    graph, _ = capture(lambda: [fn() for _ in range(calls)], warmups)
    return event_seconds(graph.replay, 1, samples, 1) / calls


def _sdpa_seconds(fn: Callable[[], Any]) -> float:
    return event_seconds(fn, SDPA_CALLS, SDPA_SAMPLES, SDPA_WARMUPS)


def probe_backends(call: SdpaCall, inputs: dict[str, Any]) -> tuple[dict[str, bool], dict[str, list[str]], list[str]]:
    """(usable per fused backend, torch's reasons for each refusal, refused backends that take the call once
    K/V are expanded to every query head)."""
    usable, reasons, expandable = {}, {}, []
    grouped = call.enable_gqa and call.q[1] > call.k[1]
    for short, _, probe_name in FUSED:
        usable[short], why = probe(probe_name, inputs)
        if not usable[short]:
            reasons[short] = why
            if grouped and probe(probe_name, random_inputs(call, inputs["query"].device, expand=True))[0]:
                expandable.append(short)
    return usable, reasons, expandable


def time_backends(call: SdpaCall, inputs: dict[str, Any], usable: dict[str, bool], reasons: dict[str, list[str]],
                  expandable: list[str]) -> dict[str, float]:
    """CUDA-event seconds per call: torch's default, math, every usable backend, and the expanded alternatives.
    A backend the probe accepted but that fails at run time is marked unusable, with the failure as its reason."""
    seconds = {"default": _sdpa_seconds(_attention(inputs, None)), "math": _sdpa_seconds(_attention(inputs, "math"))}
    for short in [name for name, ok in usable.items() if ok]:
        try:
            seconds[short] = _sdpa_seconds(_attention(inputs, short))
        except RuntimeError as exc:
            usable[short], reasons[short] = False, [f"failed at run time: {exc}"]
    for short in expandable:
        expanded = _attention(inputs | {"enable_gqa": False}, short, call.q[1] // call.k[1])
        seconds[short + EXPANDED] = _sdpa_seconds(expanded)
    return seconds


@torch.inference_mode()
def gate_row(phase: str, call: SdpaCall, calls_per_pass: float, device: torch.device) -> GateRow:
    """Probe and (on CUDA) time every backend for one recorded call, on random data of its shapes."""
    inputs = random_inputs(call, device)
    default = default_backend(inputs)
    if device.type != "cuda":
        return GateRow(phase, call, calls_per_pass, f"{default} (cpu)")
    usable, reasons, expandable = probe_backends(call, inputs)
    seconds = time_backends(call, inputs, usable, reasons, expandable)
    return GateRow(phase, call, calls_per_pass, default, usable, reasons, seconds)

