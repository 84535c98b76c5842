"""Layered generation on tiny models whose greedy text varies: records, stops, limits; every CPU lever keeps the
greedy tokens and proves it ran; logits processors act alike in every token loop."""

from __future__ import annotations


import pytest
import torch

from conftest import ARCHS, tiny_runner
from kerneltriage.backends.torch.speculative import install_speculation
from kerneltriage.core.errors import InputError
from kerneltriage.engine.generation import generate, generate_step, stream_generate
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.config import parse_speculation

GREEDY = SamplingParams()
PROMPT = [9, 10, 11, 12]


def greedy_tokens(runner, count: int = 10, params: SamplingParams = GREEDY) -> list[int]:  # noqa: ANN001
    return list(generate_step(runner, PROMPT, params, count))


def test_stream_records_count_tokens_and_end_on_length() -> None:
    runner = tiny_runner("llama")
    records = list(stream_generate(runner, [3, 4, 5], GREEDY, max_tokens=6))
    assert [r.generation_tokens for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[-1].finish_reason == "length"
    assert all(r.finish_reason is None for r in records[:-1])
    assert records[-1].prompt_tps > 0 and records[-1].generation_tps > 0
    assert all(r.prompt_tokens == 3 for r in records)
    assert [r.token for r in records] == list(generate_step(runner, [3, 4, 5], GREEDY, 6))


def test_eos_stops_generation() -> None:
    tokens = list(generate_step(tiny_runner("qwen2"), [7, 8], GREEDY, 5))
    eos_runner = tiny_runner("qwen2", eos_token_ids=(tokens[2],))  # same weights: eos changes no draw
    records = list(stream_generate(eos_runner, [7, 8], GREEDY, 5))
    assert [r.token for r in records] == tokens[: tokens.index(tokens[2]) + 1]
    assert len(records) < 5 and records[-1].finish_reason == "stop" and records[-1].text == ""


def test_stop_string_cuts_the_text() -> None:
    runner = tiny_runner("llama")
    text = generate(runner, [65, 66], GREEDY, 12)
    assert len(text) > 3
    stop = text[2:4]
    cut = generate(runner, [65, 66], GREEDY, 12, stop=(stop,))
    assert cut == text[: text.index(stop)]


def test_text_held_back_for_a_stop_string_is_printed_when_eos_ends_the_run() -> None:
    tokens = list(generate_step(tiny_runner("llama"), [65, 66], GREEDY, 8))
    runner = tiny_runner("llama", eos_token_ids=(tokens[5],))
    full = generate(runner, [65, 66], GREEDY, 8)
    assert full  # the EOS ends the run after a few tokens of text
    # a stop string that begins with the last character holds it back, and the stop never comes
    assert generate(runner, [65, 66], GREEDY, 8, stop=(full[-1] + "\x00never",)) == full


def test_context_limit_ends_generation() -> None:
    runner = tiny_runner("qwen3", max_context=16)
    records = list(stream_generate(runner, list(range(1, 13)), GREEDY, max_tokens=50))
    assert len(records) == 4 and records[-1].finish_reason == "length"


@pytest.mark.parametrize("prompt, max_tokens, message", [
    (list(range(20)), 4, "context of 16"), (list(range(16)), 4, "context of 16"), ([], 4, "at least one token"),
    ([1, 2], 0, "--max-tokens 0"),
])
def test_bad_prompts_are_input_errors(prompt: list[int], max_tokens: int, message: str) -> None:
    runner = tiny_runner("llama", max_context=16)
    with pytest.raises(InputError, match=message):
        list(generate_step(runner, prompt, GREEDY, max_tokens))


def test_last_logits_lever_keeps_greedy_output() -> None:
    plain = greedy_tokens(tiny_runner("qwen3"), 8)
    runner = tiny_runner("qwen3", "last_logits")
    assert runner.levers == ("last_logits",) and runner.run_config.has("last_logits")
    assert greedy_tokens(runner, 8) == plain
    assert runner.counters["last_logits"] == 1  # the one prefill


# sdpa_backend=flash: the CPU's dispatcher serves every call with flash, whatever the priority order
@pytest.mark.parametrize("levers", ["one_sync", "packed_qkv", "packed_gate_up", "sdpa_backend=flash", "fused_norm",
                                    "sdpa_fold", "sdpa_fold,sdpa_backend=flash",
                                    "last_logits,one_sync,packed_qkv,packed_gate_up,fused_norm"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cpu_levers_keep_greedy_output_and_prove_they_ran(arch: str, levers: str) -> None:
    plain = greedy_tokens(tiny_runner(arch))
    assert len(set(plain)) >= 4  # the equality below could fail
    runner = tiny_runner(arch, levers)
    assert sorted(runner.levers) == sorted(levers.split(","))
    assert greedy_tokens(runner) == plain
    for lever in runner.levers:
        assert runner.counters[lever] > 0, lever


def test_one_sync_counts_every_token_and_a_pinned_flash_every_call() -> None:
    runner = tiny_runner("llama", "sdpa_backend=flash,one_sync")
    greedy_tokens(runner)
    # 10 tokens read once each; 2 layers × (1 prefill + 9 decode steps) attention calls, all served by flash
    assert runner.counters["one_sync"] == 10 and runner.counters["sdpa_backend=flash"] == 2 * 10


@pytest.mark.parametrize("backend", ["math", "efficient"])
def test_a_pinned_backend_the_cpu_never_serves_keeps_output_and_counts_nothing(backend: str) -> None:
    """On the CPU torch serves with flash whatever the priority order: the lever never ran (ab: invalid)."""
    plain = greedy_tokens(tiny_runner("qwen2"))
    runner = tiny_runner("qwen2", f"sdpa_backend={backend}")
    assert greedy_tokens(runner) == plain
    assert runner.counters[f"sdpa_backend={backend}"] == 0


def test_levers_apply_in_the_table_order_whatever_the_order_named() -> None:
    runner = tiny_runner("llama", "one_sync,last_logits,fused_norm,packed_qkv")
    assert runner.levers == ("packed_qkv", "fused_norm", "last_logits", "one_sync")


# Two compilations serve a token loop (the position specialised, then symbolic): Dynamo's limit is held at 2 so
# that a third — a step recompiled as its counters or positions move — fails the test.
COMPILATIONS = 2


def test_compile_lever_keeps_greedy_output() -> None:
    import torch._dynamo

    plain = greedy_tokens(tiny_runner("llama"), 4)
    runner = tiny_runner("llama", "compile=default")
    with torch._dynamo.config.patch(recompile_limit=COMPILATIONS):
        assert greedy_tokens(runner, 4) == plain
    assert runner.counters["compile=default"] == 3  # every decode step, none of them the prefill


def test_a_lever_compiled_into_the_step_counts_its_calls() -> None:
    """sdpa_fold runs only on one-token decode steps, all of them compiled here: its count must come from the
    compiled step it was traced into (counting inside the trace recompiled the step at every call)."""
    import torch._dynamo

    plain = greedy_tokens(tiny_runner("llama"), 5)
    runner = tiny_runner("llama", "sdpa_fold,compile=default")
    with torch._dynamo.config.patch(recompile_limit=COMPILATIONS):
        assert greedy_tokens(runner, 5) == plain
    # per call of the compiled step, one count, though the fold ran once per layer inside it
    assert runner.counters["sdpa_fold"] == runner.counters["compile=default"] == 4


def compiled_runners(count: int) -> list:
    """`count` live runners, each compiling its decode step at a cache length of its own (a guard each)."""
    from kerneltriage.backends.torch.cache import StaticKVCache

    runners = []
    for extra in range(count):
        runner = tiny_runner("llama", "packed_qkv,fused_norm,compile=default", num_layers=1)
        runner.cache_type = StaticKVCache
        prompt = PROMPT + [13] * extra
        expected = list(generate_step(tiny_runner("llama", num_layers=1), prompt, GREEDY, 2))
        assert list(generate_step(runner, prompt, GREEDY, 2)) == expected
        assert runner.counters["compile=default"] == 1 and runner.counters["packed_qkv"] == 1 + 1  # prefill, step
        runners.append(runner)
    return runners


def test_live_compiled_runners_do_not_share_one_compile_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo keeps compiled code per code object, `recompile_limit` entries at most (8; then, under fullgraph, a
    hard failure): runners alive together (ab holds three, the benchmarks several) each compile their own copy of
    the step. The limit is lowered to 2 here: 3 runners make the point 9 would at 8. The control shares one copy
    between the runners, as `decode_one` itself was shared, and fails at the third."""
    import torch._dynamo

    from kerneltriage.backends.torch import accelerate
    from kerneltriage.backends.torch.runner import decode_one, verify_rows

    with torch._dynamo.config.patch(recompile_limit=2):
        assert len(compiled_runners(3)) == 3
        shared = {step: accelerate.own_code(step) for step in (decode_one, verify_rows)}  # one copy for all runners
        monkeypatch.setattr(accelerate, "own_code", shared.__getitem__)
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            compiled_runners(3)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_flex_decoding_keeps_greedy_output(arch: str) -> None:
    """flex_decode's attention around eager FlexAttention (the lever compiles it, on CUDA only): decode steps
    through it, the prompt through SDPA, the same greedy tokens."""
    from torch.nn.attention.flex_attention import flex_attention

    from kerneltriage.backends.torch.attention_levers import flex_decoding

    plain = greedy_tokens(tiny_runner(arch))
    runner = tiny_runner(arch)
    runner.model.attention = flex_decoding(runner, flex_attention)
    assert greedy_tokens(runner) == plain
    assert runner.counters["flex_decode"] == 2 * 9  # 2 layers × 9 decode steps; the prefill kept SDPA


def test_flex_decoding_traces_into_a_compiled_step_over_a_static_window() -> None:
    """What `graphs` captures under compile, on the CPU: the decode step compiled whole (aot_eager: Dynamo's
    trace, eager kernels; Inductor's CPU FlexAttention is not exact) over the static cache's full window, the
    positions read from the cache's device scalar as a replay would."""
    from torch.nn.attention.flex_attention import flex_attention

    from kerneltriage.backends.torch.attention_levers import flex_decoding
    from kerneltriage.backends.torch.cache import StaticKVCache
    from kerneltriage.backends.torch.runner import decode_one

    expected = greedy_tokens(tiny_runner("llama"), 8)
    assert len(set(expected)) > 4  # tokens that depend on the attention
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

    runner.decode_step = windowed
    assert greedy_tokens(runner, 8) == expected


def test_flex_decode_masks_a_static_window_by_the_live_positions() -> None:
    """Under graphs the cache hands attention a fixed window and a mask; flex_decode masks by the position tensor
    instead, read at each call: one row (decode) and a verify's rows, with GQA, equal SDPA's masked attention."""
    from torch.nn.attention.flex_attention import flex_attention

    from kerneltriage.backends.torch.attention_levers import flex_decoding
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


@pytest.mark.parametrize("levers", ["graphs", "flex_decode", "compile=default,graphs", "packed_qkv,flex_decode"])
def test_cuda_levers_refuse_cpu(levers: str) -> None:
    refused = "graphs" if "graphs" in levers else "flex_decode"
    with pytest.raises(InputError, match=f"--levers {refused}: needs a CUDA device, not cpu"):
        tiny_runner("llama", levers)


def test_sdpa_pad_stays_off_where_a_kernel_takes_the_head_dim() -> None:
    runner = tiny_runner("llama", "sdpa_pad")  # the CPU's flash kernel takes any head_dim
    assert greedy_tokens(runner, 4)
    assert runner.levers == ("sdpa_pad",) and runner.counters["sdpa_pad"] == 0  # never ran: ab calls that invalid


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sdpa_pad_keeps_greedy_output_when_it_pads(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kerneltriage.backends.torch import attention_levers

    monkeypatch.setattr(attention_levers, "fused_head_dim", lambda dim, dtype, device: dim + 8)  # as if none took it
    plain = greedy_tokens(tiny_runner(arch))
    runner = tiny_runner(arch, "sdpa_pad")
    assert greedy_tokens(runner) == plain
    assert runner.counters["sdpa_pad"] == 2 * 10  # 2 layers × (the prefill and 9 decode steps)


def test_sdpa_pad_forced_size_pads_every_call() -> None:
    from kerneltriage.backends.torch.attention_levers import sdpa_pad

    plain = greedy_tokens(tiny_runner("qwen2"))
    runner = tiny_runner("qwen2")
    sdpa_pad(runner, size=64)  # head_dim 16 → 64
    assert greedy_tokens(runner) == plain
    assert runner.counters["sdpa_pad"] == 2 * 10


def test_sdpa_pad_pads_what_sdpa_fold_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    from kerneltriage.backends.torch import attention_levers

    monkeypatch.setattr(attention_levers, "fused_head_dim", lambda dim, dtype, device: dim + 8)
    plain = greedy_tokens(tiny_runner("llama"))
    runner = tiny_runner("llama", "sdpa_pad,sdpa_fold")
    assert runner.levers == ("sdpa_fold", "sdpa_pad")  # the table's order: fold first, then pad what it folded
    assert greedy_tokens(runner) == plain
    # per attention call, 2 layers: 9 decode steps folded; those and the prefill padded
    assert runner.counters["sdpa_fold"] == 2 * 9 and runner.counters["sdpa_pad"] == 2 * 10


def test_padded_attention_is_exact_on_every_path() -> None:
    from kerneltriage.backends.torch.attention_levers import padded_attention
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


LONG_PROMPT = list(range(9, 49))  # 40 tokens, half past the penalty's window: prompt lookup finds some drafts


@pytest.mark.parametrize("arch", ARCHS)
def test_repetition_penalty_is_the_same_in_every_token_loop(arch: str) -> None:
    """The penalty is a logits processor applied by the sampler: the plain loop, the pipelined one and
    speculation's acceptance (each verify row processed with the history and the drafts before it) agree. The
    whole target drafting (selfdraft:2) proposes the unpenalized greedy tokens, deep: rows after accepted drafts
    are where a processor that forgot the drafts would go wrong."""
    penalized = SamplingParams(repetition_penalty=1.3)

    def tokens(runner, params: SamplingParams = penalized) -> list[int]:  # noqa: ANN001
        return list(generate_step(runner, LONG_PROMPT, params, 24))

    plain = tokens(tiny_runner(arch))
    assert plain != tokens(tiny_runner(arch), GREEDY)  # the processor acts on this text
    assert tokens(tiny_runner(arch, "one_sync")) == plain
    for spec, depth in (("ngram", "3"), ("selfdraft:1", "3"), ("selfdraft:2", "8")):
        runner = tiny_runner(arch)
        decoder = install_speculation(runner, parse_speculation(spec, depth))
        assert tokens(runner) == plain, spec
        assert runner.counters["spec"] == decoder.stats.verify_steps > 0, spec
        assert spec == "ngram" or sum(decoder.stats.accepted) > 0, spec  # drafts were kept under the penalty


def test_compile_prefill_serves_every_prompt_length_from_one_compilation() -> None:
    from torch._dynamo.utils import counters

    plain, runner = tiny_runner("llama"), tiny_runner("llama", "last_logits,compile_prefill")
    before = counters["stats"]["unique_graphs"]
    # longest first: the cache is allocated once (a larger one is a new shape, hence one recompilation)
    for prompt in (PROMPT * 3, PROMPT + [13, 14, 15, 16], PROMPT, PROMPT[:3]):
        assert list(generate_step(runner, prompt, GREEDY, 3)) == list(generate_step(plain, prompt, GREEDY, 3))
    assert runner.counters["compile_prefill"] == runner.counters["last_logits"] == 4  # every prefill, compiled
    assert counters["stats"]["unique_graphs"] - before == 1  # the length is dynamic from the first prompt on


def test_compile_prefill_takes_a_prompt_that_fills_the_cache_exactly() -> None:
    """The H200's pp512 bench allocates exactly the prompt's slots: copy_ into the full cache made dynamo specialise
    the length it was told was dynamic (a ConstraintViolationError); now it compiles for that length."""
    plain, runner = tiny_runner("llama"), tiny_runner("llama", "compile_prefill")
    prompt = PROMPT * 2
    for r in (plain, runner):
        r.reset_cache(len(prompt))
    assert runner.cache_capacity == len(prompt)
    torch.testing.assert_close(runner.prefill(prompt, 0), plain.prefill(prompt, 0), rtol=1e-5, atol=1e-5)
