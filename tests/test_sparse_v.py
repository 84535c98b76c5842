"""sparse_v (delete, approximate): the declared quality metrics, the split design against exact attention, the lever
in a model and through ab's judgement, the table's refusals, and the fused Triton kernel's skip (in Triton's
interpreter on a machine without CUDA: conftest sets TRITON_INTERPRET)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_checkpoint, tiny_runner
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.backends.torch.sparse_v import sparse_decode
from kerneltriage.bench import equivalence
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.levers import LEVERS, LeverSetting, Place, refusal
from kerneltriage.engine.quality import Compared, Quality, agreement
from kerneltriage.engine.sampling import SamplingParams


def test_quality_metrics_measure_what_they_name() -> None:
    ref = np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    rows = ref + np.array([[0.0, 0.25, 0.0], [0.0, 0.0, -0.5]])
    seen = Compared(ref, rows, np.array([0, 1]), ([1, 2, 3, 4], [1, 2, 9, 4]))
    assert Quality.parse("maxlogit<=0.4").measure(seen) == 0.5
    assert not Quality.parse("maxlogit<=0.4").holds(0.5)
    assert Quality.parse("greedy>=0.5").measure(seen) == 0.5  # equal up to the first difference only
    ppl = Quality.parse("ppl<=1.01").measure(seen)
    assert ppl > 1.0 and math.isclose(ppl, math.exp(-np.mean(_logp(rows)) + np.mean(_logp(ref))))
    assert Quality.parse("ppl<=1.01").measure(Compared(ref, ref, np.array([0, -1]))) == 1.0
    assert agreement([5, 6], [5, 6, 7]) == 1.0


def _logp(x: np.ndarray) -> np.ndarray:
    return np.array([x[0, 0], x[1, 1]]) - np.log(np.exp(x).sum(-1))


@pytest.mark.parametrize("text", ["greedy<=0.9", "ppl>=1.0", "maxlogit<0.1", "", "bleu>=0.3"])
def test_quality_refuses_what_it_cannot_measure(text: str) -> None:
    with pytest.raises(ValueError):
        Quality.parse_all(text)


def test_declared_quality_of_sparse_v_parses() -> None:
    metrics = {q.metric for q in Quality.parse_all(LEVERS["sparse_v"].quality or "")}
    assert metrics == {"maxlogit", "ppl", "greedy"}


def _peaked(heads: int = 6, kv_heads: int = 2, keys: int = 300, dim: int = 32, seed: int = 0):  # noqa: ANN202
    """q, k, v whose weights are mostly ~0: key 0 is a sink that every query head of each KV head attends to."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, 1, dim, generator=g) * 4
    k, v = torch.randn(1, kv_heads, keys, dim, generator=g), torch.randn(1, kv_heads, keys, dim, generator=g)
    k[:, :, 0] = q.reshape(1, kv_heads, heads // kv_heads, dim).mean(2) * 3
    return q, k, v


def test_split_design_drops_rows_and_stays_within_its_bound() -> None:
    q, k, v = _peaked()
    exact = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    out, read = sparse_decode(q, k, v, None)
    assert read < 0.5 * k.shape[1] * k.shape[2]  # most rows deleted
    bound, error = k.shape[2] * 1e-6 * float(v.abs().max()), float((out - exact).abs().max())
    assert error <= bound
    everything, read_all = sparse_decode(q, k, v, None, threshold=0.0)
    assert read_all == k.shape[1] * k.shape[2] and torch.allclose(everything, exact, atol=1e-6)
    coarse, _ = sparse_decode(q, k, v, None, threshold=0.05)  # a coarse threshold drops real weight: visibly wrong
    assert float((coarse - exact).abs().max()) > 10 * max(error, 1e-7)


def test_a_row_one_query_head_needs_is_kept_for_its_whole_group() -> None:
    """The rows kept are per KV head, the union of its query heads' needs: a row only head 1 attends to is read."""
    q, k, v = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    q[0, 1, 0, 0], k[0, 0, 2, 0] = 40.0, 1.0  # head 1 puts ~all its weight on key 2; head 0 spreads it evenly
    out, read = sparse_decode(q, k, v, None)
    assert read == 3
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True), atol=1e-6)


def test_masked_keys_are_neither_read_nor_weighted() -> None:
    q, k, v = _peaked(keys=64)
    mask = torch.arange(64).unsqueeze(0) < 40  # (1, S): a static cache's window, 40 live positions
    out, read = sparse_decode(q, k, v, mask)
    exact = F.scaled_dot_product_attention(q, k[:, :, :40], v[:, :, :40], enable_gqa=True)
    assert torch.allclose(out, exact, atol=1e-5) and read <= 2 * 40


