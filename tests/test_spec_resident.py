"""Resident steps (`one_sync` with a lookup `--spec` under graphs): the device's draft is the host n-gram index's
(the latest longest match, copied LZ77-style), its choice between a plain step and a verify shape
`resident.device_choice`'s, its acceptance greedy_accept's, every token plain greedy decoding's, and the next step is
queued before the last one is read. On the CPU the kernels run in Triton's interpreter, graphs are recaptured replays
(conftest.rerun_capture) and the choice is read on the host; with CUDA, compiled kernels and captured graphs with the
choice in a SWITCH node."""

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
from kerneltriage.engine.speculative.resident import CHOICES, DONE, device_choice, widest
from kerneltriage.kernels import lookup_draft

GREEDY = SamplingParams()
PROMPT = [210, 158, 247, 186, 114, 261] * 2
NEW = 48
WEIGHTS = dict(random_weights=True)  # the preset init falls into loops of several tokens: long copies to draft
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # in the GPU suite too: on CUDA its kernels run compiled (here, in the interpreter)
OPEN = 1 << 30  # a run's end no text here reaches


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
def test_the_device_draft_is_the_ngram_index_proposal_and_its_choice_the_reference(rows: int, lookback: int) -> None:
    rng = random.Random(rows * 100 + lookback)
    for size in (1, 2, 40, 300, 1500):  # 1500: the scan goes round more than once
        text = _text(rng, size)
        history = torch.full((size + 64,), -7, dtype=torch.long, device=DEVICE)  # past the text: never read
        history[:size] = torch.tensor(text)
        length, tokens = torch.tensor(size, device=DEVICE), torch.zeros((1, rows), dtype=torch.long, device=DEVICE)
        position, matched = (torch.zeros((), dtype=torch.long, device=DEVICE) for _ in range(2))
        for limits in ((2, 1, OPEN), (1, 1, OPEN), (0, 1, OPEN), (2, 3, OPEN), (2, 40, OPEN), (2, 1, size)):
            choice = torch.tensor(-1, dtype=torch.int32, device=DEVICE)
            allowed = torch.tensor(limits, dtype=torch.int32, device=DEVICE)
            out = torch.full((rows + 3,), -1, dtype=torch.long, device=DEVICE)
            lookup_draft.draft(history, length, tokens, position, matched, choice, allowed, out, lookback)
            index = NgramIndex(lookback)
            index.extend(text)
            expected = index.propose(rows - 1) or text[-1:] * (rows - 1)  # nothing recurs: the last token repeated
            assert tokens[0].tolist() == [text[-1], *expected], (size, text[-40:])
            assert int(position) == size - 1
            assert (int(choice), int(matched)) == device_choice(text, lookback, limits), (size, limits, text[-40:])
            # the text complete (DONE): no body will run, and the result says nothing was emitted
            assert out[:3].tolist() == ([0, int(matched), 0] if int(choice) == DONE else [-1, -1, -1])


def test_the_choice_follows_the_suffix_drafters_rule() -> None:
    """Plain where nothing recurs or a one-token match went on differently before; the narrower verify from a match
    of 2 (or of one token that always went on the same way); the wider from LONG_MATCH tokens; within the host's
    limits (the widest shape, the least match; none once the text has the run's end)."""
    assert device_choice([5, 6, 7], 32, (2, 1, OPEN)) == (0, 0)  # nothing recurs
    assert device_choice([5, 6, 5, 7, 5], 32, (2, 1, OPEN)) == (0, 1)  # 5 went on as 6 and as 7
    assert device_choice([5, 6, 9, 5], 32, (2, 1, OPEN)) == (1, 1)  # 5 always went on as 6
    assert device_choice([1, 2, 3, 1, 2], 32, (2, 1, OPEN)) == (1, 2)
    assert device_choice([1, 2, 3, 1, 2], 32, (2, 3, OPEN))[0] == 0  # below the least match
    text = list(range(10)) * 2
    assert device_choice(text, 32, (2, 1, OPEN)) == (2, 10) and device_choice(text, 32, (1, 1, OPEN)) == (1, 10)
    assert device_choice(text, 32, (0, 1, OPEN)) == (0, 10)
    assert device_choice(text, 4, (2, 1, OPEN)) == (1, 4)  # the lookback caps the match
    assert device_choice(text, 32, (2, 1, len(text))) == (DONE, 10)  # the text has the run's end: no body
    assert [widest(k) for k in (0, 1, 15, 16, 31)] == [0, 1, 1, 2, 2]  # the shape a draft of k is padded to


