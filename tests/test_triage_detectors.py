"""Triage detectors on tiny CPU models: each fires on a planted case and stays silent on a clean one."""

from __future__ import annotations

import math
import warnings
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_runner
from kerneltriage.backends.torch import census, gates, profile
from kerneltriage.backends.torch.sparsity import attention_sparsity
from kerneltriage.engine.decoding import plain_loop
from kerneltriage.engine.probes import GateRow, SdpaCall, Sparsity, SweepCurve
from kerneltriage.triage import amdahl, q1_delete, q2_fastpath, q3_dispatch
from kerneltriage.triage.breakdown import GAP_CLASS, Breakdown
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.report import rank

PROMPT = list(range(1, 17))


def test_amdahl_arithmetic() -> None:
    assert amdahl.speedup(0.5, 2.0) == pytest.approx(4 / 3)
    assert amdahl.speedup_if_free(0.25) == pytest.approx(4 / 3)
    assert amdahl.speedup(0.03, 1.3) == pytest.approx(1.0070, abs=1e-4)  # "Amdahl eats kernels"
    assert amdahl.speedup(1.0, math.inf) == math.inf and amdahl.speedup(0.0, 10.0) == 1.0
    rows = amdahl.outlook({"attention": 0.1, "down_proj": 0.4})
    assert [r.op for r in rows] == ["down_proj", "attention"]
    top = rows[0]
    assert top.if_free == pytest.approx(1 / 0.6) and top.if_2x == pytest.approx(1 / 0.8)
    assert top.prior_low == pytest.approx(1 / (0.6 + 0.4 / 0.5)) and top.prior_high < 1  # the prior: a loss
    with pytest.raises(ValueError):
        amdahl.speedup(1.5, 2.0)


def test_finding_validates() -> None:
    with pytest.raises(ValueError, match="question"):
        Finding("speed", "x", "t", {}, 1.1, None, "estimated", "fix")
    with pytest.raises(ValueError, match="measured_gain"):
        Finding("delete", "x", "t", {}, 1.1, -1.0, "measured", "fix")
    assert Finding("delete", "x", "t", {"a": 1}, 1.1, 1.3, "measured", "fix").to_dict()["evidence"] == {"a": 1}


def test_all_position_logits_fires_on_stock_prefill_and_not_with_last_logits() -> None:
    runner = tiny_runner("llama")
    planted = profile.profile_prefill(runner, [], PROMPT)
    assert planted.output_rows == (len(PROMPT),)
    assert {"q_proj", "attention", "output projection", "norms", "rope", "kv cache"} <= set(planted.class_seconds)
    finding = q1_delete.all_position_logits(planted.output_rows, 0.2)
    assert finding is not None and finding.lever == "last_logits" and finding.phase == "prefill"
    assert finding.estimated_gain == pytest.approx(1 / (1 - 0.2 * (1 - 1 / len(PROMPT))))
    levered = tiny_runner("llama", "last_logits")
    clean = profile.profile_prefill(levered, [], PROMPT)
    assert clean.output_rows == (1,) and q1_delete.all_position_logits(clean.output_rows, 0.2) is None
    assert levered.counters["last_logits"] == 2  # the warm-up pass and the profiled one ran the lever's prefill


