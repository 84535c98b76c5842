"""Prompt lookup on token lists: the n-gram index and the drafter that proposes from it (no framework)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from kerneltriage.engine.speculative.config import VERIFY_BUCKETS
from kerneltriage.engine.speculative.draft import Draft
from kerneltriage.engine.speculative.suffix import copy_from

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Sampler, Steps


class NgramIndex:
    """Prompt-lookup drafting: for every n-gram (n ≤ max_n) of the context, where it last occurred with a
    token after it. Updated incrementally, so a lookup costs O(max_n) whatever the context length."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram → index of the token that followed it

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # `token` lands here: every n-gram ending just before it gains a continuation
            for n in range(1, min(self.max_n, end) + 1):
                self.follows[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix (n = max…1).

        A copy that runs into the end of the context continues from its own start (LZ77-style overlap),
        so a period shorter than k still yields k tokens."""
        for n in range(min(self.max_n, len(self.tokens)), 0, -1):
            start = self.follows.get(tuple(self.tokens[-n:]))
            if start is not None:
                return copy_from(self.tokens, start, k)
        return []


class NgramDrafter:
    """Prompt lookup: propose what followed the latest earlier occurrence of the context's suffix. Where verifies
    are padded it drafts no more than the smallest padded shape holds: a match of a few tokens says nothing of a
    copy's length, and a larger shape costs more (config.VERIFY_BUCKETS)."""

    shadows = True  # drafting runs no forward: the loop may score what it would draft during plain steps

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.index = NgramIndex(max_n)
        self.most: int | None = None  # tokens per draft at most (None: as many as asked)

    def reset(self, runner: "Steps", capacity: int) -> None:
        self.index = NgramIndex(self.max_n)
        self.most = VERIFY_BUCKETS[0] - 1 if runner.pads_verify else None

    def catch_up(self, context: list[int]) -> None:
        self.index.extend(context[len(self.index.tokens):])  # the context only grows: rejected drafts never enter

    def draft(self, context: list[int], k: int, sampler: "Sampler") -> Draft | None:
        self.catch_up(context)
        proposal = self.index.propose(min(k, self.most or k))
        return Draft(proposal) if proposal else None
