"""The climb on the fake backend (tests/fake_backend.py): levers whose effect on time is planted, judged by the real
`ab` through triage/trials.py, so what is tested is the whole rule — candidates from the lever table, sequential
pairs, the noise band, the verdict, adoption and confirmation."""

from __future__ import annotations

import pytest

from fake_backend import Effect, FakeBackend, fake_checkpoint, use_fake_host_clock
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage.candidates import candidates
from kerneltriage.triage.climb import Climb, gain
from kerneltriage.triage.ladder import Ladder
from kerneltriage.triage.setup import Budget, Workload
from kerneltriage.triage.trials import Trials

WORKLOAD = Workload(prompt=16, gen=8, depth=0)
BUDGET = Budget(repeats=1, warmups=1, profile_steps=2, lever_pairs=12, lever_tokens=8, lever_prompt=16,
                census_prompt=4, census_tokens=2, context_depth=0, climb_seconds={"quick": 1e9})
CEILINGS = Ceilings(1e11, 1e12, "measured", "fake", "float32")


def climb(effects: dict[str, Effect], only: set[str], favor: str = "balanced", seed: int = 0,
          noise: float = 0.02, spent_after: int | None = None, stack: bool = True) -> tuple[Ladder, FakeBackend]:
    """A climb from stock over the levers `only` (the table's rows for torch on CUDA), on a fake GPU; with
    `spent_after`, its budget runs out once that many candidates have been judged; `stack`: the stack first."""
    backend = FakeBackend(effects, noise=noise, seed=seed, device="cuda", backend_name="torch")
    root = backend.build(fake_checkpoint(), RunConfig())
    trials = Trials(backend, root, WORKLOAD, BUDGET, CEILINGS)

    def propose(config, breakdowns, start):  # noqa: ANN001, ANN202
        found, refused = candidates(config, root.place, breakdowns, reference=start)
        return [c for c in found if c.text in only], [r for r in refused if r.text in only]

    seconds = 1e9
    if spent_after is not None:
        judge, judged = trials.judge, []

        def counted(base, candidate):  # noqa: ANN001, ANN202
            judged.append(candidate.text)
            return judge(base, candidate)

        trials.judge = counted  # type: ignore[method-assign]
        trials.elapsed = lambda: 2e9 if len(judged) >= spent_after else 0.0  # type: ignore[method-assign]
    ladder, final = Climb(trials, propose, favor, seconds, stack=stack).run(root.run_config)
    trials.release(final)
    return ladder, backend


def adopted(ladder: Ladder) -> list[str]:
    return [rung.added for rung in ladder.rungs[1:]]


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_host_clock(monkeypatch)


@pytest.mark.parametrize("stack", [True, False])
def test_levers_that_win_only_together_are_both_found(stack: bool) -> None:
    effects = {"graphs": Effect(decode=0.3), "one_sync": Effect(decode=0.8, needs=("graphs",))}
    ladder, _ = climb(effects, {"graphs", "one_sync", "packed_qkv"}, stack=stack)
    assert ladder.final.lever_names == ("graphs", "one_sync")  # packed_qkv, a no-op, never kept
    assert ladder.stop.endswith("adopted nothing: no candidate wins")
    if stack:  # the stack won; leaving either out is slower; leaving the no-op out changed nothing
        stacked, removed = adopted(ladder)
        assert set(stacked.split("+")) == set(effects) | {"packed_qkv"}
        assert removed == "-packed_qkv"
        left_out = {t.candidate.text: t.result.verdict for t in ladder.trials if t.round == 2}
        assert left_out == {"-graphs": "loss", "-one_sync": "loss", "-packed_qkv": "neutral"}
        return
    assert adopted(ladder) == ["graphs", "one_sync"]
    first = [t for t in ladder.trials if t.candidate.text == "one_sync"][0]
    assert first.round == 1 or first.base == "levers=graphs"  # judged against stock (or cut by graphs' restart)
    rung = ladder.rungs[2]
    assert rung.trial.base == "levers=graphs" and rung.ratio("decode")["estimate"] == pytest.approx(1.25, rel=0.05)


