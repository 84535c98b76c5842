"""Prefill and decode speed of several lever sets on one model, through the bench harness (a quick look before
`ab`: the sets run one after another, not interleaved — claims come from `kerneltriage ab`).

Usage: python benchmarks/decode_levers.py --model default --sets "none;graphs;graphs,one_sync" [-p 512] [-n 128]
           [-r 5] [--out DIR]
Each set gets a fresh runner and the harness's pp{p} and tg{n} tests (one warm-up each, -r timed samples; the
decode loop is the runner's own: one_sync's pipelining is not cancelled by a per-token sync). Writes
DIR/decode-levers-<model>-<device>.json after every set.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

from kerneltriage.bench.harness import Settings, run_tests
from kerneltriage.bench.workloads import Test
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.backend import get_backend
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint


def measure(backend, checkpoint, config: RunConfig, tests: list[Test], repeats: int, device: str, dtype: str) -> dict:
    runner = backend.build(checkpoint, config, device, dtype)
    results = run_tests(runner, tests, Settings(repeats))
    row = {"levers": config.text, "counters": dict(runner.counters)}
    for result in results:
        m = result.timed
        row[result.test.phase] = {"test": result.test.name, "tok_s": m.rate, "iqr_s": m.iqr, "samples": list(m.samples),
                                  "tokens": list(result.tokens)}
    backend.release(runner)
    return row


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
    backend = get_backend()
    device = backend.resolve_device(args.device)
    dtype = backend.resolve_dtype(None, device)
    checkpoint = load_checkpoint(args.model)
    out = Path(args.out) / f"decode-levers-{checkpoint.config.name or args.model}-{device.split(':')[0]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, tests = [], [Test("pp", args.p), Test("tg", args.n)]
    for text in args.sets.split(";"):
        config = RunConfig.from_flags("" if text == "none" else text)
        rows.append(measure(backend, checkpoint, config, tests, args.r, device, dtype))
        gc.collect()
        out.write_text(json.dumps({"benchmark": "decode-levers", "model": checkpoint.source, "dtype": dtype,
                                   "tests": [t.name for t in tests], "repeats": args.r, "interleaved": False,
                                   "rows": rows, "environment": capture_environment()}, indent=2))
        row = rows[-1]
        print(f"{text:50s} prefill {row['prefill']['tok_s']:>10,.0f} tok/s  decode {row['decode']['tok_s']:>8,.1f} tok/s",
              flush=True)


if __name__ == "__main__":
    main()
