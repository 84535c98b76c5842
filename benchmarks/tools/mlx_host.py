"""Where an MLX decode step's time goes, kerneltriage's (per lever set) beside mlx-lm's on the same weights: the
first calls one by one (a compiled step traces, and on CUDA compiles its fused kernels, on the first), then the
steady state: the graph build (the step call returning, before any evaluation: Python and MLX's graph on the
host), the synchronous step (build and evaluation, one token at a time), the pipelined token (mlx-lm's pattern: each
step's greedy token queued with its step, the last one read while the next runs) and the engine's own token loop (ours
through the runner's loop and sampler with its levers, as `bench` times it; mlx-lm's `generate_step`). On a GPU, MLX
encodes a step's kernels on the host thread that queues it, so a host-bound step's token is its build plus that
encoding; a loop slower than the pipelined token spends the difference in its own work between steps.

Usage: python benchmarks/tools/mlx_host.py [--model default] [--device gpu] [--dtype float16] [-p 64] [-n 64]
           [--levers quantized] [--levers quantized,packed_qkv,...] [--out FILE.json]
Lines print as each measurement ends (a run cut short keeps what it printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import mlx.core as mx

from kerneltriage.backends.mlx.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sampling import SamplingParams
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
    began = time.perf_counter()  # mlx-lm's pattern: each step's token queued with its step, the last one read
    nxt = mx.argmax(step(token), axis=-1).astype(mx.int32)  # int32, as our sampler feeds it (journal)
    mx.async_eval(nxt)
    for _ in range(steps):
        last = nxt
        nxt = mx.argmax(step(last.reshape(1, 1)), axis=-1).astype(mx.int32)
        mx.async_eval(nxt)
        last.item()
    nxt.item()
    return {"first_ms": first, "build": _ms(build), "step": _ms(whole),
            "pipelined_ms": (time.perf_counter() - began) / (steps + 1) * 1e3}


def loop_ms(loop: Iterator[Any], steps: int) -> float:
    """Milliseconds a token of a token loop's `steps` tokens after its first (the prefill's)."""
    next(loop)
    began = time.perf_counter()
    if len(list(loop)) != steps:
        raise RuntimeError(f"the token loop gave other than {steps} tokens after its first")
    return (time.perf_counter() - began) / steps * 1e3


def ours(checkpoint: Any, levers: str, device: str, dtype: str, prompt: int, steps: int) -> dict[str, Any]:
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), device, dtype)
    prefix = list(range(100, 100 + prompt))
    runner.reset_cache(prompt + FIRST + 3 * steps + 3)
    mx.eval(runner.prefill(prefix, 0))
    position = [prompt]

    def step(token: mx.array) -> mx.array:
        position[0] += 1
        return runner.decode_step(runner.model, token, position[0] - 1)  # unscheduled: the build alone

    row = profile(step, mx.array([[5]], dtype=mx.int32), steps)
    runner.reset_cache(prompt + steps + 1)  # the engine's own token loop, as `bench` times it
    loop = runner.loop(runner.prefill(prefix, 0), prompt, steps + 1, runner.sampler(SamplingParams(), prefix))
    return {**row, "loop_ms": loop_ms(loop, steps)}


def mlx_lm(checkpoint: Any, dtype: str, prompt: int, steps: int) -> dict[str, Any]:
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    model = load_gguf_model(checkpoint, getattr(mx, dtype))
    prefix = mx.array([list(range(100, 100 + prompt))], dtype=mx.int32)
    cache = make_prompt_cache(model)
    mx.eval(model(prefix, cache=cache))
    row = profile(lambda token: model(token, cache=cache)[:, -1, :], mx.array([[5]], dtype=mx.int32), steps)
    loop = generate_step(prefix[0], model, max_tokens=steps + 1, sampler=lambda logits: mx.argmax(logits, axis=-1),
                         prompt_cache=make_prompt_cache(model))  # its own token loop, as the mlx-lm peer times it
    return {**row, "loop_ms": loop_ms(loop, steps)}


def _line(name: str, row: dict[str, Any]) -> str:
    first = " ".join(f"{ms:.1f}" for ms in row["first_ms"])
    return (f"{name:70s} first calls {first} ms; build {row['build']['median_ms']:.2f} ms, step "
            f"{row['step']['median_ms']:.2f} ms, pipelined {row['pipelined_ms']:.2f} ms, its own token loop "
            f"{row['loop_ms']:.2f} ms ({1e3 / row['loop_ms']:.0f} tok/s)")


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
