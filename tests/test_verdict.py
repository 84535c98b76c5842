"""Verdict rules and the claim checklist on synthetic numbers."""

from __future__ import annotations

import pytest

from kerneltriage.core import stats, verdict
from kerneltriage.core.environment import Snapshot
from kerneltriage.core.stats import Interval


def ci(low: float, high: float) -> Interval:
    return Interval((low + high) / 2, low, high, 0.95)


def test_noise_band_is_the_farthest_aa_bound_with_a_floor() -> None:
    assert verdict.noise_band(ci(0.97, 1.02)) == pytest.approx(0.03)
    assert verdict.noise_band(ci(0.999, 1.001)) == verdict.MIN_NOISE_BAND


@pytest.mark.parametrize(
    ("ratio", "share", "expected"),
    [
        (ci(1.10, 1.20), None, "win"),
        (ci(0.80, 0.90), None, "loss"),
        (ci(0.98, 1.03), None, "neutral"),
        (ci(1.04, 1.08), None, "neutral"),  # a "win" whose CI reaches into the band is neutral
        (ci(1.00, 1.02), 0.01, "no-lever"),  # 1% of the time: at most 1.0101×, inside a 5% band
        (ci(0.80, 0.90), 0.01, "loss"),  # a tiny op can still be made to cost time
    ],
)
def test_phase_verdicts(ratio: Interval, share: float | None, expected: str) -> None:
    assert verdict.phase_verdict(ratio, band=0.05, share=share).verdict == expected


def test_a_large_share_does_not_turn_a_win_into_no_lever() -> None:
    assert verdict.phase_verdict(ci(1.2, 1.3), band=0.05, share=0.5).verdict == "win"


def _phases(*verdicts: str) -> dict[str, verdict.Verdict]:
    return {f"phase{i}": verdict.Verdict(v, "") for i, v in enumerate(verdicts)}


@pytest.mark.parametrize(
    ("phases", "slower", "expected"),
    [
        (("win", "neutral"), (), "win"),
        (("win", "neutral"), ("phase1",), "traded"),  # decode 0.76 [0.66, 1.02] beside a prefill win
        (("win", "loss"), ("phase1",), "traded"),
        (("loss", "neutral"), ("phase0",), "loss"),
        (("neutral", "no-lever"), (), "neutral"),
        (("no-lever", "no-lever"), (), "no-lever"),
        (("neutral", "neutral"), (), "neutral"),
    ],
)
def test_overall_combines_phases(phases: tuple[str, ...], slower: tuple[str, ...], expected: str) -> None:
    assert verdict.overall_verdict(_phases(*phases), True, [], slower_phases=slower).verdict == expected


def test_a_phase_is_slower_when_its_estimate_is_below_the_band_whatever_its_ci() -> None:
    fused_norm_decode = stats.Interval(0.76, 0.66, 1.02, 0.9375)  # the recorded H200 row that was called "win"
    assert verdict.phase_verdict(fused_norm_decode, 0.01).verdict == "neutral"
    assert verdict.slower(fused_norm_decode, 0.01)
    assert not verdict.slower(stats.Interval(0.995, 0.98, 1.01, 0.9375), 0.01)


@pytest.mark.parametrize("pairs", [2, 3, 4])
def test_fewer_than_five_pairs_is_indicative_never_a_win(pairs: int) -> None:
    result = verdict.overall_verdict(_phases("win", "win"), True, [], pairs=pairs)
    assert result.verdict == "indicative" and "would be win" in result.reason
    assert verdict.overall_verdict(_phases("win", "win"), True, [], pairs=verdict.MIN_PAIRS).verdict == "win"


def test_a_shared_machine_gets_no_verdict() -> None:
    wide = verdict.band_contention({"prefill": 0.05, "decode": 0.71})
    assert wide is not None and "decode ±0.71" in wide
    assert verdict.band_contention({"prefill": 0.05, "decode": 0.30}) is None
    result = verdict.overall_verdict(_phases("win", "win"), True, [], contention=wide)
    assert result.verdict == "contended" and "no verdict" in result.reason


def test_an_interval_outside_even_a_wide_band_is_decided() -> None:
    """The eager 8B decode's A/A band was ±0.78; graphs read B/A [4.87, 8.99]: more than that noise, a win."""
    assert verdict.band_contention({"prefill": 0.02, "decode": 0.78}, cleared=["decode"]) is None
    assert verdict.band_contention({"prefill": 0.02, "decode": 0.78}, cleared=["prefill"]) is not None


def test_invalid_beats_any_timing() -> None:
    wins = _phases("win", "win")
    differ = verdict.overall_verdict(wins, False, [], "digests differ", contention="busy")
    assert differ.verdict == "invalid" and "digests differ" in differ.reason
    silent = verdict.overall_verdict(wins, True, ["graphs"], pairs=2)
    assert silent.verdict == "invalid" and "graphs" in silent.reason


def test_every_verdict_is_reachable_and_the_ledger_accepts_exactly_these() -> None:
    from kerneltriage.core import ledger

    reached = {verdict.phase_verdict(ci(1.1, 1.2), 0.05).verdict, verdict.phase_verdict(ci(0.8, 0.9), 0.05).verdict,
               verdict.phase_verdict(ci(0.99, 1.01), 0.05).verdict,
               verdict.phase_verdict(ci(0.99, 1.01), 0.05, 0.001).verdict,
               verdict.overall_verdict(_phases("win"), False, []).verdict,
               verdict.overall_verdict(_phases("win", "loss"), True, [], slower_phases=["phase1"]).verdict,
               verdict.overall_verdict(_phases("win"), True, [], pairs=2).verdict,
               verdict.overall_verdict(_phases("win"), True, [], contention="shared").verdict}
    assert reached == set(verdict.VERDICTS) == set(ledger.VERDICTS)


def test_checklist_points_answer_from_the_data() -> None:
    assert verdict.synthetic_item(False, False).status == "warn"
    assert "random weights" in verdict.synthetic_item(True, True).answer
    assert verdict.question_item({"graphs": "dispatch"}).status == "ok"
    assert verdict.question_item({"my_gemv": "kernel"}).status == "warn"
    assert verdict.question_item({}).status == "warn"
    assert verdict.baseline_item((), None).status == "unknown"
    assert verdict.baseline_item((), {"attention backend": "fell back to math"}).status == "warn"
    assert verdict.baseline_item((), {"attention backend": None}).status == "ok"
    assert verdict.baseline_item(("graphs",), None).status == "warn"
    assert verdict.phases_item(["prefill", "decode"]).status == "ok"
    assert verdict.phases_item(["decode"]).status == "warn"


def test_thermals_from_snapshots_and_sustained_windows() -> None:
    cool = Snapshot(0.0, sm_clock_mhz=1980, memory_clock_mhz=3201, temperature_c=40)
    hot = Snapshot(60.0, sm_clock_mhz=1500, memory_clock_mhz=3201, temperature_c=70)
    steady = {"A decode": (1000.0, 990.0)}
    assert verdict.thermals_item(cool, cool, None).status == "unknown"
    assert verdict.thermals_item(cool, cool, steady).status == "ok"
    drifted = verdict.thermals_item(cool, hot, steady)
    assert drifted.status == "warn" and "SM clock" in drifted.answer and "temperature" in drifted.answer
    assert verdict.thermals_item(None, None, {"B decode": (1000.0, 800.0)}).status == "warn"


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        verdict.Verdict("better", "")
    with pytest.raises(ValueError):
        verdict.amdahl_ceiling(1.5)
    with pytest.raises(ValueError):
        verdict.overall_verdict({}, True, [])
