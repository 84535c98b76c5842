"""The decode-loop contract: a loop takes the runner's steps, the logits after the prompt, the first position to
fill, how many tokens to emit and a sampler, and yields host token ids.

The sampler applies the generation's logits processors, `(tokens, logits) → logits` as in mlx-lm, before
sampling; every loop — the stock one, the pipelined one (`one_sync`) and speculation's — samples only through
it, so a processor changes all of them alike. A processor whose state is on the host (a constraint) is told each
token as the loop reads it (`sampler.follow`, in `next_logits`): after the next step is queued, so that its host work
overlaps the device's step. Loops are framework-free: device arrays pass through as handles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Pending, Sampler, Steps

# (runner steps, logits (1, V) after the prompt, first position to fill, tokens to emit, sampler) → host ids
TokenLoop = Callable[["Steps", Any, int, int, "Sampler"], Iterator[int]]
ONE_SYNC = "one_sync"


def next_logits(runner: "Steps", sampler: "Sampler", token: Any, read: "Pending", position: int) -> Any:
    """Queue the step that feeds `token` (on its way to the host as `read`) at `position`: logits (1, V). A sampler
    with host state (a constraint) follows the token once the step is queued — its next mask computed while the
    device runs the step — or before it, where the runner computes only the allowed rows (`vocab_compact`: the step
    needs them). A sampler without host state does not wait for the token here."""
    if not sampler.host_bound:
        return runner.decode(token, position)
    if runner.compact_limit:
        sampler.follow(read.result())
        return runner.decode(token, position, sampler.rows(runner.compact_limit))
    logits = runner.queue(runner.decode(token, position))  # started before the host waits for the token
    sampler.follow(read.result())  # the host's work for step i+1 while the device runs it
    return logits


def first_logits(runner: "Steps", sampler: "Sampler", token: Any, position: int) -> Any:
    """Queue the step that feeds `token`, already followed by the sampler (a host id, or one it was told): logits
    (1, V), only the allowed rows where the runner compacts them."""
    if sampler.host_bound and runner.compact_limit:
        return runner.decode(token, position, sampler.rows(runner.compact_limit))
    return runner.decode(token, position)


def plain_loop(runner: "Steps", logits: Any, start: int, count: int, sampler: "Sampler") -> Iterator[int]:
    """Sample on the device, read the token (one sync), decode it, repeat."""
    for position in range(start, start + count):
        token = sampler(logits)
        read = runner.read_later(token)
        yield read.result()
        if position + 1 < start + count:
            logits = next_logits(runner, sampler, token, read, position)


def pipelined_loop(runner: "Steps", logits: Any, start: int, count: int, sampler: "Sampler") -> Iterator[int]:
    """One host readback per token, and step i+1 queued before token i is read: the device never waits for the
    host between steps (the lever `one_sync`). Under a constraint, sampling step i+1 waits for token i (its mask
    needs it), but the step itself is queued first."""
    token = sampler(logits)
    for position in range(start, start + count):
        runner.counters[ONE_SYNC] += 1
        pending = runner.read_later(token)
        if position + 1 < start + count:  # queue step i+1 before waiting for token i
            token = sampler(next_logits(runner, sampler, token, pending, position))
        yield pending.result()  # waits for the copy only, not for the step queued after it
