"""The one verdict rule, driven end to end through `measure_phase` / `run_ab` on a fake backend whose clock a
test controls: a no-op lever is neutral, a 1.10× lever is a win, a traded phase is never a plain win, the band
comes from the A/A block, the pairs alternate, fewer than 5 pairs never win, a lever whose code never runs is
invalid. bench, ab and one triage stage run on the same fake backend: they need nothing but the protocol."""

from __future__ import annotations

import pytest

from fake_backend import Effect, FakeBackend, fake_checkpoint, use_fake_host_clock
from kerneltriage.bench import ab, harness
from kerneltriage.bench.workloads import Test
from kerneltriage.engine.configuration import RunConfig

B = RunConfig.from_flags("packed_qkv")  # any real lever: the fake backend gives it the effect a test plants
RUNS = 200


def _runners(backend: FakeBackend, b: RunConfig = B) -> dict:
    checkpoint = fake_checkpoint()
    return ab.build_runners(backend, checkpoint, RunConfig(), b, "cpu", "float32")


@pytest.fixture(autouse=True)
def fake_host_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_host_clock(monkeypatch)


def _phase(backend: FakeBackend, test: Test, pairs: int = 5, b: RunConfig = B) -> ab.Phase:
    settings = ab.Settings(prompt=8, gen=4, pairs=pairs, warmups=0)
    return ab.measure_phase(_runners(backend, b), test, settings, lambda what: None)


@pytest.mark.parametrize("noise", [0.02, 0.10])
def test_a_no_op_lever_is_neutral_in_at_least_95_percent_of_runs(noise: float) -> None:
    verdicts = [_phase(FakeBackend(noise=noise, seed=seed), Test("tg", 4)).verdict.verdict for seed in range(RUNS)]
    assert verdicts.count("neutral") >= 0.95 * RUNS, {v: verdicts.count(v) for v in set(verdicts)}


def test_a_lever_ten_percent_faster_is_a_win() -> None:
    effects = {"packed_qkv": Effect(decode=1 / 1.10)}
    verdicts = [_phase(FakeBackend(effects, noise=0.01, seed=seed), Test("tg", 4)).verdict.verdict
                for seed in range(50)]
    assert verdicts.count("win") >= 0.95 * 50


def test_the_band_comes_from_the_a_a_block() -> None:
    # A' (the second runner built) is noisy, B is not: the band widens with A/A's noise, not with B/A's
    quiet = _phase(FakeBackend(noise=0.005, seed=1), Test("tg", 4))
    noisy = _phase(FakeBackend(noise=0.005, seed=1, noise_by_runner={1: 0.2}), Test("tg", 4))
    assert quiet.band < 0.03 < noisy.band
    assert noisy.band == pytest.approx(max(0.01, noisy.aa_ratio.high - 1, 1 - noisy.aa_ratio.low))
    assert (noisy.ratio.high - noisy.ratio.low) < 0.1  # B/A itself stayed tight


def test_pairs_alternate_which_side_runs_first() -> None:
    backend = FakeBackend(seed=2)
    _phase(backend, Test("pp", 8))
    firsts = []
    for i in range(0, len(backend.calls), 2):  # each sample of pp8 is one prefill call
        firsts.append(backend.calls[i].split()[0])
    aa, ab_block = firsts[:5], firsts[5:]
    assert aa == ["r0", "r1", "r0", "r1", "r0"]  # A A', A' A, A A', … : the first runner of each pair alternates
    assert ab_block == ["r0", "r2", "r0", "r2", "r0"]


def _report(backend: FakeBackend, pairs: int = 5, b: RunConfig = B) -> ab.Report:
    settings = ab.Settings(prompt=8, gen=4, pairs=pairs, warmups=0)
    return ab.run_ab(backend, _runners(backend, b), settings, lambda what: None)


