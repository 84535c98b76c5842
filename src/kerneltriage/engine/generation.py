"""Generation as layered generators over the backend protocol: generate_step (token ids) → stream_generate
(response records with running rates) → generate (text); and stop-string handling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

from kerneltriage.core.errors import InputError
from kerneltriage.engine.sampling import LogitsProcessor, SamplingParams

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Runner


@dataclass(frozen=True)
class GenerationResponse:
    """One streamed step: the new text and the running statistics (mlx-lm's record, kept framework-free)."""

    text: str
    token: int
    prompt_tokens: int
    prompt_tps: float  # prefill tokens / time to first token
    generation_tokens: int
    generation_tps: float  # decode tokens / decode time, the first token excluded
    peak_memory: int  # bytes
    finish_reason: str | None = None  # None while running; "stop" (EOS or stop string) or "length"


class StopStrings:
    """Feeds streamed text through, holding back any tail that could still become a stop string."""

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to print now, whether a stop string was hit)."""
        self.pending += text
        hits = [self.pending.find(s) for s in self.stops if s in self.pending]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        keep = self._partial_tail()
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def _partial_tail(self) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:size]):
                    best = size
                    break
        return best


def check_prompt(runner: "Runner", prompt: Sequence[int], max_tokens: int) -> int:
    """Cache length needed; a prompt that leaves no room to generate is an InputError."""
    context = runner.config.max_context
    if not prompt:
        raise InputError("prompt: expected at least one token")
    if len(prompt) >= context:
        raise InputError(f"prompt of {len(prompt)} tokens: expected fewer than the model's context of {context}")
    if max_tokens < 1:
        raise InputError(f"--max-tokens {max_tokens}: expected at least 1")
    return min(context, len(prompt) + max_tokens)


def generate_step(runner: "Runner", prompt: Sequence[int], params: SamplingParams, max_tokens: int,
                  processors: Sequence[LogitsProcessor] = ()) -> Iterator[int]:
    """Yield up to `max_tokens` token ids (fewer if the context fills). The caller decides when to stop.
    `processors` (`(tokens, logits) → logits`) apply before sampling, ahead of the workload's constraint."""
    needed = check_prompt(runner, prompt, max_tokens)
    runner.reset_cache(needed)
    logits = runner.prefill(prompt, 0)
    sampler = runner.sampler(params, prompt, processors)
    yield from runner.loop(logits, len(prompt), needed - len(prompt), sampler)


def stream_generate(runner: "Runner", prompt: Sequence[int], params: SamplingParams, max_tokens: int,
                    stop: tuple[str, ...] = (), processors: Sequence[LogitsProcessor] = ()
                    ) -> Iterator[GenerationResponse]:
    """Yield one record per generated token with the new text and running speeds.

    Prefill rate = prompt tokens / time to first token; decode rate excludes that first token.
    """
    limit = check_prompt(runner, prompt, max_tokens) - len(prompt)
    tokenizer = runner.checkpoint.tokenizer
    decoder, stops = tokenizer.stream_decoder(), StopStrings(stop)
    eos = set(runner.config.eos_token_ids) | set(tokenizer.eos_token_ids)
    runner.reset_peak_memory()
    start = runner.clock()
    first = prompt_tps = 0.0
    for count, token in enumerate(generate_step(runner, prompt, params, limit, processors), start=1):
        now = runner.clock()
        if count == 1:
            first, prompt_tps = now, len(prompt) / (now - start)
        decode_tps = (count - 1) / (now - first) if count > 1 else 0.0
        text, hit_stop = ("", False) if token in eos else stops.feed(decoder(token))
        done = token in eos or hit_stop
        reason = "stop" if done else ("length" if count == limit else None)
        if reason is not None:  # the run ends: text held back for a stop string is text (empty after a hit)
            text += stops.flush()
        yield GenerationResponse(text, token, len(prompt), prompt_tps, count, decode_tps, runner.peak_memory(), reason)
        if done:
            return


def generate(runner: "Runner", prompt: Sequence[int], params: SamplingParams, max_tokens: int,
             stop: tuple[str, ...] = (), processors: Sequence[LogitsProcessor] = ()) -> str:
    """The whole completion as text."""
    return "".join(r.text for r in stream_generate(runner, prompt, params, max_tokens, stop, processors))
