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
    from rich.console import Console
    from rich.table import Table

    from kerneltriage.engine.fetch import list_cached_models
    from kerneltriage.engine.paths import cache_dir
    from kerneltriage.engine.presets import PRESETS

    table = Table(title=f"models (cache: {cache_dir()})")
    for column in ("--model", "kind", "architecture", "layers", "hidden", "heads/kv", "vocab"):
        table.add_column(column)
    for path in list_cached_models():
        size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
        table.add_row(str(path), f"cached, {size / 1e6:,.0f} MB", "", "", "", "", "")
    for name, cfg in PRESETS.items():
        table.add_row(name, "preset (random weights)", cfg.arch, str(cfg.num_layers), str(cfg.hidden_size),
                      f"{cfg.num_heads}/{cfg.num_kv_heads}", f"{cfg.vocab_size:,}")
    Console().print(table)
    return 0
