"""Where a graphed verify's extra time goes, and candidates against it: each kernel's µs in a plain step and in
verifies of 9, 16 and 32 rows under the fused set (torch.profiler over graph replays), and per candidate the queued µs
per replay, candidates interleaved in one process (rounds of every candidate in turn: the host and clocks drift between
processes by more than the candidates differ). CUDA only; no model file (the default model's shapes, random weights).

Why: a k = 8 verify (9 rows, padded to 16) cost 682–691 µs against a plain step's 541–551 (1.25×, H200,
verify-tiles-smollm2-preset-h200-split-gemv.json); issue 14 asks ≤ 1.15×. The tiles were swept
(`verify_tiles_probe.py`); this says which kernels hold the rest, and times what else might cut it (CANDIDATES has
what each did).

    python3 benchmarks/verify_kernels_probe.py --out verify-kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from typing import NamedTuple

import torch
from torch import nn

from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.kernels import fused_layer

from verify_tiles_probe import FUSED, POSITION, queued_us

REPLAYS, ROUNDS, ITERS = 50, 7, 100


class Candidate(NamedTuple):
    pdl: bool = True
    dot_warps: int = fused_layer.DOT_WARPS  # fused_layer's knobs while its graphs are captured
    split_programs: int = fused_layer.SPLIT_PROGRAMS
    gather: bool = False  # the embedding as a gather (_Gathered)


# 2026-12-01, H200, median of 7 interleaved rounds (µs per replay; verify / plain at 9 / 16 / 32 rows):
# round 1 (verify-kernels-smollm2-preset-h200-round1.json, machine 2): current 774 / 814 / 916 against a plain step's
#   602 (1.29 / 1.35 / 1.52); PDL off 855 / 871 / 945 (plain 660); 2 / 1 / 8 warps per tl.dot program 816 / 848 /
#   1,020, 813 / 863 / 1,100, 1,014 / 1,054 / 1,134; the weights asked of L2 before PDL's wait (PTX
#   prefetch.global.L2 in `_gemv2`; "current" there, "no prefetch" is the code since) 741 / 794 / 902 without it:
#   the prefetch cost ~20 µs, dropped; the gathered embedding 747 / 803 / 918 (with the prefetch).
# round 2 (…-round2.json, machine 3): current 742 / 798 / 904, plain 598 (1.24 / 1.33 / 1.51); the loads a split K's
#   epilogue needs (residual, RoPE's tables, positions) issued before its count ("current" there; "no hoist" is the
#   code since) 736 / 804 / 896: nothing, dropped; K split until 32 / 128 programs 768 / 846 / 915, 855 / 871 / 1,043
#   (64 stays); the gathered embedding 735 / 791 / 900: 7–13 µs at 9–16 rows, but at one row its kernel takes 4.3 µs
#   against index_select's 2.8 (round 1's profiles): not taken.
# The per-kernel tables without PDL (…-round0.json: each kernel alone, no overlap) put the 16-row verify's extra
# ~200 µs in the GEMVs (o_proj + down +76, gate/up +41, q/k/v +45: ~1.3–1.5 µs more per tl.dot launch than per one-row
# launch), attention +16, the embedding's index_select +9.
# round 3 (2026-12-02, …-loop.json): instead of tl.dot, the verify rows summed one at a time on the CUDA cores, each as
#   the one-row GEMV sums (its tiles: 4 columns, the whole K per program; a code variant, removed): at 9 / 16 / 32 rows
#   1,431 / 1,983 / 1,015 (rows ≤ 16 so; 32: tl.dot) against current 849 / 927 / 1,016, plain 706 (1.97 / 2.73×);
#   2 or 8 columns per program 1,504 / 2,230 and 1,708 / 2,789; all 32 rows so 4,351. Every row's product repeats the
#   one-row program's whole work: the one-row launch is not latency alone; each row added ~85–90 µs.
CANDIDATES = {"current": Candidate(), "no pdl": Candidate(pdl=False), "warps2": Candidate(dot_warps=2),
              "warps1": Candidate(dot_warps=1), "warps8": Candidate(dot_warps=8),
              "split32": Candidate(split_programs=32), "split128": Candidate(split_programs=128),
              "gather": Candidate(gather=True)}


class _Gathered(nn.Embedding):
    """The embedding as a gather (`weight[tokens]`, one elementwise kernel over the rows' elements) instead of
    index_select, whose small-index kernel walks the rows in turn (12 µs for 16 rows against 2.5 for one, H200,
    spec-profile-repetitive-h200-shapes.json)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.weight[tokens]


def kernels(call, replays: int = REPLAYS) -> dict[str, dict[str, float]]:  # noqa: ANN001
    """µs per replay and launches per replay of each kernel (its name cut to 60 characters) over `replays` calls."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            call()
        torch.cuda.synchronize()
    found: dict[str, dict[str, float]] = defaultdict(lambda: {"us": 0.0, "launches": 0.0})
    for event in prof.key_averages():
        if event.device_time_total > 0 and event.count:
            row = found[event.key[:60]]
            row["us"] += event.device_time_total / replays
            row["launches"] += event.count / replays
    return dict(sorted(found.items(), key=lambda kv: -kv[1]["us"]))


def calls(checkpoint, candidate: Candidate, shapes: list[int]) -> dict[int, object]:  # noqa: ANN001
    """A runner built, prefilled and captured with `candidate`'s settings; per shape (1: a plain step) its call."""
    knobs = ("DOT_WARPS", "SPLIT_PROGRAMS")
    before = [getattr(fused_layer, knob) for knob in knobs]
    for knob, value in zip(knobs, (candidate.dot_warps, candidate.split_programs)):
        setattr(fused_layer, knob, value)
    try:
        levers = FUSED if candidate.pdl else FUSED.replace(",pdl", "")
        runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cuda", "bfloat16")
        if candidate.gather:
            runner.model.embed_tokens.__class__ = _Gathered
        runner.reset_cache(POSITION + 64)
        runner.prefill(list(range(1, POSITION + 1)), 0)
        found = {}
        for rows in shapes:
            drafts = list(range(7, 7 + rows - 1))
            found[rows] = (lambda: runner.decode(3, POSITION)) if rows == 1 else \
                (lambda d=drafts, r=rows: runner.verify(3, d, POSITION, r))
            found[rows]()  # captured now, under these settings
        torch.cuda.synchronize()
        return found
    finally:
        for knob, value in zip(knobs, before):
            setattr(fused_layer, knob, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", default="9,16,32")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help="names from CANDIDATES, comma-separated")
    parser.add_argument("--out", default="verify-kernels.json")
    args = parser.parse_args()
    checkpoint = load_checkpoint(args.model)
    shapes = [1, *map(int, args.rows.split(","))]
    names = args.candidates.split(",")
    result = {"benchmark": "verify-kernels", "model": args.model, "position": POSITION, "replays": REPLAYS,
              "rounds": ROUNDS, "iters": ITERS, "candidates": {}, "environment": capture_environment()}
    runs = {}
    for name in names:
        runs[name] = calls(checkpoint, CANDIDATES[name], shapes)
        result["candidates"][name] = {"settings": CANDIDATES[name]._asdict(), "queued_us": {r: [] for r in shapes},
                                      "kernels": {r: kernels(runs[name][r]) for r in shapes}}
    for i in range(ROUNDS):
        for name in names:
            for rows in shapes:
                result["candidates"][name]["queued_us"][rows].append(queued_us(runs[name][rows], ITERS))
        print("round", i, {n: [round(result["candidates"][n]["queued_us"][r][-1]) for r in shapes] for n in names},
              flush=True)
        with open(args.out, "w") as out:  # after every round: a run cut short keeps what it measured
            json.dump(result, out, indent=1)
    for name in names:
        found = result["candidates"][name]
        found["median_us"] = {r: statistics.median(v) for r, v in found["queued_us"].items()}
        found["verify_over_plain"] = {r: found["median_us"][r] / found["median_us"][1] for r in shapes[1:]}
        print(name, {r: round(v) for r, v in found["median_us"].items()},
              {r: round(v, 3) for r, v in found["verify_over_plain"].items()}, flush=True)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
