"""Token-tree speculation (`--spec suffix:tree`): the tree and its walk, the suffix drafter's branches, the tree
mask (a sibling is never visible), the accepted branch's cache, greedy exactness on every architecture, and
tokens per verify step against the linear suffix draft on a planted branching text."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from conftest import ARCHS, tiny_runner
from kerneltriage.backends.torch.sampling import TorchSampler
from kerneltriage.backends.torch.speculative import install_speculation
from kerneltriage.backends.torch.tree import tree_mask
from kerneltriage.core.errors import InputError
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.config import Speculation, parse_speculation
from kerneltriage.engine.speculative.decoder import SPEC_COUNTER, SpeculativeDecoder
from kerneltriage.engine.speculative.lookup import lookup_drafter
from kerneltriage.engine.speculative.suffix import SuffixAutomaton, tree_candidates
from kerneltriage.engine.speculative.tree import TokenTree, merge

GREEDY = SamplingParams()
PROMPT = [210, 158, 247, 186, 114, 261] * 2  # every tiny model's greedy text repeats after it: lookups verify
NEW = 40


def test_merge_shares_prefixes_and_spreads_the_budget_level_by_level() -> None:
    tree = merge([[1, 2, 3], [1, 4, 5], [6]], 16)
    assert tree == TokenTree((1, 6, 2, 4, 3, 5), (0, 0, 1, 1, 3, 4))
    assert tree.depths() == [0, 1, 1, 2, 2, 3, 3] and tree.depth == 3
    assert tree.lineage(6) == [0, 1, 4, 6] and tree.first_path() == [1, 2, 3]
    assert merge([[1, 2, 3], [1, 4, 5], [6]], 3) == TokenTree((1, 6, 2), (0, 0, 1))
    assert merge([[]], 4) is None


def test_walk_follows_the_argmax_through_the_children() -> None:
    tree = merge([[1, 2, 3], [1, 4, 5], [6]], 16)  # rows: root, 1, 6, 2, 4, 3, 5
    assert tree.walk([1, 4, 0, 0, 5, 0, 0]) == [1, 4, 6]  # the second branch, to its leaf
    assert tree.walk([6, 0, 0, 0, 0, 0, 0]) == [2]
    assert tree.walk([7, 0, 0, 0, 0, 0, 0]) == []


def test_tree_candidates_are_every_continuation_of_the_match_latest_first() -> None:
    automaton = SuffixAutomaton()
    automaton.extend([1, 2, 3, 4, 5, 0, 1, 2, 3, 7, 8, 6, 1, 2, 3])  # "1 2 3" went on as 4 5 0, then 7 8 6
    assert automaton.match.length == 3
    assert tree_candidates(automaton, 8, 4) == [[7, 8, 6], [4, 5, 0]]  # a 3-token match drafts 3 per branch


def test_a_short_match_with_one_continuation_adds_shorter_matches() -> None:
    automaton = SuffixAutomaton()
    automaton.extend([3, 9, 1, 2, 4, 3, 1, 2])  # "3 1 2" never occurred before; "1 2" went on as 4; "2" too
    assert tree_candidates(automaton, 8, 4) == [[4, 3]]  # "2" alone adds no other continuation
    automaton.extend([5, 8, 2, 7, 8, 1, 2])  # now "8 1 2" is new, "1 2" → 4 and 5; "2" → 4, 5, 7
    assert tree_candidates(automaton, 2, 4) == [[5, 8], [4, 3]]


def test_parse_suffix_tree() -> None:
    speculation = parse_speculation("suffix:tree", "4")
    assert speculation == Speculation("suffix", depth=4, tree_nodes=16) and speculation.tree
    assert speculation.source_text == "suffix:tree" and speculation.label == "suffix:tree k=4"
    with pytest.raises(ValueError, match="tree_nodes"):
        Speculation("ngram", tree_nodes=4)


def test_tree_mask_sees_the_prefix_and_the_ancestors_only() -> None:
    tree = merge([[1, 2], [3]], 16)  # rows: root, 1, 3, 2 (child of 1)
    mask = tree_mask(tree, 2, torch.device("cpu")).int().tolist()
    assert mask == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]]


def _prefilled(arch: str):  # noqa: ANN202
    runner = tiny_runner(arch)
    runner.reset_cache(64)
    runner.prefill(PROMPT[:-1], 0)
    return runner


@pytest.mark.parametrize("arch", ARCHS)
def test_every_tree_row_equals_a_linear_verify_of_its_own_path(arch: str) -> None:
    """The sibling test: the second branch's rows sit after the first branch's in the forward; were those
    visible (a causal mask), its logits would differ from a verify of the second branch alone."""
    tree = merge([[11, 12, 13], [21, 22]], 16)  # rows: root, 11, 21, 12, 22, 13
    runner = _prefilled(arch)
    rows = runner.verify_tree(PROMPT[-1], tree, len(PROMPT) - 1)
    for branch, nodes in (([11, 12, 13], [0, 1, 3, 5]), ([21, 22], [0, 2, 4])):
        runner.trim_cache(len(PROMPT) - 1)
        linear = runner.verify(PROMPT[-1], branch, len(PROMPT) - 1, 0)
        torch.testing.assert_close(rows[nodes], linear, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_accepted_branch_is_cached_as_a_linear_forward_would_have_cached_it(arch: str) -> None:
    tree = merge([[11, 12, 13], [21, 22, 23]], 16)  # rows: root, 11, 21, 12, 22, 13, 23
    runner = _prefilled(arch)
    start = len(PROMPT) - 1
    runner.verify_tree(PROMPT[-1], tree, start)
    runner.keep_branch(start, [2, 4])  # 21 22: slots start+2, start+4 → start+1, start+2
    reference = tiny_runner(arch)
    reference.reset_cache(64)
    reference.prefill(PROMPT + [21, 22], 0)
    end = start + 3
    assert runner.model.cache.length == end
    cache, expected = runner.model.cache, reference.model.cache
    torch.testing.assert_close(cache.keys[..., :end, :], expected.keys[..., :end, :], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache.values[..., :end, :], expected.values[..., :end, :], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("depth", ["3", "auto"])
def test_greedy_tree_speculation_equals_plain_greedy(arch: str, depth: str) -> None:
    expected = list(generate_step(tiny_runner(arch), PROMPT, GREEDY, NEW))
    assert len(set(expected)) >= 4
    runner = tiny_runner(arch)
    decoder = install_speculation(runner, parse_speculation("suffix:tree", depth))
    assert list(generate_step(runner, PROMPT, GREEDY, NEW)) == expected
    assert runner.counters[SPEC_COUNTER] == decoder.stats.verify_steps > 0


def test_tree_is_refused_where_it_cannot_be_exact() -> None:
    runner = tiny_runner("llama")
    install_speculation(runner, parse_speculation("suffix:tree", "3"))
    with pytest.raises(InputError, match="temperature 0"):
        list(generate_step(runner, PROMPT, SamplingParams(temperature=0.8, seed=1), 8))
    with pytest.raises(InputError, match="eagerly only"):
        install_speculation(tiny_runner("llama", "compile=default"), parse_speculation("suffix:tree"))


class OracleTarget:
    """A target whose greedy choice after a context is the planted text's next token when the context is a
    prefix of the text (else token 0): plain greedy writes the text out. Logits are one-hot rows."""

    pads_verify, cache_capacity, vocab = False, 1 << 20, 64

    def __init__(self, text: list[int]) -> None:
        self.text, self.counters, self.kept, self.tree = text, Counter(), [], None

    def _row(self, context: list[int]) -> torch.Tensor:
        ok = context == self.text[:len(context)] and len(context) < len(self.text)
        return torch.nn.functional.one_hot(torch.tensor(self.text[len(context)] if ok else 0), self.vocab).float()

    def _rows(self, start: int, paths: list[list[int]]) -> torch.Tensor:
        return torch.stack([self._row(self.text[:start] + path) for path in paths])

    def decode(self, token: int, position: int) -> torch.Tensor:
        return self._rows(position, [[token]])

    def verify(self, last: int, drafts: list[int], start: int, rows: int) -> torch.Tensor:
        return self._rows(start, [[last, *drafts[:i]] for i in range(len(drafts) + 1)])

    def verify_tree(self, last: int, tree: TokenTree, start: int) -> torch.Tensor:
        self.tree = tree
        paths = [[last] + [tree.tokens[n - 1] for n in tree.lineage(row)[1:]] for row in range(tree.size + 1)]
        return self._rows(start, paths)

    def keep_branch(self, start: int, path: list[int]) -> None:
        self.kept.append((self.tree, path))

    def trim_cache(self, length: int) -> None:
        pass

    def read_later(self, token: torch.Tensor):  # noqa: ANN201
        return type("Read", (), {"result": lambda _: int(token)})()

    def clock(self) -> float:
        return 0.0


def planted_text(segments: int = 24, seed: int = 3) -> list[int]:
    """A phrase that recurs with one of two continuations, chosen at random each time (both seen early)."""
    choices = [0, 1] + [random.Random(seed).randrange(2) for _ in range(segments - 2)]
    endings = ([10, 11, 12, 13], [20, 21, 22, 23])
    return [token for choice in choices for token in [1, 2, 3, 4, 5, *endings[choice]]]


def speculate_on_planted(spec: str) -> tuple[list[int], SpeculativeDecoder, OracleTarget]:
    text = planted_text()
    prompt, target = text[:18], OracleTarget(text)
    speculation = parse_speculation(spec, "8")
    decoder = SpeculativeDecoder(speculation, lookup_drafter(speculation))
    sampler = TorchSampler(GREEDY, prompt, torch.device("cpu"))
    first = target._rows(len(prompt) - 1, [[prompt[-1]]])
    out = list(decoder(target, first, len(prompt), len(text) - len(prompt), sampler))
    return prompt + out, decoder, target


def _off_first_branch(tree: TokenTree, path: list[int]) -> bool:
    """The path left the first candidate: some node of it is not its parent's first child."""
    return any(node != min(tree.children(tree.parent(node)).values()) for node in path)


def test_tree_accepts_the_second_branch_and_beats_the_linear_draft_on_a_branching_text() -> None:
    text, tree, target = speculate_on_planted("suffix:tree")
    linear_text, linear, _ = speculate_on_planted("suffix")
    assert text == linear_text == planted_text()  # both equal plain greedy: the text itself
    assert any(_off_first_branch(tree, path) for tree, path in target.kept)
    assert tree.stats.tokens_per_step > linear.stats.tokens_per_step


def test_tree_acceptance_processes_each_row_with_its_own_path() -> None:
    """A repetition penalty reads the history: a tree row must be processed with its own path's tokens."""
    params = SamplingParams(repetition_penalty=1.5)
    expected = list(generate_step(tiny_runner("qwen3"), PROMPT, params, NEW))
    runner = tiny_runner("qwen3")
    decoder = install_speculation(runner, parse_speculation("suffix:tree", "4"))
    assert list(generate_step(runner, PROMPT, params, NEW)) == expected
    assert decoder.stats.verify_steps > 0
