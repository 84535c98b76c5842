"""CUDA-only: speculation under graphs keeps greedy output token for token on the real default model — a draft model
(the target's own layers) and a lookup on a lever set's runner, the suffix drafter's two verify shapes, resident
steps that choose on the device, an EAGLE head's drafts. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from gpu_helpers import PROMPT, REPETITIVE, crossing, cuda_runner
from kerneltriage.backends.torch.backend import build_runner
from kerneltriage.backends.torch.levers import apply_config
from kerneltriage.bench.workloads import load_prompt_set
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.config import parse_speculation
from kerneltriage.engine.speculative.decoder import SPEC_COUNTER

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def prompt(default_checkpoint) -> list[int]:  # noqa: ANN001
    return default_checkpoint.tokenizer.encode(PROMPT)


@pytest.fixture(scope="module")
def copying(default_checkpoint) -> list[int]:  # noqa: ANN001
    """add-type-hints from the repetitive set: the model copies the module out (long matches for a lookup)."""
    return list(load_prompt_set(REPETITIVE, default_checkpoint.tokenizer).prompts[2])


@pytest.mark.parametrize("levers", ["graphs", "packed_qkv,packed_gate_up,compile=default,graphs", "flex_decode,graphs",
                                    "fused_layer,graphs"])
def test_graphed_speculation_keeps_greedy_tokens(default_checkpoint, gpu_greedy, prompt,  # noqa: ANN001
                                                 levers: str) -> None:
    """A lookup and the target's first 15 layers, installed in turn on one runner of the lever set (its compiled
    steps and captured graphs serve both: compiling them twice was most of this test's time)."""
    plain = gpu_greedy(prompt, crossing(prompt))
    runner = cuda_runner(default_checkpoint, levers)
    for spec in ("ngram", "selfdraft:15"):
        runner.counters.clear()
        apply_config(runner, RunConfig((), parse_speculation(spec, "4")))
        decoder = runner.speculation
        assert list(generate_step(runner, prompt, SamplingParams(), len(plain))) == plain, spec
        assert decoder.stats.verify_steps > 0, spec
        # every verify replayed a graph of k+1 = 5 rows
        assert {rows for _, rows in runner.verify_step.graphs} == {5}
        assert runner.counters[SPEC_COUNTER] == decoder.stats.verify_steps <= runner.counters["graphs"], spec


@pytest.mark.parametrize("levers", ["graphs", "fused_layer,pdl,graphs"])
def test_graphed_suffix_speculation_verifies_in_both_shapes(default_checkpoint, gpu_greedy, copying,  # noqa: ANN001
                                                            levers: str) -> None:
    """Auto depth on copied text: verifies replay the 16-row and the 32-row graphs (a long match drafts 31), and the
    tokens are plain decoding's."""
    plain = gpu_greedy(copying, 200, levers)
    runner = cuda_runner(default_checkpoint, levers, "suffix")
    assert list(generate_step(runner, copying, SamplingParams(), 200)) == plain
    assert {rows for _, rows in runner.verify_step.graphs} == {16, 32}
    assert runner.speculation.stats.tokens_per_step > 8


@pytest.mark.parametrize("levers", ["graphs,one_sync", "fused_layer,pdl,graphs,one_sync"])
@pytest.mark.parametrize("spec", ["suffix", "ngram"])
def test_resident_steps_keep_greedy_tokens(default_checkpoint, gpu_greedy, copying, levers: str,  # noqa: ANN001
                                           spec: str) -> None:
    """one_sync with a lookup --spec under graphs: every step drafts, chooses (plain or a verify shape, a SWITCH
    node) and accepts on the device, queued one ahead (backends/torch/resident.py); the tokens are plain decoding's
    across a window boundary, through plain steps and both shapes."""
    new = max(352 - len(copying), 64)  # past the first 256-slot window by more than a 32-row verify
    plain = gpu_greedy(copying, new, levers)
    runner = cuda_runner(default_checkpoint, levers, spec)
    decoder, chosen = runner.speculation, []
    record = decoder.record_step
    decoder.record_step = lambda steps, rows, accepted, seconds, matched=0: (
        chosen.append(rows), record(steps, rows, accepted, seconds, matched))
    assert list(generate_step(runner, copying, SamplingParams(), new)) == plain
    stats = decoder.stats
    assert runner.counters["one_sync"] > runner.counters[SPEC_COUNTER] == stats.verify_steps > 0
    # every step chose a body the device has; the copy made it verify, at both shapes where k reaches 31 (suffix)
    assert stats.tokens_per_step > 6 and {16, 32 if spec == "suffix" else 16} <= set(chosen) <= {1, 16, 32}, chosen
    resident = runner.resident_steps.graphs  # captured before the run: one per window it may reach
    assert len({window for window, _ in resident}) >= 2  # the text crossed a 256-slot window


@pytest.mark.parametrize("levers", ["graphs", "fused_layer,pdl,graphs,prefill_graphs"])
def test_graphed_eagle_speculation_keeps_greedy_tokens(default_checkpoint, gpu_greedy, prompt, tmp_path,  # noqa: ANN001
                                                       levers: str) -> None:
    """A head (untrained: the tokens, not the speed, are checked) drafts from the features graphed prefills,
    plain steps and padded verifies store; the tokens are plain decoding's, float32, across a window boundary."""
    from kerneltriage.backends.torch import eagle

    target = build_runner(default_checkpoint, torch.device("cuda"), torch.float32)
    path = tmp_path / "head.safetensors"
    torch.manual_seed(0)
    eagle.save_head(eagle.EagleHead(target.model, "cuda"), path)
    plain = gpu_greedy(prompt, crossing(prompt), levers)
    runner = cuda_runner(default_checkpoint, levers, f"eagle:{path}", "3")
    assert list(generate_step(runner, prompt, SamplingParams(), len(plain))) == plain
    assert runner.speculation.stats.verify_steps > 20 and runner.counters["graphs"] > 0
