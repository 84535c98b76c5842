"""`compile=blocks` on MLX: each layer's fixed-shape decode parts compiled, attention and the cache eager — greedy
tokens equal the eager step's on the llama-family architectures, every decode layer call counts it, prompts and
verifies run the layers as they are, and Gemma-3's layers are refused."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from conftest import tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.core.errors import InputError  # noqa: E402
from kerneltriage.engine.generation import generate_step  # noqa: E402
from kerneltriage.engine.sampling import SamplingParams  # noqa: E402

PROMPT, TOKENS = [9, 10, 11, 12, 40], 12


@pytest.mark.parametrize(("arch", "levers"), [("llama", ""), ("qwen2", "packed_qkv,packed_gate_up,one_sync"),
                                              ("qwen3", "quantized,packed_qkv,packed_gate_up,last_logits")])
def test_compiled_blocks_decode_the_eager_steps_tokens(arch: str, levers: str) -> None:
    checkpoint = quantized_checkpoint(arch)  # qwen2's q/k/v biases, qwen3's per-head norms inside the traced part
    eager = list(generate_step(mlx_runner(checkpoint, levers), PROMPT, SamplingParams(), TOKENS))
    runner = mlx_runner(checkpoint, ",".join(filter(None, [levers, "compile=blocks"])))
    assert list(generate_step(runner, PROMPT, SamplingParams(), TOKENS)) == eager and len(set(eager)) > 2
    layers = runner.config.num_layers
    assert runner.counters["compile=blocks"] == (TOKENS - 1) * layers  # every decode step's layers; not the prompt
    for setting in runner.run_config.levers:  # the levers inside the traced parts count at every call
        assert runner.counters[setting.text] > 0, (setting.text, dict(runner.counters))


def test_a_verify_runs_the_layers_as_they_are() -> None:
    runner = mlx_runner(tiny_checkpoint("llama"), "compile=blocks", spec="ngram", depth="3")
    tokens = list(generate_step(runner, [5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(), 10))
    assert tokens == list(generate_step(mlx_runner(tiny_checkpoint("llama")), [5, 6, 7, 5, 6, 7, 5, 6],
                                        SamplingParams(), 10))


def test_gemma3_layers_are_refused() -> None:
    with pytest.raises(InputError, match="takes llama-family layers"):
        mlx_runner(tiny_checkpoint("gemma3"), "compile=blocks")
