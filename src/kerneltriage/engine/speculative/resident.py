"""Speculative steps queued ahead of the host: `--levers …,one_sync --spec ngram|suffix` on a runner whose steps can
run resident (CUDA graphs: backends/torch/resident.py), at temperature 0.

A host-fed speculative step is a round trip: the device verifies, the host reads the rows' argmaxes, accepts,
decides and drafts the next step and feeds it, and only then does the device start it — on the H200 ~0.15 plain
steps of waiting at every such turn, more wherever the host's own pace slows (verify_host_probe.py); and a
pipelined plain run finds a draft one token late (the next plain step was queued before the token that made it was
read). Resident, the device keeps its own copy of the text and each step drafts from it (the latest longest
earlier match of its suffix), chooses there between a plain step and a verify by the suffix drafter's rule
(lookup_draft.draft), runs it and accepts greedily. Every step that runs emits at least one token of plain greedy
decoding's text, so none is wasted: the host keeps AHEAD + 1 of them queued and only reads what they emitted,
recording each in the stats and the depth controller. A step queued while the one before it may still reach the
run's end finds, where that one did, the text complete: the device runs no body (DONE), ~5 µs instead of a forward
nobody reads (on copy_heavy's 16 × 64 tokens, H200, the time outside steps fell from 19.7 to 4.1 ms of ~195:
spec-trace-copy_heavy-h200-{head,done}.json). The controller sets the device's limits: the widest verify (its k) and
the least match length a verify needs (the shortest whose verifies have emitted tokens faster than plain steps on
this text: controller.DepthController.least); when the recent verifies lose as a whole, it switches speculation
off, the run drains and plain steps follow, host-fed with shadow drafts, until it switches back on.

The tokens are plain greedy decoding's whatever the device chooses (every step's acceptance is `greedy_accept`'s
rule); the choice costs time, not exactness.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator, Protocol

from kerneltriage.engine.decoding import ONE_SYNC
from kerneltriage.engine.speculative.config import VERIFY_BUCKETS, padded_rows
from kerneltriage.engine.speculative.suffix import LONG_MATCH

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Queued, Steps
    from kerneltriage.engine.speculative.config import Speculation
    from kerneltriage.engine.speculative.controller import DepthController

AHEAD = 1  # resident steps queued beyond the one the host waits for
CHOICES = (1, *VERIFY_BUCKETS)  # a resident step's rows by the device's choice: a plain step, then the verify shapes
WIDEST = CHOICES[-1]  # the rows a resident step may compute at most
DONE = len(CHOICES)  # the device's choice once the text has the run's end: no body (the step queued past the end)
RESIDENT_SLACK = (AHEAD + 1) * WIDEST  # cache room past a run's end: the steps in flight may write up to there


def widest(k: int) -> int:
    """The widest body the device may choose under a depth of k, as CHOICES' index (0: plain steps only): the shape a
    draft of k is padded to."""
    return CHOICES.index(padded_rows(k, WIDEST - 1)) if k > 0 else 0


def device_choice(text: list[int], lookback: int, limits: tuple[int, int, int]) -> tuple[int, int]:
    """(choice, matched): what a resident step after `text` chooses (kernels/lookup_draft.draft, on the host: the
    replay models it, the tests check the kernel against it) — the latest longest earlier match of the text's suffix
    up to `lookback` tokens; the widest verify from LONG_MATCH tokens, the narrower from 2, or from 1 where every
    earlier occurrence of the last token went on the same way, else a plain step (0); a plain step below a match of
    `least` tokens, and no wider than `widest`; DONE once the text has `end` tokens: limits = (widest, least, end)."""
    last, matched = len(text) - 1, 0
    for at in range(last):  # each earlier position a match could end at
        length = 0
        while length < min(lookback, at + 1) and text[at - length] == text[last - length]:
            length += 1
        matched = max(matched, length)
    after = {text[at + 1] for at in range(last) if text[at] == text[last]}
    choice = 2 if matched >= LONG_MATCH else 1 if matched >= 2 or (matched == 1 and len(after) == 1) else 0
    cap, least, end = limits
    return (DONE if len(text) >= end else min(choice if matched >= least else 0, cap)), matched


class Deciding(Protocol):
    """What a resident run asks of the speculative decoder that runs it (decoder.py: SpeculativeDecoder)."""

    speculation: "Speculation"
    controller: "DepthController"

    def host_clock(self) -> float: ...

    def depth(self, runner: "Steps", context: list[int], end: int) -> int:
        """The controller's k for the next step (0: a plain step)."""

    def record_step(self, runner: "Steps", rows: int, accepted: int, seconds: float, matched: int = 0) -> None:
        """A step that emitted `accepted` + 1 tokens from `rows` rows in `seconds`, into the stats and controller."""


def resident_run(decoder: Deciding, runner: "Steps", context: list[int], end: int) -> Iterator[int]:
    """Resident steps after `context` (extended in place) until the controller switches speculation off, the text
    reaches `end` tokens, or the cache's end; every step queued is read before this returns (but where the caller
    closes it early). A step's cost is the time between two results arriving: the device's pace. Nothing is uploaded
    where the cache cannot hold one step (a context cut short of the steps' reach: the caller steps plainly)."""
    if len(context) - 1 + WIDEST > runner.cache_capacity:
        return
    runner.begin_resident(context, decoder.speculation.lookback)
    queued: deque["Queued"] = deque()
    last = decoder.host_clock()
    try:
        while True:
            cap = widest(decoder.depth(runner, context, end))
            reach = len(context) - 1 + (len(queued) + 1) * WIDEST  # past the last position this one may write
            # each step in flight emits a token at least: queue while the text may still be short of `end`
            if cap and len(queued) <= AHEAD and len(context) + len(queued) < end and reach <= runner.cache_capacity:
                queued.append(runner.queue_step(reach, (cap, decoder.controller.least, end)))
                runner.counters[ONE_SYNC] += 1
                continue
            if not queued:
                return
            tokens, matched, rows = queued.popleft().result()
            emitted = tokens[:end - len(context)]  # one queued near the end may pass it
            now = decoder.host_clock()
            if emitted:
                decoder.record_step(runner, rows, len(emitted) - 1, now - last, matched)
            last = now
            context += emitted
            yield from emitted
    finally:  # what was read is the device's text too (a step still queued writes only past it)
        runner.trim_cache(len(context) - 1)
