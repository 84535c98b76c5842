"""Plain `generate` on the default model beside HF transformers eager: same weights, same prompt tokens.

Usage: python benchmarks/generate_vs_hf.py [--device auto] [--new 128] [--repeats 3] [--out DIR]
Writes DIR/generate-vs-hf-<device>.json with every sample and the environment.
Greedy; EOS ignored on both sides so both decode exactly --new tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from decode_levers import one_run  # the same timed generation loop

from kerneltriage.backends.torch.device import resolve_device, resolve_dtype
from kerneltriage.backends.torch.runner import build_runner
from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.bench.peers import StreamStamps
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.fetch import default_model_path
from kerneltriage.engine.sources import load_checkpoint

PROMPT = ("Summarise in one paragraph why batch-1 decoding of a small language model on a large GPU "
          "is limited by kernel launches rather than by memory bandwidth or arithmetic.")


def ours(runner, prompt: list[int], new: int) -> dict:
    """One run of our generator (generate_step ignores EOS: the caller decides when to stop)."""
    prefill, decode, tokens = one_run(runner, prompt, new)
    return {"prefill_tps": prefill, "decode_tps": decode, "tokens": tokens}


def hf_eager(model, prompt: list[int], new: int, device: torch.device) -> dict:
    ids = torch.tensor([prompt], device=device)
    stamps = StreamStamps()
    start = synced_clock(device)
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=stamps)
    first, end = stamps.times[1], stamps.times[-1]
    return {"prefill_tps": len(prompt) / (first - start), "decode_tps": (new - 1) / (end - first),
            "tokens": out[0, len(prompt):].tolist()}


def summarize(runs: list[dict]) -> dict:
    decode = [r["decode_tps"] for r in runs]
    prefill = [r["prefill_tps"] for r in runs]
    return {"decode_tps_median": statistics.median(decode), "decode_tps_samples": decode,
            "prefill_tps_median": statistics.median(prefill), "prefill_tps_samples": prefill}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = resolve_dtype(None, device)

    started = time.perf_counter()
    checkpoint = load_checkpoint("default")
    runner = build_runner(checkpoint, device, dtype)
    load_s = time.perf_counter() - started
    prompt = checkpoint.tokenizer.encode(PROMPT)

    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).to(device).eval()

    ours(runner, prompt, 8), hf_eager(hf, prompt, 8, device)  # warm-up
    mine, theirs = [], []
    for _ in range(args.repeats):  # interleaved
        mine.append(ours(runner, prompt, args.new))
        theirs.append(hf_eager(hf, prompt, args.new, device))
    result = {
        "benchmark": "generate-vs-hf", "model": checkpoint.source, "device": str(device),
        "dtype": str(dtype), "prompt_tokens": len(prompt), "new_tokens": args.new, "load_seconds": load_s,
        "kerneltriage": summarize(mine), "hf_eager": summarize(theirs),
        "same_tokens": mine[0]["tokens"] == theirs[0]["tokens"],
        "environment": capture_environment(),
    }
    out = Path(args.out) / f"generate-vs-hf-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))


if __name__ == "__main__":
    main()
