"""The generation contract shared by the backends: response records and stop-string handling."""

from __future__ import annotations

from dataclasses import dataclass


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
