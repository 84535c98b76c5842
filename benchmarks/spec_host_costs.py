"""The speculative loop's host work that the device waits for, timed on this machine (no device needed): indexing a
prompt in the suffix automaton, a verify step's draft with and without following the copy in progress, and one
judgement of the depth controller at 15 and 31 depths. Over the replay texts of draft_replay.py.

    python3 benchmarks/spec_host_costs.py --texts ~/.cache/kerneltriage/replay-texts.json --out costs.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.speculative.config import padded_rows
from kerneltriage.engine.speculative.controller import DepthController
from kerneltriage.engine.speculative.suffix import SuffixDrafter

PADDED = SimpleNamespace(pads_verify=True)


def us(seconds: list[float]) -> float:
    return round(1e6 * statistics.median(seconds), 1)


def prompt_index(texts: list) -> float:
    """µs to index a prompt (median over the prompts), and their median length."""
    seconds = []
    for prompt, _ in texts:
        drafter = SuffixDrafter(31)
        drafter.reset(PADDED, 0)
        began = time.perf_counter()
        drafter.catch_up(prompt)
        seconds.append(time.perf_counter() - began)
    return us(seconds)


def draft_per_step(texts: list, follow: bool, accepted: int = 8) -> float:
    """µs per draft after `accepted` + 1 tokens were emitted (the text's own), the automaton's catch-up included when
    the draft needs it (not when it follows the copy: that catch-up overlaps the verify)."""
    seconds = []
    for prompt, text in texts:
        drafter = SuffixDrafter(31)
        drafter.reset(PADDED, 0)
        drafter.catch_up(prompt)
        if not follow:
            drafter.following = None
        for end in range(1, len(text), accepted + 1):
            context = prompt + text[:end]
            began = time.perf_counter()
            drafter.draft(context, 31, None)
            seconds.append(time.perf_counter() - began)
            drafter.catch_up(context)
            if not follow:
                drafter.following = None
    return us(seconds)


def judgement(depth: int, calls: int = 300) -> float:
    """µs per depth judgement of a padded controller up to `depth`, after 20 verifies."""
    controller, rng = DepthController(None, depth, padded=True), random.Random(0)
    for _ in range(8):
        controller.observe_plain(0.0005)
    for _ in range(20):
        k = max(controller.next_depth(), 1)
        controller.observe_verify(k, rng.randrange(k + 1), 1e-5, 0.0007, padded_rows(k, depth))
    seconds = []
    for _ in range(calls):
        began = time.perf_counter()
        controller._judge()
        seconds.append(time.perf_counter() - began)
    return us(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", required=True, help="draft_replay.py's greedy texts (written by it)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    path = Path(args.texts).expanduser()
    try:
        sets = json.loads(path.read_text())["sets"]
        texts = [pair for name in ("copy_heavy", "repetitive") for pair in sets[name]]
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"--texts {path}: expected draft_replay.py's greedy texts of copy_heavy and repetitive ({exc})")
    result = {"benchmark": "spec-host-costs", "prompts": len(texts),
              "prompt_tokens_median": statistics.median(len(p) for p, _ in texts),
              "prompt_index_us": prompt_index(texts),
              "draft_us_automaton": draft_per_step(texts, follow=False),
              "draft_us_following": draft_per_step(texts, follow=True),
              "judgement_us_depth15": judgement(15), "judgement_us_depth31": judgement(31),
              "environment": capture_environment()}
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
