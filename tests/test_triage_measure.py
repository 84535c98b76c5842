"""Triage's lever A/B builds its candidate from a stock copy of the baseline's model."""

from __future__ import annotations

import threading

import pytest
import torch

from conftest import ARCHS, tiny_runner
from kerneltriage.backends.torch.accelerate import apply_levers
from kerneltriage.backends.torch.generate import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.triage.measure import candidate_runner

PROMPT = list(range(1, 17))


class _Uncopyable:
    """A step that, like a captured CUDA graph, cannot be deep-copied."""

    def __init__(self, step) -> None:  # noqa: ANN001
        self.step, self.lock = step, threading.Lock()

    def __call__(self, *args: object) -> torch.Tensor:
        return self.step(*args)


def test_candidate_is_a_stock_copy_with_the_baseline_levers_plus_one() -> None:
    runner = apply_levers(tiny_runner("qwen2"), ("packed_qkv", "fused_norm"))
    runner.decode = _Uncopyable(runner.decode)  # the baseline's own step objects must not be copied
    expected = list(generate_step(runner, PROMPT, SamplingParams(), 8))
    before = dict(runner.counters)
    candidate = candidate_runner(runner, "last_logits")
    assert candidate.levers == ("packed_qkv", "fused_norm", "last_logits")
    assert list(generate_step(candidate, PROMPT, SamplingParams(), 8)) == expected
    assert dict(runner.counters) == before  # the copy's levers count for the copy, not the baseline
    assert all(candidate.counters[lever] > 0 for lever in candidate.levers)
    ours = {p.data_ptr() for p in runner.model.parameters()}
    assert not ours & {p.data_ptr() for p in candidate.model.parameters()}  # weights copied, not shared
    # packed once: each attention holds one packed q/k/v, as on the baseline
    assert [n for n, _ in candidate.model.layers[0].self_attn.named_children()].count("packed_q_proj_k_proj_v_proj") == 1


def test_the_ab_runs_baseline_and_candidate_in_caches_of_one_size() -> None:
    from kerneltriage.bench.workloads import Test
    from kerneltriage.triage.measure import measure_lever

    runner = tiny_runner("llama")
    runner.reset_cache(100)  # left by an earlier, longer stage
    test = Test("tg", 4, 0)
    gain = measure_lever(runner, "last_logits", test, pairs=1, warmups=0)
    assert gain.ran and gain.same_tokens
    assert runner.model.cache.max_len == test.context_needed  # not the 100-slot cache of before


@pytest.mark.parametrize("arch", ARCHS)
def test_stock_copy_copies_every_weight_and_no_lever(arch: str) -> None:
    from kerneltriage.backends.torch.load import stock_copy
    from kerneltriage.backends.torch.models.llama import sdpa_attention

    runner = tiny_runner(arch)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every weight distinct (the presets' biases are 0 and norms 1: a swap would not show)
        for parameter in runner.model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    apply_levers(runner, ("packed_qkv", "packed_gate_up", "fused_norm"))
    copy = stock_copy(runner.model)
    source = dict(runner.model.named_parameters(remove_duplicate=False))
    copied = dict(copy.named_parameters(remove_duplicate=False))
    assert copied and all(torch.equal(p, source[name]) for name, p in copied.items())
    assert torch.equal(copy.inv_freq, runner.model.inv_freq) and copy.inv_freq.dtype == torch.float32
    assert (copy.lm_head.weight is copy.embed_tokens.weight) == runner.config.tie_embeddings
    assert copy.attention is sdpa_attention and not any("packed" in name for name in copied)
