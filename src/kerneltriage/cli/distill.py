"""`kerneltriage distill`: train a draft model for speculative decoding by self-distillation, write it as a Hugging
Face folder, and say how to use it (`--spec draft:PATH`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kerneltriage.cli.common import add_engine_arguments, build_runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig

DEFAULT_LAYERS = 2
DEFAULT_STEPS = 300
DEFAULT_CONTINUATION = 96  # greedy tokens of the target after each prompt

EPILOG = """The draft is a copy of the target's first --layers layers (with its embedding, final norm and output
projection), trained to match the target's next-token distribution on the target's own greedy answers to 20
built-in prompts (none from benchmarks/prompts/; the answers' positions only); 4 more prompts are held out to
measure top-1 agreement with the target over their answers — the acceptance a verify sees at draft position 1 —
before and after. Training runs in float32 on --device. On the H200 the default model's 2-layer draft reached 20.6%
and, in speculation, lost (0.17× on a copy-heavy set: README).

examples:
  kerneltriage distill                                  # default model, 2 layers, 300 steps → the user cache
  kerneltriage distill --layers 4 --steps 1000 --out ./smollm2-draft
  kerneltriage ab --a "levers=graphs" --b "levers=graphs;spec=draft:PATH" --prompts benchmarks/prompts/copy_heavy.jsonl"""


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
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
    add("--steps", type=_positive, default=DEFAULT_STEPS, help="training steps, one sequence each (default: "
        "%(default)s)")
    add("--continuation", type=_positive, default=DEFAULT_CONTINUATION,
        help="greedy tokens of the target after each prompt (default: %(default)s)")
    add("--out", default=None, help="the folder to write (default: drafters/MODEL-L<layers> in the user cache)")
    add("--output", choices=("text", "json"), default="text", help="the report's format on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kerneltriage.backends.torch.distill import distill, save_folder, student_checkpoint
    from kerneltriage.engine.backend import backend_name
    from kerneltriage.engine.paths import cache_dir
    from kerneltriage.engine.sources import load_checkpoint

    if backend_name(args.backend) != "torch":
        raise InputError(f"--backend {args.backend}: distill trains with torch; expected --backend torch or auto")
    args.backend = "torch"
    checkpoint = load_checkpoint(args.model)
    student_checkpoint(checkpoint, args.layers)  # bad --layers or an unwritable model: fail before loading it
    out = Path(args.out).expanduser() if args.out else cache_dir() / "drafters" / f"{checkpoint.config.name}-L{args.layers}"
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder; expected a folder to write the draft into")
    target = build_runner(checkpoint, args, RunConfig())
    student, report = distill(target, args.layers, args.steps, args.continuation,
                              lambda line: print(line, file=sys.stderr))
    save_folder(student, out)
    report.path = str(out)
    if args.output == "json":
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    print(f"draft: {report.layers} layers, {report.steps} steps over {report.sequences} sequences in "
          f"{report.seconds:.0f} s; KL(target ‖ draft) {report.kl_first:.2f} → {report.kl_last:.2f} nats per "
          "answer position")
    print(f"top-1 agreement with the target on held-out answers: {report.agreement_before:.1%} (its first layers "
          f"untrained, = --spec selfdraft:{report.layers}) → {report.agreement_after:.1%}")
    print(f"wrote {out}; use it with --spec draft:{out}")
    return 0