def test_lever_keeps_greedy_tokens_and_counts_what_it_skipped() -> None:
    prompt = [3, 17, 40, 9, 88, 21, 5, 64]
    plain = list(generate_step(tiny_runner("llama"), prompt, SamplingParams(), 24))
    runner = tiny_runner("llama", "sparse_v")
    assert len(set(plain)) >= 4  # the equality below could fail
    assert list(generate_step(runner, prompt, SamplingParams(), 24)) == plain
    assert runner.counters["sparse_v"] == 23 * runner.config.num_layers  # every decode step, every layer
    assert runner.counters["sparse_v.rows_read"] > 0


def test_ab_judges_it_by_its_declared_metrics() -> None:
    checkpoint = tiny_checkpoint("llama")
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    b = BACKEND.build(checkpoint, RunConfig.from_flags("sparse_v"), "cpu", "float32")
    result = equivalence.check_outputs(BACKEND, a, b)
    assert set(result.quality) == {"maxlogit<=0.1", "ppl<=1.001", "greedy>=0.9"} and result.logit_error is None
    assert result.passed, result.detail
    assert result.quality["maxlogit<=0.1"][0] < 1e-3


@pytest.mark.parametrize(("other", "backend", "device"), [("graphs", "torch", "cuda"), ("compile", "torch", "cpu"),
                                                          ("fused_layer", "torch", "cuda"), (None, "mlx", "cpu")])
def test_table_refuses_it_where_it_cannot_run(other: str | None, backend: str, device: str) -> None:
    value = "default" if other == "compile" else None
    on = (LeverSetting(LEVERS["sparse_v"]),) + ((LeverSetting(LEVERS[other], value),) if other else ())
    why = refusal(on[0], on, Place(backend, device, "llama"))
    assert why is not None and (other or "torch") in why


def test_builder_refuses_it_beside_compile_in_one_line() -> None:
    with pytest.raises(InputError, match="not with compile"):
        tiny_runner("llama", "sparse_v,compile=default")


def test_fused_kernel_skips_tiles_and_stays_within_the_bound() -> None:
    pytest.importorskip("triton")
    from kerneltriage.kernels.sparse_v_attention import sparse_decode_attention
    from kerneltriage.kernels.split_kv_attention import decode_attention

    q, k, v = _peaked(keys=400)
    exact = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    out, dense, skipped = torch.empty_like(q), torch.empty_like(q), torch.zeros(64, dtype=torch.int32)
    sparse_decode_attention(q, k, v, None, out, skipped=skipped)
    decode_attention(q, k, v, None, dense)
    assert int(skipped.sum()) > 0  # tiles after the sink's, all far below the sink's score: their V never read
    bound = k.shape[2] * 1e-6 * float(v.abs().max())
    error = float((out - exact).abs().max())
    assert error <= bound + float((dense - exact).abs().max())
    sparse_decode_attention(q, k, v, None, out, threshold=0.2)  # a coarse threshold: visibly wrong
    assert float((out - exact).abs().max()) > 100 * max(error, 1e-7)


def test_fused_kernel_passes_the_kernel_check() -> None:
    pytest.importorskip("triton")
    from kerneltriage.triage import kernel_path

    settings = kernel_path.KernelSettings(rows=(1, 9), depths=(0, 70))
    runner = BACKEND.build(tiny_checkpoint("llama", max_context=512), RunConfig(), "cpu", "float32")
    report = kernel_path.check_kernel(BACKEND, runner, "kerneltriage.kernels.sparse_v_attention:SPARSE_V", settings)
    assert report.passed, [c.to_dict() for c in report.checks if not c.passed]


def test_q1_ceiling_counts_the_rows_the_lever_can_skip_not_the_weights() -> None:
    from kerneltriage.engine.probes import Sparsity
    from kerneltriage.triage import q1_delete

    # 80% of weights are ~0, but only 20% of V rows are ~0 for every query head sharing them: the lever skips 20%
    measured = Sparsity(300, 1e-6, 0.8, (0.8,), skippable=0.2)
    assert q1_delete.sparse_v(measured, 0.5) is None  # 20% is no finding …
    assert q1_delete.sparse_v_share(measured, 0.5) == pytest.approx(0.5 * 0.5 * 0.2)
    assert "ceiling 1.053×" in q1_delete.sparse_v_note(measured, 0.5)  # … but Q1 says what it measured
    dense = q1_delete.sparse_v(Sparsity(300, 1e-6, 0.9, (0.9,), skippable=0.6), 0.5)
    assert dense is not None and dense.lever == "sparse_v" and dense.estimated_gain == pytest.approx(1 / (1 - 0.15))
    assert q1_delete.deletable(None) == {"sparse_v": 0.0} and q1_delete.deletable(measured)["sparse_v"] == 0.1


