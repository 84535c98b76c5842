"""Where does `vocab_compact` stop paying? For each allowed-set size K, the output head both ways on one model, paired
and interleaved in one process: the full projection plus the constraint's mask (what a constrained step does without
the lever) against the compact head (K rows gathered, one small GEMV, the rest -inf). The whole decode step both ways
at a few sizes too, since the head is only a share of it. The crossover is the smallest K whose compact head is not
faster; backends/torch/vocab_compact.py's CROSSOVER takes it per device type.

    python benchmarks/tools/vocab_crossover.py --model default --device cpu --out FILE.json
    python benchmarks/tools/vocab_crossover.py --model default --device cuda --out FILE.json   (the H200)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

SMALL = (1, 16, 128, 1024)  # allowed-set sizes, then shares of the vocabulary (49,152: 2,048 … 49,152)
SHARES = (1 / 24, 1 / 12, 1 / 6, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 1)
STEP_SIZES = (16, 1024)  # and V/6: whole decode steps both ways
PROMPT = 32


def words_of(ids: np.ndarray, vocab: int) -> np.ndarray:
    """The bitmask (int32 words) that allows `ids`."""
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[ids] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


def paired(runner: Any, first: Callable[[], Any], second: Callable[[], Any], repeats: int) -> tuple[list, list]:
    """Seconds of each, `repeats` pairs, the order alternating; the runner's clock synchronizes the device."""
    a, b = [], []
    for r in range(repeats):
        for fn, out in ((first, a), (second, b)) if r % 2 == 0 else ((second, b), (first, a)):
            began = runner.clock()
            fn()
            out.append(runner.clock() - began)
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: its own choice)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from kerneltriage.backends.torch import vocab_compact
    from kerneltriage.backends.torch.vocab_compact import hidden_one
    from kerneltriage.core.environment import capture_environment
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.sources import load_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = get_backend("torch")
    device = backend.resolve_device(args.device)
    checkpoint = load_checkpoint(args.model)
    runner = backend.build(checkpoint, RunConfig(), device, backend.resolve_dtype(args.dtype, device))
    vocab = checkpoint.config.vocab_size
    vocab_compact.CROSSOVER[runner.device.type] = 1.0  # every size goes through the compact head here
    vocab_compact.vocab_compact(runner)
    model, rng = runner.model, np.random.default_rng(0)
    runner.reset_cache(PROMPT + 8)
    runner.prefill(rng.integers(0, vocab, PROMPT).tolist(), 0)
    token = runner.tensor([int(rng.integers(vocab))])
    with torch.inference_mode():
        hidden = hidden_one(model, token, PROMPT)
        heads, steps = [], []
        sizes = sorted({*SMALL, *(int(share * vocab) for share in SHARES)})
        for k in sizes:
            ids = np.sort(rng.choice(vocab, size=min(k, vocab), replace=False))
            words = words_of(ids, vocab)
            full, compact = paired(runner, partial(_full_head, runner, hidden, words),
                                   partial(runner.compact_step.head, hidden, ids), args.repeats)
            heads.append(_row(k, full, compact))
            print(json.dumps(heads[-1]), file=sys.stderr)
            if k in STEP_SIZES or k == int(vocab / 6):
                steps.append(_row(k, *paired(runner, partial(_step, runner, token, words, None),
                                             partial(_step, runner, token, None, ids), max(5, args.repeats // 2))))
                print(json.dumps(steps[-1]), file=sys.stderr)
    crossover = next((h["k"] for h in heads if h["compact_over_full"] >= 1.0), None)
    report = {"model": args.model, "vocab": vocab, "device": device, "dtype": runner.dtype,
              "threads": torch.get_num_threads(), "head": heads,
              "step": steps, "crossover_k": crossover, "load": os.getloadavg(), "environment": capture_environment()}
    text = json.dumps(report, indent=1)
    args.out.write_text(text) if args.out else print(text)


def _full_head(runner: Any, hidden: torch.Tensor, words: np.ndarray) -> Any:
    return runner.masked(runner.model.logits(hidden), words)


def _step(runner: Any, token: torch.Tensor, words: np.ndarray | None, ids: np.ndarray | None) -> Any:
    """One decode step at the same position: the full one and the mask (`words`), or the compact one (`ids`)."""
    runner.trim_cache(PROMPT)
    logits = runner.decode(token, PROMPT, ids)
    return logits if words is None else runner.masked(logits, words)


def _row(k: int, full: list[float], compact: list[float]) -> dict[str, float]:
    ratios = sorted(c / f for c, f in zip(compact, full))
    return {"k": k, "full_us": statistics.median(full) * 1e6, "compact_us": statistics.median(compact) * 1e6,
            "compact_over_full": statistics.median(ratios), "ratio_q1": ratios[len(ratios) // 4],
            "ratio_q3": ratios[3 * len(ratios) // 4]}


if __name__ == "__main__":
    main()