@pytest.mark.parametrize("stack", [True, False])
def test_a_lever_that_wins_alone_but_loses_in_combination_is_not_adopted(stack: bool) -> None:
    effects = {"packed_qkv": Effect(prefill=0.75),
               "last_logits": Effect(prefill=0.85, instead={"packed_qkv": Effect(prefill=1.3)})}
    ladder, _ = climb(effects, {"packed_qkv", "last_logits"}, stack=stack)
    assert ladder.final.lever_names == ("packed_qkv",)
    if stack:  # the stack (0.975 of stock) is judged first, then the bottom-up rounds or leaving one out
        assert ladder.trials[0].candidate.text == "packed_qkv+last_logits"
        return
    assert adopted(ladder) == ["packed_qkv"]
    judged = [(t.base, t.result.verdict) for t in ladder.trials if t.candidate.text == "last_logits"]
    assert judged[0] == ("levers=(stock)", "win")  # it did win alone …
    assert all(verdict != "win" for base, verdict in judged[1:]) and len(judged) >= 2  # … never on top of packed_qkv


@pytest.mark.parametrize(("favor", "taken"), [("prefill", True), ("decode", False), ("balanced", False)])
def test_a_traded_lever_follows_favor(favor: str, taken: bool) -> None:
    effects = {"prefill_graphs": Effect(prefill=0.5, decode=1.25)}  # decode is most of this workload's time
    ladder, _ = climb(effects, {"prefill_graphs"}, favor)
    trial = ladder.trials[0]
    assert trial.result.verdict == "traded"
    assert (adopted(ladder) == ["prefill_graphs"]) == taken


def test_the_best_winner_judged_is_adopted_when_the_budget_runs_out_in_its_round() -> None:
    """Two winners judged, then the budget is spent: the larger is adopted (its own A/B judged it), the other is not
    (it would need a confirmation on top of the first), and the stop says why."""
    effects = {"packed_qkv": Effect(prefill=0.9), "packed_gate_up": Effect(prefill=0.8)}
    ladder, _ = climb(effects, {"packed_qkv", "packed_gate_up"}, spent_after=2, stack=False)
    assert {t.candidate.text for t in ladder.trials if t.result.verdict == "win"} == {"packed_qkv", "packed_gate_up"}
    assert adopted(ladder) == ["packed_gate_up"]
    assert ladder.stop.startswith("budget spent") and ladder.final.lever_names == ("packed_gate_up",)


def test_a_lever_whose_requirement_is_missing_is_never_tried() -> None:
    effects = {"pdl": Effect(decode=0.5)}
    ladder, backend = climb(effects, {"pdl", "packed_qkv"})
    assert not any(r.run_config.has("pdl") for r in backend.built)
    assert ("pdl", "needs fused_layer on beside it") in {(r.text, r.why) for r in ladder.refused}
    assert "pdl" not in adopted(ladder)


def test_a_requirement_once_adopted_opens_the_lever_that_needs_it() -> None:
    effects = {"fused_layer": Effect(decode=0.5), "pdl": Effect(decode=0.8, needs=("fused_layer",))}
    for stack in (True, False):
        ladder, backend = climb(effects, {"fused_layer", "pdl"}, stack=stack)
        assert ladder.final.lever_names == ("fused_layer", "pdl")
        assert adopted(ladder) == (["fused_layer+pdl"] if stack else ["fused_layer", "pdl"])
        assert all(r.run_config.has("fused_layer") for r in backend.built if r.run_config.has("pdl"))
        if stack:  # leaving fused_layer out takes pdl with it
            left_out = {t.candidate.config.label for t in ladder.trials if t.candidate.text == "-fused_layer"}
            assert left_out == {"levers=(stock)"}


def test_a_no_op_lever_is_rarely_adopted() -> None:
    """200 climbs over one lever that changes nothing: adopted in fewer than 5% (the band and the sequential
    rule together; each climb judges it once, and again only after a false adoption)."""
    runs = [climb({}, {"packed_qkv"}, seed=seed, noise=0.05)[0] for seed in range(200)]
    rate = sum(bool(adopted(ladder)) for ladder in runs) / len(runs)
    assert rate < 0.05
    assert all(ladder.trials[0].result.verdict in ("neutral", "win", "loss", "no-lever") for ladder in runs)


