"""Gemma-3, the second real model: Gemma-3-270M's Q4_K_M GGUF (PyPI's chunk packages, `--model gemma3-270m`)
against transformers' own reading of the same file (logits and greedy tokens, float32, CPU), MLX against torch on
it, and on the tiny
gemma3 (a sliding first layer of window 8, passed by every sequence here) the levers that take Gemma's layers keep
its greedy tokens while those that do not are refused in one line."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import tiny_runner
from kerneltriage.backends.torch.backend import build_runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

PROMPT = "The history of computing is a story of layers: transistors become gates, gates become"
NEW = 8
# levers that take Gemma's layers on the CPU (the band-masked sliding attention bypasses the attention ones past
# the window: they must still keep the tokens)
LEVER_SETS = ("packed_qkv,packed_gate_up", "sdpa_fold", "sdpa_pad", "sdpa_backend=math", "last_logits", "one_sync")


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    """The real GGUF, fetched into the user cache on first use (238 MB), as the default model's fixture does: a
    fetch that fails is a failure, not a skip."""
    from kerneltriage.engine.fetch import PUBLISHED, published_model_path

    return published_model_path(PUBLISHED["gemma3-270m"], progress=None)


@pytest.fixture(scope="module")
def gemma_checkpoint(gemma_gguf: Path) -> Any:
    from kerneltriage.engine.sources import load_checkpoint

    return load_checkpoint(str(gemma_gguf))


@pytest.fixture(scope="module")
def gemma_runner(gemma_checkpoint: Any) -> Any:
    return build_runner(gemma_checkpoint, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def gemma_greedy(gemma_checkpoint: Any, gemma_runner: Any) -> list[int]:
    """Our torch greedy tokens after PROMPT: what transformers and MLX must emit."""
    return list(generate_step(gemma_runner, gemma_checkpoint.tokenizer.encode(PROMPT), SamplingParams(), NEW))


@pytest.fixture(scope="module")
def hf_gemma(gemma_gguf: Path) -> torch.nn.Module:
    """transformers' conversion of the GGUF (norms back to w, Q4_K/Q5_0/Q6_K/Q8_0 dequantized by gguf-py). Its
    reader parses the 262k-token vocabulary in Python (~20 s a parse): parsed once here, not once per use."""
    import gguf
    import transformers  # a dependency of the project: its absence is a failure, not a skip

    reader = functools.cache(gguf.GGUFReader)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", lambda path, mode="r": reader(str(path), mode))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        return transformers.AutoModelForCausalLM.from_pretrained(
            gemma_gguf.parent, gguf_file=gemma_gguf.name, dtype=torch.float32).eval()


@pytest.mark.real_model
def test_the_gguf_is_read_as_gemma3(gemma_checkpoint: Any) -> None:
    config = gemma_checkpoint.config
    assert (config.arch, config.vocab_size, config.head_dim, config.sliding_window) == ("gemma3", 262144, 256, 512)
    assert [config.sliding(i) for i in range(6)] == [True] * 5 + [False]
    assert {raw.qtype for raw in gemma_checkpoint.tensors.values()} >= {"Q4_K", "Q6_K"}


@pytest.mark.real_model
def test_logits_and_greedy_tokens_match_transformers(gemma_checkpoint: Any, gemma_runner: Any,
                                                     gemma_greedy: list[int], hf_gemma: torch.nn.Module) -> None:
    ids = gemma_checkpoint.tokenizer.encode(PROMPT)
    gemma_runner.reset_cache(64)
    with torch.inference_mode():
        ours, theirs = gemma_runner.model(torch.tensor([ids]), 0), hf_gemma(torch.tensor([ids])).logits
    assert (ours - theirs).abs().max().item() < 1e-3  # measured 2.5e-5 (logits up to ~30)
    assert len(set(gemma_greedy)) >= 4  # a continuation two implementations could disagree on
    expected = []
    with torch.inference_mode():
        out = hf_gemma(torch.tensor([ids]), use_cache=True)
        for _ in range(NEW):  # plain greedy through HF's own KV cache, EOS not special: generate_step's rule
            expected.append(int(out.logits[0, -1].argmax()))
            out = hf_gemma(torch.tensor([expected[-1:]]), past_key_values=out.past_key_values, use_cache=True)
    assert gemma_greedy == expected


@pytest.mark.real_model
def test_mlx_emits_torchs_greedy_tokens(gemma_checkpoint: Any, gemma_greedy: list[int]) -> None:
    pytest.importorskip("mlx.core")
    from kerneltriage.backends.mlx.load import build_runner as mlx_runner

    ids = gemma_checkpoint.tokenizer.encode(PROMPT)
    runner = mlx_runner(gemma_checkpoint, "cpu", "float32")
    # measured: logits within 6.9e-5 of torch's, 16 of 16 greedy tokens equal
    assert list(generate_step(runner, ids, SamplingParams(), NEW)) == gemma_greedy


def test_levers_that_take_gemma_layers_keep_its_greedy_tokens() -> None:
    prompt = list(range(9, 21))  # 12 positions: past the sliding window of 8 from the prompt on
    stock = list(generate_step(tiny_runner("gemma3"), prompt, SamplingParams(), 16))
    assert len(set(stock)) >= 4
    for levers in LEVER_SETS:
        assert list(generate_step(tiny_runner("gemma3", levers), prompt, SamplingParams(), 16)) == stock, levers


def test_an_attention_function_of_four_arguments_is_called_as_the_model_calls_it() -> None:
    """A probe replacing `Model.attention` may take (q, k, v, pos) alone (engine/sparsity.py): the sliding layers'
    wrapper passes on only what it was given."""
    from kerneltriage.backends.torch.models.llama import sdpa_attention

    prompt, seen = [9, 10, 11, 12], []
    stock = list(generate_step(tiny_runner("gemma3"), prompt, SamplingParams(), 8))
    runner = tiny_runner("gemma3")
    runner.model.attention = lambda q, k, v, pos: seen.append(k.shape[2]) or sdpa_attention(q, k, v, pos)
    assert list(generate_step(runner, prompt, SamplingParams(), 8)) == stock
    # keys 4 (the prompt) to 11: the global layer at each step, the sliding one while the keys fit its window of 8
    assert sorted(seen) == sorted([*range(4, 12), *range(4, 9)])


def test_graphs_static_cache_keeps_the_sliding_window() -> None:
    """Under `graphs` attention reads a fixed window of cache slots under the cache's mask (wider than the sliding
    window of 8): the band is cut out of that mask. On the CPU a "replay" reruns what was captured."""
    from conftest import rerun_capture
    from kerneltriage.backends.torch import accelerate

    prompt = list(range(9, 21))
    stock = list(generate_step(tiny_runner("gemma3"), prompt, SamplingParams(), 16))
    runner = tiny_runner("gemma3")
    accelerate.graphs(runner, capture_fn=rerun_capture(runner))
    assert list(generate_step(runner, prompt, SamplingParams(), 16)) == stock
    assert runner.counters["graphs"] == 15


def test_roofline_reads_a_sliding_layer_s_window_only() -> None:
    """Tiny gemma3: layer 0 slides over 8 positions, layer 1 is global. A decode step at context 100 reads 8 + 100
    positions' K and V; 3 steps from depth 5 (contexts 6, 7, 8 in layer 1; 6, 7, 8 capped at 8 in layer 0)."""
    from conftest import tiny_config
    from kerneltriage.core import roofline

    config = tiny_config("gemma3")
    per_position = 2 * config.num_kv_heads * config.head_dim * 4  # K and V of one layer, float32
    assert roofline.decode_cost(config, 1, 99, 0.0, 4).bytes == (8 + 100) * per_position
    assert roofline.layer_contexts(config, 5, 3) == (6 + 7 + 8) * 2
    assert roofline.layer_contexts(config, 6, 3) == (7 + 8 + 8) + (7 + 8 + 9)
    assert roofline.layer_contexts(tiny_config("gemma3", sliding_window=None, sliding_pattern=0), 99, 1) == 200


@pytest.mark.parametrize("lever", ["fused_norm", "fused_layer"])  # (pdl needs fused_layer beside it)
def test_levers_without_gemma_layers_are_refused_in_one_line(lever: str) -> None:
    from kerneltriage.engine.levers import LEVERS, Place, parse_setting, refusal

    takes = LEVERS[lever].architectures
    assert "gemma3" not in takes and refusal(parse_setting(lever), (), Place("torch", "cuda", takes[0])) is None
    why = refusal(parse_setting(lever), (), Place("torch", "cuda", "gemma3"))
    assert why == f"takes {', '.join(takes)} layers, not gemma3's"
    if lever == "fused_norm":  # the CPU runs it: the runner refuses it in one line
        with pytest.raises(InputError) as info:
            tiny_runner("gemma3", lever)
        assert str(info.value) == "--levers fused_norm: takes llama, qwen2, qwen3 layers, not gemma3's"