@pytest.mark.parametrize("rows", [1, 4, 16, 32])
def test_the_device_acceptance_is_greedy_accept(rows: int) -> None:
    rng = random.Random(rows)
    for _ in range(12):
        drafts = [rng.randrange(5) for _ in range(rows - 1)]
        best = [d if rng.random() < 0.8 else rng.randrange(5) for d in drafts] + [rng.randrange(5)]
        text = [rng.randrange(5) for _ in range(30)]
        history = torch.zeros(30 + rows, dtype=torch.long, device=DEVICE)
        history[:30] = torch.tensor(text)
        length, matched = torch.tensor(30, device=DEVICE), torch.tensor(9, device=DEVICE)
        out = torch.full((rows + 3,), -1, dtype=torch.long, device=DEVICE)
        tokens = torch.tensor([[text[-1], *drafts]], device=DEVICE)
        lookup_draft.accept(history, length, torch.tensor(best, device=DEVICE), tokens, matched, out)
        logits = torch.nn.functional.one_hot(torch.tensor(best), 5).float()
        emitted = greedy_accept(logits, drafts)  # one row (a plain step): its argmax
        assert out.tolist() == [len(emitted), 9, rows, *best]
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
def test_resident_steps_emit_plain_greedy_tokens(expected: list[int], spec: str, depth: str) -> None:
    runner, decoder = resident_runner(spec=spec, depth=depth)
    chosen = _chosen(decoder)
    assert list(generate_step(runner, PROMPT, GREEDY, NEW)) == expected
    stats = decoder.stats
    assert runner.counters[SPEC_COUNTER] == stats.verify_steps == sum(rows > 1 for rows in chosen) > 0
    assert runner.counters[ONE_SYNC] >= len(chosen)  # every step queued, plain or verify (one may find the text done)
    assert stats.verify_tokens + len(stats.plain_seconds) == NEW - 1  # every token once, the prefill's aside
    if depth != "auto":  # a fixed depth k: verifies of k + 1 rows padded to their shape, drafted to it on the device
        assert set(chosen) <= {1, CHOICES[widest(int(depth))]}
        assert stats.drafted_tokens == stats.verify_steps * (CHOICES[widest(int(depth))] - 1)
        assert stats.tokens_per_step > 2  # the loops were copied


def _chosen(decoder) -> list[int]:  # noqa: ANN001
    """The rows of every resident step the decoder records from now on (1: a plain step)."""
    chosen, record = [], decoder.record_step

    def logged(runner, rows: int, accepted: int, seconds: float, matched: int = 0) -> None:  # noqa: ANN001
        chosen.append(rows)
        record(runner, rows, accepted, seconds, matched)

    decoder.record_step = logged
    return chosen


def test_resident_steps_count_their_levers() -> None:
    """Each replay counts the levers its step ran (`ab`'s proof that a lever ran), here packed q/k/v in both layers:
    the CPU's captures warm up on the plain body even where the limits before a run's first step read as its end
    (DONE would run none, and the graph would count nothing)."""
    runner, decoder = resident_runner(levers="one_sync,packed_qkv")
    chosen = _chosen(decoder)
    list(generate_step(runner, PROMPT, GREEDY, NEW))
    assert chosen and runner.counters["packed_qkv"] >= 2 * len(chosen), (runner.counters, len(chosen))


def test_the_device_chooses_plain_steps_and_verifies_in_one_run() -> None:
    """A text that copies, then writes something new: the device verifies the copies and steps plainly where nothing
    recurs, within one run of queued steps (no host-fed step between them)."""
    expected = list(generate_step(tiny(), PROMPT, GREEDY, 2 * NEW))
    runner, decoder = resident_runner(depth="31")
    chosen = _chosen(decoder)
    assert list(generate_step(runner, PROMPT, GREEDY, 2 * NEW)) == expected
    texts = [PROMPT + expected[:i] for i in range(1, 2 * NEW)]
    wanted = {CHOICES[device_choice(text, 32, (2, least, OPEN))[0]] for text in texts for least in (1, 2, 3, 4, 8, 33)}
    assert set(chosen) <= wanted and len(chosen) <= runner.counters[ONE_SYNC]
    assert 1 in chosen and (16 in chosen or 32 in chosen), chosen


def test_the_next_step_is_queued_before_the_last_one_is_read() -> None:
    expected = list(generate_step(tiny(), PROMPT, GREEDY, 2 * NEW))  # the loop it falls into repeats for long
    runner, _ = resident_runner()
    events, queue = [], runner.queue_step

    def logged(reach: int, limits: tuple[int, int, int]):  # noqa: ANN202
        pending = queue(reach, limits)
        events.append("queue")

        class Read:
            def result(self):  # noqa: ANN202
                found = pending.result()
                events.append("read" if found[2] else "done")  # done: no body ran (rows 0)
                return found

        return Read()

    runner.queue_step = logged
    assert list(generate_step(runner, PROMPT, GREEDY, 2 * NEW)) == expected
    # two queued before the first read, then one queued behind each read while the text is short of its end
    assert events[:3] == ["queue", "queue", "read"], events
    assert ("read", "queue", "read", "queue") in set(zip(events, events[1:], events[2:], events[3:])), events
    assert events.count("queue") == events.count("read") + events.count("done") > 2  # each run drained before it ends
    assert "done" not in events[:-1]  # (a step finds the text complete only at the end)
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
    emitted, _, rows = runner.queue_step(capacity, (2, 1, OPEN)).result()  # captured at capacity - 32: warm-ups end
    assert emitted and emitted == expected[1:1 + len(emitted)]  # there
    assert rows == CHOICES[device_choice(text, 32, (2, 1, OPEN))[0]]
    assert int(runner.resident_steps.length) == len(text) + len(emitted)


