"""`kerneltriage models`: the models in the user cache and the random-weight presets."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models", help="list cached models and presets",
        description="List the models in the user cache (usable as --model PATH, the default one as "
        "--model default) and the presets (real shapes, random weights: speed only).",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Two tables (cached files, presets) that fit 80 columns; a path folds onto more lines, never '…'."""
    from rich.console import Console

    from kerneltriage.cli.tables import add_row, folded_table
    from kerneltriage.core.units import format_bytes
    from kerneltriage.engine.fetch import list_cached_models
    from kerneltriage.engine.paths import cache_dir
    from kerneltriage.engine.presets import PRESETS

    console = Console()
    cached = folded_table(f"cached models ({cache_dir()}; the default one is --model default)", ("--model", "size"))
    for path in list_cached_models():
        size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
        add_row(cached, path, format_bytes(size))
    console.print(cached)
    presets = folded_table("presets (real shapes, random weights: speed only)",
                           ("--model", "arch", "layers", "hidden", "heads/kv", "vocab"), whole=(0,))
    for name, cfg in PRESETS.items():
        add_row(presets, name, cfg.arch, cfg.num_layers, cfg.hidden_size, f"{cfg.num_heads}/{cfg.num_kv_heads}",
                f"{cfg.vocab_size:,}")
    console.print(presets)
    return 0
