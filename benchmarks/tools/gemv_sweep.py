"""Are the projections at the bandwidth roofline? Each projection shape of a model under a lever set, per call at
M = 1 (and any other row counts asked), the weight bytes it reads and the bandwidth that makes, as a share of the
device's measured copy bandwidth. It is the backend's M-sweep (what triage's Q2 runs): on CUDA every layer's weight
of a shape is cycled through, so none stays in L2, and the calls are captured in a CUDA graph and replayed.

    python benchmarks/tools/gemv_sweep.py --model /tmp/llama3-8b-q4_0.gguf --levers quantized --out FILE.json
    python benchmarks/tools/gemv_sweep.py --model llama3-8b --levers packed_qkv,packed_gate_up   (cuBLAS, bf16)
    python benchmarks/tools/gemv_sweep.py --model /tmp/llama3-8b-q4_0.gguf --levers quantized \
        --tiles 8:8192:4:3 --tiles 4:8192:4:4 --tiles 16:16384:8:3    (the GEMV's tiles: BN:VALUES:WARPS:STAGES)
    python benchmarks/tools/gemv_sweep.py --model /tmp/llama3-8b-q4_0.gguf --levers quantized,q8_dot   (integer GEMV)

Prints one line per shape; --out writes the rows with the ceilings and the environment (git sha, dirty flag).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a --model value: a GGUF, a folder, a preset, default")
    parser.add_argument("--levers", default="", help="the lever set the projections run under (e.g. quantized)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rows", default="1", help="comma-separated row counts M (default 1: decode's GEMV)")
    parser.add_argument("--tiles", action="append", default=[], metavar="BN:VALUES:WARPS:STAGES",
                        help="time the quantized GEMV with these tiles (repeatable; kernels/quant_gemv.py Tiles, "
                        "q8_gemv.py's too)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    from kerneltriage.core.environment import capture_environment
    from kerneltriage.core.errors import InputError
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.sources import load_checkpoint

    try:
        rows = tuple(int(m) for m in args.rows.split(","))
        if not rows or min(rows) < 1:
            raise ValueError
    except ValueError:
        print(f"gemv_sweep: --rows {args.rows!r}: expected comma-separated counts ≥ 1, e.g. 1,4,16", file=sys.stderr)
        return 2
    try:
        tiles = [tuple(int(v) for v in text.split(":")) for text in args.tiles]
        if any(len(t) != 4 or min(t) < 1 for t in tiles):
            raise ValueError
    except ValueError:
        print(f"gemv_sweep: --tiles {' '.join(args.tiles)!r}: expected BN:VALUES:WARPS:STAGES, positive integers, "
              "e.g. 8:8192:4:3", file=sys.stderr)
        return 2
    try:
        backend = get_backend("torch")
        device = backend.resolve_device(args.device)
        dtype = backend.resolve_dtype(args.dtype, device)
        runner = backend.build(load_checkpoint(args.model), RunConfig.from_flags(args.levers), device, dtype)
    except InputError as exc:
        print(f"gemv_sweep: {exc}", file=sys.stderr)
        return 2
    ceilings = backend.ceilings(device, dtype)
    found = []
    for tile in tiles or [None]:
        if tile is not None:  # both GEMVs' (under q8_dot the decode row takes the integer one)
            from kerneltriage.kernels import q8_gemv, quant_gemv

            quant_gemv.TILES = q8_gemv.TILES = quant_gemv.Tiles(*tile)
        for curve in backend.sweep_projections(runner, rows):
            row = {"name": curve.name, "k": curve.k, "n": curve.n, "weight_bytes": curve.weight_bytes,
                   "weights_cycled": curve.weights, "rows": list(curve.rows),
                   "us": [s * 1e6 for s in curve.seconds], "gb_per_s": curve.bandwidth() / 1e9,
                   "of_copy": curve.bandwidth() / ceilings.bandwidth, "timer": curve.timer,
                   "tiles": None if tile is None else ":".join(map(str, tile))}
            found.append(row)
            print(f"{row['tiles'] or '':>12} {row['name']:>24} K={row['k']:6d} N={row['n']:6d}  "
                  f"{row['us'][0]:8.1f} µs  "
                  f"{row['gb_per_s']:7.1f} GB/s  {100 * row['of_copy']:5.1f}% of copy")
    report = {"model": args.model, "levers": args.levers, "device": device, "dtype": dtype,
              "copy_bandwidth": ceilings.bandwidth, "rows": found, "environment": capture_environment()}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
