"""The host's share of a graphed verify step: µs on the host of each call the decoder makes between reading one
verify's tokens and the device starting the next (the device idles meanwhile), and of the alternatives. CUDA only;
no model file (the default model's shapes, random weights).

Why: in the speculative loop a verify step took 754–831 µs against the device's 691 for the verify alone
(spec-profile-repetitive-h200-shapes.json), and `runner.verify` — queueing it — 114 µs of host time (a plain step's
`decode` 46): the device waits for the host after every verify, since acceptance reads the tokens back.

Each call is timed with the device idle (synchronized first), as the loop finds it after acceptance; median of
--iters, the whole list PASSES times (a process's host pace drifts: on the H200's host one pass in three ran every
call 2–4× slower). Pieces of `Runner.verify` under `graphs`: the padded tokens to the device (`torch.tensor` of a
list), the graph's input slot written, the cache position filled, the replay, the counters, and the alternative for
the first three (the tokens through pinned memory, without blocking); then greedy acceptance on finished logits
(argmax, one read back) and the whole step serially (verify + accept + trim) against the verify queued.

    python3 benchmarks/verify_host_probe.py --out verify-host.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kerneltriage.backends.torch.acceptance import greedy_accept
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint

from verify_tiles_probe import queued_us

FUSED = "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs"
POSITION = 300
PASSES = 3


def host_us(call, iters: int, idle: bool = True) -> float:  # noqa: ANN001
    """Median host µs of `call`, the device idle before each (`idle`) or not."""
    seconds = []
    for _ in range(iters):
        if idle:
            torch.cuda.synchronize()
        began = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - began)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(seconds)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--out", default="verify-host.json")
    args = parser.parse_args()
    runner = BACKEND.build(load_checkpoint(args.model), RunConfig.from_flags(FUSED), "cuda", "bfloat16")
    runner.reset_cache(POSITION + 64)
    runner.prefill(list(range(1, POSITION + 1)), 0)
    rows, last = args.rows, 3
    drafts = list(range(7, 7 + rows - 1))
    padded = [last, *drafts]
    logits = runner.verify(last, drafts, POSITION, rows)
    token = logits[:1].argmax(-1)
    runner.decode(token, POSITION)
    step = runner.verify_step
    entry = next(g for (window, r), g in step.graphs.items() if r == rows)
    cache = runner.model.cache
    pinned = torch.empty(rows, dtype=torch.long, pin_memory=True)
    staged = torch.empty(rows, dtype=torch.long, device="cuda")
    finished = runner.verify(last, drafts, POSITION, rows)
    torch.cuda.synchronize()

    def serial_step() -> None:
        greedy_accept(runner.verify(last, drafts, POSITION, rows), drafts)
        runner.trim_cache(POSITION + 1)

    def pinned_copy() -> None:
        pinned.numpy()[:] = padded
        entry.tokens.view(-1).copy_(pinned, non_blocking=True)

    pieces = {
        "runner.verify": lambda: runner.verify(last, drafts, POSITION, rows),
        "runner.decode (token on the device)": lambda: runner.decode(token, POSITION),
        "torch.tensor(padded list, cuda)": lambda: runner.tensor(padded),
        "slot.copy_(device tensor)": lambda: entry.tokens.copy_(staged.view(1, -1)),
        "pinned write + copy_(non_blocking)": pinned_copy,
        "cache.position.fill_": lambda: cache.position.fill_(POSITION),
        "graph.replay": entry.graph.replay,
        "counters.update": lambda: runner.counters.update(entry.inside),
        "logits[:count] slice": lambda: finished[:rows],
        "greedy_accept (finished logits)": lambda: greedy_accept(finished, drafts),
        "argmax launch": lambda: finished.argmax(-1),
        "trim_cache": lambda: runner.trim_cache(POSITION + 1),
    }
    result = {"benchmark": "verify-host", "model": args.model, "rows": rows, "position": POSITION,
              "iters": args.iters, "levers": FUSED, "host_us_device_idle": {}, "environment": capture_environment()}
    for sweep in range(PASSES):  # the whole list again: a process's host pace drifts over seconds
        for name, call in pieces.items():
            result["host_us_device_idle"].setdefault(name, []).append(host_us(call, args.iters))
            print(f"{sweep} {name:40s} {result['host_us_device_idle'][name][-1]:8.1f} µs", flush=True)
    result["serial_step_us"] = queued_us(serial_step, args.iters)
    result["verify_queued_us"] = queued_us(lambda: runner.verify(last, drafts, POSITION, rows), args.iters)
    result["plain_queued_us"] = queued_us(lambda: runner.decode(token, POSITION), args.iters)
    for name in ("serial_step_us", "verify_queued_us", "plain_queued_us"):
        print(f"{name:40s} {result[name]:8.1f} µs", flush=True)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