def test_a_step_queued_past_the_runs_end_runs_no_body(expected: list[int]) -> None:
    """The step queued behind one that may reach the run's end (the host cannot know it will) finds the text
    complete: it chooses no body (DONE), emits nothing, leaves the text and the cache as they were, and says so."""
    runner, _ = resident_runner()
    runner.reset_cache(len(PROMPT) + 100)
    runner.prefill(PROMPT, 0)
    text = PROMPT + expected[:1]
    runner.begin_resident(text, 32)
    limits = (2, 1, len(text) + 1)  # one token more completes the text
    emitted, _, rows = runner.queue_step(len(text) + 31, limits).result()
    assert emitted == expected[1:1 + len(emitted)] and rows >= 1
    cache = runner.model.cache
    keys, values = cache.keys.clone(), cache.values.clone()
    late = runner.queue_step(len(text) + 63, limits).result()
    assert late[0] == [] and late[2] == 0 and int(runner.resident_steps.choice) == DONE
    assert int(runner.resident_steps.length) == len(text) + len(emitted)
    assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
    with pytest.raises(ValueError, match="expected"):  # limits without the end: refused, not read as the end reached
        runner.queue_step(len(text) + 63, (2, 1))


def test_the_controller_limits_resident_verifies_by_the_match_lengths_that_pay() -> None:
    """Resident steps: verifies from a match length that emit fewer tokens per second than plain steps raise the
    least match the device needs above it, plain steps bring it back down a bucket (to try again), and verifies that
    lose as a whole switch speculation off; the depth is left alone (the device picks each shape); the next prompt on
    the runner starts from what paid."""
    from kerneltriage.engine.speculative.controller import REPROBE_STEPS, WARMUP_STEPS, YIELD_MIN, DepthController

    def controller() -> DepthController:
        made = DepthController(None, 31, padded=True)
        made.resident = True
        for _ in range(3):
            made.observe_plain(1.0)  # a plain step: one token a second
        return made

    def verify(made: DepthController, matched: int, tokens: int, seconds: float, rows: int = 16) -> None:
        made.observe_match(matched, tokens, seconds)
        made.observe_verify(rows - 1, tokens - 1, 0.0, seconds, rows)

    mixed = controller()
    for _ in range(3):
        verify(mixed, 1, 1, 1.3)  # a one-token match: nothing accepted, 1.3 s
        verify(mixed, 9, 10, 1.5)  # a long match: 9 accepted
    assert mixed.least == 2 and not mixed.off and mixed.depth == 31
    following = DepthController(None, 31, padded=True)
    following.carry_over(mixed)  # the next prompt on the runner: which match lengths paid goes on
    assert following.least == 2 and len(following.matches[1]) == 3
    for _ in range(REPROBE_STEPS):
        mixed.observe_plain(1.0)
    assert mixed.least == 1
    losing = controller()
    for _ in range(YIELD_MIN + WARMUP_STEPS):  # (judged every WARMUP_STEPS verifies) 16 rows cheap, 32 dear
        verify(losing, 2, 1, 1.1)
        verify(losing, 2, 1, 3.0, rows=32)
    assert losing.off and losing.least == 3 and losing.next_depth() == 0
    for _ in range(3):  # shadow drafts that would have been accepted: back on, at the deepest k (the device picks
        for position in range(4):  # each step's shape within it; a shallower one would forbid its long verifies)
            losing.observe_shadow(position, True)
    assert not losing.off and losing.next_depth() == 31


def test_every_window_a_run_reaches_is_captured_before_it() -> None:
    """The steps in flight reach RESIDENT_SLACK positions past the text: their windows are captured before the run
    (graphed.GraphedStep.prepare), never inside it — on a cache just large enough, with a window of 8 slots."""
    runner, _ = resident_runner()
    steps = runner.resident_steps
    steps.window_step = 8
    prepared, captured, capture = [], [], steps._capture

    def spied(*args):  # noqa: ANN002, ANN202
        captured.append(bool(prepared))
        return capture(*args)

    prepare = steps.prepare
    steps._capture = spied
    steps.prepare = lambda *args: (prepare(*args), prepared.append(True))
    list(generate_step(runner, PROMPT, GREEDY, NEW))
    assert captured and prepared and not any(captured), captured  # every capture happened during the prepare
