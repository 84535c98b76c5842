"""The checks the climb leans on: a stock runner's greedy continuation verified over another runner's tokens equals
its own token loop's, whatever the draft; an exact difference between two configurations is recognised from the
lever table; a check against the same base reuses what it computed; a copy released frees its weights."""

from __future__ import annotations

import pytest

from conftest import tiny_runner
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.bench import equivalence, outputs
from kerneltriage.bench.harness import GREEDY
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step

PROMPT = list(range(3, 19))


@pytest.mark.parametrize("draft", ["itself", "half", "none", "wrong"])
def test_verified_greedy_is_the_token_loops_greedy(draft: str) -> None:
    runner = tiny_runner("llama")
    truth = list(generate_step(runner, PROMPT, GREEDY, 40))
    assert len(set(truth)) > 10  # a continuation that could be got wrong
    drafts = {"itself": truth, "half": truth[:20] + [0] * 20, "none": [], "wrong": [(t + 1) % 64 for t in truth]}
    assert outputs.verified_greedy(runner, PROMPT, 40, drafts[draft]) == truth


@pytest.mark.parametrize("draft", ["itself", "half", "none", "wrong"])
def test_verified_greedy_stops_at_the_first_disagreement_when_asked(draft: str) -> None:
    runner = tiny_runner("llama")
    truth = list(generate_step(runner, PROMPT, GREEDY, 40))
    drafts = {"itself": truth, "half": truth[:20] + [(t + 1) % 64 for t in truth[20:]], "none": [],
              "wrong": [(t + 1) % 64 for t in truth]}
    got = outputs.verified_greedy(runner, PROMPT, 40, drafts[draft], until_disagreement=True)
    expected = {"itself": 40, "half": 21, "none": 40, "wrong": 1}[draft]  # no draft: nothing to disagree with
    assert got == truth[:expected]


def test_a_stock_side_against_a_differing_side_is_verified_only_to_the_first_difference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest of a stock A against a B whose tokens part from A's: A's forwards stop there (an eager stock
    A past it would take one forward a token), its digest differs, and the tokens forced on are A's to there, B's
    after."""
    a = tiny_runner("llama")
    b = BACKEND.copy(a, RunConfig.from_flags("packed_qkv"))
    truth = list(generate_step(a, PROMPT, GREEDY, 40))
    parted = truth[:10] + [(t + 1) % 64 for t in truth[10:]]
    monkeypatch.setattr(outputs, "token_digest", lambda runner, prompts, count, kept=None: ("b", [parted]))
    forwards: list[int] = []
    real = a.forced_logits
    monkeypatch.setattr(a, "forced_logits", lambda *args: forwards.append(1) or real(*args))
    (digest_a, fed), (digest_b, _) = outputs.digests(a, b, [PROMPT], 40, None)
    assert digest_a != digest_b and len(forwards) == 1
    assert fed == [truth[:11] + parted[11:]]


def test_exact_difference_reads_the_lever_table() -> None:
    base = tiny_runner("llama", "fused_norm")
    assert equivalence.exact_difference(base, BACKEND.copy(base, RunConfig.from_flags("fused_norm,one_sync")))
    assert equivalence.exact_difference(base, BACKEND.copy(base, RunConfig.from_flags("fused_norm,last_logits")))
    assert not equivalence.exact_difference(base, BACKEND.copy(base, RunConfig.from_flags("fused_norm,packed_qkv")))
    assert not equivalence.exact_difference(base, BACKEND.copy(base, RunConfig.from_flags("")))  # fused_norm off


def test_an_exact_difference_with_equal_tokens_needs_no_logits_and_a_reordering_one_does() -> None:
    base = tiny_runner("llama", "fused_norm")
    exact = equivalence.check_outputs(BACKEND, base, BACKEND.copy(base, RunConfig.from_flags("fused_norm,one_sync")))
    assert exact.passed and exact.digest_a == exact.digest_b and exact.logit_error is None
    reorders = equivalence.check_outputs(BACKEND, base,
                                         BACKEND.copy(base, RunConfig.from_flags("fused_norm,packed_qkv")))
    assert reorders.passed and reorders.logit_error is not None  # the logits judged it


def test_a_check_against_the_same_base_reuses_its_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    base, kept = tiny_runner("llama"), outputs.Outputs()
    calls: list[str] = []
    real = base.forced_logits
    monkeypatch.setattr(base, "forced_logits", lambda *args: calls.append("base") or real(*args))
    for flags in ("packed_qkv", "fused_norm"):
        assert equivalence.check_outputs(BACKEND, base, BACKEND.copy(base, RunConfig.from_flags(flags)), kept).passed
    first = len(calls)
    assert first > 0
    equivalence.check_outputs(BACKEND, base, BACKEND.copy(base, RunConfig.from_flags("packed_gate_up")), kept)
    assert len(calls) == first  # the base's digest and rows came from the earlier checks


def test_release_frees_a_copys_weights_while_it_is_still_referred_to() -> None:
    base = tiny_runner("llama")
    copy = BACKEND.copy(base, RunConfig.from_flags("packed_qkv"))
    BACKEND.release(copy)
    assert all(p.numel() == 0 for p in copy.model.parameters())
    assert all(p.numel() > 0 for p in base.model.parameters())  # the base's own weights untouched


def test_a_climb_upcasts_stock_once_and_each_winner_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """In bf16 every check needs stock's float32 rows: kept between checks of copies holding the stock values (an
    8B's float32 copy is 32 GB), rebuilt where a lever holds values of its own (quantized's blocks)."""
    base, kept = tiny_runner("llama", dtype="bfloat16"), outputs.Outputs()
    built: list[str] = []
    real = BACKEND.float32_reference
    monkeypatch.setattr(BACKEND, "float32_reference",
                        lambda runner, config=None: built.append(config.text if config else "stock")
                        or real(runner, config))
    for flags in ("packed_qkv", "fused_norm"):
        checked = equivalence.check_outputs(BACKEND, base, BACKEND.copy(base, RunConfig.from_flags(flags)), kept)
        assert checked.passed and checked.reference == "float32" and checked.semantic_error is not None
    assert built == ["stock", "levers=packed_qkv", "levers=fused_norm"]  # stock once, then each winner
    # the next round's base (its own greedy tokens): the same positions are forced, stock's rows reused
    higher = BACKEND.copy(base, RunConfig.from_flags("packed_qkv"))
    top = BACKEND.copy(base, RunConfig.from_flags("packed_qkv,packed_gate_up"))
    assert equivalence.check_outputs(BACKEND, higher, top, kept).passed
    assert built[3:] == ["levers=packed_qkv,packed_gate_up"]
    assert RunConfig.from_flags("packed_qkv").stock_values and not RunConfig.from_flags("quantized").stock_values
