"""CUDA-only: every lever keeps greedy output token for token on the real default model. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from kerneltriage.backends.torch.accelerate import apply_levers
from kerneltriage.backends.torch.generate import generate_step
from kerneltriage.backends.torch.runner import build_runner
from kerneltriage.engine.sampling import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPT = "List three facts about the Moon, one per line:\n1."
LEVER_SETS = [("graphs",), ("compile=default", "graphs"), ("one_sync",), ("graphs", "one_sync"), ("packed_qkv", "packed_gate_up"),
              ("last_logits",), ("graphs", "one_sync", "packed_qkv", "packed_gate_up", "last_logits"),
              ("sdpa_backend=efficient",), ("sdpa_backend=math",), ("sdpa_fold",),
              ("fused_norm", "compile=default", "graphs"), ("flex_decode",), ("flex_decode", "graphs"),
              ("packed_qkv", "packed_gate_up", "fused_norm", "flex_decode", "compile=default", "graphs")]


@pytest.fixture(scope="module")
def prompt(default_checkpoint) -> list[int]:
    return default_checkpoint.tokenizer.encode(PROMPT)


@pytest.fixture(scope="module")
def plain_tokens(default_checkpoint, prompt) -> list[int]:
    runner = build_runner(default_checkpoint, torch.device("cuda"), torch.float32)
    return list(generate_step(runner, prompt, SamplingParams(), 300))


@pytest.mark.parametrize("levers", LEVER_SETS, ids=",".join)
def test_lever_keeps_greedy_tokens_on_the_real_model(default_checkpoint, prompt, plain_tokens, levers) -> None:
    # float32: the test is about the lever's logic; bf16 kernels of other shapes may round near-ties apart
    runner = apply_levers(build_runner(default_checkpoint, torch.device("cuda"), torch.float32), levers)
    # 300 tokens cross a graph window boundary (256), so a second graph is captured and used
    assert list(generate_step(runner, prompt, SamplingParams(), 300)) == plain_tokens
    for lever in levers:
        assert runner.counters[lever] > 0, lever


@pytest.mark.parametrize("levers", [("graphs",), ("packed_qkv", "packed_gate_up", "compile=default", "graphs"),
                                    ("flex_decode", "graphs")],
                         ids=",".join)
@pytest.mark.parametrize("spec", ["ngram", "selfdraft:15"])
def test_graphed_speculation_keeps_greedy_tokens(default_checkpoint, prompt, plain_tokens, levers, spec) -> None:
    from kerneltriage.backends.torch.speculative import install_speculation
    from kerneltriage.engine.speculative import parse_spec

    runner = apply_levers(build_runner(default_checkpoint, torch.device("cuda"), torch.float32), levers)
    decoder = install_speculation(runner, parse_spec(spec, "4"))
    assert list(generate_step(runner, prompt, SamplingParams(), 300)) == plain_tokens
    assert decoder.stats.verify_steps > 0
    # every verify replayed a graph of k+1 = 5 rows
    assert {rows for _, rows in runner.verify.graphs} == {5}
    assert runner.counters["spec"] == decoder.stats.verify_steps <= runner.counters["graphs"]


def test_m_sweep_times_the_gemv_not_the_host(default_checkpoint) -> None:
    from kerneltriage.backends.torch.msweep import m_sweep

    runner = build_runner(default_checkpoint, torch.device("cuda"), torch.bfloat16)
    curves = m_sweep(runner.model, torch.device("cuda"), (1, 5))
    assert curves and all(c.timer == "cuda graph replay" and min(c.seconds) > 0 for c in curves)
    # the 57 MB output projection streams at well over 2.5 TB/s on an H200-class GPU; timed through eager
    # launches on a slow host it measured ~30 µs per call, i.e. under 2 TB/s
    head = next(c for c in curves if "lm_head" in c.name)
    assert head.bandwidth() > 2.5e12


def test_sdpa_pad_finds_the_head_dims_fused_kernels_take() -> None:
    from kerneltriage.backends.torch import gates
    from kerneltriage.backends.torch.accelerate import fused_head_dim

    cuda = torch.device("cuda")
    assert fused_head_dim(64, torch.bfloat16, cuda) == 64  # flash takes it: nothing to pad
    size = fused_head_dim(300, torch.bfloat16, cuda)  # over flash's 256 and not 8-aligned for the others
    call = gates.SdpaCall((1, 8, 16, size), (1, 8, 16, size), "bfloat16", None, True, False)
    taken = [gates.probe(name, gates.random_inputs(call, cuda))[0] for _, _, name in gates.FUSED]
    assert size == 300 or (size % 8 == 0 and any(taken))