def _masked_attention(window: int | None):
    """A planted attention function: an explicit mask (causal, or sliding-window) instead of is_causal."""
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos, sdpa=None) -> torch.Tensor:  # noqa: ANN001
        length, keys = q.shape[2], k.shape[2]
        mask = torch.ones(length, keys, dtype=torch.bool).tril(keys - length)  # (T, S)
        if window is not None:
            mask &= ~torch.ones(length, keys, dtype=torch.bool).tril(keys - length - window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return attention


@pytest.mark.parametrize("window, fires", [(None, True), (4, False)])
def test_explicit_causal_mask_detector(window: int | None, fires: bool) -> None:
    runner = tiny_runner("qwen2")
    with gates.record_sdpa_calls() as clean_calls:
        runner.reset_cache(len(PROMPT))
        runner.prefill(PROMPT, 0)
    assert clean_calls and q1_delete.explicit_causal_masks(clean_calls, 0.3) is None
    runner.model.attention = _masked_attention(window)
    with gates.record_sdpa_calls() as planted:
        runner.reset_cache(len(PROMPT))
        runner.prefill(PROMPT, 0)
    finding = q1_delete.explicit_causal_masks(planted, 0.3)
    assert (finding is not None) == fires
    if fires:
        assert finding.evidence["calls"] == runner.config.num_layers
        assert finding.estimated_gain == pytest.approx(amdahl.speedup(0.3, 2.0))


def test_padding_detector() -> None:
    pad = 0
    finding = q1_delete.padding_work([pad] * 4 + PROMPT + [pad] * 2, pad)
    assert finding is not None and finding.evidence["leading"] == 4 and finding.evidence["trailing"] == 2
    assert finding.estimated_gain == pytest.approx(1 / (1 - 6 / 22))
    assert q1_delete.padding_work(PROMPT, pad) is None  # a pad id inside the text is not padding
    assert q1_delete.padding_work([5, pad, 6], pad) is None and q1_delete.padding_work(PROMPT, None) is None


def test_vocabulary_ceiling_and_sparse_v() -> None:
    assert q1_delete.output_projection_decode(0.01) is None
    assert q1_delete.output_projection_decode(0.25).estimated_gain == pytest.approx(4 / 3)
    assert q1_delete.sparse_v(None, 0.5) is None
    assert q1_delete.sparse_v(Sparsity(100, 1e-6, 0.1, (0.1,)), 0.5) is None
    dense = q1_delete.sparse_v(Sparsity(100, 1e-6, 0.8, (0.8,)), 0.5)
    assert dense is not None and dense.evidence["deletable_share"] == pytest.approx(0.5 * 0.5 * 0.8)
    measured = attention_sparsity(tiny_runner("qwen3"), PROMPT)
    assert len(measured.per_layer) == 2 and 0.0 <= measured.fraction <= 1.0 and measured.depth == len(PROMPT)


def test_blocks_read_as_values_fires_on_a_quantized_file_read_in_float32() -> None:
    """A GGUF whose projections and head are Q4/Q8 blocks, read as float32 values: the finding's bound is the bytes
    a token reads then over the bytes it would read with the blocks; a file with none stays silent."""
    np = pytest.importorskip("numpy")
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    from conftest import tiny_checkpoint
    from kerneltriage.core import roofline
    from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
    from kerneltriage.engine.memory import stored_blocks
    from kerneltriage.engine.names import PROJECTIONS

    plain = tiny_checkpoint("llama", vocab_size=320)
    assert stored_blocks(plain, 4) == (0, 0)
    assert q1_delete.blocks_read_as_values(0, 0, 10**6) is None
    tensors = dict(plain.tensors)
    for name, raw in plain.tensors.items():
        if name == "lm_head" or (name.startswith("layers.") and name.split(".")[-1] in PROJECTIONS):
            values = np.asarray(raw.data, dtype=np.float32)
            tensors[name] = RawTensor("Q4_0", values.shape, quants.quantize(values, GGMLQuantizationType.Q4_0))
    blocks, values = stored_blocks(Checkpoint(plain.config, tensors, plain.tokenizer, source="q4"), 4)
    assert values / blocks == pytest.approx(4 * 32 / 18)  # float32 values against Q4_0's 18 bytes a block of 32
    read = roofline.engine_weight_bytes(plain.config, 4)
    found = q1_delete.blocks_read_as_values(blocks, values, read)
    assert found is not None and found.lever == "quantized" and "--dtype bfloat16" in found.fix
    assert found.estimated_gain == pytest.approx(read / (read - values + blocks)) and found.estimated_gain > 2


def test_an_unmeasured_bound_is_answered_as_one_not_as_noise() -> None:
    """After a climb that adopted nothing, a question whose best finding is a bound (estimated, ceiling) is 'not
    judged here' with the fix to try; one whose best was measured and did not clear the noise is 'nothing above
    the noise'."""
    from kerneltriage.triage.ladder import Ladder
    from kerneltriage.triage.report import Report

    bound = q1_delete.blocks_read_as_values(100, 500, 600)
    measured = Finding("dispatch", "lever-one_sync", "one_sync: decode 1.01× (neutral)", {}, 1.01, 1.01, "measured",
                       "--levers one_sync", "decode", "one_sync")
    answers = Report({}, {}, {}, [bound, measured], ladder=Ladder(rungs=[])).answers()
    assert answers["delete"].startswith("not judged here — decode reads") and "--dtype bfloat16" in answers["delete"]
    assert answers["dispatch"].startswith("nothing above the noise — closest: one_sync")
    assert answers["fast-path"].startswith("no — ")


def test_the_sparsity_probe_runs_on_a_stock_copy_not_the_runners_own_steps() -> None:
    """Its host readbacks must not run inside the runner's captured prefill (prefill_graphs on the H200: 'operation
    not permitted when stream is capturing'): the runner's levers never see the probe."""
    from kerneltriage.backends.torch.backend import BACKEND

    runner = tiny_runner("llama", "packed_qkv,last_logits")
    before = dict(runner.counters)
    measured = BACKEND.attention_sparsity(runner)
    assert dict(runner.counters) == before and measured.depth > 0
    assert all(p.numel() > 0 for p in runner.model.parameters())  # the copy was released, not the runner


def _planted_sync_loop(runner, logits, start, count, sampler) -> Iterator[int]:  # noqa: ANN001
    """The stock loop plus one readback per token (a planted sync)."""
    for token in plain_loop(runner, logits, start, count, sampler):
        runner.model.cache.keys.sum().item()
        yield token


def _decode_breakdown(syncs: float = 0.0) -> Breakdown:
    return Breakdown("decode", 1e-3, {"q_proj": 4e-4}, None, sync_calls_per_token=syncs)


def test_a_planted_sync_raises_syncs_per_token() -> None:
    runner = tiny_runner("llama")
    clean = census.census_decode(runner, [1, 2], 4).per(4)
    assert clean["readbacks"] == 1 and "runner.py" in next(iter(clean["readback_sites"]))
    assert q3_dispatch.extra_syncs(_decode_breakdown(), clean, gpu=False) is None
    runner.token_loop = _planted_sync_loop
    planted = census.census_decode(runner, [1, 2], 4).per(4)
    assert planted["readbacks"] == 2
    finding = q3_dispatch.extra_syncs(_decode_breakdown(), planted, gpu=False)
    assert finding is not None and any("test_triage_detectors.py" in s for s in finding.evidence["readback_sites"])
    assert q3_dispatch.extra_syncs(_decode_breakdown(2.0), clean, gpu=True) is not None  # GPU: runtime calls


def _fake_probe(ok: bool, why: str):
    def can_use(params, debug: bool = False) -> bool:  # noqa: ANN001
        if not ok and debug:
            warnings.warn(why, stacklevel=1)
        return ok
    return can_use


def test_math_fallback_from_a_faked_capability_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    call = SdpaCall((1, 8, 1, 320), (1, 2, 64, 320), "float32", None, False, True)
    inputs = gates.random_inputs(call, torch.device("cpu"))
    for _, _, name in gates.FUSED:
        monkeypatch.setattr(torch.backends.cuda, name, _fake_probe(False, f"{name}: head_dim 320 unsupported"))
    usable, reasons, _ = gates.probe_backends(call, inputs)
    assert not any(usable.values()) and reasons["flash"] == ["can_use_flash_attention: head_dim 320 unsupported"]
    row = GateRow("decode", call, 16.0, "math", usable, reasons,
                        {"default": 1e-4, "math": 1e-4, "efficient+expand_kv": 2e-5})
    finding = q2_fastpath.math_fallback(row, step_seconds=4e-3)
    assert finding is not None and finding.evidence["reasons"]["flash"] == reasons["flash"]
    assert finding.estimated_gain == pytest.approx(1 / (1 - 16 * 8e-5 / 4e-3))
    assert finding.lever == "sdpa_fold"  # K/V expanded is what folding the query heads gets without the copy
    for _, _, name in gates.FUSED:
        monkeypatch.setattr(torch.backends.cuda, name, _fake_probe(True, ""))
    usable, reasons, _ = gates.probe_backends(call, inputs)
    clean = GateRow("decode", call, 16.0, "flash", usable, reasons, {"default": 2e-5, "math": 1e-4, "flash": 2e-5})
    assert all(usable.values()) and not reasons
    assert q2_fastpath.math_fallback(clean, 4e-3) is None and q2_fastpath.slower_default(clean, 4e-3) is None


def test_slower_default_backend() -> None:
    call = SdpaCall((1, 32, 1, 64), (1, 8, 4096, 64), "bfloat16", None, False, True)
    row = GateRow("decode", call, 30.0, "efficient", {"flash": True}, {},
                        {"default": 71e-6, "math": 400e-6, "flash": 43e-6, "efficient": 71e-6})
    finding = q2_fastpath.slower_default(row, 10e-3)
    assert finding is not None and finding.lever == "sdpa_backend=flash"


def _curve(seconds: tuple[float, ...], timer: str = "cuda graph replay", k: int = 576, n: int = 1536) -> SweepCurve:
    return SweepCurve("gate_proj/up_proj", k, n, 30, tuple(range(1, len(seconds) + 1)), seconds, timer, k * n * 2)


def test_gemv_bandwidth_detector() -> None:
    copy = 4.2e12
    weight = 4096 * 14336 * 2  # 117 MB: 28 µs at copy bandwidth
    slow = _curve((weight / (0.3 * copy), 1e-6), k=4096, n=14336)  # reads at 30% of copy bandwidth
    finding = q2_fastpath.gemv_bandwidth_finding(slow, {"gate_proj": 0.2, "up_proj": 0.2}, copy)
    assert finding is not None and finding.evidence["fraction"] == pytest.approx(0.3)
    assert finding.estimated_gain == pytest.approx(1 / (0.6 + 0.4 * 0.3 / 0.9))  # 40% of decode runs 3× faster
    fast = _curve((weight / (0.85 * copy), 1e-6), k=4096, n=14336)
    assert q2_fastpath.gemv_bandwidth_finding(fast, {"gate_proj": 0.2}, copy) is None
    on_cpu = _curve(slow.seconds, timer="cpu clock", k=4096, n=14336)  # a host clock times more than the kernel
    assert q2_fastpath.gemv_bandwidth_finding(on_cpu, {"gate_proj": 0.2}, copy) is None
    small = _curve((576 * 1536 * 2 / (0.02 * copy), 1e-6))  # 1.8 MB: launch cost and L2, not bandwidth
    assert q2_fastpath.gemv_bandwidth_finding(small, {"gate_proj": 0.2}, copy) is None


def test_context_attention_detector() -> None:
    from kerneltriage.triage.context import ContextCost

    copy, per_position = 4.2e12, 2 * 30 * 3 * 64 * 2  # the default model's K and V per position, bf16
    # the H200's best set: 1.28 ms/token at depth 0, 4.55 at 2048 — the cache read at ~14 GB/s
    slow = ContextCost(2048, 16, 1.28e-3, 4.55e-3, per_position)
    deep = q2_fastpath.context_finding(slow, 2080, copy, gpu=True, levers=("graphs",))
    assert deep is not None and deep.lever == "flex_decode" and deep.confidence == "estimated"
    assert deep.evidence["fraction"] == pytest.approx(per_position * 2048 / 3.27e-3 / copy)
    now, fast = 1.28e-3 + 2080 * 3.27e-3 / 2048, 1.28e-3 + 2080 * per_position / (0.9 * copy)
    assert deep.estimated_gain == pytest.approx(now / fast)  # ~3.5× for a workload decoding at depth 2048
    assert "72% of each token" in deep.title
    shallow = q2_fastpath.context_finding(slow, 33, copy, gpu=True, levers=())  # a workload at depth 0
    assert shallow is not None and 1.0 < shallow.estimated_gain < 1.05
    on = q2_fastpath.context_finding(slow, 2080, copy, gpu=True, levers=("flex_decode",))
    assert on is not None and on.lever is None  # the lever is on already: the finding stays, without it
    cpu = q2_fastpath.context_finding(slow, 2080, copy, gpu=False, levers=())
    assert cpu is not None and cpu.lever is None and cpu.confidence == "low"
    small = ContextCost(2048, 16, 4.2e-3, 4.55e-3, per_position)  # 8% of a token
    assert q2_fastpath.context_finding(small, 2080, copy, gpu=True, levers=()) is None
    # half of each token, but the cache read at half the copy bandwidth: the kernel is fine
    bandwidth_bound = ContextCost(2048, 16, 1e-5, 1e-5 + per_position * 2048 / (0.5 * copy), per_position)
    assert bandwidth_bound.share > 0.5
    assert q2_fastpath.context_finding(bandwidth_bound, 2080, copy, gpu=True, levers=()) is None
    flat = ContextCost(2048, 16, 1.3e-3, 1.28e-3, per_position)  # noise: deeper measured faster
    assert flat.read_bandwidth is None and flat.share == 0.0
    assert q2_fastpath.context_finding(flat, 2080, copy, gpu=True, levers=()) is None


def test_m_sweep_stall_and_non_monotone_from_fake_tables() -> None:
    flat = _curve((10e-6, 10.2e-6, 10.1e-6, 10.3e-6, 10.4e-6))
    assert q2_fastpath.sweep_holes(flat) == [] and q2_fastpath.sweep_finding(flat, {}, True) is None
    stall = _curve((10e-6, 10e-6, 25e-6, 25e-6, 26e-6))
    assert [h["kind"] for h in q2_fastpath.sweep_holes(stall)] == ["stall"]
    bump = _curve((10e-6, 10e-6, 14e-6, 10e-6, 10e-6))
    kinds = {h["kind"] for h in q2_fastpath.sweep_holes(bump)}
    assert kinds == {"non-monotone"}
    finding = q2_fastpath.sweep_finding(stall, {"gate_proj": 0.1, "up_proj": 0.1}, reliable=False)
    assert finding is not None and finding.confidence == "low" and finding.evidence["decode_share"] == 0.2


def test_breakdown_shares_and_ranking() -> None:
    b = Breakdown("decode", 10e-3, {"attention": 1e-3, "q_proj": 2e-3}, 8e-3)
    assert sum(b.shares.values()) == pytest.approx(1.0) and b.shares[GAP_CLASS] == pytest.approx(0.7)
    assert b.dispatch_bound and list(b.op_shares) == ["q_proj", "attention"]
    ceiling = Finding("dispatch", "gap", "t", {}, 3.0, None, "ceiling", "f", lever="graphs")
    measured = Finding("dispatch", "lever-graphs", "t", {"ab": {"verdict": "win"}}, 3.0, 2.0, "measured", "f",
                       lever="graphs")
    loss = Finding("dispatch", "lever-x", "t", {"ab": {"verdict": "loss"}}, 1.0, 0.9, "measured", "f", lever="x")
    assert [f.code for f in rank([ceiling, loss, measured])] == ["lever-graphs"]  # one per lever, losses out


def test_copies_cpu_ops_and_dispatch_gap_detectors() -> None:
    census_counts = {"casts": 30.0, "strided_copies": 2.0, "cpu_ops": 3.0, "cpu_op_sites": {"aten::arange @ x": 3.0}}
    assert q2_fastpath.copies_finding("decode", census_counts, 0.08).estimated_gain == pytest.approx(1 / 0.92)
    assert q2_fastpath.copies_finding("decode", census_counts, 0.001) is None
    assert q2_fastpath.copies_finding("decode", census_counts | {"casts": 0.0, "strided_copies": 0.0}, 0.08) is None
    assert q2_fastpath.cpu_ops_finding(census_counts, gpu=True).evidence["sites"] == {"aten::arange @ x": 3.0}
    assert q2_fastpath.cpu_ops_finding(census_counts, gpu=False) is None
    idle = Breakdown("decode", 10e-3, {"attention": 1e-3}, 9e-3, kernels_per_token=900, launches_per_token=900)
    busy = Breakdown("decode", 10e-3, {"attention": 9.8e-3}, 1e-3)
    finding = q3_dispatch.dispatch_gap(idle, gpu=True)
    assert finding is not None and finding.lever == "graphs" and "dispatch-bound" in finding.title
    assert q3_dispatch.dispatch_gap(busy, gpu=True) is None
