"""benchmarks/tools/draft_replay.py: the real speculative decoder driven over recorded text on a virtual clock —
its tokens are the text's, and its modelled speed-up follows the text (a copy pays, text that never recurs does not
lose)."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tools" / "draft_replay.py"


@pytest.fixture(scope="module")
def draft_replay():  # noqa: ANN201 - the script as a module
    spec = importlib.util.spec_from_file_location("draft_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_copy_pays_and_text_that_never_recurs_does_not_lose(draft_replay) -> None:  # noqa: ANN001
    rng = random.Random(0)
    code = [rng.randrange(100, 900) for _ in range(120)]
    copy = [[[1, 2, *code, 3], [4, *code[:50], 5, *code[50:110]]]]  # the code again, one token inserted
    # text that never recurs but by chance: 20 tokens drawn at random, so short matches (and failed drafts) abound
    noise = [[[rng.randrange(100, 120) for _ in range(40)], [rng.randrange(100, 120) for _ in range(200)]]
             for _ in range(3)]
    costs = draft_replay.parse_costs(draft_replay.DEFAULT_COSTS)
    copied = draft_replay.replay("suffix", None, copy, costs, True)
    assert copied["modelled_speedup"] > 3.0 and copied["tokens_per_verify"] > 10, copied
    never = draft_replay.replay("suffix", None, noise, costs, True)
    assert 0.98 <= never["modelled_speedup"] <= 1.0 and never["verify_steps"] < 0.05 * never["plain_steps"], never
    dearer = draft_replay.replay("suffix", None, copy, {16: 1.43, 32: 3.0}, True)  # a 32-row verify that loses
    assert dearer["modelled_speedup"] < copied["modelled_speedup"] and dearer["modelled_speedup"] > 2.5, dearer


def test_resident_steps_choose_on_the_device_and_keep_the_text(draft_replay) -> None:  # noqa: ANN001
    """Resident steps (--resident): each chooses, drafts and accepts as the device does; a copy pays at least as much
    as host-fed verifies that wait for the host (no gap between steps), text that never recurs stays near plain
    speed (its plain steps at the resident graph's price), and a wait at each run's start costs time."""
    rng = random.Random(1)
    code = [rng.randrange(100, 900) for _ in range(120)]
    copy = [[[1, 2, *code, 3], [4, *code[:50], 5, *code[50:110]]]]
    noise = [[[rng.randrange(100, 120) for _ in range(40)], [rng.randrange(100, 120) for _ in range(200)]]]
    costs, resident = draft_replay.parse_costs(draft_replay.DEFAULT_COSTS), {1: 1.02, 16: 1.3, 32: 1.6}
    copied = draft_replay.replay("suffix", None, copy, costs, True, resident)
    assert copied["modelled_speedup"] > 3.0 and copied["tokens_per_verify"] > 10, copied
    never = draft_replay.replay("suffix", None, noise, costs, True, resident)
    assert 0.95 <= never["modelled_speedup"] <= 1.0, never
    waited = draft_replay.replay("suffix", None, copy, costs, True, resident, gap=0.5)
    assert waited["modelled_speedup"] < copied["modelled_speedup"], waited


def test_a_resident_step_reports_the_match_it_drafted_from(draft_replay) -> None:  # noqa: ANN001
    """The controller judges resident verifies by the match length they came from: the replay's step reports it, as
    the device's does (reported as 0, every verify fell in the one-token bucket and no length was ever excluded)."""
    from kerneltriage.engine.speculative.resident import CHOICES, device_choice

    text = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 5, 7, 8, 9, 10]  # its last 4 tokens occurred before
    target = draft_replay.ReplayTarget({16: 1.3, 32: 1.6}, True, 20, {1: 1.0, 16: 1.3, 32: 1.6})
    target.start(text[:3], text[3:] + [11, 12])
    target.begin_resident(text, 32)
    limits = (2, 1, 1 << 30)
    emitted, matched, rows = target.queue_step(len(text) + 31, limits).result()
    assert (CHOICES.index(rows), matched) == device_choice(text, 32, limits) and matched == 4
    assert emitted[:2] == [11, 12]


def test_passes_carry_the_decoder_and_step_times_price_resident_steps(draft_replay, tmp_path) -> None:  # noqa: ANN001
    """--passes: the set again on the same decoder, each pass's steps adding up to the whole; --step-times: each
    resident step priced at a draw from a trace's times of its rows, over its plain steps' median (a trace that
    lacks a shape is refused by name)."""
    rng = random.Random(2)
    code = [rng.randrange(100, 900) for _ in range(60)]
    texts = [[[1, 2, *code, 3], [4, *code[:30], 5, *code[30:50]]]]
    costs, resident = draft_replay.parse_costs(draft_replay.DEFAULT_COSTS), {1: 1.0, 16: 1.3, 32: 1.6}
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"resident_steps": [{"rows": 1, "us": 500.0}, {"rows": 1, "us": 600.0},
                                                    {"rows": 16, "us": 1650.0}, {"rows": 32, "us": 2200.0}]}))
    draws = draft_replay.step_draws(str(trace), [1, 16, 32])
    assert draws == {1: [500 / 550, 600 / 550], 16: [3.0], 32: [4.0]}
    fixed = draft_replay.replay("suffix", None, texts, costs, True, resident, passes=3)
    assert len(fixed["passes"]) == 3 and sum(p["verify_steps"] for p in fixed["passes"]) == fixed["verify_steps"]
    assert sum(p["plain_steps"] for p in fixed["passes"]) == fixed["plain_steps"]
    dear = draft_replay.replay("suffix", None, texts, costs, True, resident, passes=3, draws=draws)
    assert dear["modelled_speedup"] < fixed["modelled_speedup"]  # verifies at 3-4 plain steps, not 1.3-1.6
    trace.write_text(json.dumps({"resident_steps": [{"rows": 1, "us": 500.0}]}))
    with pytest.raises(ValueError, match="16,32 rows"):
        draft_replay.step_draws(str(trace), [1, 16, 32])


def test_costs_name_every_padded_shape(draft_replay) -> None:  # noqa: ANN001
    assert draft_replay.parse_costs("16:1.4,32:1.6") == {16: 1.4, 32: 1.6}
    assert draft_replay.parse_costs("1:1.02,16:1.4,32:1.6") == {1: 1.02, 16: 1.4, 32: 1.6}  # a plain step's too
    for bad in ("16:1.4", "16:x,32:1", "16=1.4,32:1.6"):
        with pytest.raises(ValueError):
            draft_replay.parse_costs(bad)
    # a what-if of other shapes (--other-shapes): any ascending set of 2..32 rows, still each shape priced
    assert draft_replay.parse_costs("9:1.3,16:1.4,32:1.6", any_shapes=True) == {9: 1.3, 16: 1.4, 32: 1.6}
    for bad in ("1:1.0,16:1.4", "16:1.4,64:2"):
        with pytest.raises(ValueError):
            draft_replay.parse_costs(bad, any_shapes=True)
