"""The suffix drafter: the automaton's longest earlier match against brute force, the continuation it proposes,
the draft length that follows the match's statistics and the padded shapes, a copy followed without the automaton,
and the decoder's padding and prompt indexing around it (greedy exactness: test_speculative.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_spec_tree import OracleTarget
from kerneltriage.backends.torch.sampling import TorchSampler
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.config import VERIFY_BUCKETS, parse_speculation
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.suffix import LONG_MATCH, SuffixAutomaton, SuffixDrafter, draft_length


def brute_longest_earlier_match(tokens: list[int]) -> int:
    """The longest suffix of `tokens` that also ends at an earlier position (0 if none)."""
    n = len(tokens)
    for size in range(n - 1, 0, -1):
        suffix = tokens[n - size:]
        if any(tokens[end - size:end] == suffix for end in range(size, n)):
            return size
    return 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.sampled_from([1, 2, 4]))
def test_match_is_the_longest_earlier_occurrence(tokens: list[int], alphabet: int) -> None:
    tokens = [t % alphabet for t in tokens]  # small alphabets: long repeats and many clones
    automaton = SuffixAutomaton()
    for n in range(1, len(tokens) + 1):
        automaton.extend(tokens[n - 1:n])
        match = automaton.match
        assert match.length == brute_longest_earlier_match(tokens[:n])
        if match.length:  # the occurrence it names really is an earlier copy of the suffix
            assert match.end < n - 1
            assert tokens[match.end - match.length + 1:match.end + 1] == tokens[n - match.length:n]


def test_extending_in_pieces_equals_extending_at_once() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    whole, pieces = SuffixAutomaton(), SuffixAutomaton()
    whole.extend(tokens)
    for i in range(0, len(tokens), 5):
        pieces.extend(tokens[i:i + 5])
    assert whole.match == pieces.match and whole.length == pieces.length and whole.next == pieces.next


def test_drafter_proposes_the_continuation_of_a_planted_repetition() -> None:
    """A 12-token phrase planted in noise and then begun again: the drafter proposes the rest of it."""
    phrase = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
    context = [7, 9, 8] + phrase + [1, 2, 3, 5, 6] + phrase[:5]
    draft = SuffixDrafter(16).draft(context, 7, sampler=None)
    assert draft is not None and draft.tokens == phrase[5:10]  # as many tokens as matched: 5
    draft = SuffixDrafter(16).draft(context + phrase[5:8], 7, sampler=None)
    assert draft is not None and draft.tokens == phrase[8:12] + [1, 2, 3]  # a long match: k, past the phrase
    assert SuffixDrafter(16).draft([1, 2, 3, 4, 5], 4, sampler=None) is None  # nothing recurs: no draft


def test_drafter_copies_past_the_end_of_a_short_period() -> None:
    drafter = SuffixDrafter(16)
    draft = drafter.draft([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], 8, sampler=None)
    assert draft is not None and draft.tokens == [1, 2, 3, 1, 2, 3, 1, 2]


def test_draft_length_follows_the_match_statistics() -> None:
    assert draft_length(0, 0, 8) == 0
    assert draft_length(1, 0, 8) == 0  # a one-token match whose earlier occurrences disagreed: nothing
    assert draft_length(1, 5, 8) == 1  # ... that always continued the same way: one token
    assert draft_length(3, 0, 8) == 1  # a short match stops at the first branch
    assert [draft_length(m, 8, 8) for m in range(1, LONG_MATCH + 2)] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    assert draft_length(LONG_MATCH, 0, 16) == 16  # a long match is a copy in progress: through branches
    assert draft_length(5, 8, 3) == 3  # never past the controller's k


def test_a_padded_verify_gets_drafts_to_the_limit_where_the_match_drafts_at_all() -> None:
    """Under graphs every verify computes the deepest k's rows: the match decides whether to draft, not how much."""
    phrase = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
    branchy = [5, 6, 1, 9, 5, 6, 2, 9, 5, 6, 3, 9, 5, 6]
    for padded, sizes in ((False, [5, 1, None]), (True, [7, 7, None])):
        got = []
        for context in ([7, 9, 8] + phrase + [1, 2, 3, 5, 6] + phrase[:5], branchy, [1, 2, 3, 4, 5]):
            drafter = SuffixDrafter(16)
            drafter.reset(SimpleNamespace(pads_verify=padded), 64)
            draft = drafter.draft(context, 7, sampler=None)
            got.append(draft.size if draft else None)
            if padded and draft:  # the latest occurrence's continuation, copied on past the text's end
                assert draft.tokens[:1] == ([45] if context[-1] == 44 else [3])
        assert got == sizes, (padded, got)


def test_draft_grows_as_a_copy_goes_on() -> None:
    """Copying a 40-token line: after a one-token match the drafts lengthen as the match does."""
    line = list(range(100, 140))
    drafter, sizes = SuffixDrafter(16), []
    context = line + [7, 8, 9] + line[:1]
    while len(context) < len(line) * 2 + 3:
        draft = drafter.draft(context, 16, sampler=None)
        sizes.append(draft.size if draft else 0)
        context = context + (draft.tokens if draft else [line[len(context) - len(line) - 3]])
    assert sizes[0] == 1 and sizes == sorted(sizes) and sizes[-1] == 16, sizes


