"""CUDA-only, on tiny models (a minute on an H200): the code paths the CPU cannot run — counters under graph replay,
a pinned SDPA backend counted under compile (at trace time), the pipelined loop's pinned readback, the float32
rebuild of `ab`'s correctness check. Skipped without CUDA;
`bash benchmarks/tools/device_run.sh smoke` runs them first."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_checkpoint
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.bench import ab, equivalence
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PROMPT = list(range(3, 19))
NEW = 40


def _run(levers: str, dtype: str = "float32", context: int = 512):  # noqa: ANN202
    runner = BACKEND.build(tiny_checkpoint("llama", max_context=context), RunConfig.from_flags(levers), "cuda", dtype)
    return runner, list(generate_step(runner, PROMPT, SamplingParams(), NEW))


@pytest.fixture(scope="module")
def plain() -> list[int]:
    return _run("")[1]


@pytest.mark.parametrize("levers", ["graphs", "fused_norm,graphs", "one_sync", "graphs,one_sync", "flex_decode",
                                    "packed_qkv,fused_norm,compile=default,graphs", "fused_layer,graphs",
                                    "fused_layer,pdl,graphs", "packed_qkv,packed_gate_up,last_logits,fused_norm,"
                                    "fused_layer,compile_prefill,graphs,one_sync", "last_logits,graphs,prefill_graphs",
                                    "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs,"
                                    "prefill_graphs,one_sync"])
def test_smoke_levers_keep_tokens_and_count_every_replay(plain: list[int], levers: str) -> None:
    runner, tokens = _run(levers)
    assert tokens == plain
    steps = NEW - 1
    if "graphs" in levers:
        assert runner.counters["graphs"] == steps  # one count per replay, none for the capture
    # compile_prefill, prefill_graphs and last_logits serve the one prefill; so do the packed projections beside
    # fused_layer (its kernels read their own weights)
    once = {"compile_prefill", "prefill_graphs", "last_logits"} | ({"packed_qkv", "packed_gate_up"}
                                                                   if "fused_layer" in levers else set())
    for setting in runner.run_config.lever_names:
        least = 0 if setting == "graphs" else 1 if setting in once else steps
        assert runner.counters[setting] >= least, (setting, dict(runner.counters))


def test_smoke_a_pinned_backend_is_counted_under_compile_only_where_it_serves(plain: list[int]) -> None:
    runner, tokens = _run("sdpa_backend=math,compile=default")
    assert tokens == plain
    assert runner.counters["sdpa_backend=math"] > 0  # math serves every call: counted through the compiled step


def test_smoke_ab_checks_bf16_semantics_in_float32_on_the_device() -> None:
    checkpoint = tiny_checkpoint("llama", max_context=512)
    runners = ab.build_runners(BACKEND, checkpoint, RunConfig(), RunConfig.from_flags("fused_norm,graphs"), "cuda",
                               "bfloat16")
    correctness = equivalence.check_outputs(BACKEND, runners["A"], runners["B"])
    assert correctness.reference == "float32" and correctness.semantic_error is not None
    assert correctness.semantic_error < equivalence.LOGIT_RTOL and correctness.passed, correctness.detail
    report = ab.run_ab(BACKEND, runners, ab.Settings(prompt=64, gen=8, pairs=5, warmups=1), lambda what: None)
    assert report.silent == [] and report.verdict.verdict != "invalid", report.verdict
