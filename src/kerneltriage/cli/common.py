"""The engine flags every command shares (--model, --backend, --device, --dtype, --levers, --spec, --spec-depth):
parsed into one RunConfig before anything loads, then one runner built through the backend protocol."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.fetch import PUBLISHED
from kerneltriage.engine.levers import help_table
from kerneltriage.engine.speculative.config import AUTO_MAX_DEPTH, MAX_DEPTH, PADDED_MAX_DEPTH, SPEC_HELP

if TYPE_CHECKING:
    from kerneltriage.engine.constraint import Constraint

def _presets_help() -> str:
    from kerneltriage.engine.presets import PRESETS

    return "\n".join(f"  {name:<13} {c.arch}, {c.num_layers} layers, hidden {c.hidden_size}, heads "
                     f"{c.num_heads}/{c.num_kv_heads} x {c.head_dim}, vocab {c.vocab_size:,}"
                     for name, c in PRESETS.items())


LEVERS_HELP = ("levers (--levers a,b; each applied from outside the model):\n" + help_table()
               + "\n\npresets (--model NAME: real shapes, random weights, speed only):\n" + _presets_help())


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--model/--backend/--device/--dtype: which weights, run where and how."""
    add = parser.add_argument
    add("--model", default="default", help=f"{' | '.join(PUBLISHED)} | preset | FILE.gguf | HF folder "
        "(default: %(default)s)")
    add("--backend", default="auto", help="auto | torch | mlx (default: auto = mlx on a Mac, torch elsewhere)")
    add("--device", default="auto", help="auto | cuda | cuda:N | cpu; mlx: gpu | metal | cuda | cpu "
                                        "(default: auto = the GPU if visible)")
    add("--dtype", default="auto", help="auto (bf16 on cuda, float32 on cpu) | float32 | bf16 | fp16")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags plus --levers/--spec/--spec-depth, shared by every command that runs one configuration."""
    add_engine_arguments(parser)
    add = parser.add_argument
    add("--levers", default="", help="comma-separated levers to switch on (listed below), e.g. last_logits,graphs")
    add("--spec", default=None, help=f"speculative decoding: {SPEC_HELP} (suffix:tree: temperature 0 and eager "
                                     "levers only; ngram/suffix with graphs,one_sync at temperature 0: steps "
                                     "drafted on the device, which chooses there a plain step or a verify and "
                                     "accepts, queued ahead of the host)")
    add("--spec-depth", default=None, help=f"draft tokens per step: 1..{MAX_DEPTH} or auto (default: auto — the cost "
        f"model picks k ≤ {AUTO_MAX_DEPTH}, ≤ {PADDED_MAX_DEPTH} for a lookup where verifies are graphed; steps "
        "chosen on the device fill the padded shape k needs, and draft only where a match is)")


def add_constraint_arguments(parser: argparse.ArgumentParser) -> None:
    """--choices/--regex/--json-schema: what every generated output must match (a constrained workload)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--choices", default=None, help="constrained decoding: the output is one of these "
                       "comma-separated strings, e.g. yes,no,maybe")
    group.add_argument("--regex", default=None, help="constrained decoding: the output matches this regular expression")
    group.add_argument("--json-schema", type=Path, default=None, metavar="FILE",
                       help="constrained decoding: the output is JSON valid against this schema (docs/constrained.md)")


def constraint_flags(args: argparse.Namespace) -> "Constraint | None":
    """The constraint the flags ask for, checked before anything loads (the library's presence too)."""
    from kerneltriage.engine.constraint import parse_constraint
    from kerneltriage.engine.grammar import require_library

    constraint = parse_constraint(args.choices, args.regex, args.json_schema)
    if constraint is not None:
        require_library(constraint)
    return constraint


def constrain(checkpoint: Any, constraint: "Constraint | None") -> None:
    """Compile the constraint for the checkpoint's tokenizer: every runner built from it then decodes under it."""
    from kerneltriage.engine.grammar import Grammar

    if constraint is not None:
        checkpoint.grammar = Grammar(constraint, checkpoint.tokenizer, checkpoint.config.vocab_size)