def test_a_branchy_short_match_drafts_one_token() -> None:
    """(5, 6) was followed by 1, then 2, then 3: a short match with three continuations drafts only the latest."""
    drafter = SuffixDrafter(16)
    draft = drafter.draft([5, 6, 1, 9, 5, 6, 2, 9, 5, 6, 3, 9, 5, 6], 8, sampler=None)
    assert draft is not None and draft.tokens == [3]


def test_a_padded_verify_drafts_one_shape_unless_the_match_is_long() -> None:
    """Padded shapes of 16 and 32 rows: a draft of up to 15 costs one shape whatever its length, so any match that
    drafts at all drafts 15; only a long match (a copy in progress) drafts past it, to the limit."""
    phrase = list(range(40, 80))
    short = [7, 9, 8] + phrase + [1, 2, 3, 5, 6] + phrase[:5]  # a 5-token match
    long = short + phrase[5:5 + LONG_MATCH]
    sizes = []
    for context in (short, long):
        drafter = SuffixDrafter(31)
        drafter.reset(SimpleNamespace(pads_verify=True), 128)
        sizes.append(drafter.draft(context, 31, sampler=None).size)
    assert sizes == [VERIFY_BUCKETS[0] - 1, 31]


def test_a_copy_in_progress_is_followed_without_the_automaton() -> None:
    """Copying a 60-token line: each draft of a followed copy equals what the automaton proposes from the whole text,
    while the automaton lags behind the text until `catch_up` (its host time moved off the verify's path)."""
    line = [(7 * i) % 97 + 100 for i in range(60)]
    context = line + [1, 2] + line[:LONG_MATCH + 1]
    drafter, followed = SuffixDrafter(31), 0
    drafter.reset(SimpleNamespace(pads_verify=True), 256)
    drafter.catch_up(context)
    while len(context) < 2 * len(line):
        draft = drafter.draft(context, 31, sampler=None)
        fresh = SuffixDrafter(31)
        fresh.reset(SimpleNamespace(pads_verify=True), 256)
        assert draft.tokens == fresh.draft(context, 31, sampler=None).tokens
        lagging = len(drafter.automaton.tokens) < len(context)
        followed += lagging
        drafter.catch_up(context)
        assert drafter.automaton.tokens == context and drafter.automaton.match == fresh.automaton.match
        context = context + draft.tokens[:5 + len(context) % 7]  # accepted prefixes of several lengths
    assert followed >= 5


def test_a_copy_that_changes_course_goes_back_to_the_automaton() -> None:
    """The text since the last draft left the source: no copy to follow, the automaton drafts (and is current)."""
    line = list(range(100, 160))
    context = line + [1, 2] + line[:20]
    drafter = SuffixDrafter(31)
    drafter.reset(SimpleNamespace(pads_verify=True), 256)
    drafter.draft(context, 31, sampler=None)
    context = context + [line[20], 999]  # one token as copied, then one the source never had
    drafter.draft(context, 31, sampler=None)
    assert drafter.automaton.tokens == context


class PaddedOracle(OracleTarget):
    """The planted-text target with verifies captured at fixed shapes: records each verify's rows, and how much of
    the text the drafter had indexed when the prefill's token was read."""

    pads_verify = True

    def __init__(self, text: list[int], drafter: SuffixDrafter) -> None:
        super().__init__(text)
        self.drafter, self.rows, self.indexed_at_first_read = drafter, [], None
        self.prepared: list[tuple[int, int, list[int]]] = []

    def prepare_steps(self, start: int, end: int, rows: list[int], lookback: int = 0) -> None:
        self.prepared.append((start, end, list(rows)))

    def verify(self, last: int, drafts: list[int], start: int, rows: int) -> torch.Tensor:
        self.rows.append((len(drafts), rows))
        return super().verify(last, drafts, start, rows)

    def read_later(self, token: torch.Tensor):  # noqa: ANN201
        if self.indexed_at_first_read is None:
            self.indexed_at_first_read = len(self.drafter.automaton.tokens)
        return super().read_later(token)


def test_the_decoder_pads_each_verify_to_the_smallest_shape_and_indexes_the_prompt_during_the_prefill() -> None:
    line = [(7 * i) % 61 + 2 for i in range(60)]
    text = line + [1] + line + [1] + line
    prompt = text[:len(line) + 1 + 12]
    drafter = SuffixDrafter(31)
    decoder = SpeculativeDecoder(parse_speculation("suffix"), drafter)
    target = PaddedOracle(text, drafter)
    sampler = TorchSampler(SamplingParams(), prompt, torch.device("cpu"))
    out = list(decoder(target, target._rows(len(prompt) - 1, [[prompt[-1]]]), len(prompt), len(text) - len(prompt),
                       sampler))
    assert prompt + out == text
    assert target.indexed_at_first_read == len(prompt)  # indexed before the prefill's token was waited for
    assert target.rows and all(rows == (16 if drafted < 16 else 32) for drafted, rows in target.rows)
    assert {rows for _, rows in target.rows} == {16, 32}, target.rows
    assert target.prepared == [(len(prompt), len(text), [16, 32])]  # every shape captured ahead, once per run
