"""`kerneltriage generate`: stream a completion from the reference engine, then one summary line."""

from __future__ import annotations

import argparse
import math
import sys

from kerneltriage.cli.common import (LEVERS_HELP, add_constraint_arguments, add_model_arguments, build_runner,
                                     constrain, constraint_flags, run_config)
from kerneltriage.core.errors import InputError

EPILOG = """examples:
  kerneltriage generate --prompt "Write a haiku about GPUs" --temperature 0.7 --seed 1
  kerneltriage generate --no-chat --prompt "The capital of France is"   (raw completion, no chat template)
  kerneltriage generate --model llama3-8b --prompt hi --max-tokens 64   (random weights: speed only)
  kerneltriage generate --model ./Qwen3-0.6B --device cpu --dtype bf16 --levers last_logits
  kerneltriage generate --prompt "Is water wet?" --choices yes,no      (the answer is one of the choices)
  kerneltriage generate --prompt "A user record" --json-schema person.json --levers vocab_compact

--model takes 'default' (SmolLM2-135M-Instruct, fetched into the user cache on first use), a preset
(real shapes, random weights), a .gguf file or a Hugging Face folder (config.json + *.safetensors)."""


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
        "tok/s and peak memory.", epilog=EPILOG + "\n\n" + LEVERS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="wrap the prompt in the model's chat template (default: when it has one, as mlx-lm does); "
                        "--no-chat: complete the prompt as written")
    parser.add_argument("--max-tokens", type=_positive, default=128, help="new tokens at most (default: %(default)s)")
    parser.add_argument("--temperature", type=_finite, default=0.0, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=_finite, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--min-p", type=_finite, default=0.0, help="drop tokens below min-p × the top probability")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument("--repetition-penalty", type=_finite, default=1.0,
                        help="divide the logits of the last 20 tokens by this (1 = off), as mlx-lm does")
    parser.add_argument("--stop", action="append", default=[], type=_stop_string, help="stop string (repeatable)")
    add_constraint_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the arguments → load → stream → summary."""
    from kerneltriage.engine.generation import stream_generate
    from kerneltriage.engine.sampling import SamplingParams
    from kerneltriage.engine.sources import load_checkpoint

    try:
        params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed,
                                args.repetition_penalty)
    except ValueError as exc:
        raise InputError(f"sampling: {exc}") from None
    if not args.prompt:
        raise InputError("--prompt '': expected some text")
    config, constraint = run_config(args), constraint_flags(args)
    checkpoint = load_checkpoint(args.model)
    constrain(checkpoint, constraint)
    prompt = encode_prompt(checkpoint, args.prompt, chat_mode(args.chat, checkpoint))
    runner = build_runner(checkpoint, args, config)
    last = None
    for last in stream_generate(runner, prompt, params, args.max_tokens, tuple(args.stop)):
        sys.stdout.write(last.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    for line in (cut_line(runner, last, args.max_tokens), summary_line(runner, last), *spec_summary(runner)):
        if line:
            print(line, file=sys.stderr)
    return 0


def chat_mode(asked: bool | None, checkpoint) -> bool:  # noqa: ANN001 - engine Checkpoint
    """--chat / --no-chat as asked; by default the model's chat template when it has one (an instruct model given
    bare text answers something else, or ends at once), else the prompt as written, said once."""
    if asked is not None:
        return asked
    if checkpoint.tokenizer.chat_template is None:
        if not checkpoint.tokenizer.is_synthetic:  # a preset's byte tokenizer: random weights, nothing to template
            print(f"{checkpoint.source} has no chat template: completing the prompt as written", file=sys.stderr)
        return False
    return True


def encode_prompt(checkpoint, text: str, chat: bool) -> list[int]:  # noqa: ANN001 - engine Checkpoint
    """Token ids of the prompt (in the chat template with `chat`, as transformers' apply_chat_template with
    add_generation_prompt); one that leaves no room in the context is an InputError, before any loading."""
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


def spec_summary(runner) -> list[str]:  # noqa: ANN001 - a backend Runner
    """Acceptance and the adaptive-depth decisions, when speculation ran."""
    loop = runner.speculation
    if loop is None:
        return []
    lines = [f"spec {loop.speculation.label} | {loop.stats.summary()}"]
    if runner.config.random_weights:
        lines.append("spec: acceptance is meaningless on random weights")
    return lines + [f"spec: step {d.step}: {d.reason}" for d in loop.controller.decisions]


def cut_line(runner, last, max_tokens: int) -> str | None:  # noqa: ANN001 - a backend Runner, a response
    """Where a generation that did not end by itself was cut: --max-tokens or the model's context."""
    if last is None or last.finish_reason != "length":
        return None
    unfinished = "" if runner.checkpoint.grammar is None else " (so it does not match the constraint yet)"
    if last.generation_tokens >= max_tokens:
        return f"stopped at --max-tokens {max_tokens} before the model ended its answer{unfinished} (raise it for more)"
    return f"stopped at the model's context of {runner.config.max_context} tokens before the model ended its answer"


def summary_line(runner, last) -> str:  # noqa: ANN001
    if last is None:
        return "no tokens generated"
    levers = ",".join(runner.run_config.lever_names) or "none"
    grammar = runner.checkpoint.grammar
    return (f"prompt {last.prompt_tokens} tok | prefill {last.prompt_tps:,.1f} tok/s | "
            f"decode {last.generation_tps:,.1f} tok/s ({last.generation_tokens} tok) | "
            f"peak memory {last.peak_memory / 1e6:,.0f} MB | levers {levers}"
            + ("" if grammar is None else f" | constraint {grammar.constraint.label}"))
