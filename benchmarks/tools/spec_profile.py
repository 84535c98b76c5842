"""Where a speculative decode's time goes on this device: the decoder's calls timed on the host during real runs
over a prompt set, then the verify forward and a plain step timed alone at a fixed position.

Usage: python benchmarks/tools/spec_profile.py [--model default] [--config "levers=...;spec=suffix"]
           [--set repetitive] [--per-set 4] [-n 64] [--passes 1] [--out FILE.json]
Per call (host seconds, perf_counter, no extra syncs): the drafter's `draft` (at verify steps and, with auto depth,
after every plain token), `runner.verify` (queueing the forward), the sampler's `accept` (it reads the result: the wait
for the device lands here), `trim_cache`, the decoder's synced `clock` reads (a model drafter's steps only, since
2026-12-01's fourth session), plain `decode` calls (graph captures inside a timed run are ruled
out by the decoder's `prepare_steps` and its tests, not counted here).
Alone, at one position (--iters each), for each padded verify shape: a plain step and a verify queued back to back
(device-bound: the device's time per call), and verify + accept + trim one after another (what one verify step costs
the loop); with `one_sync` in the config, resident steps (drafted, chosen and accepted on the device) queued back to
back: verifies, and plain steps. With --passes N the set is timed N times in a row on the one runner, as `ab`'s
consecutive samples of a side run it (the controller's state carried from each to the next): per pass its seconds,
the decoder's step counts, the host's calls and every resident step that emitted (`passes`; the top-level figures
are the first pass's) — whether later passes run other steps, or the same steps slower.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from kerneltriage.bench.harness import prompts_sample
from kerneltriage.bench.workloads import load_prompt_set
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.backend import get_backend
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.draft import Draft
from kerneltriage.engine.speculative.resident import CHOICES, WIDEST
from kerneltriage.engine.sources import load_checkpoint

PROMPTS = Path(__file__).resolve().parents[1] / "prompts"
FUSED = "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs"
OPEN = 1 << 30  # the resident steps' run end: none reached (every step queued runs a body)


class Timed:
    """Host seconds per named call, collected while `on`."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.on = False

    def wrap(self, owner: object, name: str, label: str | None = None) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            began = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if self.on:
                    self.seconds[label or name].append(time.perf_counter() - began)

        setattr(owner, name, timed)

    def report(self) -> dict[str, dict[str, float]]:
        return {name: {"calls": len(s), "mean_us": 1e6 * statistics.fmean(s), "median_us": 1e6 * statistics.median(s),
                       "total_ms": 1e3 * sum(s)} for name, s in self.seconds.items() if s}


def alone(runner, iters: int, position: int, rows: int) -> dict[str, float]:  # noqa: ANN001 - a torch Runner
    """µs per call of a plain step and a verify queued back to back, and of verify + accept + trim in turn."""
    import torch

    token, drafts = 1, list(range(2, 2 + rows - 1))
    sampler = runner.sampler(SamplingParams(), [0] * position)

    def queued(call) -> float:  # noqa: ANN001
        call()
        runner.synchronize()
        began = time.perf_counter()
        for _ in range(iters):
            call()
        runner.synchronize()
        return 1e6 * (time.perf_counter() - began) / iters

    def step() -> None:
        sampler.accept(runner.verify(token, drafts, position, rows), Draft(drafts))
        runner.trim_cache(position + 1)

    with torch.inference_mode():
        result = {"plain_queued_us": queued(lambda: runner.decode(token, position)),
                  "verify_queued_us": queued(lambda: runner.verify(token, drafts, position, rows)),
                  "verify_step_serial_us": queued(step), "rows": rows}
        if runner.device_type == "cuda":  # the device's kernels per call, graph replays included
            result["kernels_plain"] = kernels(runner, lambda: runner.decode(token, position))
            result["kernels_verify"] = kernels(runner, lambda: runner.verify(token, drafts, position, rows))
        if runner.resident and runner.speculation.queue_ahead:
            result |= resident(runner, position, rows, queued)
    return result


