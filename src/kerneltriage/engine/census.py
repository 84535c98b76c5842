"""An op census, backend-neutral: the counts a backend's counting mode collects over a run (host readbacks with
their call sites, work scheduled without waiting, casts, strided copies, ops left on the CPU), per token or per
prefill, and the runs counted (one prefill; the token loop after its first token). A backend supplies the counting
(torch: a dispatch mode seeing every aten op; MLX: its host waits wrapped for the run)."""

from __future__ import annotations

import traceback
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from kerneltriage.engine.sampling import SamplingParams

GREEDY = SamplingParams()
MAX_SITES = 5  # call sites kept per kind, most frequent first
Counting = Callable[["Census"], AbstractContextManager[Any]]  # counts what runs inside the block into the census


@dataclass
class Census:
    """Counts over one run; `per(n)` divides them by tokens or passes. `ops` counts every op where the backend sees
    them (torch); a field a backend cannot count stays 0."""

    ops: int = 0
    readbacks: Counter = field(default_factory=Counter)  # call site → count
    scheduled: Counter | None = None  # call site → work queued without a wait, where counted (MLX's async_eval)
    cpu_ops: Counter = field(default_factory=Counter)  # "op @ call site" → count
    casts: Counter = field(default_factory=Counter)  # "float32→bfloat16" → count
    strided_copies: int = 0

    def per(self, n: int) -> dict[str, Any]:
        """The counts per unit (`n` tokens or passes), call sites most frequent first."""
        per: dict[str, Any] = {"ops": self.ops / n, "cpu_ops": sum(self.cpu_ops.values()) / n,
                               "casts": sum(self.casts.values()) / n, "strided_copies": self.strided_copies / n}
        for kind, sites in (("readbacks", "readback_sites"), ("cpu_ops", "cpu_op_sites"), ("casts", "cast_kinds")):
            per[sites] = _sites(getattr(self, kind), n)
        per["readbacks"] = sum(self.readbacks.values()) / n
        if self.scheduled is not None:
            per |= {"scheduled": sum(self.scheduled.values()) / n, "scheduled_sites": _sites(self.scheduled, n)}
        return per


def _sites(counts: Counter, n: int) -> dict[str, float]:
    return {site: count / n for site, count in counts.most_common(MAX_SITES)}


def call_site(skipped: tuple[str, ...]) -> str:
    """The innermost frame outside the framework and the counting code (`skipped`: path prefixes): 'path:line in
    function'."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(skipped) and frame.filename != __file__:
            return f"{_short(frame.filename)}:{frame.lineno} in {frame.name}"
    return "unknown"


def _short(path: str) -> str:
    parts = Path(path).parts
    return str(Path(*parts[parts.index("kerneltriage"):])) if "kerneltriage" in parts else path


def census_prefill(runner: Any, prompt: Sequence[int], counting: Counting, read: bool = False) -> Census:
    """The census of one prefill of `prompt` at depth 0; with `read`, its logits read as the harness reads them
    (greedy: a lazy backend's prefill is no work until then)."""
    runner.reset_cache(len(prompt))
    census = Census()
    with counting(census):
        logits = runner.prefill(prompt, 0)
        if read:
            runner.greedy(logits)
    return census


def census_decode(runner: Any, prefix: Sequence[int], tokens: int, counting: Counting) -> Census:
    """The census of `tokens` tokens of the runner's token loop (the first, from the prefill, excluded)."""
    runner.reset_cache(len(prefix) + tokens + 1)
    logits = runner.prefill(prefix, 0)
    loop: Iterator[int] = runner.loop(logits, len(prefix), tokens + 1, runner.sampler(GREEDY, prefix))
    next(loop)
    census = Census()
    with counting(census):
        for _ in loop:
            pass
    return census


def per_unit(runner: Any, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int, counting: Counting,
             read: bool = False) -> dict[str, Any]:
    """`Backend.census`: per prefill of the prompt `tokens`, or per token over `tokens` decode steps after `prefix`."""
    if phase == "prefill":
        assert not isinstance(tokens, int), "a prefill's tokens are its prompt"
        return census_prefill(runner, tokens, counting, read).per(1)
    assert isinstance(tokens, int), "a decode's tokens are a count of steps"
    return census_decode(runner, prefix, tokens, counting).per(tokens)
