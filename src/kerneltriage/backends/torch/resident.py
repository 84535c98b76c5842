"""Verify steps resident on the device: the text, the draft, the verify and greedy acceptance all on the GPU, so that
the host queues the next verify before it reads the last one (speculation's `one_sync` loop,
engine/speculative/resident.py).

Why: a host-fed verify step waits for the host after every verify — the tokens read back, accepted, the next
draft made, the next verify fed and launched — ~100-170 µs per step on the H200 beside a ~690 µs verify, and more
whenever the host's own pace slows (verify_host_probe.py measured every call 2-4× slower in one pass of a process
than in another). Here one CUDA graph per (window, rows) runs a whole verify step: `lookup_draft.draft` writes its
tokens and position from the device's copy of the text, the verify forward runs, the rows' argmax, then
`lookup_draft.accept` appends what greedy acceptance keeps and writes [emitted, matched, argmaxes] for the host to
copy back later. The device needs nothing from the host between two verifies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kerneltriage.backends.torch.accelerate import GraphedStep
from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch.models import Model
from kerneltriage.engine.speculative.config import VERIFY_BUCKETS

if TYPE_CHECKING:
    from kerneltriage.backends.torch.accelerate import Capture, _Graph
    from kerneltriage.backends.torch.runner import Runner, RowsFn

RESULT_SLOTS = 4  # pinned host buffers for results in flight (the loop reads one while at most two are queued)
MAX_ROWS = VERIFY_BUCKETS[-1]  # the largest verify's rows: the text buffer's room past its end, a result's size


class Result:
    """One resident verify's outcome on its way to the host: `result()` waits for its copy only."""

    def __init__(self, out: torch.Tensor, slot: "tuple[torch.Tensor, torch.cuda.Event] | None") -> None:
        """`out` is the graph's output buffer, rewritten by its next replay: copied now (in stream order) into the
        pinned buffer of `slot`, whose event marks the copy done."""
        self.size, self.ready = len(out), None
        if slot is None:  # the CPU: the step has run
            self.values = out.tolist()
            return
        self.host, self.ready = slot
        self.host[:self.size].copy_(out, non_blocking=True)
        self.ready.record()

    def result(self) -> tuple[list[int], int]:
        """(the tokens the step emitted, the length of the match its draft came from)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.values, self.ready = self.host[:self.size].tolist(), None
        return self.values[2:2 + self.values[0]], self.values[1]


class ResidentVerify(GraphedStep):
    """Graphed verify steps that draft from, and append to, the device's copy of the text (module docstring). `begin`
    puts the text on the device, `queue` replays one step and starts its result's copy to the host; the device's text
    and length then run ahead of the host's until it reads the results."""

    def __init__(self, runner: "Runner", verify: "RowsFn", window_step: int | None, capture_fn: "Capture") -> None:
        super().__init__(runner, self._step, window_step, capture_fn)
        self.verify = verify
        self.lookback = 0
        self.history: torch.Tensor | None = None  # (S,) the text, with room for a verify's rows past its end
        self.length: torch.Tensor | None = None  # () its length
        self.matched: torch.Tensor | None = None  # () the last draft's match
        self.capturing: int | None = None  # while a graph is captured: the text's length each warm-up starts from
        self._host: list[tuple[torch.Tensor, torch.cuda.Event]] = []

    def attach(self, cache: StaticKVCache) -> StaticKVCache:
        """A new cache: the text buffer sized to it (its graphs read this one)."""
        if cache is not self.cache:
            device = cache.keys.device
            self.history = torch.zeros(cache.max_len + MAX_ROWS, dtype=torch.long, device=device)  # (S,)
            self.length = torch.zeros((), dtype=torch.long, device=device)
            self.matched = torch.zeros((), dtype=torch.long, device=device)
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

    def queue(self, model: Model, rows: int, reach: int) -> Result:
        """Replay a verify of `rows` rows whose writes end before position `reach` at the latest (the steps queued ahead
        of it included): it drafts after the device's text, verifies and accepts."""
        entry = self.entry(model, rows, reach, None, reach - rows)
        return Result(self.replay(model, entry, reach), self._slot())

    def _step(self, model: Model, slot: torch.Tensor, start: int) -> torch.Tensor:
        """What each replay runs: slot (1, rows) is the graph's own token buffer; out (rows + 2,) its result."""
        from kerneltriage.kernels import lookup_draft

        if self.capturing is not None and not (slot.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.length.fill_(self.capturing)  # a warm-up: each from the same text end, as the capture (not recorded)
        lookup_draft.draft(self.history, self.length, slot, model.cache.position, self.matched, self.lookback)
        best = self.verify(model, slot, start).argmax(dim=-1)  # (rows,) the target's token after each row
        out = torch.empty(slot.shape[1] + 2, dtype=torch.long, device=slot.device)
        lookup_draft.accept(self.history, self.length, best, slot, self.matched, out)
        return out

    def _capture(self, model: Model, cache: StaticKVCache, window: int, tokens: torch.Tensor, start: int) -> "_Graph":
        """Capture with the device's text ending at `start`: every warm-up drafts, verifies and writes the cache from
        there (one that went on from the last one's accepted tokens would write past `start + rows`, up to the
        cache's end and beyond); the length is put back after."""
        length, self.capturing = self.length.clone(), start + 1
        try:
            return super()._capture(model, cache, window, tokens, start)
        finally:
            self.capturing = None
            self.length.copy_(length)

    def _slot(self) -> "tuple[torch.Tensor, torch.cuda.Event] | None":
        """The oldest pinned result buffer and its event (CUDA; None on the CPU, where a result is there when
        queued)."""
        if not self.history.is_cuda:
            return None
        if not self._host:  # (a slot is rewritten RESULT_SLOTS queues later: the loop reads each before then)
            self._host = [(torch.empty(MAX_ROWS + 2, dtype=torch.long, pin_memory=True), torch.cuda.Event())
                          for _ in range(RESULT_SLOTS)]
        self._host.append(self._host.pop(0))
        return self._host[-1]
