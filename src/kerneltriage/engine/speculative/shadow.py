"""Shadow acceptance: during plain steps, what a lookup drafter would have drafted, scored against the tokens the
target then emits — how a verify of it would have gone, learnt at no forward's cost.

At temperature 0 a draft token is accepted exactly when it equals the target's argmax, which is the token a plain
step emits: the shadow's acceptance is the verify's. At temperature > 0 a one-hot draft d is accepted with
probability min(1, p(d)/1) = p(d), and a plain step emits d with probability p(d): the same rate, in expectation.

A shadow draft starts at every plain step and is scored token by token as the text arrives (position i is
reached when positions before it matched), so a turn to repetitive text shows within a few steps instead of after
a whole k-token draft has played out; a draft is dropped at its first miss or after its last token.
"""

from __future__ import annotations


class Shadow:
    """The pending shadow drafts: for each, its tokens and how many of them the emitted text has matched."""

    def __init__(self) -> None:
        self.drafts: list[tuple[list[int], int]] = []  # (tokens, matched so far), oldest first

    def start(self, tokens: list[int]) -> None:
        if tokens:
            self.drafts.append((list(tokens), 0))

    def clear(self) -> None:
        self.drafts = []

    def score(self, token: int) -> list[tuple[int, bool]]:
        """The next emitted token: (draft position, hit) for every pending draft, oldest first."""
        events, kept = [], []
        for tokens, matched in self.drafts:
            hit = tokens[matched] == token
            events.append((matched, hit))
            if hit and matched + 1 < len(tokens):
                kept.append((tokens, matched + 1))
        self.drafts = kept
        return events
