"""Decode step time of the `fused_layer` lever against the best stock set, at several depths, the GEMV columns
per program and the chunks of keys (`kernels/fused_layer.BN`, `MAX_SPLITS`; 2026-12-01 swept 2/4/8 and 16/32/64),
programmatic dependent launch on and off (`pdl`), and each kernel's count and µs per token (torch.profiler over graph
replays): what to keep before `bench` and `ab` judge it. CUDA only.

    python3 benchmarks/fused_layer_probe.py --model smollm2-135m --depths 0,2048 --out probe.json

Per configuration and depth: the prompt (random tokens) prefilled to the depth, then 128 greedy steps fed back on
the device (no host readback inside the timed loop), wall time over the steps / 128, the median of 5 runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import triton

from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.kernels import fused_layer

FUSED = "packed_qkv,last_logits,fused_norm,fused_layer,graphs"
STEPS, RUNS = 128, 5


def _step_ms(runner, depth: int) -> list[float]:  # noqa: ANN001
    gen = torch.Generator().manual_seed(depth)
    prompt = torch.randint(0, runner.config.vocab_size, (max(depth, 1),), generator=gen).tolist()
    times = []
    for _ in range(RUNS + 1):  # the first run captures the graphs (and compiles)
        runner.reset_cache(len(prompt) + STEPS + 1)
        logits = runner.prefill(prompt, 0)
        token = logits.argmax(-1).view(1, 1)
        runner.synchronize()
        start = time.perf_counter()
        for i in range(STEPS):
            token = runner.decode(token, len(prompt) + i).argmax(-1).view(1, 1)
        runner.synchronize()
        times.append((time.perf_counter() - start) / STEPS * 1e3)
    return times[1:]


def _profile(runner, depth: int, steps: int = 16) -> list[dict]:  # noqa: ANN001
    """Kernels per token and µs per kernel of `steps` decode steps at `depth` (after one untimed run)."""
    from torch.profiler import ProfilerActivity, profile

    _step_ms(runner, depth)
    prompt = [1] * max(depth, 1)
    runner.reset_cache(len(prompt) + steps + 1)
    token = runner.prefill(prompt, 0).argmax(-1).view(1, 1)
    runner.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            token = runner.decode(token, len(prompt) + i).argmax(-1).view(1, 1)
        runner.synchronize()
    rows = [{"kernel": e.key[:90], "per_token": e.count / steps, "us": e.device_time_total / max(e.count, 1)}
            for e in prof.key_averages() if e.device_time_total > 0 and e.count]
    return sorted(rows, key=lambda r: -r["per_token"] * r["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--depths", default="0,2048")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    checkpoint = load_checkpoint(args.model)
    depths = [int(d) for d in args.depths.split(",")]
    variants = {"fused": (FUSED, None, None), "fused+pdl": (FUSED + ",pdl", None, None)}
    stock, results = (fused_layer.BN, fused_layer.MAX_SPLITS), {"model": args.model, "steps": STEPS, "runs": RUNS,
                                                "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                "triton": triton.__version__, "rows": []}
    for name, (levers, bn, splits) in variants.items():
        fused_layer.BN, fused_layer.MAX_SPLITS = bn or stock[0], splits or stock[1]
        try:
            runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cuda", "bfloat16")
            for depth in depths:
                ms = _step_ms(runner, depth)
                row = {"variant": name, "levers": levers, "depth": depth, "ms_per_token": statistics.median(ms),
                       "min": min(ms), "max": max(ms), "tok_s": 1e3 / statistics.median(ms)}
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                if name in ("fused", "fused+pdl"):
                    results[f"profile {name} depth {depth}"] = _profile(runner, depth)
            del runner
        except Exception as exc:  # noqa: BLE001 - a probe: record the failure and go on
            results["rows"].append({"variant": name, "error": repr(exc)[:400]})
            print(name, "failed:", repr(exc)[:400], flush=True)
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
