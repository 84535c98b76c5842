"""`kerneltriage ceilings`: the device's measured copy bandwidth and matmul peak (cached), and their source."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ceilings` to the top-level subcommands."""
    parser = subparsers.add_parser(
        "ceilings", help="measured copy bandwidth and matmul peak of this device", description=__doc__ +
        " Measured once per device, framework version and dtype, then read from the cache; --refresh measures again."
        " Each carries the load it was measured under; ceilings measured on a shared machine are measured again"
        " once the machine is quiet.")
    parser.add_argument("--backend", default="auto",
                        help="auto | torch | mlx: which framework measures (default: auto)")
    parser.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu; mlx: gpu | cpu (default: auto)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, float32 on cpu) | float32 | bf16 | fp16")
    parser.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the backend and device → get (or measure) its ceilings → print them."""
    from kerneltriage.core import ceilings_cache
    from kerneltriage.core.ceilings_cache import CACHE_FILE
    from kerneltriage.core.units import format_bandwidth, format_flops
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.paths import cache_dir

    backend = get_backend(args.backend)
    device = backend.resolve_device(args.device)
    dtype = backend.resolve_dtype(args.dtype, device)
    ceilings = backend.ceilings(device, dtype, refresh=args.refresh)
    cached = f"cache {cache_dir() / CACHE_FILE}"
    where = "vendor datasheet: measuring failed" if ceilings.source == "datasheet" else cached
    print(f"device        {ceilings.device} ({device}, {backend.name})")
    print(f"copy          {format_bandwidth(ceilings.bandwidth)} (bytes read + written)")
    print(f"matmul        {format_flops(ceilings.matmul_flops)} ({ceilings.dtype})")
    print(f"source        {ceilings.source} — {where}")
    key = backend.ceilings_key(device, dtype)
    print(f"key           {key}")
    entry = ceilings_cache.entry(cache_dir() / CACHE_FILE, key) if ceilings.source == "measured" else {}
    if entry:
        print(f"measured      {entry.get('measured_at', 'at an unrecorded time')}, {_load_line(entry)}")
    if entry.get("contended"):
        print(f"warning: measured on a shared machine ({entry['contended']}): the ceilings are too low until "
              "measured again on a quiet one", file=sys.stderr)
    return 0


def _load_line(entry: dict) -> str:
    if "contended" not in entry:
        return "load not recorded (measured again once the machine is quiet)"
    others, load = entry.get("other_cores"), entry.get("load_avg_1m")
    share = "unknown" if others is None else f"{others:.2f} cores"
    return f"other processes' CPU during it: {share}, load average {'unknown' if load is None else f'{load:.2f}'}"
