"""The engine flags every command shares (--model, --backend, --device, --dtype, --levers, --spec, --spec-depth):
parsed into one RunConfig before anything loads, then one runner built through the backend protocol."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.levers import help_table

LEVERS_HELP = "levers (--levers a,b; each applied from outside the model):\n" + help_table()


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--model/--backend/--device/--dtype: which weights, run where and how."""
    add = parser.add_argument
    add("--model", default="default", help="default | preset | FILE.gguf | HF folder (default: %(default)s)")
    add("--backend", default="auto", help="auto | torch | mlx (default: auto = mlx on a Mac, torch elsewhere)")
    add("--device", default="auto", help="auto | cuda | cuda:N | cpu; mlx: gpu | metal | cuda | cpu "
                                        "(default: auto = the GPU if visible)")
    add("--dtype", default="auto", help="auto (bf16 on cuda, float32 on cpu) | float32 | bf16 | fp16")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags plus --levers/--spec/--spec-depth, shared by every command that runs one configuration."""
    add_engine_arguments(parser)
    add = parser.add_argument
    add("--levers", default="", help="comma-separated levers to switch on (listed below), e.g. last_logits,graphs")
    add("--spec", default=None, help="speculative decoding: ngram[:N] | selfdraft[:L] | draft:MODEL")
    add("--spec-depth", default=None, help="draft tokens per step: 1..16 or auto (default: auto)")


def run_config(args: argparse.Namespace, speculate: bool = True) -> RunConfig:
    """The configuration the flags ask for, and the backend checked (an InputError before any loading when they are
    wrong)."""
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.levers import parse_levers
    from kerneltriage.engine.speculative.config import parse_speculation

    get_backend(args.backend)
    try:
        levers = parse_levers(args.levers)
    except InputError as exc:
        raise InputError(f"--levers {args.levers!r}: {exc}") from None
    return RunConfig(levers, parse_speculation(args.spec, args.spec_depth) if speculate else None)


def build_runner(checkpoint: Any, args: argparse.Namespace, config: RunConfig) -> Any:
    """Backend, device and dtype from the flags; load the weights there with `config`; say how long that took."""
    from kerneltriage.engine.backend import get_backend

    backend = get_backend(args.backend)
    device = backend.resolve_device(args.device)
    dtype = backend.resolve_dtype(args.dtype, device)
    started = time.perf_counter()
    runner = backend.build(checkpoint, config, device, dtype)
    note = " — RANDOM WEIGHTS: speed only, the text is noise" if checkpoint.config.random_weights else ""
    print(f"loaded {checkpoint.source} on {device} ({dtype}, {backend.name}) in "
          f"{time.perf_counter() - started:.1f} s{note}", file=sys.stderr)
    return runner
