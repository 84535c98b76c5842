"""The `fused_layer` GEMV tiles for speculative verify rows (9 and 16: k = 8 and 15, both padded to 16), CUDA only.

Why: on the H200 a 9-row verify of the default model took 1,537 µs against a plain step's 561 µs
(`spec-profile-repetitive-h200.json`): its GEMVs went through tl.dot in 16 × 16 × 128 tiles, ~30–100 programs each
looping over K, 4× slower per launch than the one-row path. Each candidate below replaces `fused_layer._tiles`
(rows, n, k) → `Tiles` (padded rows, columns per program, K per load round, rounds, rounds in flight); a tile with
16+ rows and 16+ columns runs tl.dot, any other the CUDA cores' broadcast product. `--rows` times other verify sizes
(a verify's cost by rows: what deeper drafts or a smaller padded shape would cost). The first round (2026-11-30,
verify-tiles-smollm2-preset-h200.json) chose 16 × 256 from one round at a time; the second adds the rounds in
flight (the K loop pipelined, 2026-12-01). Per candidate: µs per graphed verify (200 replays queued)
and per plain step, and the float32 verify logits' largest difference from the stock layers' (no fused_layer).

    python3 benchmarks/verify_tiles_probe.py --model smollm2-135m --out verify-tiles.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import triton

from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.kernels import fused_layer

FUSED = "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs"
STOCK = "packed_qkv,packed_gate_up,last_logits,fused_norm,graphs"
POSITION, ITERS = 300, 200
CURRENT = fused_layer._tiles


def candidate(bn: int, bk: int, stages: int, programs: int = 0):  # noqa: ANN201
    """Tiles for ≥ 16 padded rows: `bn` columns, K in rounds of `bk` (at most K, padded to a power of two),
    `stages` rounds in flight (Triton's software pipelining; 1: one round at a time, as before 2026-12-01), K split
    over programs until there are `programs` of them (`fused_layer._k_splits`; 0: not split). A tile of fewer than 16
    columns sums on the CUDA cores. Fewer rows keep the current one-row tiles."""
    def tiles(rows: int, n: int, k: int) -> fused_layer.Tiles:
        padded = triton.next_power_of_2(rows)
        if padded < fused_layer.DOT_ROWS:
            return CURRENT(rows, n, k)
        size = min(triton.next_power_of_2(k), bk)
        rounds = triton.cdiv(k, size)
        with _programs(programs):
            splits = fused_layer._k_splits(triton.cdiv(n, bn), rounds)
        return fused_layer.Tiles(padded, bn, size, rounds // splits, stages, splits)
    return tiles


def per_gemv(qkv: int, o_proj: int, down: int, gate_up: int):  # noqa: ANN201
    """The current tiles for ≥ 16 padded rows with K split per GEMV of the default model as given (q/k/v: 480
    rotation pairs of K 576; o_proj: 576 × 576; down: 576 × 1536; gate/up: 1,536 × 576); 1: not split. Default
    model only (another model's shapes are not in the table). Since round four, `current` splits K (64 programs):
    `dot16x64s8` is the unsplit tiling earlier files call current."""
    splits = {(480, 576): qkv, (576, 576): o_proj, (576, 1536): down, (1536, 576): gate_up}

    def tiles(rows: int, n: int, k: int) -> fused_layer.Tiles:
        t = candidate(16, 64, 8)(rows, n, k)
        if t.rows < fused_layer.DOT_ROWS:
            return t
        assert t.rounds % splits[n, k] == 0, (n, k, t.rounds)  # a split takes whole rounds, every one of them
        return t._replace(rounds=t.rounds // splits[n, k], splits=splits[n, k])
    return tiles


@contextlib.contextmanager
def _programs(programs: int):  # noqa: ANN202 - a context manager
    before, fused_layer.SPLIT_PROGRAMS = fused_layer.SPLIT_PROGRAMS, programs
    try:
        yield
    finally:
        fused_layer.SPLIT_PROGRAMS = before


# Round three (2026-12-01, verify-tiles-smollm2-preset-h200-split.json): K split over programs, and the CUDA cores'
# sums pipelined for 16 rows
CANDIDATES = {
    "current": CURRENT, "dot16x256s1": candidate(16, 256, 1), "dot16x256s2": candidate(16, 256, 2),
    "dot16x256s4": candidate(16, 256, 4), "dot16x128s4": candidate(16, 128, 4), "dot16x128s6": candidate(16, 128, 6),
    "dot16x64s8": candidate(16, 64, 8), "dot16x512s2": candidate(16, 512, 2), "dot32x256s3": candidate(32, 256, 3),
    "dot16x32s8": candidate(16, 32, 8), "dot16x32s16": candidate(16, 32, 16), "dot16x64s4": candidate(16, 64, 4),
    "dot16x64s12": candidate(16, 64, 12), "dot16x128s8": candidate(16, 128, 8),
    "split64": candidate(16, 64, 8, 64), "split128": candidate(16, 64, 8, 128), "split256": candidate(16, 64, 8, 256),
    "split128x128": candidate(16, 128, 4, 128), "split128x32": candidate(16, 32, 8, 128),
    "split128s2": candidate(16, 64, 2, 128), "cc4x128s4": candidate(4, 128, 4), "cc4x64s8": candidate(4, 64, 8),
    "cc8x64s4": candidate(8, 64, 4),
}
ROUND3 = "current,split64,split128,split256,split128x128,split128x32,split128s2,cc4x128s4,cc4x64s8,cc8x64s4"
# Round four: which GEMVs a split pays on (split64 splits q/k/v and o_proj in 3, down in 2, gate/up not)
SPLITS = {"q3o3d2g1": (3, 3, 2, 1), "q3o3d3g1": (3, 3, 3, 1), "q3o3d4g1": (3, 3, 4, 1), "q3o3d6g1": (3, 3, 6, 1),
          "q3o3d4g3": (3, 3, 4, 3), "q3o3d2g3": (3, 3, 2, 3), "q3o1d2g1": (3, 1, 2, 1), "q1o3d2g1": (1, 3, 2, 1)}
CANDIDATES.update({name: per_gemv(*splits) for name, splits in SPLITS.items()})
ROUND4 = ",".join(["current", *SPLITS])


def queued_us(call, iters: int = ITERS) -> float:  # noqa: ANN001
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / iters


def verify_logits(checkpoint, levers: str, dtype: str, rows: int) -> tuple[object, torch.Tensor]:  # noqa: ANN001
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cuda", dtype)
    runner.reset_cache(POSITION + 64)
    runner.prefill(list(range(1, POSITION + 1)), 0)
    drafts = list(range(7, 7 + rows - 1))
    return runner, runner.verify(3, drafts, POSITION, rows).float().clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--candidates", default=ROUND4, help="names from CANDIDATES, comma-separated")
    parser.add_argument("--rows", default="9,16", help="verify rows, comma-separated (default 9,16: k = 8 and 15; at "
                        "most fused_layer.MAX_ROWS)")
    parser.add_argument("--out", default="verify-tiles.json")
    args = parser.parse_args()
    rows_asked = [int(r) for r in args.rows.split(",")]
    if not all(2 <= r <= fused_layer.MAX_ROWS for r in rows_asked):
        parser.error(f"--rows {args.rows}: expected counts in 2..{fused_layer.MAX_ROWS}")
    checkpoint = load_checkpoint(args.model)
    result = {"benchmark": "verify-tiles", "model": args.model, "position": POSITION, "rows": {},
              "environment": capture_environment()}
    for rows in rows_asked:
        _, reference = verify_logits(checkpoint, STOCK, "float32", rows)
        drafts = list(range(7, 7 + rows - 1))
        stock, _ = verify_logits(checkpoint, STOCK, "bfloat16", rows)
        stock_us = queued_us(lambda: stock.verify(3, drafts, POSITION, rows))
        found = result["rows"][rows] = {"stock_verify_us": stock_us}
        for name in args.candidates.split(","):
            fused_layer._tiles = CANDIDATES[name]
            try:
                _, logits = verify_logits(checkpoint, FUSED, "float32", rows)
                runner, first = verify_logits(checkpoint, FUSED, "bfloat16", rows)
                found[name] = {
                    "verify_us": queued_us(lambda: runner.verify(3, drafts, POSITION, rows)),
                    "plain_us": queued_us(lambda: runner.decode(3, POSITION)),
                    "float32_max_diff": float((logits - reference).abs().max()),
                    # the same bf16 logits after 400 replays (a split K's sums in a fixed order; its semaphores
                    # back at zero)
                    "replays_identical": bool(torch.equal(runner.verify(3, drafts, POSITION, rows).float(), first)),
                    "semaphores_zero": not fused_layer._semaphores(torch.device("cuda")).any().item(),
                    "tiles_k576": CANDIDATES[name](rows, 576, 576), "tiles_k1536": CANDIDATES[name](rows, 576, 1536)}
            except Exception as exc:  # noqa: BLE001 - a candidate that fails to build is a result too
                found[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            finally:
                fused_layer._tiles = CURRENT
            print(rows, name, found[name], flush=True)
            with open(args.out, "w") as out:  # after every candidate: a run cut short keeps what it measured
                json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
