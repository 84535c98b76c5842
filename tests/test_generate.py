"""Layered generation on a tiny random model."""

from __future__ import annotations

import pytest

from conftest import tiny_runner
from kerneltriage.backends.torch.generate import generate, generate_step, stream_generate
from kerneltriage.core.errors import InputError
from kerneltriage.engine.sampling import SamplingParams

GREEDY = SamplingParams()


def test_stream_records_count_tokens_and_end_on_length() -> None:
    runner = tiny_runner("llama")
    records = list(stream_generate(runner, [3, 4, 5], GREEDY, max_tokens=6))
    assert [r.generation_tokens for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[-1].finish_reason == "length"
    assert all(r.finish_reason is None for r in records[:-1])
    assert records[-1].prompt_tps > 0 and records[-1].generation_tps > 0
    assert [r.token for r in records] == list(generate_step(runner, [3, 4, 5], GREEDY, 6))


def test_eos_stops_generation() -> None:
    runner = tiny_runner("qwen2")
    tokens = list(generate_step(runner, [7, 8], GREEDY, 5))
    eos_runner = tiny_runner("qwen2", eos_token_ids=(tokens[2],))
    records = list(stream_generate(eos_runner, [7, 8], GREEDY, 5))
    assert [r.token for r in records] == tokens[: tokens.index(tokens[2]) + 1]
    assert records[-1].finish_reason == "stop"


def test_stop_string_cuts_the_text() -> None:
    runner = tiny_runner("llama")
    text = generate(runner, [65, 66], GREEDY, 12)
    assert len(text) > 3
    stop = text[2:4]
    cut = generate(runner, [65, 66], GREEDY, 12, stop=(stop,))
    assert cut == text[: text.index(stop)]


def test_context_limit_ends_generation() -> None:
    runner = tiny_runner("qwen3", max_context=16)
    records = list(stream_generate(runner, list(range(1, 13)), GREEDY, max_tokens=50))
    assert len(records) == 4 and records[-1].finish_reason == "length"


def test_prompt_longer_than_context_is_an_input_error() -> None:
    runner = tiny_runner("llama", max_context=16)
    with pytest.raises(InputError, match="context of 16"):
        list(generate_step(runner, list(range(20)), GREEDY, 4))


def test_last_logits_lever_keeps_greedy_output() -> None:
    from kerneltriage.backends.torch.accelerate import apply_levers

    plain = list(generate_step(tiny_runner("qwen3"), [9, 10, 11], GREEDY, 8))
    lever = apply_levers(tiny_runner("qwen3"), ("last_logits",))
    assert lever.levers == ("last_logits",)
    assert list(generate_step(lever, [9, 10, 11], GREEDY, 8)) == plain


@pytest.mark.parametrize("levers", [("one_sync",), ("packed_qkv",), ("packed_gate_up",), ("sdpa_backend=math",),
                                    ("fused_norm",), ("sdpa_fold",), ("sdpa_fold", "sdpa_backend=math"),
                                    ("last_logits", "one_sync", "packed_qkv", "packed_gate_up")])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cpu_levers_keep_greedy_output_and_prove_they_ran(arch: str, levers: tuple[str, ...]) -> None:
    from kerneltriage.backends.torch.accelerate import apply_levers

    plain = list(generate_step(tiny_runner(arch), [9, 10, 11, 12], GREEDY, 10))
    runner = apply_levers(tiny_runner(arch), levers)
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 10)) == plain
    for lever in levers:
        assert runner.counters[lever] > 0, lever


def test_compile_lever_keeps_greedy_output() -> None:
    from kerneltriage.backends.torch.accelerate import apply_levers

    plain = list(generate_step(tiny_runner("llama"), [9, 10, 11, 12], GREEDY, 6))
    runner = apply_levers(tiny_runner("llama"), ("compile=default",))
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 6)) == plain
    assert runner.counters["compile=default"] == 5


