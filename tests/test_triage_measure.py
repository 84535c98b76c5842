"""The climb's lever A/Bs (triage/trials.py): run through `ab` on stock copies of the baseline's weights, judged by
ab's one verdict rule (a null lever is neutral, a lever that never runs is invalid and never adopted)."""

from __future__ import annotations

import itertools
import threading
from typing import Callable

import pytest
import torch

from conftest import ARCHS, tiny_runner
from kerneltriage.backends.torch import levers as torch_levers
from kerneltriage.bench import ab
from kerneltriage.bench.harness import Sample
from kerneltriage.bench.workloads import Test
from kerneltriage.engine.backend import get_backend
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.levers import LEVERS, LeverSetting
from kerneltriage.engine.probes import GateRow, SdpaCall
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.levers import parse_setting
from kerneltriage.triage import climbing
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.candidates import Candidate
from kerneltriage.triage.climb import gain
from kerneltriage.triage.ladder import Ladder, Trial
from kerneltriage.triage.setup import Budget, Workload
from kerneltriage.triage.shares import baseline_evidence, lever_shares
from kerneltriage.triage import trials as trials_module
from kerneltriage.triage.trials import Trials

BACKEND = get_backend("torch")
PROMPT = list(range(1, 17))
PACKED_QKV = LeverSetting(LEVERS["packed_qkv"])
# triage's own lever A/B: MIN_PAIRS pairs, so that a verdict other than `indicative` can be reached
FIVE_PAIRS = ab.Settings(prompt=8, gen=4, pairs=5, warmups=0)
DECODE = Breakdown("decode", 1e-3, {"q_proj": 1e-4, "k_proj": 5e-5, "v_proj": 5e-5, "down_proj": 3e-4}, None)


class _Uncopyable:
    """A step that, like a captured CUDA graph, cannot be deep-copied."""

    def __init__(self, step) -> None:  # noqa: ANN001
        self.step, self.lock = step, threading.Lock()

    def __call__(self, *args: object) -> torch.Tensor:
        return self.step(*args)


def test_candidate_is_a_stock_copy_with_the_baseline_levers_plus_one() -> None:
    runner = tiny_runner("qwen2", "packed_qkv,fused_norm")
    runner.decode_step = _Uncopyable(runner.decode_step)  # the baseline's own step objects must not be copied
    expected = list(generate_step(runner, PROMPT, SamplingParams(), 8))
    before = dict(runner.counters)
    candidate = BACKEND.copy(runner, runner.run_config.plus(LeverSetting(LEVERS["last_logits"])))
    assert candidate.run_config.lever_names == ("packed_qkv", "fused_norm", "last_logits")
    assert list(generate_step(candidate, PROMPT, SamplingParams(), 8)) == expected and len(set(expected)) > 1
    assert dict(runner.counters) == before  # the copy's levers count for the copy, not the baseline
    assert all(candidate.counters[lever] > 0 for lever in candidate.run_config.lever_names)
    ours = {p.data_ptr() for p in runner.model.parameters()}
    assert not ours & {p.data_ptr() for p in candidate.model.parameters()}  # weights copied, not shared
    # packed once: each attention holds one packed q/k/v, as on the baseline
    children = [name for name, _ in candidate.model.layers[0].self_attn.named_children()]
    assert children.count("packed_q_proj_k_proj_v_proj") == 1
    with pytest.raises(Exception, match="already on"):
        runner.run_config.plus(PACKED_QKV)


def _trials(runner, pairs: int = 5) -> Trials:  # noqa: ANN001
    """The climb's bench over the tiny runner: pp8, tg4, at most `pairs` pairs a block."""
    budget = Budget(repeats=1, warmups=0, profile_steps=2, lever_pairs=pairs, lever_tokens=4, lever_prompt=8,
                    census_prompt=4, census_tokens=2, context_depth=0)
    return Trials(BACKEND, runner, Workload(8, 4, 0), budget, Ceilings(20e9, 100e9, "measured", "test", "float32"))


