"""Where an MLX decode step's time goes, kerneltriage's (per lever set) beside mlx-lm's on the same weights: the
first calls one by one (a compiled step traces, and on CUDA compiles its fused kernels, on the first), then the
steady state as three numbers: the graph build (the step call returning, before any evaluation: Python and MLX's
graph on the host), the synchronous step (build and evaluation, one token at a time) and the pipelined token (the
next step built while the last one runs, as `one_sync` and mlx-lm's generate do). A host-bound step has its
pipelined token near its build; a device-bound one near the evaluation.

Usage: python benchmarks/tools/mlx_host.py [--model default] [--device gpu] [--dtype float16] [-p 64] [-n 64]
           [--levers quantized,packed_qkv] [--levers ...,compile=blocks] [--out FILE.json]
Lines print as each measurement ends (a run cut short keeps what it printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx

from kerneltriage.backends.mlx.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.peers.mlxlm import load_gguf_model

FIRST = 3  # first calls timed one by one


def _ms(seconds: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(seconds) * 1e3, "min_ms": min(seconds) * 1e3, "max_ms": max(seconds) * 1e3}


def profile(step: Callable[[mx.array], mx.array], token: mx.array, steps: int) -> dict[str, Any]:
    """`step(token)` → logits (1, V) for the next position (the caller's cache advances by one each call)."""
    first = []
    for _ in range(FIRST):
        began = time.perf_counter()
        mx.eval(step(token))
        first.append((time.perf_counter() - began) * 1e3)
    build, whole = [], []
    for _ in range(steps):
        began = time.perf_counter()
        out = step(token)
        built = time.perf_counter()
        mx.eval(out)
        build.append(built - began)
        whole.append(time.perf_counter() - began)
    began = time.perf_counter()
    nxt = step(token)
    mx.async_eval(nxt)
    for _ in range(steps):
        last = nxt
        nxt = step(mx.argmax(last, axis=-1).reshape(1, 1).astype(mx.int32))
        mx.async_eval(nxt)
        mx.eval(last)  # the last token's logits read while the next step runs
    mx.eval(nxt)
    pipelined = (time.perf_counter() - began) / (steps + 1)
    return {"first_ms": first, "build": _ms(build), "step": _ms(whole), "pipelined_ms": pipelined * 1e3,
            "tokens_per_s": 1 / pipelined}


def ours(checkpoint: Any, levers: str, device: str, dtype: str, prompt: int, steps: int) -> dict[str, Any]:
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), device, dtype)
    runner.reset_cache(prompt + FIRST + 2 * steps + 2)
    mx.eval(runner.prefill(list(range(100, 100 + prompt)), 0))
    position = [prompt]

    def step(token: mx.array) -> mx.array:
        position[0] += 1
        return runner.decode_step(runner.model, token, position[0] - 1)  # unscheduled: the build alone

    return profile(step, mx.array([[5]], dtype=mx.int32), steps)


def mlx_lm(checkpoint: Any, dtype: str, prompt: int, steps: int) -> dict[str, Any]:
    from mlx_lm.models.cache import make_prompt_cache

    model = load_gguf_model(checkpoint, getattr(mx, dtype))
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(100, 100 + prompt))], dtype=mx.int32), cache=cache))
    return profile(lambda token: model(token, cache=cache)[:, -1, :], mx.array([[5]], dtype=mx.int32), steps)


def _line(name: str, row: dict[str, Any]) -> str:
    first = " ".join(f"{ms:.1f}" for ms in row["first_ms"])
    return (f"{name:70s} first calls {first} ms; build {row['build']['median_ms']:.2f} ms, step "
            f"{row['step']['median_ms']:.2f} ms, pipelined {row['pipelined_ms']:.2f} ms ({row['tokens_per_s']:.0f}/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="auto", help="auto, cpu or gpu")
    parser.add_argument("--dtype", default=None, help="default: float16 on a GPU, float32 on the CPU")
    parser.add_argument("-p", "--prompt", type=int, default=64, help="prompt tokens before the timed steps")
    parser.add_argument("-n", "--steps", type=int, default=64, help="steady-state steps timed, each way")
    parser.add_argument("--levers", action="append", help="a lever set of ours (repeatable; default: quantized)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = BACKEND.resolve_device(args.device)
    dtype = BACKEND.resolve_dtype(args.dtype or ("float32" if device == "cpu" else "float16"), device)
    mx.set_default_device(mx.cpu if device == "cpu" else mx.gpu)
    checkpoint = load_checkpoint(args.model)
    result: dict[str, Any] = {"model": checkpoint.source, "device": device, "dtype": dtype, "prompt": args.prompt,
                              "steps": args.steps, "ours": {}}
    for levers in args.levers or ["quantized"]:
        result["ours"][levers] = ours(checkpoint, levers, device, dtype, args.prompt, args.steps)
        print(_line(levers, result["ours"][levers]), flush=True)
    result["mlx-lm"] = mlx_lm(checkpoint, dtype, args.prompt, args.steps)
    print(_line("mlx-lm", result["mlx-lm"]), flush=True)
    result["environment"] = capture_environment()
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