def test_a_lever_compiled_into_the_step_counts_its_calls() -> None:
    """sdpa_fold runs only on one-token decode steps, all of them compiled here: its count must come from the
    compiled step it was traced into (counting inside the trace recompiled the step at every call)."""
    from kerneltriage.backends.torch.accelerate import apply_levers

    plain = list(generate_step(tiny_runner("llama"), [9, 10, 11, 12], GREEDY, 12))
    runner = apply_levers(tiny_runner("llama"), ("sdpa_fold", "compile=default"))
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 12)) == plain
    assert runner.counters["sdpa_fold"] == runner.counters["compile=default"] == 11


def test_live_compiled_runners_do_not_share_one_compile_cache() -> None:
    """Dynamo keeps compiled code per code object, 8 entries at most (then, under fullgraph, a hard failure):
    runners alive together (ab holds three, the benchmarks several) each compile their own copy of the step."""
    from kerneltriage.backends.torch.accelerate import apply_levers
    from kerneltriage.backends.torch.cache import StaticKVCache

    runners = []
    for extra in range(10):  # a cache length each: a guard each, more than the 8 one code object keeps
        runner = apply_levers(tiny_runner("llama"), ("packed_qkv", "fused_norm", "compile=default"))
        runner.cache_type = StaticKVCache
        prompt = [9, 10, 11, 12] + [13] * extra
        assert list(generate_step(runner, prompt, GREEDY, 4)) == list(generate_step(tiny_runner("llama"), prompt,
                                                                                      GREEDY, 4))
        runners.append(runner)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_flex_decoding_keeps_greedy_output(arch: str) -> None:
    """flex_decode's attention around eager FlexAttention (the lever compiles it, on CUDA only): decode steps
    through it, the prompt through SDPA, the same greedy tokens."""
    from torch.nn.attention.flex_attention import flex_attention

    from kerneltriage.backends.torch.accelerate import flex_decoding

    plain = list(generate_step(tiny_runner(arch), [9, 10, 11, 12], GREEDY, 10))
    runner = tiny_runner(arch)
    runner.model.attention = flex_decoding(runner, flex_attention)
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 10)) == plain
    assert runner.counters["flex_decode"] == 2 * 9  # 2 layers × 9 decode steps; the prefill kept SDPA


def test_flex_decoding_traces_into_a_compiled_step_over_a_static_window() -> None:
    """What `graphs` captures under compile, on the CPU: the decode step compiled whole (aot_eager: Dynamo's
    trace, eager kernels; Inductor's CPU FlexAttention is not exact) over the static cache's full window, the
    positions read from the cache's device scalar as a replay would."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from kerneltriage.backends.torch.accelerate import flex_decoding
    from kerneltriage.backends.torch.cache import StaticKVCache
    from kerneltriage.backends.torch.runner import decode_one

    expected = list(generate_step(tiny_runner("llama"), [9, 10, 11, 12], GREEDY, 8))
    assert len(set(expected)) > 4  # tokens that depend on the attention (tiny qwen3 repeats one token)
    runner = tiny_runner("llama")
    runner.cache_type = StaticKVCache
    runner.model.attention = flex_decoding(runner, flex_attention)
    compiled = torch.compile(decode_one, backend="aot_eager", fullgraph=True)

    def windowed(model, token, start):  # noqa: ANN001, ANN202 - GraphedStep's bookkeeping, without the graph
        cache = model.cache
        cache.window = cache.max_len
        cache.position.fill_(start)
        try:
            return compiled(model, token, start)
        finally:
            cache.window, cache.length = None, start + 1

    runner.decode = windowed
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 8)) == expected


def test_flex_decode_masks_a_static_window_by_the_live_positions() -> None:
    """Under graphs the cache hands attention a fixed window and a mask; flex_decode masks by the position tensor
    instead, read at each call: one row (decode) and a verify's rows, with GQA, equal SDPA's masked attention."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from kerneltriage.backends.torch.accelerate import flex_decoding
    from kerneltriage.backends.torch.cache import Positions
    from kerneltriage.backends.torch.models.llama import sdpa_attention

    runner = tiny_runner("llama")
    runner.model.attention = flex_decoding(runner, flex_attention)
    generator = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 32, 16, generator=generator) for _ in range(2))  # a 32-slot window, 2 KV heads
    for rows, start in ((1, 5), (1, 20), (3, 11)):
        q = torch.randn(1, 4, rows, 16, generator=generator)
        ids = torch.arange(start, start + rows)
        pos = Positions(None, ids, torch.arange(32).unsqueeze(0) <= ids.unsqueeze(1))
        assert torch.allclose(runner.model.attention(q, k, v, pos), sdpa_attention(q, k, v, pos), atol=1e-5)
    assert runner.counters["flex_decode"] == 3


