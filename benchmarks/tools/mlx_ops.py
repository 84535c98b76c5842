"""Ops per step on MLX as a GPU runs them, kerneltriage's (per lever set) beside mlx-lm's on the same weights: the
primitives of one prefill of -p tokens and of one decode step after them, each `mx.fast` call one op, views left
out (`backends/mlx/graph_ops.py`, what the MLX census reports as `ops`). Counted on the graph, on any device: the
same counts on the CPU as on a GPU, where each is a kernel launch. A compiled step is counted as traced, before
`mx.compile` fuses elementwise chains.

Usage: python benchmarks/tools/mlx_ops.py [--model default] [--dtype float32] [-p 64]
           [--levers quantized] [--levers quantized,packed_qkv,...] [--out FILE.json]
mlx-lm's step is its model called on its own cache, allocated by a real prefill of the prompt (evaluated: the one
computation here) and trimmed back for the prefill's count; its greedy token is an argmax, as ours.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx

from kerneltriage.backends.mlx.backend import BACKEND
from kerneltriage.backends.mlx.graph_ops import count_ops, step_ops
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.peers.mlxlm import load_gguf_model

PHASES = ("prefill", "decode")


def _row(counts: Counter) -> dict[str, Any]:
    return {"ops": sum(counts.values()), "by_primitive": dict(counts.most_common())}


def ours(checkpoint: Any, levers: str, dtype: str, length: int) -> dict[str, Any]:
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cpu", dtype)
    return {phase: _row(step_ops(runner, phase, length)) for phase in PHASES}


def mlx_lm(checkpoint: Any, dtype: str, length: int) -> dict[str, Any]:
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    model = load_gguf_model(checkpoint, getattr(mx, dtype))
    prompt, token = mx.zeros((1, length), dtype=mx.int32), mx.zeros((1, 1), dtype=mx.int32)
    cache = make_prompt_cache(model)
    mx.eval(prompt, token, model(prompt, cache=cache))  # allocates its cache (256-slot steps), fills `length` slots
    decode = count_ops(lambda: [mx.argmax(model(token, cache=cache)[:, -1, :], axis=-1)])
    mx.eval([c.state for c in cache])  # the counted step's cache writes run: no graph left under the next count
    trim_prompt_cache(cache, cache[0].offset)
    prefill = count_ops(lambda: [mx.argmax(model(prompt, cache=cache)[:, -1, :], axis=-1)])
    return {"prefill": _row(prefill), "decode": _row(decode)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("-p", "--prompt", type=int, default=64, help="prompt tokens (the decode step follows them)")
    parser.add_argument("--levers", action="append", help="a lever set of ours (repeatable; default: quantized)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    checkpoint = load_checkpoint(args.model)
    result = {"model": checkpoint.source, "dtype": args.dtype, "prompt": args.prompt,
              "ours": {levers: ours(checkpoint, levers, args.dtype, args.prompt)
                       for levers in args.levers or ["quantized"]},
              "mlx-lm": mlx_lm(checkpoint, args.dtype, args.prompt), "environment": capture_environment()}
    for name, phases in [*result["ours"].items(), ("mlx-lm", result["mlx-lm"])]:
        print(f"{name:60s} " + "  ".join(f"{phase} {phases[phase]['ops']:4d}" for phase in PHASES))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
