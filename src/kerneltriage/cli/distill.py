"""`kerneltriage distill`: train a drafter for speculative decoding by self-distillation — a draft model written as
a Hugging Face folder (`--spec draft:PATH`), or with --eagle an EAGLE-style head on the target's hidden states
written to the user cache (`--spec eagle`) — and say how to use it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kerneltriage.cli.common import add_engine_arguments, build_runner, check_before_loading
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig

if TYPE_CHECKING:
    from kerneltriage.train import Trainer

DEFAULT_LAYERS = 2
DEFAULT_STEPS = 300
DEFAULT_EAGLE_STEPS = 1200
DEFAULT_SAMPLES = 3  # --eagle: sampled answers per prompt beside the greedy one
GENERATION_LEVERS = "last_logits,graphs"  # --eagle on CUDA: the target's answers decoded through graphs (the
# features are then taken by one plain forward per answer)
DEFAULT_CONTINUATION = 96  # greedy tokens of the target after each prompt

EPILOG = """The draft is a copy of the target's first --layers layers (with its embedding, final norm and output
projection), trained to match the target's next-token distribution on the target's own greedy answers to 20
built-in prompts (none from benchmarks/prompts/; the answers' positions only); 4 more prompts are held out to
measure top-1 agreement with the target over their answers — the acceptance a verify sees at draft position 1 —
before and after. Training runs in float32 on --device. On the H200 the default model's 2-layer draft reached 20.6%
and, in speculation, lost (0.17× on a copy-heavy set: README).

--eagle trains an EAGLE-style head instead: one decoder layer that takes the target's last hidden state at each
position with the next token's embedding and predicts the next hidden state, which the target's own lm_head turns
into a draft token (backends/torch/eagle.py). Same prompts, same held-out agreement; the target runs in float32;
on top of the greedy answers it trains on --samples more per prompt drawn at temperature 0.8, and on 32 more
prompts; the head is written to eagle/MODEL.safetensors in the user cache, where --spec eagle finds it (--out FILE
elsewhere, then --spec eagle:FILE).

examples:
  kerneltriage distill                                  # default model, 2 layers, 300 steps → the user cache
  kerneltriage distill --layers 4 --steps 1000 --out ./smollm2-draft
  kerneltriage distill --eagle --device cuda            # the EAGLE head, 1200 steps → --spec eagle
  kerneltriage ab --a "levers=graphs" --b "levers=graphs;spec=draft:PATH" \\
      --prompts benchmarks/prompts/copy_heavy.jsonl"""


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "distill", help="train a draft model for --spec by self-distillation",
        description="Train a small draft model on the target's own outputs and write it as a Hugging Face folder "
        "that --spec draft:PATH loads (torch backend).", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_arguments(parser)
    add = parser.add_argument
    add("--layers", type=_positive, default=DEFAULT_LAYERS, help="the draft's layers (default: %(default)s)")
    add("--eagle", action="store_true", help="train an EAGLE-style head on the target's hidden states (for --spec "
        "eagle) instead of a draft model")
    add("--steps", type=_positive, default=None, help=f"training steps, one sequence each (default: {DEFAULT_STEPS}; "
        f"{DEFAULT_EAGLE_STEPS} with --eagle)")
    add("--samples", type=_whole, default=DEFAULT_SAMPLES, help="--eagle: answers per prompt sampled at temperature "
        "0.8 beside the greedy one (default: %(default)s)")
    add("--continuation", type=_positive, default=DEFAULT_CONTINUATION,
        help="greedy tokens of the target after each prompt (default: %(default)s)")
    add("--out", default=None, help="the folder to write (default: drafters/MODEL-L<layers> in the user cache); "
        "with --eagle the head's file (default: eagle/MODEL.safetensors there)")
    add("--output", choices=("text", "json"), default="text", help="the report's format on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kerneltriage.engine.paths import cache_dir
    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.train import get_trainer

    check_before_loading(args)
    trainer = get_trainer(args.backend)
    if args.eagle:
        return _run_eagle(args, trainer)
    checkpoint = load_checkpoint(args.model)
    trainer.check_student(checkpoint, args.layers)  # bad --layers or an unwritable model: fail before loading it
    drafters = cache_dir() / "drafters"
    out = Path(args.out).expanduser() if args.out else drafters / f"{checkpoint.config.name}-L{args.layers}"
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder; expected a folder to write the draft into")
    target = build_runner(checkpoint, args, RunConfig())
    student, report = trainer.distill(target, args.layers, args.steps or DEFAULT_STEPS, args.continuation,
                                      lambda line: print(line, file=sys.stderr))
    trainer.save_draft(student, out)
    return _report(args, report, out, f"draft: {report.layers} layers", f"its first layers untrained, = --spec "
                   f"selfdraft:{report.layers}", f"--spec draft:{out}")


def _report(args: argparse.Namespace, report, out: Path, what: str, before: str, use: str) -> int:  # noqa: ANN001
    """The training report on stdout: JSON, or three lines (what trained, the held-out agreement, how to use it)."""
    report.path = str(out)
    if args.output == "json":
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    print(f"{what}, {report.steps} steps over {report.sequences} sequences in {report.seconds:.0f} s; KL(target ‖ "
          f"{'head' if args.eagle else 'draft'}) {report.kl_first:.2f} → {report.kl_last:.2f} nats per answer position")
    print(f"top-1 agreement with the target on held-out answers: {report.agreement_before:.1%} ({before}) → "
          f"{report.agreement_after:.1%}")
    print(f"wrote {out}; use it with {use}")
    return 0


def _run_eagle(args: argparse.Namespace, trainer: Trainer) -> int:
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.sources import load_checkpoint

    if args.dtype not in ("auto", "float32"):
        raise InputError(f"--dtype {args.dtype}: an EAGLE head trains on the target's float32 features; expected "
                         "--dtype float32 or auto")
    args.dtype = "float32"
    out = Path(args.out).expanduser() if args.out else None
    if out is not None and (out.is_dir() or out.suffix != ".safetensors"):
        raise InputError(f"--out {out}: expected a .safetensors file to write the head into")
    checkpoint = load_checkpoint(args.model)
    if checkpoint.config.random_weights:
        raise InputError(f"--model {checkpoint.source}: random weights have nothing to distill; expected a model file")
    out = out or trainer.head_path(checkpoint.config)
    on_cuda = get_backend(args.backend).resolve_device(args.device).startswith("cuda")
    target = build_runner(checkpoint, args, RunConfig.from_flags(GENERATION_LEVERS if on_cuda else ""))
    head, report = trainer.train_head(target, args.steps or DEFAULT_EAGLE_STEPS, args.continuation, args.samples,
                                      lambda line: print(line, file=sys.stderr))
    trainer.save_head(head, out)
    return _report(args, report, out, "EAGLE head", "untrained", f"--spec eagle:{out}" if args.out else "--spec eagle")
