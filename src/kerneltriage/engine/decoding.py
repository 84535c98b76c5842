"""The decode-loop contract: a loop takes the runner's steps, the logits after the prompt, the first position to
fill, how many tokens to emit and a sampler, and yields host token ids.

The sampler applies the generation's logits processors, `(tokens, logits) → logits` as in mlx-lm, before
sampling; every loop — the stock one, the pipelined one (`one_sync`) and speculation's — samples only through
it, so a processor changes all of them alike. Loops are framework-free: device arrays pass through as handles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Sampler, Steps

# (runner steps, logits (1, V) after the prompt, first position to fill, tokens to emit, sampler) → host ids
TokenLoop = Callable[["Steps", Any, int, int, "Sampler"], Iterator[int]]
ONE_SYNC = "one_sync"


def plain_loop(runner: "Steps", logits: Any, start: int, count: int, sampler: "Sampler") -> Iterator[int]:
    """Sample on the device, read the token (one sync), decode it, repeat."""
    for position in range(start, start + count):
        token = sampler(logits)
        yield runner.read_later(token).result()
        if position + 1 < start + count:
            logits = runner.decode(token, position)


def pipelined_loop(runner: "Steps", logits: Any, start: int, count: int, sampler: "Sampler") -> Iterator[int]:
    """One host readback per token, and step i+1 queued before token i is read: the device never waits for the
    host between steps (the lever `one_sync`)."""
    token = sampler(logits)
    for position in range(start, start + count):
        runner.counters[ONE_SYNC] += 1
        pending = runner.read_later(token)
        if position + 1 < start + count:  # queue step i+1 before waiting for token i
            token = sampler(runner.decode(token, position))
        yield pending.result()  # waits for the copy only, not for the step queued after it
