"""Planted faults that correctness and proof of execution must catch: a 3% logit error on the real default model
in bf16, a wrong token only after a graph window (position 256), a lever counted at capture but never replayed."""

from __future__ import annotations

import pytest
import torch

from conftest import rerun_capture, tiny_checkpoint, tiny_runner
from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch import accelerate, graphed, levers
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.bench import equivalence
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

GREEDY = SamplingParams()


class _FakeGraph:
    """Stands in for a CUDA graph on the CPU: a replay re-runs the kernels, never the Python that captured them."""

    def replay(self) -> None:
        pass


def fake_capture(fn, warmups: int):  # noqa: ANN001, ANN201 - the signature of cudagraph.capture
    for _ in range(warmups):
        fn()
    return _FakeGraph(), fn()


def _graphed(levers: str = ""):  # noqa: ANN202
    runner = tiny_runner("llama", levers)
    accelerate.graphs(runner, capture_fn=fake_capture)  # CPU: graphs' bookkeeping with a fake capture
    return runner


def test_counters_under_graphs_count_replays_not_captures() -> None:
    runner = _graphed("fused_norm")
    tokens = list(generate_step(runner, list(range(1, 9)), GREEDY, 12))
    steps = len(tokens) - 1  # the first token comes from the prefill
    norms_per_step = 2 * runner.config.num_layers + 1
    assert runner.counters["graphs"] == steps
    assert runner.counters["fused_norm"] == steps * norms_per_step + (2 * 2 + 1)  # + the one eager prefill


def test_a_lever_counted_at_capture_only_stays_at_zero() -> None:
    runner = tiny_runner("llama")
    stock, seen = runner.decode_step, []

    def capture_only(model, tokens, start):  # noqa: ANN001, ANN202 - planted: counts in warm-ups, not when captured
        seen.append(start)
        if len(seen) <= graphed.GRAPH_WARMUPS:
            runner.counters["one_sync"] += 1
        return stock(model, tokens, start)

    runner.decode_step = capture_only
    accelerate.graphs(runner, capture_fn=fake_capture)
    list(generate_step(runner, list(range(1, 9)), GREEDY, 12))
    assert len(seen) == graphed.GRAPH_WARMUPS + 1  # ran in the warm-ups and the capture only
    assert runner.counters["one_sync"] == 0 and runner.counters["graphs"] == 11


def _planted_after(runner, position: int) -> None:  # noqa: ANN001 - a decode step wrong from `position` on
    stock = runner.decode_step
    bias = torch.zeros(runner.config.vocab_size)
    bias[7] = 1e3  # token 7 wins every step from there

    def wrong_late(model, tokens, start):  # noqa: ANN001, ANN202
        logits = stock(model, tokens, start)
        return logits + bias if start >= position else logits

    runner.decode_step = wrong_late


def _windowed(runner):  # noqa: ANN001, ANN202 - a static cache, as graphs sets (without a window on the CPU it
    runner.cache_type = StaticKVCache  # behaves as the plain cache): the check must then cross a graph window
    return runner


@pytest.mark.parametrize("lever", ["one_sync", "fused_norm,one_sync"])  # an exact lever, and a reordering one
def test_a_wrong_token_after_the_graph_window_is_caught(lever: str) -> None:
    checkpoint = tiny_checkpoint("llama", max_context=512)
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    b = _windowed(BACKEND.build(checkpoint, RunConfig.from_flags(lever), "cpu", "float32"))
    _planted_after(b, accelerate.GRAPH_WINDOW + 4)
    caught = equivalence.check_outputs(BACKEND, a, b)
    assert caught.tokens == equivalence.WINDOW_TOKENS and not caught.passed
    control = _windowed(BACKEND.build(checkpoint, RunConfig.from_flags(lever), "cpu", "float32"))
    assert equivalence.check_outputs(BACKEND, a, control).passed
    plain = BACKEND.build(checkpoint, RunConfig.from_flags(lever), "cpu", "float32")  # no window to cross: short
    assert equivalence.digest_prompts(a, plain)[1] == equivalence.DIGEST_TOKENS