def test_a_no_op_lever_in_the_stack_rarely_stays() -> None:
    """200 climbs where the stack holds a lever that wins (graphs) and one that changes nothing: the no-op stays
    in the final configuration in fewer than 5% (leaving it out must read slower to keep it)."""
    runs = [climb({"graphs": Effect(decode=0.5)}, {"graphs", "packed_qkv"}, seed=seed, noise=0.05)[0]
            for seed in range(200)]
    assert all(set(ladder.trials[0].candidate.text.split("+")) == {"graphs", "packed_qkv"} for ladder in runs)
    assert all(ladder.final.has("graphs") for ladder in runs)
    assert sum(ladder.final.has("packed_qkv") for ladder in runs) / len(runs) < 0.05


def test_small_parts_that_add_up_stay_in_the_stack() -> None:
    """Three levers worth 2.5% of prefill each (inside the noise one by one) and one that wins: leaving each out
    alone is neutral, but together they are 7% of prefill, so they stay."""
    small = {name: Effect(prefill=0.975) for name in ("packed_qkv", "packed_gate_up", "last_logits")}
    ladder, _ = climb({"graphs": Effect(decode=0.5), **small}, {"graphs", *small})
    together = [t for t in ladder.trials if t.round == 2 and t.candidate.text.count("-") > 1]
    assert together and together[0].result.phases["prefill"]["slower"]
    assert set(ladder.final.lever_names) == {"graphs", *small}


def test_gain_weighs_the_workload_and_refuses_what_is_not_a_win() -> None:
    class Result:  # the part of a LeverResult `gain` reads
        def __init__(self, verdict: str, prefill: float, decode: float, won: str = "") -> None:
            self.verdict, self._ratios = verdict, {"prefill": prefill, "decode": decode}
            self.phases = {p: {"verdict": "win" if p == won else "neutral"} for p in self._ratios}

        def ratio(self, phase: str) -> float:
            return self._ratios[phase]

    weights, bands = {"prefill": 1.0, "decode": 3.0}, {"prefill": 0.02, "decode": 0.02}
    assert gain(Result("win", 2.0, 1.0), "balanced", weights, bands) == pytest.approx(4 / 3.5)
    assert gain(Result("neutral", 2.0, 1.0), "balanced", weights, bands) is None
    traded = Result("traded", 2.0, 0.8, won="prefill")
    assert gain(traded, "prefill", weights, bands) == 2.0 and gain(traded, "decode", weights, bands) is None
    assert gain(traded, "balanced", weights, bands) is None  # 4 / (0.5 + 3.75): slower on this workload
    worth = Result("traded", 3.0, 0.95, won="prefill")  # 4 / (0.33 + 3.16) = 1.15: this workload gains
    assert gain(worth, "balanced", weights, bands) == pytest.approx(4 / (1 / 3 + 3 / 0.95))


def test_speculation_is_a_candidate_with_prompts_and_is_tried_after_the_levers() -> None:
    from kerneltriage.engine.levers import Place

    found, _ = candidates(RunConfig(), Place("torch", "cuda", "llama"), {}, speculate=True)
    texts = [c.text for c in found]
    assert texts[-2:] == ["spec=ngram", "spec=suffix"] and all(not t.startswith("spec=") for t in texts[:-2])
    assert found[-1].config.speculation.source == "suffix" and found[-1].config.levers == ()
    assert not any(c.text.startswith("spec=") for c in candidates(RunConfig(), Place("torch", "cuda", "llama"), {})[0])


def test_a_choice_a_backend_does_not_take_is_refused_by_the_table() -> None:
    from kerneltriage.engine.levers import Place, parse_setting, refusal

    autotune = parse_setting("compile=max-autotune-no-cudagraphs")
    assert refusal(autotune, (), Place("mlx", "cpu", "llama")) == "takes compile=default on mlx"
    assert refusal(parse_setting("compile=default"), (), Place("mlx", "cpu", "llama")) is None
    assert refusal(autotune, (), Place("torch", "cpu", "llama")) is None
