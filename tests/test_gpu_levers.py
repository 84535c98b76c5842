"""CUDA-only: every lever set keeps greedy output token for token on the real default model, across a graph window
boundary, and counts its own runs. Skipped without CUDA. (The GPU suite: `pytest -m gpu`; speculation on CUDA is in
test_gpu_speculation.py, timed probes in test_gpu_probes.py.)"""

from __future__ import annotations

import pytest
import torch

from gpu_helpers import PROMPT, crossing, cuda_runner
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# --levers values. Efficient attention refuses GQA (enable_gqa), so its pin is counted where sdpa_fold makes the
# decode calls plain attention; math serves every call.
# compile=default alone and with fused_norm are left to the tiny models of test_gpu_smoke.py: each compile of the real
# model costs tens of seconds, and the compiled set below has both.
LEVER_SETS = ["graphs", "one_sync", "graphs,one_sync", "packed_qkv,packed_gate_up",
              "last_logits", "graphs,one_sync,packed_qkv,packed_gate_up,last_logits",
              "sdpa_fold,sdpa_backend=efficient", "sdpa_backend=math", "sdpa_fold",
              "flex_decode", "flex_decode,graphs",
              "packed_qkv,packed_gate_up,fused_norm,flex_decode,compile=default,graphs",
              "fused_layer,graphs", "fused_layer,pdl,graphs",
              "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,compile_prefill,graphs,one_sync",
              "last_logits,graphs,prefill_graphs",
              "packed_qkv,packed_gate_up,last_logits,fused_norm,fused_layer,pdl,graphs,prefill_graphs,one_sync"]


EAGER_TOKENS = 32  # eager steps cost ~25 ms each: the 250 a crossing takes were 6 s a lever set


@pytest.fixture(scope="module")
def prompt(default_checkpoint) -> list[int]:  # noqa: ANN001
    return default_checkpoint.tokenizer.encode(PROMPT)


@pytest.mark.parametrize("levers", LEVER_SETS)
def test_lever_keeps_greedy_tokens_on_the_real_model(default_checkpoint, gpu_greedy, prompt,  # noqa: ANN001
                                                     levers: str) -> None:
    graphed = "graphs" in levers.split(",")  # only a graphed step changes at a window boundary
    plain = gpu_greedy(prompt, crossing(prompt) if graphed else EAGER_TOKENS)
    assert len(set(plain)) >= 4
    runner = cuda_runner(default_checkpoint, levers)
    assert sorted(runner.levers) == sorted(levers.split(","))
    assert list(generate_step(runner, prompt, SamplingParams(), len(plain))) == plain
    for lever in runner.levers:
        assert runner.counters[lever] > 0, lever
    if runner.run_config.has("graphs"):  # eager steps: a graph per 256-slot window, both used; compiled: one
        windows = {window for window, _ in runner.decode_step.graphs}
        assert len(windows) == (1 if runner.run_config.has("compile") else 2), windows
