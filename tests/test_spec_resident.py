"""Resident verifies (`one_sync` with a lookup `--spec` under graphs): the device's draft is the host n-gram index's
(the latest longest match, copied LZ77-style), its acceptance greedy_accept's, every token plain greedy decoding's,
and the next verify is queued before the last one is read. On the CPU the kernels run in Triton's interpreter and
graphs are recaptured replays (conftest.rerun_capture); with CUDA, compiled kernels and captured graphs."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import rerun_capture, tiny_checkpoint
from kerneltriage.backends.torch import accelerate
from kerneltriage.backends.torch.acceptance import greedy_accept
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.backends.torch.speculative import install_speculation
from kerneltriage.engine.decoding import ONE_SYNC
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.config import parse_speculation
from kerneltriage.engine.speculative.decoder import SPEC_COUNTER
from kerneltriage.engine.speculative.ngram import NgramIndex
from kerneltriage.kernels import lookup_draft

GREEDY = SamplingParams()
PROMPT = [210, 158, 247, 186, 114, 261] * 2
NEW = 48
WEIGHTS = dict(random_weights=True)  # the preset init falls into loops of several tokens: long copies to draft
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _text(rng: random.Random, size: int) -> list[int]:
    """Random tokens with copies in them: pieces of the text so far repeated, some with a token changed."""
    text = [rng.randrange(50) for _ in range(8)]
    while len(text) < size:
        if rng.random() < 0.5:
            start = rng.randrange(len(text))
            piece = text[start:start + rng.randrange(1, 40)]
            if piece and rng.random() < 0.3:
                piece[rng.randrange(len(piece))] = rng.randrange(50)
            text += piece
        else:
            text.append(rng.randrange(50))
    return text[:size]


@pytest.mark.parametrize("rows, lookback", [(16, 32), (32, 32), (4, 3), (16, 1)])
def test_the_device_draft_is_the_ngram_index_proposal(rows: int, lookback: int) -> None:
    rng = random.Random(rows * 100 + lookback)
    for size in (1, 2, 40, 300, 1500):  # 1500: the scan goes round more than once
        text = _text(rng, size)
        history = torch.full((size + 64,), -7, dtype=torch.long, device=DEVICE)  # past the text: never read
        history[:size] = torch.tensor(text)
        length, tokens = torch.tensor(size, device=DEVICE), torch.zeros((1, rows), dtype=torch.long, device=DEVICE)
        position, matched = (torch.zeros((), dtype=torch.long, device=DEVICE) for _ in range(2))
        lookup_draft.draft(history, length, tokens, position, matched, lookback)
        index = NgramIndex(lookback)
        index.extend(text)
        expected = index.propose(rows - 1) or text[-1:] * (rows - 1)  # nothing recurs: the last token repeated
        assert tokens[0].tolist() == [text[-1], *expected], (size, text[-40:])
        assert int(position) == size - 1
        longest = next((n for n in range(min(lookback, size - 1), 0, -1)
                        if any(text[j - n + 1:j + 1] == text[-n:] for j in range(n - 1, size - 1))), 0)
        assert int(matched) == longest


@pytest.mark.parametrize("rows", [4, 16, 32])
def test_the_device_acceptance_is_greedy_accept(rows: int) -> None:
    rng = random.Random(rows)
    for _ in range(12):
        drafts = [rng.randrange(5) for _ in range(rows - 1)]
        best = [d if rng.random() < 0.8 else rng.randrange(5) for d in drafts] + [rng.randrange(5)]
        text = [rng.randrange(5) for _ in range(30)]
        history = torch.zeros(30 + rows, dtype=torch.long, device=DEVICE)
        history[:30] = torch.tensor(text)
        length, matched = torch.tensor(30, device=DEVICE), torch.tensor(9, device=DEVICE)
        out = torch.full((rows + 2,), -1, dtype=torch.long, device=DEVICE)
        tokens = torch.tensor([[text[-1], *drafts]], device=DEVICE)
        lookup_draft.accept(history, length, torch.tensor(best, device=DEVICE), tokens, matched, out)
        logits = torch.nn.functional.one_hot(torch.tensor(best), 5).float()
        emitted = greedy_accept(logits, drafts)
        assert out.tolist() == [len(emitted), 9, *best]
        assert int(length) == 30 + len(emitted) and history[30:30 + len(emitted)].tolist() == emitted
        assert history[:30].tolist() == text


def tiny(levers: str = ""):  # noqa: ANN201
    """The tiny llama with the preset init on DEVICE, in float32, with `levers`."""
    return BACKEND.build(tiny_checkpoint("llama", **WEIGHTS), RunConfig.from_flags(levers), DEVICE, "float32")


def resident_runner(levers: str = "one_sync", spec: str = "suffix", depth: str | None = "15"):  # noqa: ANN201
    """A tiny graphed runner (on the CPU replays recompute) with `levers` and speculation: resident with one_sync."""
    runner = tiny(levers)
    accelerate.graphs(runner, **({} if DEVICE == "cuda" else {"capture_fn": rerun_capture(runner)}))
    return runner, install_speculation(runner, parse_speculation(spec, depth))


@pytest.fixture(scope="module")
def expected() -> list[int]:
    tokens = list(generate_step(tiny(), PROMPT, GREEDY, NEW))
    assert len(set(tokens)) >= 6 and len(set(tokens)) < NEW // 2  # varied, and it repeats: copies to verify
    return tokens


@pytest.mark.parametrize("spec, depth", [("suffix", "15"), ("ngram", "15"), ("suffix", "3"), ("suffix", "auto")])
def test_resident_verifies_emit_plain_greedy_tokens(expected: list[int], spec: str, depth: str) -> None:
    runner, decoder = resident_runner(spec=spec, depth=depth)
    assert list(generate_step(runner, PROMPT, GREEDY, NEW)) == expected
    stats = decoder.stats
    assert runner.counters[ONE_SYNC] >= runner.counters[SPEC_COUNTER] == stats.verify_steps > 0
    assert stats.verify_tokens + len(stats.plain_seconds) == NEW - 1  # every token once, the prefill's aside
    if depth != "auto":  # a fixed depth k: each verify has k + 1 rows, all drafted on the device
        assert stats.drafted_tokens == stats.verify_steps * int(depth)
        assert stats.tokens_per_step > 2  # the loops were copied


def test_the_next_verify_is_queued_before_the_last_one_is_read() -> None:
    expected = list(generate_step(tiny(), PROMPT, GREEDY, 2 * NEW))  # the loop it falls into repeats for long
    runner, _ = resident_runner()
    events, queue = [], runner.queue_verify

    def logged(rows: int, reach: int):  # noqa: ANN202
        pending = queue(rows, reach)
        events.append("queue")

        class Read:
            def result(self):  # noqa: ANN202
                events.append("read")
                return pending.result()

        return Read()

    runner.queue_verify = logged
    assert list(generate_step(runner, PROMPT, GREEDY, 2 * NEW)) == expected
    # a run's first verify is read before the next is queued (it may have been the match's only one), then one ahead
    assert events[:2] == ["queue", "read"], events
    assert ("read", "queue", "queue", "read") in set(zip(events, events[1:], events[2:], events[3:])), events
    assert events.count("queue") == events.count("read") > 2  # each run of verifies drained before it ends
    assert runner.model.cache.length <= len(PROMPT) + 2 * NEW - 1  # trimmed to the text the host read


@pytest.mark.parametrize("case", ["no one_sync", "sampled", "tree"])
def test_verifies_stay_host_fed_where_the_device_cannot_decide(expected: list[int], case: str) -> None:
    """Without one_sync, at temperature > 0 (the device accepts by argmax) and for token trees, the host feeds
    every verify: no resident step runs, and greedy tokens are still plain greedy decoding's."""
    if case == "tree":  # trees verify eagerly (a tree mask): the host-fed loop, with one_sync on
        runner = tiny("one_sync")
        install_speculation(runner, parse_speculation("suffix:tree", "3"))
    else:
        runner, _ = resident_runner(levers="" if case == "no one_sync" else "one_sync")
    params = SamplingParams(temperature=0.8, seed=1) if case == "sampled" else GREEDY
    out = list(generate_step(runner, PROMPT, params, NEW))
    assert runner.counters[ONE_SYNC] == 0 and runner.counters[SPEC_COUNTER] > 0
    assert out == expected or case == "sampled"


def test_a_capture_at_the_caches_end_runs_every_warm_up_from_the_same_text_end(expected: list[int]) -> None:
    """A capture's warm-ups run the step (on the CPU two, then the captured run): each drafts and writes the cache
    from the text end the capture starts at, as the replays will — not from the last one's accepted tokens, which
    near the cache's end would write past it (an index error here, memory not ours under fused_layer on the GPU).
    The text and its length are the run's again after the capture: its replay emits plain greedy tokens."""
    runner, _ = resident_runner()
    runner.reset_cache(len(PROMPT) + 20)
    capacity = runner.cache_capacity
    runner.prefill(PROMPT, 0)
    text = PROMPT + expected[:1]
    runner.begin_resident(text, 32)
    emitted, _ = runner.queue_verify(16, capacity).result()  # captured at capacity - 16: warm-ups end at the end
    assert emitted and emitted == expected[1:1 + len(emitted)]
    assert int(runner.resident_verify.length) == len(text) + len(emitted)
