"""Speculative decoding on the two prompt sets (repetitive, plain) against plain decoding, same model.

Usage: python benchmarks/spec_prompts.py [--configs "levers=|levers=graphs|spec=ngram;levers=last_logits"]
           [-n 96] [--per-set 4] [--dtype float32]   (configs split on '|', fields on ';', levers on ',')
Each config runs every prompt (chat template, greedy, EOS ignored so lengths match) once untimed (graph capture,
compilation), then timed; decode tok/s is total decode tokens / total decode time. Outputs must equal the first config's, token for token.
One runner per config serves both sets. Writes DIR/spec-prompts-<device>-<dtype>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch
from decode_levers import one_run  # the same timed generation loop

from kerneltriage.backends.torch.accelerate import apply_levers
from kerneltriage.backends.torch.device import resolve_device, resolve_dtype
from kerneltriage.backends.torch.runner import build_runner
from kerneltriage.backends.torch.speculative import decoder_of, install_speculation
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.levers import parse_levers
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.engine.speculative import parse_spec

PROMPTS = Path(__file__).parent / "prompts"


def make_runner(checkpoint, config: str, device: torch.device, dtype: torch.dtype):
    fields = dict(part.split("=", 1) for part in config.split(";") if part)
    runner = apply_levers(build_runner(checkpoint, device, dtype), parse_levers(fields.get("levers", "")))
    if fields.get("spec"):
        install_speculation(runner, parse_spec(fields["spec"], fields.get("depth")))
    return runner


def run_config(runner, prompts: list[list[int]], new: int) -> dict:
    # One cache for the longest prompt, then an untimed pass over every prompt: the graphs of every window
    # and row count are captured (and compiled) before the timed pass, which measures the steady state.
    runner.reset_cache(max(map(len, prompts)) + new)
    for prompt in prompts:
        one_run(runner, prompt, new)
    seconds = count = 0
    outputs = []
    speculative = decoder_of(runner) is not None
    summaries = []  # per prompt: the decoder's stats and decisions restart with every run
    for prompt in prompts:
        _, rate, tokens = one_run(runner, prompt, new)
        seconds, count = seconds + (len(tokens) - 1) / rate, count + len(tokens) - 1
        outputs.append(tokens)
        if speculative:  # the auto depth's decisions say why a prompt speculated less than a fixed depth did
            loop = runner.decode_loop
            summaries.append([loop.stats.summary()] + [f"step {d.step}: {d.reason}" for d in loop.controller.decisions])
    row = {"decode_tps": count / seconds, "outputs": outputs}
    if speculative:
        row["spec"] = summaries
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--configs", default="levers=|levers=graphs|spec=ngram")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bf16 | fp16 (float32: exact comparisons)")
    parser.add_argument("-n", type=int, default=96)
    parser.add_argument("--per-set", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    device = resolve_device("auto")
    dtype = resolve_dtype(args.dtype, device)
    checkpoint = load_checkpoint(args.model)
    tok = checkpoint.tokenizer
    result = {"benchmark": "spec-prompts", "model": checkpoint.source, "dtype": str(dtype), "new_tokens": args.n,
              "sets": {}, "environment": capture_environment()}
    sets = {}
    for name in ("repetitive", "plain"):
        lines = (PROMPTS / f"{name}.jsonl").read_text().splitlines()[: args.per_set]
        texts = [json.loads(line)["prompt"] for line in lines]
        sets[name] = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]), add_special=False)
                      for t in texts]
        result["sets"][name] = {}
    out = Path(args.out) / f"spec-prompts-{device.type}-{str(dtype).removeprefix('torch.')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for config in args.configs.split("|"):  # one runner per config serves both sets: it compiles once
        runner = make_runner(checkpoint, config, device, dtype)
        for name, prompts in sets.items():
            rows = result["sets"][name]
            rows[config] = run_config(runner, prompts, args.n)
            rows[config]["same_as_first"] = rows[config]["outputs"] == next(iter(rows.values()))["outputs"]
            print(f"{name:10s} {config:40s} decode {rows[config]['decode_tps']:8.1f} tok/s "
                  f"same={rows[config]['same_as_first']}", *sum(rows[config].get("spec", []), []), sep="\n    ",
                  flush=True)
        del runner
        gc.collect()  # lever closures hold cycles back to the runner: free its model before the next one
        out.write_text(json.dumps(result, indent=2))  # after every config: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