def run_config(args: argparse.Namespace, speculate: bool = True) -> RunConfig:
    """The configuration the flags ask for, with every flag checked (an InputError before any loading when one is
    wrong)."""
    from kerneltriage.engine.levers import parse_levers
    from kerneltriage.engine.speculative.config import parse_speculation

    try:
        levers = parse_levers(args.levers)
    except InputError as exc:
        raise InputError(f"--levers {args.levers!r}: {exc}") from None
    config = RunConfig(levers, parse_speculation(args.spec, args.spec_depth))
    check_before_loading(args, config)
    return config if speculate else RunConfig(config.levers)


def check_before_loading(args: argparse.Namespace, *configs: RunConfig) -> None:
    """--backend/--device/--dtype spelled right and the draft model or head file each configuration speculates with
    there: seconds before loading would find out. (--model is load_checkpoint's first check, before it reads.)"""
    from kerneltriage.engine.preflight import check_engine, check_speculation

    check_engine(args.backend, args.device, args.dtype)
    for config in configs:
        check_speculation(config.speculation)


def _nvidia_device_nodes() -> bool | None:
    """Whether this Linux host has an NVIDIA GPU device node; None where that cannot be told without CUDA itself
    (not Linux, or WSL, whose GPUs appear as /dev/dxg)."""
    if platform.system() != "Linux" or Path("/dev/dxg").exists():
        return None
    return any(Path("/dev").glob("nvidia[0-9]*"))


def refuse_early(checkpoint: Any, args: argparse.Namespace, config: RunConfig | None = None) -> None:
    """The torch backend's device and memory checks, made before torch is imported (seconds on a small machine):
    `--device cuda` on a host with no NVIDIA device, or a model that cannot fit in the host's memory on the CPU,
    is refused at once. The backend checks again at load, exactly."""
    from kerneltriage.engine.backend import backend_name
    from kerneltriage.engine.memory import (DTYPE_BYTES, DTYPE_NAMES, host_available_bytes, require_fits,
                                            stored_blocks)

    if backend_name(args.backend) != "torch":
        return
    gpu = _nvidia_device_nodes()
    if args.device.startswith("cuda") and gpu is False:
        raise InputError(f"--device {args.device}: no CUDA device on this machine (no NVIDIA device in /dev)")
    on_cpu = args.device == "cpu" or (args.device == "auto" and gpu is False)
    dtype = "float32" if args.dtype == "auto" else DTYPE_NAMES.get(args.dtype)
    if on_cpu and dtype is not None:
        # with `quantized` the weights it keeps count as their blocks (the backend's check at load is exact)
        saved = 0
        if config is not None and config.has("quantized") and not checkpoint.config.random_weights:
            blocks, values = stored_blocks(checkpoint, DTYPE_BYTES[dtype])
            saved = values - blocks
        require_fits(checkpoint.config, dtype, DTYPE_BYTES[dtype], "cpu", host_available_bytes(), saved)


def build_runner(checkpoint: Any, args: argparse.Namespace, config: RunConfig) -> Any:
    """Backend, device and dtype from the flags; load the weights there with `config`; say how long that took."""
    from kerneltriage.engine.backend import get_backend

    refuse_early(checkpoint, args, config)
    backend = get_backend(args.backend)
    device = backend.resolve_device(args.device)
    dtype = backend.resolve_dtype(args.dtype, device)
    started = time.perf_counter()
    runner = backend.build(checkpoint, config, device, dtype)
    note = " — RANDOM WEIGHTS: speed only, the text is noise" if checkpoint.config.random_weights else ""
    print(f"loaded {checkpoint.source} on {device} ({dtype}, {backend.name}) in "
          f"{time.perf_counter() - started:.1f} s{note}", file=sys.stderr)
    return runner