def test_the_window_length_is_what_catches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tiny_checkpoint("llama", max_context=512)
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    b = _windowed(BACKEND.build(checkpoint, RunConfig.from_flags("one_sync"), "cpu", "float32"))
    _planted_after(b, accelerate.GRAPH_WINDOW + 4)
    monkeypatch.setattr(equivalence, "WINDOW_TOKENS", equivalence.DIGEST_TOKENS)  # the old 32-token check …
    assert equivalence.check_outputs(BACKEND, a, b).passed  # … passes the fault


@pytest.fixture(scope="module")
def bf16_default(default_checkpoint):  # noqa: ANN001, ANN201 - the real default model in bf16, loaded once
    return BACKEND.build(default_checkpoint, RunConfig(), "cpu", "bfloat16")


@pytest.mark.real_model
@pytest.mark.parametrize(("scale", "passes"), [(1.0, True), (1.03, False)])
def test_a_three_percent_logit_error_fails_on_the_real_model_in_bf16(
        bf16_default, monkeypatch: pytest.MonkeyPatch, scale: float, passes: bool) -> None:  # noqa: ANN001
    monkeypatch.setattr(equivalence, "DIGEST_PROMPTS", 1)  # one prompt of 16 tokens, 8 positions: bf16 is slow here
    monkeypatch.setattr(equivalence, "DIGEST_TOKENS", 8)
    stock_fused_norm = levers.APPLIERS["fused_norm"]

    def planted(runner, value):  # noqa: ANN001, ANN202 - a reordering lever whose code is off by `scale`
        stock_fused_norm(runner, value)
        logits = runner.model.logits
        runner.model.logits = lambda hidden: logits(hidden) * scale

    monkeypatch.setitem(levers.APPLIERS, "fused_norm", planted)
    a = bf16_default
    b = BACKEND.copy(a, RunConfig.from_flags("fused_norm"))  # a stock copy of the weights, the lever applied
    result = equivalence.check_outputs(BACKEND, a, b)
    assert result.reference == "float32" and result.error_a > 1e-2  # bf16's own error: as large as the fault
    assert result.passed is passes, result.detail
    assert (result.semantic_error > 0.5 * (scale - 1)) if scale != 1.0 else result.semantic_error < 1e-4


def _approximating(monkeypatch: pytest.MonkeyPatch, quality: str, keep: float):  # noqa: ANN202
    """A planted lever that approximates: it drops the logits of the vocabulary's top `1 - keep` ids (a crude
    vocabulary compaction), declaring `quality`."""
    import dataclasses

    from kerneltriage.engine import levers as table

    lever = dataclasses.replace(table.LEVERS["last_logits"], name="compact_vocab", numerics="approximates",
                                quality=quality, question="delete", stage="model", phases=("prefill", "decode"))

    def apply(runner, value):  # noqa: ANN001, ANN202
        logits, cut = runner.model.logits, int(runner.config.vocab_size * keep)

        def compacted(hidden):  # noqa: ANN001, ANN202
            runner.counters["compact_vocab"] += 1
            out = logits(hidden).clone()
            out[..., cut:] = -1e4
            return out

        runner.model.logits = compacted

    monkeypatch.setitem(levers.APPLIERS, "compact_vocab", apply)
    monkeypatch.setitem(table.LEVERS, "compact_vocab", lever)
    monkeypatch.setitem(table.ORDER, "compact_vocab", len(table.ORDER))
    return RunConfig((table.LeverSetting(lever),))