def test_q1_names_vocab_compact_only_under_a_constraint() -> None:
    from kerneltriage.triage import q1_delete

    free, constrained = q1_delete.output_projection_decode(0.3), q1_delete.output_projection_decode(0.3, True)
    assert free is not None and free.lever is None and "--json-schema" in free.fix
    assert constrained is not None and constrained.lever == "vocab_compact"


def test_the_probe_counts_v_rows_per_kv_head() -> None:
    from kerneltriage.backends.torch.sparsity import _below

    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 3, 4)
    q[0, 1, 0, 0], k[0, 0, 2, 0] = 40.0, 1.0  # head 1 leaves keys 0 and 1 ~0; head 0 spreads evenly
    small, total, rows_small, rows_total = _below(q, k, 2, 1e-6)
    assert (small, total) == (2, 6) and (rows_small, rows_total) == (0, 3)  # no row is ~0 for both heads


def test_the_climb_scales_a_delete_levers_ceiling_by_what_q1_measured() -> None:
    from kerneltriage.engine.configuration import RunConfig as Config
    from kerneltriage.triage.breakdown import Breakdown
    from kerneltriage.triage.candidates import candidates

    step = Breakdown("decode", 0.01, {"attention": 0.004, "other": 0.006}, None)
    breakdowns = {"decode": step, "prefill": Breakdown("prefill", 0.01, {"other": 0.01}, None)}
    place = Place("torch", "cpu", "llama")
    found, _ = candidates(Config(), place, breakdowns)
    full = next(c for c in found if c.text == "sparse_v")
    assert full.ceilings["decode"] == pytest.approx(1 / (1 - 0.4))  # the whole attention share
    found, _ = candidates(Config(), place, breakdowns, deletable={"sparse_v": 0.05})
    scaled = next(c for c in found if c.text == "sparse_v")
    assert scaled.ceilings["decode"] == pytest.approx(1 / (1 - 0.02)) and scaled.inside({"decode": 0.05})


def test_in_bf16_the_metrics_judge_the_levers_in_float32_and_b_keeps_abs_precision_bound() -> None:
    checkpoint = tiny_checkpoint("llama")
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "bfloat16")
    b = BACKEND.build(checkpoint, RunConfig.from_flags("sparse_v"), "cpu", "bfloat16")
    result = equivalence.check_outputs(BACKEND, a, b)
    assert result.reference == "float32" and result.tolerance is not None, result.detail
    assert result.passed and "B's levers in float32" in result.detail, result.detail


def test_a_coarse_threshold_fails_the_declared_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """The metrics can fail: skipping rows that carry real weight (threshold 0.3) is caught in float32."""
    from kerneltriage.backends.torch import sparse_v as lever

    monkeypatch.setattr(lever, "THRESHOLD", 0.3)
    checkpoint = tiny_checkpoint("llama")
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    b = BACKEND.build(checkpoint, RunConfig.from_flags("sparse_v"), "cpu", "float32")
    result = equivalence.check_outputs(BACKEND, a, b)
    assert not result.passed and "FAILS" in result.detail, result.detail
    assert result.quality["maxlogit<=0.1"][0] > 0.1


def test_the_fused_kernel_is_judged_by_its_declared_metrics_in_ab() -> None:
    pytest.importorskip("triton")
    ref = "kerneltriage.kernels.sparse_v_attention:SPARSE_V"
    checkpoint = tiny_checkpoint("llama", max_context=64)  # in Triton's interpreter: 32 passage tokens, 31 greedy
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    b = BACKEND.build(checkpoint, RunConfig.from_flags(f"kernel={ref}"), "cpu", "float32")
    assert b.approximations == [LEVERS["sparse_v"].quality]
    result = equivalence.check_outputs(BACKEND, a, b)
    assert set(result.quality) == {"maxlogit<=0.1", "ppl<=1.001", "greedy>=0.9"}, result.detail
    assert result.passed, result.detail


def test_a_kernel_declaring_an_unknown_metric_is_refused() -> None:
    from kerneltriage.engine.kernels import Kernel

    with pytest.raises(ValueError):
        Kernel("attn.decode", lambda *args, out: out, quality="bleu>=0.3")
