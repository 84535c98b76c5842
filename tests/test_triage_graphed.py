"""Q3 after the climb, through triage's stages on the fake backend: a final configuration whose graphed step is
device-bound with many small kernels gets the graphed-step finding with its µs per kernel and one Amdahl ceiling per
fusion candidate; a host-bound step and the CPU get nothing of it."""

from __future__ import annotations

import pytest

from fake_backend import Effect, FakeBackend, fake_checkpoint, use_fake_host_clock
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage import fusion, q3_dispatch
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.run import _State, stage_climb, stage_dispatch, stage_setup, stage_where
from kerneltriage.triage.setup import Workload, budget_for

LAYERS = 2  # fake_checkpoint's
KERNELS = 200.0  # per token: 100 per layer, far above MANY_KERNELS_PER_LAYER
DEVICE_SHARE = 0.95  # of the graphed step: the device idles 5%
UNATTRIBUTED = "unattributed (graph replay)"  # the class of a graph replay's kernels (backends/torch/profile.py)


@pytest.fixture(autouse=True)
def fake_host_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_host_clock(monkeypatch)


def _triage(backend: FakeBackend, levers: str | None) -> _State:
    runner = backend.build(fake_checkpoint(), RunConfig.from_flags(levers))
    state = _State(backend, runner, Workload(8, 4, 0), budget_for("cpu"), backend.device == "cuda")
    for stage in (stage_setup, stage_where, stage_dispatch, stage_climb):
        stage(state)
    return state


def _graphed_step(state: _State) -> Finding | None:
    return next((f for f in state.findings if f.code == "graphed-step"), None)


def _rows(finding: Finding) -> dict[str, dict]:
    return {row["candidate"]: row for row in finding.evidence["candidates"]}


def test_a_graphed_device_bound_step_of_many_kernels_gets_its_floor_and_ceilings() -> None:
    backend = FakeBackend(noise=0.0, device="cuda", kernels=KERNELS, classes={UNATTRIBUTED: DEVICE_SHARE})
    finding = _graphed_step(_triage(backend, "graphs"))
    assert finding is not None and finding.question == "dispatch" and finding.confidence == "ceiling"
    per_kernel = DEVICE_SHARE * 1e-3 / KERNELS  # the fake's decode step is 1 ms
    assert finding.evidence["seconds_per_kernel"] == pytest.approx(per_kernel)
    assert "200 kernels per token, 4.75 µs per kernel, device-bound (gap 5%)" in finding.title
    rows = _rows(finding)
    # graph replays leave no op class to count: every count is structural (float32, no fused_norm, eager ops)
    assert {row["source"] for name, row in rows.items() if name != "pdl"} == {"structure"}
    rope_cache = LAYERS * (2 * 5 + 2)  # RoPE on q and k (5 ops each) and the k, v cache writes, per layer
    assert rows["qkv_rope_cache"]["kernels_removed"] == rope_cache
    assert rows["qkv_rope_cache"]["ceiling"] == pytest.approx(1 / (1 - rope_cache / KERNELS))
    assert rows["residual_epilogue"]["kernels_removed"] == LAYERS * 2
    assert rows["split_kv_attention"]["kernels_removed"] == LAYERS * 1  # the static cache's mask repeat
    assert rows["pdl"]["kernels_removed"] == 0 and rows["pdl"]["ceiling"] == pytest.approx(1 / DEVICE_SHARE)
    assert finding.estimated_gain == pytest.approx(max(row["ceiling"] for row in rows.values()))
    assert list(rows)[0] == "qkv_rope_cache"  # largest ceiling first


def test_counts_come_from_the_eager_profile_when_the_climb_adopted_graphs() -> None:
    counts = {"norms": 10.0, "activation": 4.0, "rope": 20.0, "kv cache": 4.0, "attention": 6.0}
    backend = FakeBackend({"graphs": Effect(decode=0.5)}, noise=0.01, seed=3, device="cuda", kernels=KERNELS,
                          classes={"q_proj": 0.3, "attention": 0.1}, graphed_classes={UNATTRIBUTED: 0.9},
                          class_kernels=counts, backend_name="torch")
    state = _triage(backend, None)
    assert state.ladder.final.lever_names == ("graphs",)  # the other levers change nothing here: left out
    assert state.breakdown["decode"].dispatch_bound  # the eager step: no graphed-step finding from it
    finding = _graphed_step(state)
    assert finding is not None
    per_kernel = 0.9 * 0.5e-3 / KERNELS  # the final configuration's own profile
    assert finding.evidence["seconds_per_kernel"] == pytest.approx(per_kernel, rel=0.05)
    rows = _rows(finding)
    assert rows["qkv_rope_cache"]["source"] == "profile" and rows["qkv_rope_cache"]["kernels_removed"] == 24
    assert rows["add_norm"]["kernels_removed"] == 10 - LAYERS * 2 + LAYERS * 2  # norms left 2 per layer, adds gone
    assert rows["split_kv_attention"]["kernels_removed"] == 6 - LAYERS  # one attention kernel per layer left
    assert rows["residual_epilogue"]["source"] == "structure"  # the adds are never isolated by the profile


