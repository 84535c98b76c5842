"""Speculative decoding on the prompt sets (repetitive, plain) against plain decoding, same model, through the
bench harness (`prompts_sample`: every prompt decoded in turn, the decode time summed).

Usage: python benchmarks/spec_prompts.py [--configs "levers=|levers=graphs|levers=graphs;spec=ngram"]
           [-n 96] [--per-set 4] [--dtype float32] [--sets repetitive,plain]   (configs split on '|', each an `ab` side)
Each config runs every prompt (chat template, greedy, EOS ignored so lengths match) once untimed (graph capture,
compilation), then timed; decode tok/s is total decode tokens / total decode time. Outputs must equal the first
config's, token for token. One runner per config serves both sets. For a verdict with an A/A band, use
`kerneltriage ab --prompts benchmarks/prompts/<set>.jsonl`. Writes DIR/spec-prompts-<device>-<dtype>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

from kerneltriage.bench.harness import prompts_sample
from kerneltriage.bench.workloads import load_prompt_set
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.backend import get_backend
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint

PROMPTS = Path(__file__).parent / "prompts"


def run_config(runner, prompts: tuple[tuple[int, ...], ...], new: int) -> dict:
    # One cache for the longest prompt; an untimed pass captures (and compiles) every window and row count first.
    runner.reset_cache(max(map(len, prompts)) + new + 1)
    prompts_sample(runner, prompts, new)
    row = {"decode_s": 0.0, "outputs": [], "spec": []}
    for prompt in prompts:  # one at a time: the decoder's stats and decisions restart with every run
        sample = prompts_sample(runner, [prompt], new)
        row["decode_s"] += sample.timed
        row["outputs"].append(list(sample.tokens))
        if runner.speculation is not None:  # the auto depth's decisions say why a prompt speculated less
            loop = runner.speculation
            row["spec"].append([loop.stats.summary()] + [f"step {d.step}: {d.reason}" for d in loop.controller.decisions])
            row.setdefault("stats", []).append(loop.stats.brief())
    row["decode_tps"] = new * len(prompts) / row["decode_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--configs", default="levers=|levers=graphs|levers=graphs;spec=ngram")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bf16 | fp16 (float32: exact comparisons)")
    parser.add_argument("-n", type=int, default=96)
    parser.add_argument("--per-set", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--sets", default="repetitive,plain", help="prompt sets (benchmarks/prompts/NAME.jsonl)")
    args = parser.parse_args()
    backend = get_backend()
    device = backend.resolve_device("auto")
    dtype = backend.resolve_dtype(args.dtype, device)
    checkpoint = load_checkpoint(args.model)
    sets = {name: load_prompt_set(PROMPTS / f"{name}.jsonl", checkpoint.tokenizer).prompts[: args.per_set]
            for name in args.sets.split(",")}
    result = {"benchmark": "spec-prompts", "model": checkpoint.source, "dtype": dtype, "new_tokens": args.n,
              "sets": {name: {} for name in sets}, "environment": capture_environment()}
    out = Path(args.out) / f"spec-prompts-{device.split(':')[0]}-{dtype}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for text in args.configs.split("|"):  # one runner per config serves both sets: it compiles once
        runner = backend.build(checkpoint, RunConfig.parse(text, "--configs"), device, dtype)
        for name, prompts in sets.items():
            rows = result["sets"][name]
            rows[text] = run_config(runner, prompts, args.n)
            rows[text]["same_as_first"] = rows[text]["outputs"] == next(iter(rows.values()))["outputs"]
            print(f"{name:10s} {text:40s} decode {rows[text]['decode_tps']:8.1f} tok/s "
                  f"same={rows[text]['same_as_first']}", *sum(rows[text]["spec"], []), sep="\n    ", flush=True)
        backend.release(runner)
        del runner
        gc.collect()  # lever closures hold cycles back to the runner: free its model before the next one
        out.write_text(json.dumps(result, indent=2))  # after every config: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
