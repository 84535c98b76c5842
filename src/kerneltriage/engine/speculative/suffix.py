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
Where the verify is padded (CUDA graphs: a verify computes the rows of the smallest captured shape that holds it,
config.VERIFY_BUCKETS), a draft's length up to the smallest shape costs nothing: the rule still decides whether to
draft, and the draft runs to that shape's size — to the limit past it where the match is long (a copy in progress).
Replayed over the default model's greedy texts at the H200's verify cost (benchmarks/tools/draft_replay.py,
archive:draft-replay-cpu.json), drafting to one padded shape took the modelled speed-up from 2.62× / 2.00× / 1.27× /
1.05× to 3.14× / 2.45× / 1.41× / 1.07× (copy_heavy / repetitive / summarize / open_ended); drafting the limit from
every match instead drafted chance one-token matches (summarize 1.23×).

A copy in progress is followed without the automaton: when the text since the last draft is what that draft's
source went on with and the match is long, the next draft is what the source says next (`Copy`), and the automaton
takes in the new text later (`catch_up`, while the device verifies) — its host time, ~3 µs a token, off the path.

A tree draft (`--spec suffix:tree`) keeps the branches instead of stopping at them: one continuation per token
that followed the match earlier (and, for a short match with one continuation, those of shorter matches),
merged into a token tree (engine/speculative/tree.py) verified in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from kerneltriage.engine.speculative.config import VERIFY_BUCKETS
from kerneltriage.engine.speculative.draft import Draft
from kerneltriage.engine.speculative.tree import merge

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Sampler, Steps

LONG_MATCH = 8  # matched tokens from which a match is trusted to the drafter's limit, through branches
TREE_BRANCHES = 4  # most candidate continuations one tree draft merges


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
        """Up to `count` tokens that followed the match's earlier occurrence."""
        return copy_from(self.tokens, self.match.end + 1, count) if self.match.length else []

    def agreed(self, proposal: list[int]) -> int:
        """Leading tokens of `proposal` at which every earlier occurrence of the context continued the same way
        (one outgoing transition); stops at the first branch."""
        state, count = self.match.state, 0
        for token in proposal:
            if len(self.next[state]) != 1 or token not in self.next[state]:
                break
            state, count = self.next[state][token], count + 1
        return count

    def paths(self, state: int, count: int, most: int) -> list[list[int]]:
        """Up to `most` continuations of `count` tokens of `state`'s context, walking the automaton: at each
        state the latest occurrence's token extends the path, and every other token that followed there
        (a branch: earlier occurrences went on differently) starts a path of its own while there is room.
        A path that reaches the end of the text goes on as an overlapping copy (as `_copy` does)."""
        paths: list[list[int]] = [[]]
        frontier = [(0, state)]  # (path, the state its tokens lead to)
        for level in range(count):
            reached = []
            for index, at in frontier:
                children = sorted(self.next[at].items(), key=lambda item: -self.end[item[1]])
                if not children:  # the path so far is the text's own end: it repeats with period `level`
                    for m in range(level, count):
                        paths[index].append(paths[index][m - level])
                prefix = list(paths[index])
                for rank, (token, child) in enumerate(children):
                    if rank and len(paths) == most:
                        break
                    if rank:
                        index = len(paths)
                        paths.append(list(prefix))
                    paths[index].append(token)
                    reached.append((index, child))
            frontier = reached
        return paths


def copy_from(text: list[int], begin: int, count: int) -> list[int]:
    """`count` tokens of `text` from `begin` on. A copy that runs into the end of the text continues from its own
    start (LZ77-style overlap), so a short period still yields `count`."""
    size, out = len(text), list[int]()
    for i in range(begin, begin + count):
        out.append(text[i] if i < size else out[i - size])
    return out


@dataclass(frozen=True)
class Copy:
    """The source of the last draft: the text from `at` on was proposed as a copy of the text from `source` on,
    after a match of `matched` tokens."""

    source: int
    at: int
    matched: int

    def follow(self, context: list[int]) -> "Copy | None":
        """The copy moved to the end of `context`, if the text since `at` is what the source went on with (then the
        match is at least `matched` + that many tokens long); else None."""
        gained = len(context) - self.at
        if context[self.at:] != context[self.source:self.source + gained]:
            return None
        return Copy(self.source + gained, len(context), self.matched + gained)


def draft_length(matched: int, agreed: int, limit: int) -> int:
    """How many tokens to draft from a match of `matched` tokens whose first `agreed` continuation tokens no
    earlier occurrence disagreed on (the module's docstring gives the rule)."""
    if matched >= LONG_MATCH:
        return limit
    budget = min(limit, matched)
    if matched < 2:
        return min(budget, agreed)
    return min(budget, max(agreed, 1))


def tree_candidates(automaton: SuffixAutomaton, limit: int, most: int) -> list[list[int]]:
    """Up to `most` distinct continuations for a tree draft: those of the longest match (as long as a match
    of its length may draft, branching wherever its earlier occurrences went on differently), then, while the
    longest match is short (< LONG_MATCH) and its earlier occurrences agreed, those of shorter matches (the suffix
    links)."""
    found: list[list[int]] = []
    state = automaton.match.state
    while state and len(found) < most:  # state 0 is the empty suffix: no match
        size = limit if automaton.length[state] >= LONG_MATCH else min(limit, automaton.length[state])
        found += [c for c in automaton.paths(state, size, most) if c not in found][:most - len(found)]
        if automaton.length[state] >= LONG_MATCH or len(found) > 1:
            break
        state = automaton.link[state]
    return found


class SuffixDrafter:
    """Longest-match lookup over prompt + generated text; proposes nothing when no suffix recurs."""

    shadows = True  # drafting runs no forward: the loop may score what it would draft during plain steps

    def __init__(self, max_tokens: int, tree_nodes: int = 0) -> None:
        self.max_tokens, self.tree_nodes = max_tokens, tree_nodes  # tree_nodes 0: a linear draft
        self.automaton = SuffixAutomaton()
        self.free = 0  # tokens a draft may have at no cost: a padded verify's smallest shape holds them
        self.following: Copy | None = None  # where the last draft copied from

    def reset(self, runner: "Steps", capacity: int) -> None:
        self.automaton = SuffixAutomaton()
        self.free = VERIFY_BUCKETS[0] - 1 if runner.pads_verify else 0
        self.following = None

    def catch_up(self, context: list[int]) -> None:
        self.automaton.extend(context[len(self.automaton.tokens):])  # the context only grows

    def draft(self, context: list[int], k: int, sampler: "Sampler") -> Draft | None:
        limit = min(k, self.max_tokens)
        if self.tree_nodes:
            self.catch_up(context)
            tree = merge(tree_candidates(self.automaton, limit, TREE_BRANCHES), self.tree_nodes)
            return Draft(tree.tokens, tree=tree) if tree else None
        followed = self.following.follow(context) if self.following else None
        if followed is not None and followed.matched >= LONG_MATCH:  # the copy goes on: so does the draft
            self.following = followed
            return Draft(copy_from(context, followed.source, limit))
        self.catch_up(context)
        match = self.automaton.match
        proposal = self.automaton.continuation(limit)
        size = draft_length(match.length, self.automaton.agreed(proposal), limit)
        if size and self.free:  # whether to draft is the match's call; how much, the padded shapes' (module doc)
            size = limit if match.length >= LONG_MATCH else max(size, min(limit, self.free))
        self.following = Copy(match.end + 1, len(context), match.length) if size else None
        return Draft(proposal[:size]) if size else None
