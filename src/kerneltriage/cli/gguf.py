"""`kerneltriage gguf write --preset NAME --type Q4_0 OUT.gguf`: a GGUF with a preset's shapes and random weights,
so that kerneltriage and llama.cpp read the same quantized file on a machine without network. `gguf write --like
FILE.gguf` takes another file's shapes and vocabulary instead, and `gguf meta FILE.gguf OUT.gguf` copies a file's
metadata without its weights (a few MB to carry where the model cannot go: `--like` reads only the metadata)."""

from __future__ import annotations

import argparse
import time
from typing import Any


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
    source = write.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", metavar="NAME", help="the shapes: a preset's name (kerneltriage models lists them)")
    source.add_argument("--like", metavar="FILE.gguf", help="the shapes, architecture keys and vocabulary of this "
                        "GGUF (its weights are not read: a `gguf meta` copy serves)")
    write.add_argument("--type", dest="qtype", default="Q4_0", metavar="TYPE",
                       help="block type: Q4_0, Q4_1 or Q8_0 (default: Q4_0)")
    write.add_argument("out", metavar="OUT.gguf", help="the file to write (replaced if it exists)")
    write.set_defaults(func=run_write)
    meta = actions.add_parser(
        "meta", help="copy IN.gguf's metadata (architecture, tokenizer) without its weights to OUT.gguf",
        description="Copy every metadata key of IN.gguf, and whether its embeddings are tied, to OUT.gguf with no "
        "tensors: what `gguf write --like` needs of a model, small enough to carry where its weights cannot go "
        "(Gemma-3-270M: 238 MB of weights, ~5 MB of metadata).")
    meta.add_argument("source", metavar="IN.gguf", help="a GGUF to copy the metadata of")
    meta.add_argument("out", metavar="OUT.gguf", help="the file to write (replaced if it exists)")
    meta.set_defaults(func=run_meta)


def run_write(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kerneltriage.core.units import format_bytes
    from kerneltriage.engine.gguf_write import write_gguf, write_like
    from kerneltriage.engine.presets import get_preset

    start = time.perf_counter()
    out = Path(args.out).expanduser()
    if args.like is not None:
        like = _existing(args.like)
        written, shapes = write_like(like, args.qtype, out), f"{like.name}'s shapes and vocabulary"
    else:
        written, shapes = write_gguf(get_preset(args.preset), args.qtype, out), f"{args.preset} shapes"
    print(f"wrote {written.path} ({format_bytes(written.size_bytes)}, {written.tensors} tensors, {args.qtype}, "
          f"{shapes}, random weights) in {time.perf_counter() - start:.1f} s")
    return 0


def run_meta(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kerneltriage.core.units import format_bytes
    from kerneltriage.engine.gguf_write import write_metadata

    written = write_metadata(_existing(args.source), Path(args.out).expanduser())
    print(f"wrote {written.path} ({format_bytes(written.size_bytes)}: {args.source}'s metadata, no tensors)")
    return 0


def _existing(text: str) -> Any:
    from pathlib import Path

    from kerneltriage.core.errors import InputError

    path = Path(text).expanduser()
    if not path.is_file():
        raise InputError(f"{text}: no such file (expected a GGUF)")
    return path
