"""The speculative loop's host work that the device waits for, timed on this machine (no device needed): indexing a
prompt in the suffix automaton, a verify step's draft with and without following the copy in progress, one
judgement of the depth controller at 15 and 31 depths, and the whole of it between a verify's acceptance and the next
step's call to the target (the device idles then: acceptance reads the tokens back). Over the replay texts of
draft_replay.py.

    python3 benchmarks/spec_host_costs.py --texts ~/.cache/kerneltriage/replay-texts.json --out costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

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


def critical_path(texts: list) -> dict[str, float]:
    """The host's time between a verify's acceptance returning and the next step's call to the target (the next
    verify or plain step; the device idles meanwhile on a GPU), µs, median and mean over every verify step of the
    decoder's runs over `texts` (draft_replay's ReplayTarget on a compact vocabulary: its one-hot rows are cheap)."""
    from kerneltriage.backends.torch.sampling import TorchSampler
    from kerneltriage.engine.sampling import SamplingParams
    from kerneltriage.engine.speculative.config import parse_speculation
    from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
    from kerneltriage.engine.speculative.lookup import lookup_drafter

    from draft_replay import ReplayTarget

    ids: dict[int, int] = {}
    compact = [[[ids.setdefault(t, len(ids)) for t in part] for part in pair] for pair in texts]
    gaps, accepted = [], [None]

    class Timed(ReplayTarget):
        def verify(self, *args):  # noqa: ANN002, ANN202
            self._gap()
            return super().verify(*args)

        def decode(self, *args):  # noqa: ANN002, ANN202
            self._gap()
            return super().decode(*args)

        def _gap(self) -> None:
            if accepted[0] is not None:
                gaps.append(time.perf_counter() - accepted[0])
                accepted[0] = None

    class Sampler(TorchSampler):
        def accept(self, *args):  # noqa: ANN002, ANN202
            emitted = super().accept(*args)
            accepted[0] = time.perf_counter()
            return emitted

    speculation = parse_speculation("suffix", None)
    decoder = SpeculativeDecoder(speculation, lookup_drafter(speculation))
    target = Timed({16: 1.43, 32: 1.62}, True, len(ids))
    decoder.host_clock = target.clock
    for _ in range(2):  # the second pass is timed: the first warms the interpreter's caches
        gaps.clear()
        for prompt, continuation in compact:
            accepted[0] = None  # a prompt's last acceptance is no step's: the next prompt's set-up follows it
            first = target.start(prompt, continuation)
            list(decoder(target, first, len(prompt), len(continuation), Sampler(SamplingParams(), prompt,
                                                                              torch.device("cpu"))))
    return {"verify_steps": len(gaps), "median_us": us(gaps), "mean_us": round(1e6 * statistics.fmean(gaps), 1)}


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
              "acceptance_to_next_step": critical_path(texts),
              "environment": capture_environment()}
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
