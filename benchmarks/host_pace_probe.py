"""Does the host's pace drift within a process, and is it the process or the machine? CUDA only; no model file.

Why: verify_host_probe.py saw every host call of a graphed verify 2-4× slower in the third of three passes of one
process (runner.verify 80 / 66 / 182 µs), and speculative runs on repetitive text range 2.55-3.13× from process to
process with the device's own steps unchanged: the speculative loop waits for the host after every verify.

Each round (--rounds) takes the median host µs of three things (verify_host_probe.host_us), the device idle: pure Python
work that touches no CUDA (a fixed small loop: the interpreter's and the core's pace), a graphed verify queued
(`runner.verify`: Python, the CUDA driver and the replay), and the graph's replay alone. If the Python work slows in
the same rounds as the verify, the core itself slowed (frequency, a neighbour, a migration); if only the CUDA calls
do, the driver. --pin runs the process on one core (os.sched_setaffinity), --no-gc with the collector off and the
heap frozen: run them in separate processes, alternately, to tell a variant from the time it ran at.

    python3 benchmarks/host_pace_probe.py --out pace.json [--pin] [--no-gc]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch

from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint

from verify_host_probe import host_us

FUSED = "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs"
POSITION, ROWS = 300, 16


def python_work() -> None:
    """A fixed bit of interpreter work (~20 µs): dict and list traffic, no CUDA."""
    seen: dict[int, int] = {}
    for i in range(200):
        seen[i % 37] = seen.get(i % 37, 0) + i
    sorted(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--iters", type=int, default=300, help="calls per measurement per round (default 300; the "
                        "H200 records took each median over 0.4 s instead, ~1,000-8,000 calls)")
    parser.add_argument("--pin", action="store_true", help="run on one core (the last this process may use)")
    parser.add_argument("--no-gc", action="store_true", help="the garbage collector off, the heap frozen")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    runner = BACKEND.build(load_checkpoint("smollm2-135m"), RunConfig.parse(f"levers={FUSED}", "--config"), "cuda",
                           "bfloat16")
    runner.reset_cache(POSITION + 64)
    drafts = list(range(2, ROWS + 1))
    with torch.inference_mode():
        runner.verify(1, drafts, POSITION, ROWS)  # captured now: no capture inside a round
        entry = next(iter(runner.verify_step.graphs.values()))
        if args.no_gc:
            gc.collect()
            gc.freeze()
            gc.disable()
        rounds = []
        for index in range(args.rounds):
            rounds.append({"round": index, "at_s": time.perf_counter(),
                           "python_us": host_us(python_work, args.iters),
                           "verify_us": host_us(lambda: runner.verify(1, drafts, POSITION, ROWS), args.iters),
                           "replay_us": host_us(entry.graph.replay, args.iters)})
            print(json.dumps({k: round(v, 1) for k, v in rounds[-1].items()}), flush=True)
    start = rounds[0]["at_s"]
    for row in rounds:
        row["at_s"] -= start
    result = {"benchmark": "host-pace", "pin": args.pin, "no_gc": args.no_gc, "cpus": sorted(os.sched_getaffinity(0)),
              "rounds": rounds, "environment": capture_environment()}
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