def test_a_traded_phase_is_never_a_plain_win() -> None:
    effects = {"packed_qkv": Effect(prefill=1 / 1.3, decode=1.2)}  # prefill 1.3× faster, decode 1.2× slower
    report = _report(FakeBackend(effects, noise=0.01, seed=3))
    assert report.phase("prefill").verdict.verdict == "win" and report.phase("decode").slower
    assert report.verdict.verdict == "traded" and "slower in decode" in report.verdict.reason


def test_fewer_than_five_pairs_is_indicative() -> None:
    report = _report(FakeBackend({"packed_qkv": Effect(decode=1 / 1.5)}, noise=0.01, seed=4), pairs=4)
    assert report.verdict.verdict == "indicative" and "would be win" in report.verdict.reason


def test_a_lever_whose_code_never_runs_is_invalid_whatever_the_timing() -> None:
    report = _report(FakeBackend({"packed_qkv": Effect(decode=1 / 1.5, counts=False)}, noise=0.01, seed=5))
    assert report.silent == ["packed_qkv"] and report.verdict.verdict == "invalid"
    assert "never executed" in report.verdict.reason


def test_no_lever_when_the_op_is_too_small_a_share() -> None:
    backend = FakeBackend({"packed_qkv": Effect(decode=1 / 1.02)}, noise=0.01, seed=6)
    settings = ab.Settings(prompt=8, gen=4, pairs=5, warmups=0)
    report = ab.run_ab(backend, _runners(backend), settings, lambda what: None,
                       shares={"prefill": 0.0, "decode": 0.005})
    phases = (report.phase("decode"), report.phase("prefill"))
    assert all(phase.verdict.verdict == "no-lever" for phase in phases)
    assert report.verdict.verdict == "no-lever"


def test_baseline_evidence_answers_checklist_point_3() -> None:
    backend = FakeBackend(seed=7)
    settings = ab.Settings(prompt=8, gen=4, pairs=5, warmups=0)
    evidence = {"attention backend": "2 attention call shape(s) fall back to math (decode)"}
    report = ab.run_ab(backend, _runners(backend), settings, lambda what: None, baseline_evidence=evidence)
    point = next(item for item in report.checklist if item.point == "baseline")
    assert point.status == "warn" and "fall back to math" in point.answer


def test_bench_runs_through_the_protocol_alone() -> None:
    from kerneltriage.bench.compare import run_bench

    backend = FakeBackend({"packed_qkv": Effect(decode=0.5)}, noise=0.0, seed=8)
    runner = backend.build(fake_checkpoint(), B)
    results = run_bench(runner, [Test("pp", 8), Test("tg", 4)], [], harness.Settings(repeats=3))
    tg = next(r for r in results if r.test.kind == "tg")
    assert [r.test.name for r in results] == ["pp8", "tg4"]
    assert tg.timed.median == pytest.approx(4 * 1e-3 * 0.5)  # 4 steps at the planted half cost
    assert runner.counters["packed_qkv"] > 0


def test_a_triage_stage_runs_through_the_protocol_alone() -> None:
    from kerneltriage.triage.run import _State, stage_climb, stage_dispatch, stage_setup, stage_where
    from kerneltriage.triage.setup import Workload, budget_for

    backend = FakeBackend({"one_sync": Effect(decode=1 / 1.3)}, noise=0.01, seed=9, backend_name="torch")
    runner = backend.build(fake_checkpoint(), RunConfig())
    state = _State(backend, runner, Workload(8, 4, 0), budget_for("cpu"), False)
    for stage in (stage_setup, stage_where, stage_dispatch, stage_climb):
        stage(state)
    assert state.ladder.final.lever_names == ("one_sync",)
    assert state.ladder.rungs[1].ratio("decode")["estimate"] > 1.2  # the stack, one_sync in it
    # packed_qkv changes nothing: leaving it out of the stack is not slower, so it goes
    packed = [t for t in state.ladder.trials if "-packed_qkv" in t.candidate.text.split(",")]
    assert packed and all(t.result is None or t.result.verdict in ("neutral", "no-lever") for t in packed)
    refused = {r.text: r.why for r in state.ladder.refused}
    assert refused["graphs"] == "needs a CUDA device, not cpu"  # graphs does not run on this device