def test_a_host_bound_graphed_step_gets_no_fusion_finding() -> None:
    backend = FakeBackend(noise=0.0, device="cuda", kernels=KERNELS, classes={UNATTRIBUTED: 0.5})
    state = _triage(backend, "graphs")
    assert _graphed_step(state) is None
    assert any(f.code == "dispatch-gap" for f in state.findings)  # the gap is the answer, not fusion


def test_the_cpu_gets_no_fusion_finding() -> None:
    backend = FakeBackend(noise=0.0, kernels=KERNELS, classes={"q_proj": DEVICE_SHARE})
    assert _graphed_step(_triage(backend, None)) is None
    step = Breakdown("decode", 1e-3, {"q_proj": DEVICE_SHARE * 1e-3}, None, kernels_per_token=KERNELS)
    structure = fusion.Structure(LAYERS, ("graphs",), "float32")
    assert q3_dispatch.graphed_step(step, {}, structure, gpu=True) is not None  # the same step on a GPU: found
    assert q3_dispatch.graphed_step(step, {}, structure, gpu=False) is None


def test_few_or_large_kernels_are_not_many_small_ones() -> None:
    structure = fusion.Structure(LAYERS, ("graphs",), "float32")
    few = Breakdown("decode", 1e-3, {UNATTRIBUTED: 0.95e-3}, None,
                    kernels_per_token=q3_dispatch.MANY_KERNELS_PER_LAYER * LAYERS - 1)
    assert q3_dispatch.graphed_step(few, {}, structure, gpu=True) is None
    large = Breakdown("decode", 10e-3, {UNATTRIBUTED: 9.5e-3}, None, kernels_per_token=KERNELS)  # 47.5 µs each
    assert q3_dispatch.graphed_step(large, {}, structure, gpu=True) is None


def test_the_candidates_are_rendered_in_text_html_and_json() -> None:
    from rich.console import Console

    from kerneltriage.triage.html import render_html
    from kerneltriage.triage.report import Report
    from kerneltriage.triage.text import sections

    backend = FakeBackend(noise=0.0, device="cuda", kernels=KERNELS, classes={UNATTRIBUTED: DEVICE_SHARE})
    state = _triage(backend, "graphs")
    config = {"model": "fake", "source": "fake", "levers": ["graphs"], "device": "cuda", "workload": {"gen": 4}}
    report = Report(config, state.setup, state.breakdown, state.findings, notes=state.notes)
    console = Console(width=200, record=True)
    for section in sections(report):
        console.print(section)
    text = console.export_text()
    assert "fusion candidate (graphed step)" in text and "qkv_rope_cache" in text and "1.136×" in text
    page = render_html(report)
    assert "fusion candidates of the graphed step" in page and "split_kv_attention" in page
    recorded = next(f for f in report.to_dict()["findings"] if f["code"] == "graphed-step")
    listed = {row["candidate"] for row in recorded["evidence"]["candidates"]}
    assert listed == {candidate.name for candidate in fusion.CANDIDATES}


def test_the_fusion_finding_offers_fused_layer_where_it_runs() -> None:
    step = Breakdown("decode", 1e-3, {"q_proj": DEVICE_SHARE * 1e-3}, None, kernels_per_token=KERNELS)
    offered = q3_dispatch.graphed_step(step, {}, fusion.Structure(LAYERS, ("graphs",), "bfloat16"), gpu=True)
    assert offered.lever == "fused_layer" and "--levers fused_layer,graphs" in offered.fix
    qwen3 = fusion.Structure(LAYERS, ("graphs",), "bfloat16", arch="qwen3")  # its per-head q/k norms: in the kernels
    assert q3_dispatch.graphed_step(step, {}, qwen3, gpu=True).lever == "fused_layer"
    for structure in (fusion.Structure(LAYERS, ("graphs", "fused_layer"), "bfloat16"),  # on already
                      fusion.Structure(LAYERS, ("graphs",), "bfloat16", arch="gemma3"),  # layers it does not take
                      fusion.Structure(LAYERS, ("graphs",), "float16", backend="mlx")):
        found = q3_dispatch.graphed_step(step, {}, structure, gpu=True)
        assert found.lever is None and "kerneltriage kernel" in found.fix
