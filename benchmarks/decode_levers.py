"""Decode and prefill speed of lever sets on one model, with token digests (a quick look before `ab`).

Usage: python benchmarks/decode_levers.py --model default --sets "none;graphs;graphs,one_sync" \
           [-p 512] [-n 128] [-r 5] [--out DIR]
Each set gets a fresh runner, one warm-up generation (graph capture happens there), then `-r` timed runs
of pp{p} + tg{n} on random prompt tokens (seed 0). Sets run one after another, not interleaved: use
`kerneltriage ab` for claims. Writes DIR/decode-levers-<model>-<device>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
from pathlib import Path

import torch

from kerneltriage.backends.torch.accelerate import apply_levers
from kerneltriage.backends.torch.device import resolve_device, resolve_dtype
from kerneltriage.backends.torch.generate import generate_step
from kerneltriage.backends.torch.runner import build_runner
from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.levers import parse_levers
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.sources import load_checkpoint


def one_run(runner, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    """(prefill tok/s, decode tok/s excluding the first token, tokens)."""
    start = synced_clock(runner.device)
    tokens, stamps = [], []
    for token in generate_step(runner, prompt, SamplingParams(), new):
        tokens.append(token)
        stamps.append(synced_clock(runner.device))
    return len(prompt) / (stamps[0] - start), (new - 1) / (stamps[-1] - stamps[0]), tokens


def measure(checkpoint, levers: tuple[str, ...], prompt: list[int], args, device, dtype) -> dict:
    runner = apply_levers(build_runner(checkpoint, device, dtype), levers)
    one_run(runner, prompt, args.n)  # warm-up: allocator, autotuning, graph capture
    runs = [one_run(runner, prompt, args.n) for _ in range(args.r)]
    prefill, decode = [r[0] for r in runs], [r[1] for r in runs]
    digest = hashlib.sha256(json.dumps(runs[0][2]).encode()).hexdigest()[:16]
    counters = dict(runner.counters)
    del runner
    torch.cuda.empty_cache() if device.type == "cuda" else None
    quartiles = lambda xs: statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3  # noqa: E731
    return {"levers": list(levers), "prefill_tps": prefill, "decode_tps": decode,
            "prefill_median": statistics.median(prefill), "decode_median": statistics.median(decode),
            "decode_iqr": quartiles(decode)[2] - quartiles(decode)[0], "digest": digest, "counters": counters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--sets", default="none;graphs;graphs,one_sync")
    parser.add_argument("-p", type=int, default=512)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = resolve_dtype(None, device)
    checkpoint = load_checkpoint(args.model)
    rng = random.Random(0)
    prompt = [rng.randrange(checkpoint.config.vocab_size) for _ in range(args.p)]
    name = checkpoint.config.name or args.model
    out = Path(args.out) / f"decode-levers-{name}-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.sets.split(";"):
        levers = parse_levers("" if spec == "none" else spec)
        try:
            rows.append(measure(checkpoint, levers, prompt, args, device, dtype))
        except Exception as exc:  # a lever that fails here is a result to record, then the next set runs
            rows.append({"levers": list(levers), "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            print(f"{spec:50s} FAILED {rows[-1]['error']}", flush=True)
            continue
        finally:  # written after every set: a later crash keeps what was measured
            out.write_text(json.dumps({"benchmark": "decode-levers", "model": checkpoint.source,
                                       "dtype": str(dtype), "prompt_tokens": args.p, "new_tokens": args.n,
                                       "repeats": args.r, "interleaved": False, "rows": rows,
                                       "environment": capture_environment()}, indent=2))
        row = rows[-1]
        print(f"{spec:50s} prefill {row['prefill_median']:>10,.0f} tok/s  decode {row['decode_median']:>8,.1f} "
              f"± {row['decode_iqr']:.1f} tok/s  digest {row['digest']}", flush=True)

if __name__ == "__main__":
    main()
