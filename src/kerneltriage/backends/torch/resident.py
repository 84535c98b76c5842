"""Speculative steps resident on the device: the text, the draft, the choice between a plain step and a verify, the
forward and greedy acceptance all on the GPU, so that the host queues steps without deciding or reading any of them
first (speculation's `one_sync` loop, engine/speculative/resident.py).

Why: a host-fed loop waits for the host at every verify — the tokens read back, accepted, the next step decided,
drafted, fed and launched — ~100-170 µs per step on the H200 beside a ~690 µs verify, more whenever the host's own
pace slows (verify_host_probe.py); and a pipelined plain run verifies one token late (the step after the one whose
token made a draft was already queued). The replay put the two at 6% and 7% of repetitive's speed-up
(draft_replay.py). Here one CUDA graph per window runs a whole step: `lookup_draft.draft` writes the step's tokens,
position and choice from the device's copy of the text, a SWITCH node (graph_switch.py) runs the chosen body — a
plain step, or a verify of one of the padded shapes — each its forward, its rows' argmax and
`lookup_draft.accept`, which appends what greedy acceptance keeps and writes [emitted, matched, rows, argmaxes]
for the host to copy back later — or, once the text has the run's end, no body (DONE: the step queued past the
end, ~5 µs), the result then nothing emitted. The device needs nothing from the host between two steps.

Off CUDA the step runs as a function that reads the choice on the host and calls that body: the same tokens, with
a host sync (the CPU's tests run it so). On CUDA without cuda.bindings (no SWITCH) no steps run resident: `one_sync`
with `--spec` verifies host-fed.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch

from kerneltriage.backends.torch import graph_switch
from kerneltriage.backends.torch.graphed import GRAPH_WARMUPS, CapturedGraph, GraphedStep, capturable_attention
from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.backends.torch.models import Model
from kerneltriage.engine.speculative.resident import CHOICES, DONE, RESIDENT_SLACK

if TYPE_CHECKING:
    from kerneltriage.backends.torch.graphed import Capture
    from kerneltriage.backends.torch.runner import Runner, RowsFn, StepFn

RESULT_SLOTS = 4  # pinned host buffers for results in flight (the loop reads one while at most two are queued)
MAX_ROWS = CHOICES[-1]  # the widest step (bodies have CHOICES' rows): the text buffer's room past its end


class Result:
    """One resident step's outcome on its way to the host: `result()` waits for its copy only."""

    def __init__(self, out: torch.Tensor, slot: "tuple[torch.Tensor, torch.cuda.Event] | None") -> None:
        """`out` is the graphs' output buffer, rewritten by the next replay: copied now (in stream order) into the
        pinned buffer of `slot`, whose event marks the copy done."""
        self.size, self.ready = len(out), None
        if slot is None:  # the CPU: the step has run
            self.values = out.tolist()
            return
        self.host, self.ready = slot
        self.host[:self.size].copy_(out, non_blocking=True)
        self.ready.record()

    def result(self) -> tuple[list[int], int, int]:
        """(the tokens the step emitted, the length of the match its draft came from, its rows: 1 for a plain
        step, 0 (and no tokens) for one that found the text complete: DONE)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.values, self.ready = self.host[:self.size].tolist(), None
        return self.values[3:3 + self.values[0]], self.values[1], self.values[2]


class ResidentSteps(GraphedStep):
    """Graphed steps that draft from, choose by, and append to the device's copy of the text (module docstring).
    `begin` puts the text on the device, `queue` replays one step and starts its result's copy to the host; the
    device's text and length then run ahead of the host's until it reads the results."""

    def __init__(self, runner: "Runner", decode: "StepFn", verify: "RowsFn", window_step: int | None,
                 capture_fn: "Capture") -> None:
        super().__init__(runner, self._step, window_step, capture_fn)
        self.decode, self.verify = decode, verify
        self.switch = capture_fn is capture  # the real capture: the choice made on the device (graph_switch)
        self.lookback = 0
        self.history: torch.Tensor | None = None  # (S,) the text, with room for a step's rows past its end
        self.length: torch.Tensor | None = None  # () its length
        self.matched: torch.Tensor | None = None  # () the last draft's match
        self.choice: torch.Tensor | None = None  # () int32: the body the last draft chose (CHOICES' index; DONE: none)
        self.limits: torch.Tensor | None = None  # (3,) int32: the widest body allowed, the least match, the end
        self.out: torch.Tensor | None = None  # (MAX_ROWS + 3,) every body's result (a DONE draft's: nothing emitted)
        self.allowed: tuple[int, int, int] | None = None  # the host's copy of `limits`
        self.capturing: int | None = None  # while a graph is captured: the text's length each warm-up starts from
        self._host: list[tuple[torch.Tensor, torch.cuda.Event]] = []

    def attach(self, cache: StaticKVCache) -> StaticKVCache:
        """A new cache: the device buffers sized to it (its graphs read these)."""
        if cache is not self.cache:
            device = cache.keys.device
            self.history = torch.zeros(cache.max_len + MAX_ROWS, dtype=torch.long, device=device)  # (S,)
            self.length, self.matched = (torch.zeros((), dtype=torch.long, device=device) for _ in range(2))
            self.choice = torch.zeros((), dtype=torch.int32, device=device)
            self.limits = torch.zeros(3, dtype=torch.int32, device=device)
            self.out = torch.zeros(MAX_ROWS + 3, dtype=torch.long, device=device)
            self.allowed = None
        return super().attach(cache)

    def use(self, lookback: int) -> None:
        """Drafts match up to `lookback` tokens from now on (compiled into the draft kernel: a new value recaptures)."""
        if lookback != self.lookback:
            self.graphs.clear()
            self.lookback = lookback

    def begin(self, model: Model, context: list[int], lookback: int) -> None:
        """The device's text ← `context` (through pinned memory: the host does not wait for the device to take it)."""
        self.use(lookback)
        self.attach(model.cache)
        staged = torch.tensor(context, dtype=torch.long, pin_memory=self.history.is_cuda)
        self.history[:len(context)].copy_(staged, non_blocking=True)
        self.length.fill_(len(context))

    def prepare(self, model: Model, start: int, end: int, rows: list[int]) -> None:
        """Capture now the graph of every window a run's steps may reach: the steps in flight write up to
        RESIDENT_SLACK positions past the text (`rows` aside: every resident graph has MAX_ROWS)."""
        super().prepare(model, start, end + RESIDENT_SLACK - MAX_ROWS, [MAX_ROWS])

    def queue(self, model: Model, reach: int, limits: tuple[int, int, int]) -> Result:
        """Replay a step — plain, or a verify within `limits` (no wider than CHOICES[widest] rows, from a match of
        `least` tokens; none once the text has `end` tokens) — whose writes end before position `reach` at the
        latest (the steps queued ahead of it included): it drafts after the device's text, chooses, runs and
        accepts. (A step that finds the text complete counts its levers as a plain step: at most one a run.)"""
        limits = tuple(limits)
        self.attach(model.cache)
        if len(limits) != len(self.limits):  # a missing end would read as the run's end reached: every step DONE
            raise ValueError(f"resident step limits {limits}: expected (widest, least, end)")
        if limits != self.allowed:  # (stream-ordered before the replay; only when they change)
            for index, value in enumerate(limits):
                self.limits[index].fill_(value)
            self.allowed = limits
        entry = self.entry(model, MAX_ROWS, reach, None, reach - MAX_ROWS)
        return Result(self.replay(model, entry, reach), self._slot())

    def _draft(self, slot: torch.Tensor) -> None:
        from kerneltriage.kernels import lookup_draft

        lookup_draft.draft(self.history, self.length, slot, self.cache.position, self.matched, self.choice,
                           self.limits, self.out, self.lookback)

    def _body(self, model: Model, slot: torch.Tensor, start: int, choice: int) -> torch.Tensor:
        """The chosen step on the drafted slot (1, MAX_ROWS): its first CHOICES[choice] rows' forward, argmax and
        acceptance."""
        from kerneltriage.kernels import lookup_draft

        tokens = slot[:, :CHOICES[choice]]
        logits = self.decode(model, tokens, start) if tokens.shape[1] == 1 else self.verify(model, tokens, start)
        best = logits.argmax(dim=-1).view(-1)  # (rows,) the target's token after each row
        lookup_draft.accept(self.history, self.length, best, tokens, self.matched, self.out)
        return self.out

    def _warming(self, slot: torch.Tensor) -> None:
        """While a graph is captured, each warm-up starts from the same text end as the capture (not recorded)."""
        if self.capturing is not None and not (slot.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.length.fill_(self.capturing)

    def _step(self, model: Model, slot: torch.Tensor, start: int) -> torch.Tensor:
        """A step with the choice read on the host (off CUDA, where a "graph" reruns this: the CPU's tests): draft,
        then the chosen body — none where the text is complete (DONE), but for a capture's warm-ups, which run the
        plain body (as the SWITCH capture counts a replay's levers from it: the limits before a run's first step
        may read as its end)."""
        self._warming(slot)
        self._draft(slot)
        choice = int(self.choice)
        if choice == DONE and self.capturing is None:
            return self.out
        return self._body(model, slot, start, 0 if choice == DONE else choice)

    def _capture(self, model: Model, cache: StaticKVCache, window: int, tokens: torch.Tensor, start: int
                 ) -> CapturedGraph:
        """Capture with the device's text ending at `start`: every warm-up drafts, runs and writes the cache from
        there (one that went on from the last one's accepted tokens would write past `start + rows`, up to the
        cache's end and beyond); the length is put back after. With the SWITCH: each body captured on its own
        (their warm-ups and captures from that text end), then the graph that drafts and switches to one."""
        length, self.capturing = self.length.clone(), start + 1
        try:
            if not self.switch:
                return super()._capture(model, cache, window, tokens, start)
            return self._capture_switch(model, cache, window, tokens.clone(), start)
        finally:
            self.capturing = None
            self.length.copy_(length)

    def _capture_switch(self, model: Model, cache: StaticKVCache, window: int, slot: torch.Tensor,
                        start: int) -> CapturedGraph:
        counters, bodies, calls = self.runner.counters, [], []
        before = Counter(counters)
        cache.position.fill_(start)
        cache.window = window
        try:
            with capturable_attention():
                self._warming(slot)
                self._draft(slot)  # the slot holds a draft: every body warms up on real tokens
                for choice in range(len(CHOICES)):
                    def body(choice: int = choice) -> torch.Tensor:
                        self._warming(slot)
                        ran = Counter(counters)
                        out = self._body(model, slot, start, choice)
                        calls.append((choice, Counter(counters) - ran))
                        return out
                    bodies.append(capture(body, GRAPH_WARMUPS, keep_graph=True)[0])
                graph = graph_switch.switch_graph(lambda: self._draft(slot), self.choice, bodies)
        finally:
            cache.window = None
            counters.clear()
            counters.update(before)  # capture is not execution: only replays count
        graph.bodies = bodies  # their pools hold the bodies' intermediates: kept as long as the graph
        # a replay runs one body, each with the same levers: it counts the plain step's
        inside = next(ran for choice, ran in reversed(calls) if choice == 0)
        self.graphs[window, MAX_ROWS] = CapturedGraph(graph, slot, self.out, inside)
        return self.graphs[window, MAX_ROWS]

    def _slot(self) -> "tuple[torch.Tensor, torch.cuda.Event] | None":
        """The oldest pinned result buffer and its event (CUDA; None on the CPU, where a result is there when
        queued)."""
        if not self.history.is_cuda:
            return None
        if not self._host:  # (a slot is rewritten RESULT_SLOTS queues later: the loop reads each before then)
            self._host = [(torch.empty(MAX_ROWS + 3, dtype=torch.long, pin_memory=True), torch.cuda.Event())
                          for _ in range(RESULT_SLOTS)]
        self._host.append(self._host.pop(0))
        return self._host[-1]