@pytest.mark.parametrize(("keep", "passes"), [(1.0, True), (0.3, False)])
def test_a_lever_that_approximates_is_judged_by_its_declared_metric(monkeypatch: pytest.MonkeyPatch, keep: float,
                                                                    passes: bool) -> None:
    config = _approximating(monkeypatch, "top1>=0.95", keep)
    checkpoint = tiny_checkpoint("llama")
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    b = BACKEND.build(checkpoint, config, "cpu", "float32")
    result = equivalence.check_outputs(BACKEND, a, b)
    assert list(result.quality) == ["top1>=0.95"] and result.logit_error is None  # no logit tolerance applied
    assert result.passed is passes, result.detail
    value = result.quality["top1>=0.95"][0]
    assert value == 1.0 if keep == 1.0 else value < 0.95


def test_a_speculative_run_captures_every_graph_it_may_replay_before_its_first_step() -> None:
    """Plain steps and both padded verify shapes, in every window the run can reach (302 positions: a window of 256
    slots and the whole cache), are captured before the first replay — where the controller verifies differs between
    runs, and a capture must not land inside one — and a second run on the runner captures nothing."""
    from kerneltriage.backends.torch.speculative import install_speculation
    from kerneltriage.engine.speculative.config import parse_speculation

    runner, replays_at_capture = tiny_runner("llama", max_context=600), []
    plain = list(generate_step(tiny_runner("llama", max_context=600), [210, 158, 247, 186, 114, 261] * 2, GREEDY, 290))
    rerun = rerun_capture(runner)  # replays recompute: the tokens are real

    def recording_capture(fn, warmups: int):  # noqa: ANN001, ANN202
        replays_at_capture.append(runner.counters["graphs"])
        return rerun(fn, warmups)

    accelerate.graphs(runner, capture_fn=recording_capture)
    install_speculation(runner, parse_speculation("suffix", None))
    prompt = [210, 158, 247, 186, 114, 261] * 2
    first = list(generate_step(runner, prompt, GREEDY, 290))
    assert first == plain  # the captures' writes past the text did not reach it
    windows = {(window, rows) for window in (256, runner.cache_capacity) for rows in (1, 16, 32)}  # the cache: 333
    graphs = set(runner.decode_step.graphs) | set(runner.verify_step.graphs)
    assert windows <= graphs and replays_at_capture and set(replays_at_capture) == {0}
    captured = len(replays_at_capture)
    assert list(generate_step(runner, prompt, GREEDY, 290)) == first and len(replays_at_capture) == captured
    assert runner.counters["spec"] > 0


@pytest.mark.parametrize(("planted_in_a", "passes"), [(True, True), (False, False)])
def test_a_fault_both_sides_share_is_not_charged_to_b(monkeypatch: pytest.MonkeyPatch, planted_in_a: bool,
                                                      passes: bool) -> None:
    """The float32 semantic check judges what B adds to A: a 3% fault in a lever A has too is A's (the precision
    bound still holds B to A's distance from float32), the same fault in a lever only B has fails B."""
    monkeypatch.setattr(equivalence, "DIGEST_PROMPTS", 1)
    monkeypatch.setattr(equivalence, "DIGEST_TOKENS", 8)
    stock_fused_norm = levers.APPLIERS["fused_norm"]

    def planted(runner, value):  # noqa: ANN001, ANN202 - a reordering lever whose code is off by 3%
        stock_fused_norm(runner, value)
        logits = runner.model.logits
        runner.model.logits = lambda hidden: logits(hidden) * 1.03

    monkeypatch.setitem(levers.APPLIERS, "fused_norm", planted)
    checkpoint = tiny_checkpoint("llama")
    a = BACKEND.build(checkpoint, RunConfig.from_flags("fused_norm" if planted_in_a else ""), "cpu", "bfloat16")
    b = BACKEND.build(checkpoint, RunConfig.from_flags("fused_norm,packed_qkv"), "cpu", "bfloat16")
    result = equivalence.check_outputs(BACKEND, a, b)
    assert result.reference == "float32" and result.passed is passes, result.detail
    assert (result.semantic_error < 1e-4) if planted_in_a else (result.semantic_error > 0.015), result.detail
