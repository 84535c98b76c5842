"""Speculation's verify steps queued ahead of the host: `--levers …,one_sync --spec ngram|suffix` on a runner whose
verifies can run resident (CUDA graphs: backends/torch/resident.py), at temperature 0.

A host-fed verify step is a round trip: the device verifies, the host reads the rows' argmaxes, accepts, drafts
the next tokens and feeds them, and only then does the device start the next verify — on the H200 ~100-170 µs of
every ~800 µs verify step, and more wherever the host's own pace slows (verify_host_probe.py). Resident, the device
keeps its own copy of the text and each verify drafts from it (the latest longest earlier match of its suffix),
verifies and accepts greedily there; behind a verify that accepted every draft (a copy in progress), the host
queues the next before it waits for the last one's tokens, so the device goes from verify to verify without
waiting (`one_sync`'s order of events).

What the host decides, it decides from the text read so far: whether a verify follows (the controller's depth, and
the host drafter's call — no recurring suffix, no verify: plain steps follow, host-fed and pipelined as before) and
at which padded shape (how far the host drafter would draft). The tokens are plain greedy decoding's whatever it
decides (every verify's acceptance is `greedy_accept`'s rule), so a late decision costs time, not exactness: a
verify queued behind one that ended the copy emits one token, as a plain step would, at a verify's price.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator

from kerneltriage.engine.decoding import ONE_SYNC

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Queued, Sampler, Steps
    from kerneltriage.engine.speculative.decoder import SpeculativeDecoder

AHEAD = 1  # resident verifies queued beyond the one the host waits for, behind one that accepted every draft


def resident_run(decoder: "SpeculativeDecoder", runner: "Steps", context: list[int], end: int, rows: int,
                 sampler: "Sampler") -> Iterator[int]:
    """Resident verifies after `context` (extended in place), the first of `rows` rows, until the host's drafter or
    the controller stops drafting, the text reaches `end` tokens, or the cache's end; every verify queued is read
    before this returns (but where the caller closes it early). A verify's cost is the time between two results
    arriving: the device's pace.

    A verify is queued blind (before the one in flight is read) only behind one that accepted every draft: the copy
    ran past its draft and likely goes on. Behind a partial acceptance the copy just broke, and a blind verify is
    mostly wasted: queued behind every verify but a run's first, it made repetitive 2.5% slower than host-fed
    verifies on the H200 (0.975× [0.972, 0.981], copy_heavy 1.075×, spec-*-h200-resident-vs-host-lag-all-2.json).
    Nor is a verify queued that the ones in flight may make unnecessary (they emit up to their rows each)."""
    runner.begin_resident(context, decoder.speculation.lookback)
    queued: deque[tuple[int, "Queued"]] = deque()
    last, ahead = decoder.host_clock(), 0
    try:
        while True:
            flight = sum(r for r, _ in queued)  # tokens the verifies in flight may still emit
            reach = len(context) - 1 + flight + rows  # past the last position this one may write
            if rows and len(queued) <= ahead and len(context) + flight < end and reach <= runner.cache_capacity:
                queued.append((rows, runner.queue_verify(rows, reach)))
                runner.counters[ONE_SYNC] += 1
                continue
            if not queued:
                return
            done, pending = queued.popleft()
            tokens = pending.result()[0]
            emitted = tokens[:end - len(context)]  # one queued near the end may pass it
            now = decoder.host_clock()
            if emitted:
                decoder.record_verify(runner, done, len(emitted) - 1, now - last)
            last = now
            context += emitted
            yield from emitted
            rows = decoder.resident_rows(runner, context, end, sampler)  # 0: queue no more
            ahead = AHEAD if len(tokens) == done else 0  # every draft accepted (and the bonus token)
    finally:  # what was read is the device's text too (a verify still queued writes only past it)
        runner.trim_cache(len(context) - 1)
