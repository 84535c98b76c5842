"""`kerneltriage generate`: stream a completion from the reference engine, then one summary line."""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
import time
from typing import Callable

from kerneltriage.core.errors import InputError

_HELP_WIDTH = 77  # argparse indents a group by 2: entries wrap under themselves within 80 columns

EPILOG = """examples:
  kerneltriage generate --prompt "The capital of France is"
  kerneltriage generate --chat --prompt "Write a haiku about GPUs" --temperature 0.7 --seed 1
  kerneltriage generate --model llama3-8b --prompt hi --max-tokens 64   (random weights: speed only)
  kerneltriage generate --model ./Qwen3-0.6B --device cpu --dtype bf16 --levers last_logits

--model takes 'default' (SmolLM2-135M-Instruct, fetched into the user cache on first use), a preset
(real shapes, random weights), a .gguf file or a Hugging Face folder (config.json + *.safetensors)."""


def checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that validates with `parse` at parse time (before any model loads), keeping the text."""
    def check(text: str) -> str:
        parse(text)
        return text
    return check


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model/--device/--dtype/--levers/--spec, shared by every command that runs the engine; the levers and
    presets are listed in --help."""
    from kerneltriage.engine.levers import parse_levers
    from kerneltriage.engine.speculative import parse_spec

    parser.add_argument("--model", default="default", help="default | preset | FILE.gguf | HF folder (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu (default: auto = cuda if visible)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, float32 on cpu) | float32 | bf16 | fp16")
    parser.add_argument("--levers", default="", type=checked(parse_levers),
                        help="comma-separated levers to switch on, e.g. last_logits (listed below)")
    parser.add_argument("--spec", default=None, type=checked(parse_spec),
                        help="speculative decoding: ngram[:N] | selfdraft[:L] | draft:MODEL")
    parser.add_argument("--spec-depth", default=None, type=checked(lambda depth: parse_spec("ngram", depth)),
                        help="draft tokens per step: 1..16 or auto (default: auto)")
    parser.add_argument_group("levers (--levers a,b)", _levers_help())
    parser.add_argument_group("presets (--model NAME: real shapes, random weights, speed only)", _presets_help())


def _levers_help() -> str:
    """One entry per lever: name, the question it answers, what it does (wrapped under itself)."""
    from kerneltriage.engine.levers import LEVERS

    return "\n".join(textwrap.fill(f"{lever.name:<28} {lever.question:<9} {lever.summary}", width=_HELP_WIDTH,
                                   subsequent_indent=" " * 39) for lever in LEVERS.values())


def _presets_help() -> str:
    from kerneltriage.engine.presets import PRESETS

    return "\n".join(f"{name:<13} {c.arch}, {c.num_layers} layers, hidden {c.hidden_size}, heads "
                     f"{c.num_heads}/{c.num_kv_heads} x {c.head_dim}, vocab {c.vocab_size:,}"
                     for name, c in PRESETS.items())


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _finite(text: str) -> float:
    """A float argument; NaN and inf parse as floats but make every sampling comparison false."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _stop_string(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a non-empty string (an empty one would match before any text)")
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate", help="run the reference engine and stream text",
        description="Generate text with the reference engine; ends with prompt tokens, prefill and decode "
        "tok/s and peak memory.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--max-tokens", type=_positive, default=128, help="new tokens at most (default: %(default)s)")
    parser.add_argument("--temperature", type=_finite, default=0.0, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=_finite, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--min-p", type=_finite, default=0.0, help="drop tokens below min-p × the top probability")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument("--stop", action="append", default=[], type=_stop_string, help="stop string (repeatable)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the arguments → load (torch only after the model's file checked out) → stream → summary."""
    from kerneltriage.engine.sampling import SamplingParams
    from kerneltriage.engine.sources import load_checkpoint

    try:
        params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    except ValueError as exc:
        raise InputError(f"sampling: {exc}") from None
    if not args.prompt:
        raise InputError("--prompt '': expected some text")
    checkpoint = load_checkpoint(args.model)
    prompt = encode_prompt(checkpoint, args.prompt, args.chat)
    from kerneltriage.backends.torch.generate import stream_generate

    runner = build_runner_from_args(checkpoint, args)
    last = None
    for last in stream_generate(runner, prompt, params, args.max_tokens, tuple(args.stop)):
        sys.stdout.write(last.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(summary_line(runner, last), file=sys.stderr)
    for line in spec_summary(runner):
        print(line, file=sys.stderr)
    return 0


def build_runner_from_args(checkpoint, args: argparse.Namespace, speculate: bool = True):  # noqa: ANN001, ANN201
    """Device, dtype, levers and speculation from the flags; load the weights there; say how long that took."""
    from kerneltriage.backends.torch.device import check_fits, resolve_device, resolve_dtype
    from kerneltriage.engine.levers import parse_levers
    from kerneltriage.engine.speculative import parse_spec

    levers = parse_levers(args.levers)
    spec = parse_spec(args.spec, args.spec_depth) if speculate else None
    # Device, dtype and memory are checked before the levers' heavy imports (compile, graphs): seconds sooner.
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    check_fits(checkpoint.config, device, dtype)
    from kerneltriage.backends.torch.accelerate import apply_levers
    from kerneltriage.backends.torch.runner import build_runner

    started = time.perf_counter()
    runner = apply_levers(build_runner(checkpoint, device, dtype), levers)
    if spec is not None:  # after the levers: speculation wraps whatever prefill they installed
        from kerneltriage.backends.torch.speculative import install_speculation

        install_speculation(runner, spec)
    note = " — RANDOM WEIGHTS: speed only, the text is noise" if checkpoint.config.random_weights else ""
    print(f"loaded {checkpoint.source} on {device} ({str(dtype).removeprefix('torch.')}) "
          f"in {time.perf_counter() - started:.1f} s{note}", file=sys.stderr)
    return runner


def encode_prompt(checkpoint, text: str, chat: bool) -> list[int]:  # noqa: ANN001 - engine Checkpoint
    """Token ids of the prompt; one that leaves no room in the context is an InputError, before any loading."""
    tokenizer = checkpoint.tokenizer
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special=False)
    else:
        ids = tokenizer.encode(text)
    context = checkpoint.config.max_context
    if len(ids) >= context:
        raise InputError(f"--prompt of {len(ids)} tokens: expected fewer than the model's context of {context}")
    return ids


def spec_summary(runner) -> list[str]:  # noqa: ANN001 - a torch Runner
    """Acceptance and the adaptive-depth decisions, when speculation ran."""
    from kerneltriage.backends.torch.speculative import decoder_of

    loop = decoder_of(runner)
    if loop is None:
        return []
    lines = [f"spec {loop.spec.label} | {loop.stats.summary()}"]
    if runner.config.random_weights:
        lines.append("spec: acceptance is meaningless on random weights")
    return lines + [f"spec: step {d.step}: {d.reason}" for d in loop.controller.decisions]


def summary_line(runner, last) -> str:  # noqa: ANN001
    if last is None:
        return "no tokens generated"
    levers = ",".join(runner.levers) or "none"
    return (f"prompt {last.prompt_tokens} tok | prefill {last.prompt_tps:,.1f} tok/s | "
            f"decode {last.generation_tps:,.1f} tok/s ({last.generation_tokens} tok) | "
            f"peak memory {last.peak_memory / 1e6:,.0f} MB | levers {levers}")
