"""prefill_graphs on the CPU: the padded, graphed prefill's bookkeeping (buckets, the real last row, the filler's
cache slots, one capture per bucket) through a stand-in graph whose replay re-runs the captured
Python under the captured window, as a CUDA graph re-runs its kernels."""

from __future__ import annotations

import pytest
import torch

from conftest import rerun_capture, tiny_runner
from kerneltriage.backends.torch import accelerate
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

GREEDY = SamplingParams()


def _graphed(levers: str = ""):  # noqa: ANN202
    runner = tiny_runner("llama", levers, max_context=512)
    accelerate.prefill_graphs(runner, capture_fn=rerun_capture(runner))
    return runner


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("levers", ["last_logits", ""])
def test_graphed_prefills_keep_greedy_tokens_and_count_replays(levers: str) -> None:
    plain, runner = tiny_runner("llama", max_context=512), _graphed(levers)
    # longest first, so the cache is allocated once (a new cache is a new window: new graphs). Bucket 128 captured;
    # bucket 64 captured, then replayed for two more lengths
    prompts = [_prompt(70, 3), _prompt(50, 2), _prompt(10, 0), _prompt(30, 1)]
    for prompt in prompts:
        expected = list(generate_step(plain, prompt, GREEDY, 6))
        assert len(set(expected)) > 2
        assert list(generate_step(runner, prompt, GREEDY, 6)) == expected
    assert runner.counters["prefill_graphs"] == 4
    assert runner.counters["last_logits"] == (4 if levers else 0)
    assert set(runner.prefill_step.graphed.graphs) == {(139, 128), (139, 64)}  # the whole cache; 128 and 64 rows


def test_a_graphed_prefill_after_a_filled_cache_matches_stock() -> None:
    """bench's pp512 at depth d: a prompt after d positions, its rows masked against the keys before them."""
    plain, runner = tiny_runner("llama", max_context=512), _graphed("last_logits")
    depth, prompt = _prompt(100, 4), _prompt(40, 5)
    for r in (plain, runner):
        r.reset_cache(len(depth) + len(prompt) + 8)
        r.prefill(depth, 0)
    expected = plain.prefill(prompt, len(depth))
    for _ in range(2):  # captured, replayed
        torch.testing.assert_close(runner.prefill(prompt, len(depth)), expected, rtol=1e-5, atol=1e-5)
        assert runner.model.cache.length == len(depth) + len(prompt)  # the filler's slots trimmed off
    assert runner.counters["prefill_graphs"] == 3  # the depth's prefill too


def test_padding_past_the_cache_runs_eagerly() -> None:
    runner = _graphed()
    prompt = _prompt(100, 6)
    for _ in range(3):
        runner.cache_slack = 0
        runner.reset_cache(len(prompt))  # 100 slots: the 128-row bucket would write past them
        runner.prefill(prompt, 0)
    assert runner.counters["prefill_graphs"] == 0 and not runner.prefill_step.graphed.graphs