def test_cuda_levers_refuse_cpu() -> None:
    from kerneltriage.backends.torch.accelerate import apply_levers

    with pytest.raises(InputError, match="CUDA"):
        apply_levers(tiny_runner("llama"), ("graphs",))
    with pytest.raises(InputError, match="flex_decode: needs a CUDA device"):
        apply_levers(tiny_runner("llama"), ("flex_decode",))


def test_sdpa_pad_stays_off_where_a_kernel_takes_the_head_dim() -> None:
    from kerneltriage.backends.torch.accelerate import apply_levers

    runner = apply_levers(tiny_runner("llama"), ("sdpa_pad",))  # the CPU's flash kernel takes any head_dim
    list(generate_step(runner, [9, 10, 11, 12], GREEDY, 4))
    assert runner.counters["sdpa_pad"] == 0  # it never ran: ab calls that invalid, triage a no-lever


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sdpa_pad_keeps_greedy_output_when_it_pads(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kerneltriage.backends.torch import accelerate

    monkeypatch.setattr(accelerate, "fused_head_dim", lambda dim, dtype, device: dim + 8)  # as if no kernel took it
    plain = list(generate_step(tiny_runner(arch), [9, 10, 11, 12], GREEDY, 10))
    runner = accelerate.apply_levers(tiny_runner(arch), ("sdpa_pad",))
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 10)) == plain
    assert runner.counters["sdpa_pad"] > 0


def test_sdpa_pad_pads_what_sdpa_fold_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    from kerneltriage.backends.torch import accelerate

    monkeypatch.setattr(accelerate, "fused_head_dim", lambda dim, dtype, device: dim + 8)
    plain = list(generate_step(tiny_runner("llama"), [9, 10, 11, 12], GREEDY, 10))
    runner = accelerate.apply_levers(tiny_runner("llama"), ("sdpa_pad", "sdpa_fold"))  # applied fold first
    assert list(generate_step(runner, [9, 10, 11, 12], GREEDY, 10)) == plain
    # per attention call, 2 layers: 9 decode steps folded; those and the prefill padded
    assert runner.counters["sdpa_fold"] == 2 * 9 and runner.counters["sdpa_pad"] == 2 * 10


def test_padded_attention_is_exact_on_every_path() -> None:
    import torch

    from kerneltriage.backends.torch.accelerate import padded_attention
    from kerneltriage.backends.torch.cache import Positions
    from kerneltriage.backends.torch.models.llama import sdpa_attention

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 20, generator=generator)
    k, v = (torch.randn(1, 2, 7, 20, generator=generator) for _ in range(2))
    mask = torch.arange(7).unsqueeze(0) <= torch.arange(4, 7).unsqueeze(1)
    for pos in (Positions(4, torch.arange(4, 7), None), Positions(None, torch.arange(4, 7), mask)):
        expected = sdpa_attention(q, k, v, pos)
        assert torch.allclose(padded_attention(sdpa_attention, 32)(q, k, v, pos), expected, atol=1e-6)
    fresh = Positions(0, torch.arange(7), None)
    q7 = torch.randn(1, 4, 7, 20, generator=generator)
    assert torch.allclose(padded_attention(sdpa_attention, 24)(q7, k, v, fresh), sdpa_attention(q7, k, v, fresh),
                          atol=1e-6)
