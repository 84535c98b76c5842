"""A CUDA graph that picks one of several captured graphs on the device: a SWITCH conditional node (CUDA 12.8+),
whose value a one-thread kernel sets from a device integer that the graph's own kernels wrote.

Why: a resident speculative step chooses between a plain step and a verify from the device's text
(kernels/lookup_draft.py); with the choice made on the device, the host queues steps without reading any of them
first. PyTorch 2.11 captures no conditional nodes, so the node is added by hand during a torch capture
(cuda.bindings' runtime API, as PyTorch's own `torch.cond` capture does where it exists): the capturing graph is
asked of the stream, a conditional handle made on it, the setting kernel launched (captured), the SWITCH node added
behind the stream's last node and the stream moved on behind it. Each body is a torch graph captured beforehand and
kept as a cudaGraph_t (`cudagraph.capture(..., keep_graph=True)`), cloned into the node: those graphs must outlive
this one (their memory pools hold the bodies' intermediates). On the H200, such a graph replays a plain step or a
16-row verify of the default model in the time of their own graphs (542.7 / 726.7 µs queued; with no body
chosen 5.3 µs: benchmarks/results/cond-step-smollm2-preset-h200.json).

The setting kernel is PTX (the driver resolves `cudaGraphSetConditional`, a device runtime function, when it loads
the module), from:  extern "C" __global__ void set_switch(cudaGraphConditionalHandle h, const int *value)
                    { cudaGraphSetConditional(h, *value); }
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable, Sequence

import torch

SET_SWITCH_PTX = """
.version 8.0
.target sm_70
.address_size 64
.extern .func cudaGraphSetConditional (.param .b64 handle, .param .b32 value);
.visible .entry set_switch (.param .u64 handle_param, .param .u64 value_param)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [handle_param];
    ld.param.u64 %rd2, [value_param];
    cvta.to.global.u64 %rd3, %rd2;
    ld.global.u32 %r1, [%rd3];
    {
        .param .b64 param0;
        st.param.b64 [param0+0], %rd1;
        .param .b32 param1;
        st.param.b32 [param1+0], %r1;
        call.uni cudaGraphSetConditional, (param0, param1);
    }
    ret;
}
"""


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether switch graphs work here: CUDA, torch graphs kept as cudaGraph_t (torch ≥ 2.8), cuda.bindings 13, and a
    driver whose graphs take SWITCH nodes (CUDA 12.8+) — asked once, by building and replaying a small one."""
    if not (torch.cuda.is_available() and hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph")):
        return False
    try:
        import cuda.bindings.runtime  # noqa: F401
    except ImportError:
        return False
    try:
        return _switches()
    except (RuntimeError, TypeError, ValueError, AttributeError):  # an API or a driver without them
        return False


def _switches() -> bool:
    """A graph whose value 1 picks the second of two bodies adds 10, not 1."""
    total, value = torch.zeros(1, device="cuda"), torch.ones((), dtype=torch.int32, device="cuda")
    bodies = []
    for step in (1.0, 10.0):
        body = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(body):
            total.add_(step)
        bodies.append(body)
    switch_graph(lambda: None, value, bodies).replay()
    return float(total) == 10.0


def _ok(found: Any) -> Any:
    """cuda.bindings returns (error, values…): the values, or an error naming the failure."""
    error, *values = found if isinstance(found, tuple) else (found,)
    if int(error) != 0:
        raise RuntimeError(f"graph_switch: CUDA returned {error!r}")
    return values[0] if len(values) == 1 else values


@functools.lru_cache(maxsize=None)
def _set_switch(device: int) -> Any:
    """The setting kernel, loaded once per device (in its primary context: torch's)."""
    from cuda.bindings import driver

    module = _ok(driver.cuModuleLoadData(SET_SWITCH_PTX.encode() + b"\0"))
    return module, _ok(driver.cuModuleGetFunction(module, b"set_switch"))


def switch_graph(before: Callable[[], None], value: torch.Tensor,
                 bodies: Sequence[torch.cuda.CUDAGraph]) -> torch.cuda.CUDAGraph:
    """A graph that runs `before` (kernels that write `value`, an int32 device scalar), then bodies[value] (none when
    it is out of range). `bodies`: torch graphs captured with keep_graph=True, cloned in."""
    from cuda.bindings import driver, runtime

    _, kernel = _set_switch(torch.cuda.current_device())
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=side):
        before()
        stream = runtime.cudaStream_t(init_value=side.cuda_stream)
        capturing = _ok(runtime.cudaStreamGetCaptureInfo(stream))[2]
        handle = _ok(runtime.cudaGraphConditionalHandleCreate(capturing, 0, 0))
        _ok(driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, driver.CUstream(side.cuda_stream),
                                  ((int(handle), value.data_ptr()), (ctypes.c_ulonglong, ctypes.c_void_p)), 0))
        _, _, capturing, dependencies, edges, count = _ok(runtime.cudaStreamGetCaptureInfo(stream))
        params = runtime.cudaGraphNodeParams()
        params.type = runtime.cudaGraphNodeType.cudaGraphNodeTypeConditional
        params.conditional.handle = handle
        params.conditional.type = runtime.cudaGraphConditionalNodeType.cudaGraphCondTypeSwitch
        params.conditional.size = len(bodies)
        node = _ok(runtime.cudaGraphAddNode(capturing, dependencies, edges, count, params))
        for index, body in enumerate(bodies):
            _ok(runtime.cudaGraphAddChildGraphNode(params.conditional.phGraph_out[index], None, 0,
                                                   runtime.cudaGraph_t(init_value=body.raw_cuda_graph())))
        _ok(runtime.cudaStreamUpdateCaptureDependencies(
            stream, [node], None, 1, runtime.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies))
    torch.cuda.current_stream().wait_stream(side)
    return graph