def _candidate(runner, text: str) -> Candidate:  # noqa: ANN001
    setting = parse_setting(text)
    return Candidate(text, setting.lever.question, runner.run_config.plus(setting), {})


def test_every_block_runs_its_sides_in_caches_of_one_size(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = tiny_runner("llama")
    runner.reset_cache(100)  # left by an earlier, longer stage
    trials = _trials(runner)
    built: list = []
    real_copy = BACKEND.copy
    monkeypatch.setattr(BACKEND, "copy", lambda r, c: built.append(real_copy(r, c)) or built[-1])
    base = trials.base(runner.run_config)
    caches = {runner.model.cache.max_len} | {r.model.cache.max_len for r in built if r.model.cache is not None}
    assert len(caches) == 1 and max(caches) < 100  # A and its twin: one cache, not the 100-slot one of before
    result, note, _ = trials.judge(base, _candidate(runner, "last_logits"))
    assert note == "" and result.lever == "last_logits" and result.counters["last_logits"] > 0
    assert set(result.phases) == {"prefill", "decode"}
    trials.release(base)
    assert runner.model.cache is None  # the user's runner keeps no cache once its base is released


@pytest.mark.parametrize("arch", ARCHS)
def test_stock_copy_copies_every_weight_and_no_lever(arch: str) -> None:
    from kerneltriage.backends.torch.load import stock_copy
    from kerneltriage.backends.torch.models.llama import sdpa_attention

    from kerneltriage.engine.levers import LEVERS

    norms = ",fused_norm" if arch in LEVERS["fused_norm"].architectures else ""  # Gemma's (1 + w) norms: refused
    runner = tiny_runner(arch, "packed_qkv,packed_gate_up" + norms)  # explicit weights: every one distinct
    copy = stock_copy(runner.model)
    source = dict(runner.model.named_parameters(remove_duplicate=False))
    copied = dict(copy.named_parameters(remove_duplicate=False))
    assert copied and all(torch.equal(p, source[name]) for name, p in copied.items())
    assert len({p.data_ptr() for p in copied.values()}) == len(copied) - runner.config.tie_embeddings
    assert torch.equal(copy.inv_freq, runner.model.inv_freq) and copy.inv_freq.dtype == torch.float32
    local = getattr(runner.model, "inv_freq_local", None)  # the sliding layers' RoPE (Gemma-3)
    assert local is None or (torch.equal(copy.inv_freq_local, local) and local.dtype == torch.float32)
    assert (copy.lm_head.weight is copy.embed_tokens.weight) == runner.config.tie_embeddings
    assert copy.attention is sdpa_attention and not any("packed" in name for name in copied)


def _fake_timer(monkeypatch: pytest.MonkeyPatch, b_factor: float) -> None:
    """ab's samples run for real (tokens and lever counters are real) but report time from a deterministic fake
    clock: 1 ms per token, times `b_factor` on the candidate, times 1 ± 1% with the sign alternating from sample to
    sample. Within each pair the side that runs first is 2% slower, and pairs alternate which side runs first: the
    noise is symmetric between the sides by construction, and the A/A band it gives is ±2%."""
    calls, real = itertools.count(), ab.sampler_of

    def sampler(runner, test: Test, *rest: object) -> Callable[[], Sample]:  # noqa: ANN001
        run = real(runner, test, *rest)
        factor = b_factor if runner.run_config.has("packed_qkv") else 1.0

        def sample() -> Sample:
            noise = 0.01 if next(calls) % 2 == 0 else -0.01
            return run()._replace(timed=1e-3 * test.n * factor * (1 + noise))
        return sample

    monkeypatch.setattr(ab, "sampler_of", sampler)
    monkeypatch.setattr(ab, "_load_contention", lambda report: None)  # fake times: another load cannot move them


def _counts_only(runner, value) -> None:  # noqa: ANN001
    """A packed_qkv that changes nothing: it only counts its executions (one per prefill)."""
    stock = runner.prefill_step

    def prefill(model, tokens, start):  # noqa: ANN001, ANN202
        runner.counters["packed_qkv"] += 1
        return stock(model, tokens, start)

    runner.prefill_step = prefill


@pytest.mark.parametrize(("b_factor", "expected"), [(1.0, "neutral"), (0.8, "win"), (1.25, "loss")])
def test_a_null_lever_is_neutral_and_a_real_difference_is_not(monkeypatch: pytest.MonkeyPatch, b_factor: float,
                                                              expected: str) -> None:
    monkeypatch.setitem(torch_levers.APPLIERS, "packed_qkv", _counts_only)
    _fake_timer(monkeypatch, b_factor)
    runner = tiny_runner("llama")
    trials = _trials(runner)
    base = trials.base(runner.run_config)
    result, _, _ = trials.judge(base, _candidate(runner, "packed_qkv"))
    assert result.verdict == expected, result.reason
    assert result.counters["packed_qkv"] > 0
    # only a win has its outputs checked (the climb adopts nothing else)
    assert ("greedy digests equal" in result.correctness) == (expected == "win")
    for phase in ("prefill", "decode"):
        record = result.phases[phase]
        assert record["band"] == pytest.approx(1.01 / 0.99 - 1)  # the fake clock's noise, sized by the A/A block
        assert record["ratio"]["confidence"] == pytest.approx(0.9375)  # [min, max] of 5 pairs, one look
        assert result.ratio(phase) == pytest.approx(1 / b_factor, rel=0.03)  # B/A throughput
        assert record["verdict"] == expected
    finding = climbing.findings(Ladder([], [Trial(1, _candidate(runner, "packed_qkv"), "stock", result)]))
    assert finding[0].confidence == "measured" and finding[0].measured_gain == pytest.approx(1 / b_factor, rel=0.03)


def test_a_lever_that_never_runs_is_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(torch_levers.APPLIERS, "packed_qkv", lambda runner, value: None)
    runner = tiny_runner("llama")
    trials = _trials(runner)
    result, _, _ = trials.judge(trials.base(runner.run_config), _candidate(runner, "packed_qkv"))
    assert result.verdict == "invalid" and "never executed" in result.reason and "packed_qkv" in result.reason
    assert result.counters == {"packed_qkv": 0} and not result.valid
    assert result.ratio("decode") is None and result.ratio("prefill") is None  # no gain from an invalid A/B
    ladder = Ladder([], [Trial(1, _candidate(runner, "packed_qkv"), "stock", result)])
    assert climbing.findings(ladder) == []  # an invalid A/B makes no finding
    assert gain(result, "balanced", {"prefill": 1.0, "decode": 1.0}, {"prefill": 0.01, "decode": 0.01}) is None


def test_a_lever_that_cannot_apply_here_is_refused_before_anything_runs() -> None:
    runner = tiny_runner("llama")
    trials = _trials(runner)
    base = trials.base(runner.run_config)
    before = dict(runner.counters)
    result, note, _ = trials.judge(base, _candidate(runner, "graphs"))
    assert result is None and note == "refused when built: --levers graphs: needs a CUDA device, not cpu"
    assert dict(runner.counters) == before  # nothing ran


def test_lever_shares_follow_the_seams_and_phases_of_the_table() -> None:
    prefill = Breakdown("prefill", 1e-2, {"q_proj": 2e-3, "attention": 3e-3, "output projection": 1e-3}, None)
    breakdowns = {"prefill": prefill, "decode": DECODE}  # prefill: 40% gap; decode: 50% gap

    def shares(text: str) -> dict[str, float]:
        name, _, value = text.partition("=")
        return lever_shares(LeverSetting(LEVERS[name], value or None), breakdowns)

    assert shares("packed_qkv") == pytest.approx({"prefill": 0.2 + 0.4, "decode": 0.2 + 0.5})
    assert shares("last_logits") == pytest.approx({"prefill": 0.1 + 0.4, "decode": 0.0})  # a prefill lever
    assert shares("one_sync") == pytest.approx({"prefill": 0.0, "decode": 0.5})  # the loop: the gap only
    assert shares("sdpa_backend=flash") == pytest.approx({"prefill": 0.3 + 0.4, "decode": 0.5})
    assert shares("kernel=pkg.mod:NAME") == {}  # no seam says what it touches: no share, no no-lever
    breakdowns["decode"] = Breakdown("decode", 1e-3, {"q_proj": 6e-4, "attention": 6e-4}, None)  # no gap seen
    assert shares("one_sync") == {"prefill": 0.0}  # host time not observed: no share, the timing decides
    assert shares("packed_qkv")["decode"] == pytest.approx(0.5)  # a seam's classes still give one


def test_baseline_evidence_from_the_gate_audit() -> None:
    call = SdpaCall((1, 4, 1, 16), (1, 2, 9, 16), "float32", None, False, True)
    assert baseline_evidence([]) == {}
    assert baseline_evidence([GateRow("decode", call, 2.0, "flash (cpu)")]) == {"attention backend": None}
    fallen = baseline_evidence([GateRow("decode", call, 2.0, "math"), GateRow("prefill", call, 2.0, "flash")])
    assert fallen == {"attention backend": "1 attention call shape(s) fall back to math (decode)"}


def test_the_setup_warms_up_at_full_size_only_where_a_first_run_differs() -> None:
    from kerneltriage.triage.setup import first_run_differs

    assert not first_run_differs(tiny_runner("llama"))  # stock: warm_up's short run did the lazy inits
    assert not first_run_differs(tiny_runner("llama", "packed_qkv,fused_norm"))  # model levers: nothing captured
    assert first_run_differs(tiny_runner("llama", "one_sync"))  # a loop lever: what replaces the loop runs first


@pytest.mark.parametrize("seconds_per_token, sizes", [(0.0, (8, 4)), (0.2, (8, 4)), (0.3, (4, 2)), (2.0, (4, 2))])
def test_samples_shrink_where_the_fewest_pairs_would_overrun(monkeypatch: pytest.MonkeyPatch,
                                                             seconds_per_token: float, sizes: tuple) -> None:
    """A slow engine (each token costs `seconds_per_token` more on a patched clock): where its fewest pairs would
    take longer than SHRINK_SECONDS its lever samples shrink to the CPU's noise budget, not below trials.SMALLEST; a
    faster one keeps the workload's pp8/tg4."""
    runner = tiny_runner("llama")
    trials = _trials(runner)
    monkeypatch.setattr(trials_module, "SMALLEST", (4, 2))
    clock = {"now": 0.0}
    real_sampler = trials_module.ab.sampler_of

    def slowed(r, test, prompt_set):  # noqa: ANN001, ANN202
        sample = real_sampler(r, test, prompt_set)

        def run() -> None:
            sample()
            clock["now"] += seconds_per_token * test.n
        return run

    monkeypatch.setattr(trials_module.ab, "sampler_of", slowed)
    monkeypatch.setattr(trials_module.time, "perf_counter", lambda: clock["now"])
    twin = BACKEND.copy(runner, runner.run_config)
    settings = trials._sized(runner, twin)
    # a pair is 2 × (8 + 4) tokens: at 0.2 s a token 4.8 s, its 5 pairs 24 s, under SHRINK_SECONDS (30): kept; at
    # 0.3 s, 36 s: × 10 / 36, pp8 → 2 → 4 (SMALLEST), tg4 → 1 → 2; at 2 s the same floors
    assert (settings.prompt, settings.gen) == sizes
    assert settings.pairs >= 5
