"""Capturing work into a CUDA graph: warm-up runs on a side stream first (lazy initialisations — cuBLAS handles,
workspaces, allocator pools — must not land in the graph), then one captured run whose outputs stay in the
graph's memory pool and are rewritten by every replay."""

from __future__ import annotations

from typing import Any, Callable

import torch


def capture(fn: Callable[[], Any], warmups: int, pool: Any = None,
            keep_graph: bool = False) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, what the captured run of `fn` returned). Graphs captured into one `pool`
    (`torch.cuda.graph_pool_handle()`) share their intermediate memory: only one of them may be replaying.
    `keep_graph`: the graph stays a cudaGraph_t (`raw_cuda_graph()`, to be cloned into another graph: graph_switch)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()  # (torch ≥ 2.8 has it)
    with torch.cuda.graph(graph, pool=pool):
        output = fn()
    return graph, output
