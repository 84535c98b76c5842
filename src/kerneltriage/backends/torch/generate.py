"""Generation as layered generators: generate_step (token ids) → stream_generate (records) → generate (text)."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from kerneltriage.backends.torch.runner import Runner
from kerneltriage.backends.torch.sampling import make_generator
from kerneltriage.backends.torch.timing import peak_memory_bytes, reset_peak_memory, synced_clock
from kerneltriage.core.errors import InputError
from kerneltriage.engine.generation import GenerationResponse, StopStrings
from kerneltriage.engine.sampling import SamplingParams


def check_prompt(runner: Runner, prompt: Sequence[int], max_tokens: int) -> int:
    """Cache length needed; a prompt that leaves no room to generate is an InputError."""
    context = runner.config.max_context
    if not prompt:
        raise InputError("prompt: expected at least one token")
    if len(prompt) >= context:
        raise InputError(f"prompt of {len(prompt)} tokens: expected fewer than the model's context of {context}")
    if max_tokens < 1:
        raise InputError(f"--max-tokens {max_tokens}: expected at least 1")
    return min(context, len(prompt) + max_tokens)


@torch.inference_mode()
def generate_step(
    runner: Runner, prompt: Sequence[int], params: SamplingParams, max_tokens: int
) -> Iterator[int]:
    """Yield up to `max_tokens` token ids (fewer if the context fills). The caller decides when to stop."""
    needed = check_prompt(runner, prompt, max_tokens)
    runner.reset_cache(needed)
    generator = make_generator(params, runner.device)
    tokens = torch.tensor([list(prompt)], device=runner.device)  # (1, T)
    logits = runner.prefill(runner.model, tokens, 0)
    yield from runner.decode_loop(runner, logits, len(prompt), needed - len(prompt), params, generator)


def stream_generate(
    runner: Runner,
    prompt: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    stop: tuple[str, ...] = (),
) -> Iterator[GenerationResponse]:
    """Yield one record per generated token with the new text and running speeds.

    Prefill rate = prompt tokens / time to first token; decode rate excludes that first token.
    """
    limit = check_prompt(runner, prompt, max_tokens) - len(prompt)
    tokenizer = runner.checkpoint.tokenizer
    decoder, stops = tokenizer.stream_decoder(), StopStrings(stop)
    eos = set(runner.config.eos_token_ids) | set(tokenizer.eos_token_ids)
    reset_peak_memory(runner.device)
    start = synced_clock(runner.device)
    first = prompt_tps = 0.0
    for count, token in enumerate(generate_step(runner, prompt, params, limit), start=1):
        now = synced_clock(runner.device)
        if count == 1:
            first = now
            prompt_tps = len(prompt) / (now - start)
        decode_tps = (count - 1) / (now - first) if count > 1 else 0.0
        text, hit_stop = ("", False) if token in eos else stops.feed(decoder(token))
        done = token in eos or hit_stop
        reason = "stop" if done else ("length" if count == limit else None)
        if reason == "length":
            text += stops.flush()
        yield GenerationResponse(text, token, len(prompt), prompt_tps, count, decode_tps,
                                 peak_memory_bytes(runner.device), reason)
        if done:
            return


def generate(runner: Runner, prompt: Sequence[int], params: SamplingParams, max_tokens: int,
             stop: tuple[str, ...] = ()) -> str:
    """The whole completion as text."""
    return "".join(r.text for r in stream_generate(runner, prompt, params, max_tokens, stop))