def resident(runner, position: int, rows: int, queued) -> dict:  # noqa: ANN001
    """µs per resident step queued back to back from `position` (draft, choice, forward, argmax, accept on the
    device): verifies of `rows` (the text repeats, so each chooses the widest shape it is allowed: capped at
    `rows`) and plain steps (capped at none); each call puts the device's text back at position + 1 tokens (an
    upload and a fill) and queues as many steps as the cache holds beyond it, reading the last; and the verifies'
    kernels."""
    text = [(7 * i) % 50 for i in range(position + 1)]  # repeats: drafts copy, as on copied text
    lookback = runner.speculation.speculation.lookback
    found = {}
    for name, cap, width in (("resident", CHOICES.index(rows), rows), ("resident_plain", 0, 1)):
        steps = max(1, (runner.cache_capacity - position - WIDEST) // width)

        def chunk(cap: int = cap, width: int = width, steps: int = steps) -> None:
            runner.begin_resident(text, lookback)  # the text put back (the steps appended to it)
            results = [runner.queue_step(position + i * width + WIDEST, (cap, 1, OPEN)) for i in range(steps)]
            results[-1].result()

        found |= {f"{name}_queued_us": queued(chunk) / steps, f"{name}_steps_per_call": steps}
        if cap and runner.device_type == "cuda":
            found["kernels_resident"] = [{key: value / steps if isinstance(value, float) else value
                                          for key, value in entry.items()} for entry in kernels(runner, chunk)]
    return found


def trace_steps(decoder, timed: Timed) -> list[dict]:  # noqa: ANN001
    """Every resident step the decoder records while `timed` is on, in order: its rows (1: plain), the drafts it kept,
    the match it drafted from, its seconds (between two results arriving), and the controller's limits then (the
    least match, the depth) — the list filled as the run goes."""
    steps, record = [], decoder.record_step

    def traced(runner, rows: int, accepted: int, seconds: float, matched: int = 0) -> None:  # noqa: ANN001
        if timed.on:
            steps.append({"rows": rows, "accepted": accepted, "us": round(1e6 * seconds, 1), "matched": matched,
                          "least": decoder.controller.least, "k": decoder.controller.next_depth()})
        record(runner, rows, accepted, seconds, matched)

    decoder.record_step = traced
    return steps


def kernels(runner, call, calls: int = 20, top: int = 12) -> list[dict]:  # noqa: ANN001
    """The top device kernels of `calls` calls (µs per call, launches per call), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        runner.synchronize()
    rows = [{"kernel": e.key[:90], "us_per_call": getattr(e, "device_time_total", 0.0) / calls,
             "launches_per_call": e.count / calls} for e in prof.key_averages()]
    rows.sort(key=lambda row: -row["us_per_call"])
    return [{"total_us_per_call": sum(row["us_per_call"] for row in rows),
             "launches_per_call": sum(row["launches_per_call"] for row in rows)}] + rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--config", default=f"levers={FUSED};spec=suffix")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--set", default="repetitive")
    parser.add_argument("--per-set", type=int, default=4)
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--passes", type=int, default=1, help="timed passes over the set in a row (ab's samples)")
    parser.add_argument("--out", default="spec-profile.json")
    parser.add_argument("--texts-out", default=None, help="also write the greedy texts this device wrote, as "
                        "draft_replay.py --texts reads them (replay the device's own text, not the CPU's)")
    args = parser.parse_args()
    if args.passes < 1:
        parser.error(f"--passes {args.passes}: expected 1 or more")
    backend = get_backend()
    device = backend.resolve_device("auto")
    dtype = backend.resolve_dtype(args.dtype, device)
    checkpoint = load_checkpoint(args.model)
    prompts = load_prompt_set(PROMPTS / f"{args.set}.jsonl", checkpoint.tokenizer).prompts[: args.per_set]
    runner = backend.build(checkpoint, RunConfig.parse(args.config, "--config"), device, dtype)
    decoder, timed = runner.speculation, Timed()
    for name in ("verify", "trim_cache", "clock", "decode", "queue_step", "begin_resident"):
        timed.wrap(runner, name)
    timed.wrap(decoder.drafter, "draft")
    make_sampler = runner.sampler

    def sampler(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        made = make_sampler(*args, **kwargs)
        timed.wrap(made, "accept")
        return made

    runner.sampler = sampler
    runner.reset_cache(max(map(len, prompts)) + args.n + 1)
    prompts_sample(runner, prompts, args.n)  # untimed: captures every window and row count
    steps = trace_steps(decoder, timed)
    passes = []
    for _ in range(args.passes):
        decoder.reset_total()
        timed.seconds.clear()
        del steps[:]
        timed.on = True
        sample = prompts_sample(runner, prompts, args.n)
        timed.on = False
        stats = decoder.total
        passes.append({"decode_tok_s": args.n * len(prompts) / sample.timed, "decode_s": sample.timed,
                       "calls": timed.report(), "spec": stats.brief(),
                       "verify_ms_mean": 1e3 * statistics.fmean(stats.verify_seconds) if stats.verify_seconds
                       else None,
                       "plain_ms_mean": 1e3 * statistics.fmean(stats.plain_seconds) if stats.plain_seconds else None,
                       "draft_ms_mean": 1e3 * statistics.fmean(stats.draft_seconds) if stats.draft_seconds else None,
                       "resident_steps": list(steps)})
    result = {"benchmark": "spec-profile", "model": checkpoint.source, "config": args.config, "set": args.set,
              "prompts": len(prompts), "new_tokens": args.n, "dtype": dtype, **passes[0]}
    if args.passes > 1:
        result["passes"] = passes
    shapes = decoder.shapes(runner) or [decoder.controller.deepest + 1]
    result["alone"] = [alone(runner, args.iters, max(map(len, prompts)), rows) for rows in shapes]
    result["environment"] = capture_environment()
    Path(args.out).write_text(json.dumps(result, indent=2))
    if args.texts_out:  # greedy: the timed run's tokens again, a prompt at a time
        texts = [[list(p), list(prompts_sample(runner, [p], args.n).tokens)] for p in prompts]
        Path(args.texts_out).write_text(json.dumps({"model": args.model, "n": args.n, "dtype": dtype,
                                                    "device": device, "sets": {args.set: texts}}))
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))


if __name__ == "__main__":
    main()
