"""`kerneltriage gguf write --preset NAME --type Q4_0 OUT.gguf`: a GGUF with a preset's shapes and random weights,
so that kerneltriage and llama.cpp read the same quantized file on a machine without network."""

from __future__ import annotations

import argparse
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `gguf` and its action `write` to the top-level subcommands."""
    parser = subparsers.add_parser("gguf", help="write a GGUF of a preset's shapes with random weights",
                                   description=__doc__)
    actions = parser.add_subparsers(dest="gguf_action", metavar="ACTION", required=True)
    write = actions.add_parser(
        "write", help="write OUT.gguf: random blocks of --type, a synthetic sentencepiece vocabulary",
        description="Write a GGUF with the preset's shapes: every matrix as random --type blocks (values ≈ N(0, "
        "0.02), written block by block, one tensor in memory at a time), norms at 1, Llama-3 rope factors where the "
        "preset scales rope, and a synthetic sentencepiece vocabulary that llama.cpp and kerneltriage both load. "
        "Speed only: the text it generates means nothing.")
    write.add_argument("--preset", required=True, metavar="NAME",
                       help="the shapes: a preset's name (kerneltriage models lists them)")
    write.add_argument("--type", dest="qtype", default="Q4_0", metavar="TYPE",
                       help="block type: Q4_0, Q4_1 or Q8_0 (default: Q4_0)")
    write.add_argument("out", metavar="OUT.gguf", help="the file to write (replaced if it exists)")
    write.set_defaults(func=run_write)


def run_write(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kerneltriage.core.units import format_bytes
    from kerneltriage.engine.gguf_write import write_gguf
    from kerneltriage.engine.presets import get_preset

    start = time.perf_counter()
    written = write_gguf(get_preset(args.preset), args.qtype, Path(args.out).expanduser())
    print(f"wrote {written.path} ({format_bytes(written.size_bytes)}, {written.tensors} tensors, {args.qtype}, "
          f"{args.preset} shapes, random weights) in {time.perf_counter() - start:.1f} s")
    return 0
