"""A draft: the tokens a drafter proposes, and the distribution they were drawn from when it is not one-hot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

if TYPE_CHECKING:
    from kerneltriage.engine.speculative.tree import TokenTree
    from kerneltriage.engine.backend import Sampler, Steps


@dataclass(frozen=True)
class Draft:
    """`tokens`: host ids (prompt lookup) or a device array (k,) (a draft model); `probs`: the draft model's
    probabilities (k, V) on the device, None when drafting is deterministic (greedy or a lookup); `tree`: the
    token tree when the draft is several branches (`tokens` are then its nodes, not one sequence)."""

    tokens: Any
    probs: Any = None
    tree: "TokenTree | None" = None

    @property
    def size(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    def reset(self, runner: "Steps", capacity: int) -> None:
        """Ready for a new sequence of at most `capacity` positions (called after the target's prefill)."""

    def draft(self, context: list[int], k: int, sampler: "Sampler") -> Draft | None:
        """Up to k tokens to follow `context`; None when there is nothing to propose."""


class LookupDrafter(Drafter, Protocol):
    """A drafter that drafts from the text alone (no forward): the loop may score its drafts during plain steps
    (`shadows`), and gives it time while the device is busy to index the text it has not seen yet."""

    shadows: bool

    def catch_up(self, context: list[int]) -> None:
        """Index `context` as far as it goes (what the next `draft` would otherwise do first, on the host, while the
        device waits): called while the prefill runs and while a verify runs."""


def is_lookup(drafter: Drafter) -> TypeGuard[LookupDrafter]:
    """The drafter drafts from the text alone (`shadows`): a LookupDrafter."""
    return bool(getattr(drafter, "shadows", False))
