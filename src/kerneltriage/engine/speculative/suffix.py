"""Longest-match drafting (as SuffixDecoding and prompt-lookup decoding do), framework-free: a suffix automaton
over prompt + generated text, grown one token at a time, and the drafter that proposes from it.

The automaton's states are the classes of substrings that end at the same set of positions (endpos). After
appending token n, the state of the whole text (`last`) holds the suffixes that occur only there; its suffix
link is the longest suffix that also occurred earlier: the match. Building is Blumer et al.'s online
construction, amortized O(1) transitions per appended token (a clone copies its state's transitions).

Draft length is chosen per step from the match's statistics, not fixed:
  - the matched length L: a long match is a copy in progress, a one-token match is mostly chance;
  - the continuations seen after the context: walking the automaton along the proposed tokens, a state with
    one outgoing transition means every earlier occurrence of that context continued the same way; a state
    with several is a branch where the earlier text disagreed.
  budget = min(limit, L) for L < LONG_MATCH, else limit; a match shorter than LONG_MATCH stops at its first
  branch (keeping one token, the latest occurrence's choice); a one-token match drafts only where no branch is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from kerneltriage.engine.speculative.draft import Draft

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Sampler, Steps

LONG_MATCH = 8  # matched tokens from which a match is trusted to the drafter's limit, through branches


@dataclass(frozen=True)
class Match:
    """The longest suffix of the text that occurred earlier: its length and state, and where an earlier
    occurrence ended (the latest one seen as a match; any earlier one is a valid source of the continuation)."""

    length: int
    state: int
    end: int


class SuffixAutomaton:
    """The suffix automaton of a growing token list, and the longest earlier match of its current suffix."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.length = [0]  # per state: the longest substring it holds
        self.link = [-1]  # per state: the state of its longest suffix in another endpos class
        self.next: list[dict[int, int]] = [{}]  # per state: token → state
        self.end = [-1]  # per state: one position where its substrings end (the latest seen as a match)
        self.last = 0
        self.match = Match(0, 0, -1)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self._append(token)

    def _append(self, token: int) -> None:
        n = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, n, {}, -1)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        self.link[cur] = 0 if p == -1 else self._split(p, token)
        self.last = cur
        state = self.link[cur]
        self.match = Match(self.length[state], state, self.end[state])
        if state:
            self.end[state] = n  # this context now also ends here: the latest occurrence for the next match

    def _split(self, p: int, token: int) -> int:
        """The state for `p`'s substrings + token, cloned out of a longer state when that one holds more."""
        q = self.next[p][token]
        if self.length[p] + 1 == self.length[q]:
            return q
        clone = self._new_state(self.length[p] + 1, self.end[q], dict(self.next[q]), self.link[q])
        while p != -1 and self.next[p].get(token) == q:
            self.next[p][token] = clone
            p = self.link[p]
        self.link[q] = clone
        return clone

    def _new_state(self, length: int, end: int, transitions: dict[int, int], link: int) -> int:
        self.length.append(length)
        self.end.append(end)
        self.next.append(transitions)
        self.link.append(link)
        return len(self.length) - 1

    def continuation(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the match's earlier occurrence. A copy that runs into the end of
        the text continues from its own start (LZ77-style overlap), so a short period still yields `count`."""
        if not self.match.length:
            return []
        size, out = len(self.tokens), []
        for i in range(self.match.end + 1, self.match.end + 1 + count):
            out.append(self.tokens[i] if i < size else out[i - size])
        return out

    def agreed(self, proposal: list[int]) -> int:
        """Leading tokens of `proposal` at which every earlier occurrence of the context continued the same way
        (one outgoing transition); stops at the first branch."""
        state, count = self.match.state, 0
        for token in proposal:
            if len(self.next[state]) != 1 or token not in self.next[state]:
                break
            state, count = self.next[state][token], count + 1
        return count


def draft_length(matched: int, agreed: int, limit: int) -> int:
    """How many tokens to draft from a match of `matched` tokens whose first `agreed` continuation tokens no
    earlier occurrence disagreed on (the module's docstring gives the rule)."""
    if matched >= LONG_MATCH:
        return limit
    budget = min(limit, matched)
    if matched < 2:
        return min(budget, agreed)
    return min(budget, max(agreed, 1))


class SuffixDrafter:
    """Longest-match lookup over prompt + generated text; proposes nothing when no suffix recurs."""

    shadows = True  # drafting runs no forward: the loop may score what it would draft during plain steps

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.automaton = SuffixAutomaton()

    def reset(self, runner: "Steps", capacity: int) -> None:
        self.automaton = SuffixAutomaton()

    def draft(self, context: list[int], k: int, sampler: "Sampler") -> Draft | None:
        self.automaton.extend(context[len(self.automaton.tokens):])  # the context only grows
        limit = min(k, self.max_tokens)
        proposal = self.automaton.continuation(limit)
        size = draft_length(self.automaton.match.length, self.automaton.agreed(proposal), limit)
        return Draft(proposal[:size]) if size else None
