"""MLX levers on tiny models of every architecture: greedy output with any lever equals greedy output without it,
each lever's own code proves it ran (per step, under compile too), and levers that cannot apply say why."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from conftest import ARCHS, tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.backends.mlx.backend import BACKEND  # noqa: E402
from kerneltriage.core.errors import InputError  # noqa: E402
from kerneltriage.engine.configuration import RunConfig  # noqa: E402
from kerneltriage.engine.generation import generate_step  # noqa: E402
from kerneltriage.engine.kernels import Kernel  # noqa: E402
from kerneltriage.engine.levers import TABLE  # noqa: E402
from kerneltriage.engine.sampling import SamplingParams  # noqa: E402

PROMPT, TOKENS = [9, 10, 11, 12], 20
LEVER_SETS = ("last_logits", "packed_qkv,packed_gate_up", "one_sync", "sdpa_unfused", "compile=default",
              "quantized", "quantized,packed_qkv,packed_gate_up,compile=default,one_sync")


def greedy(runner) -> list[int]:  # noqa: ANN001
    return list(generate_step(runner, PROMPT, SamplingParams(), TOKENS))


def test_every_mlx_lever_of_the_table_has_an_applier() -> None:
    from kerneltriage.backends.mlx.levers import APPLIERS

    assert {lever.name for lever in TABLE if "mlx" in lever.backends} == set(APPLIERS)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_output_with_each_lever_equals_stock(arch: str) -> None:
    checkpoint = quantized_checkpoint(arch)  # blocks for `quantized`; every other lever runs on its dequantized model
    stock = greedy(mlx_runner(checkpoint))
    assert len(set(stock)) >= 4
    for levers in LEVER_SETS:
        runner = mlx_runner(checkpoint, levers)
        assert greedy(runner) == stock, levers
        for setting in runner.run_config.levers:
            assert runner.counters[setting.text] > 0, (levers, dict(runner.counters))


def test_compile_counts_every_step_and_the_levers_traced_into_it() -> None:
    runner = mlx_runner(tiny_checkpoint("llama"), "packed_qkv,compile=default")
    greedy(runner)
    # 19 compiled decode steps (the first token comes from the eager prefill), each counting packed_qkv once;
    # the eager prefill counts packed_qkv once per layer
    assert runner.counters["compile=default"] == TOKENS - 1
    assert runner.counters["packed_qkv"] == TOKENS - 1 + runner.config.num_layers


def test_compile_attends_over_windows_of_the_static_cache() -> None:
    from kerneltriage.backends.mlx.accelerate import WINDOW
    from kerneltriage.backends.mlx.cache import StaticKVCache

    checkpoint = tiny_checkpoint("llama", max_context=600)
    runner = mlx_runner(checkpoint, "compile=default")
    prompt = list(range(1, 250))
    tokens = list(generate_step(runner, prompt, SamplingParams(), 12))  # crosses the 256-slot window
    # one trace per window: 256 slots, then the whole cache (prompt + 12 slots: a window never passes its end)
    assert isinstance(runner.model.cache, StaticKVCache) and set(runner.decode_step.slots) == {WINDOW, 261}
    assert tokens == list(generate_step(mlx_runner(checkpoint), prompt, SamplingParams(), 12))


def test_quantized_keeps_the_blocks_and_reads_fewer_bytes() -> None:
    from kerneltriage.backends.mlx.quant import QuantizedEmbedding, QuantizedLinear

    checkpoint = quantized_checkpoint("qwen3")  # tied: the head multiplies by the embedding's own blocks
    stock, levered = mlx_runner(checkpoint), mlx_runner(checkpoint, "quantized")
    model = levered.model
    assert isinstance(model.embed_tokens, QuantizedEmbedding) and isinstance(model.lm_head, QuantizedLinear)
    assert model.lm_head.weight is model.embed_tokens.weight and model.embed_tokens.bits == 8
    assert model.layers[0].mlp.down_proj.bits == 4
    assert levered.held_bytes() < stock.held_bytes() / 3
    # nothing dequantized is held for copies' sake: a copy makes its stock weights again from the blocks
    assert callable(model.stock.weights["layers.0.mlp.down_proj.weight"])
    copy = BACKEND.copy(levered, RunConfig())  # a stock copy is dequantized again, from the kept stock weights
    assert not isinstance(copy.model.lm_head, QuantizedLinear) and greedy(copy) == greedy(stock)


def test_a_build_with_quantized_never_makes_the_dequantized_weights_it_replaces() -> None:
    """MLX is lazy: the build applies `quantized` before it evaluates the stock weights, so the matrices the lever
    keeps as blocks are never dequantized — the build's peak is below the stock model's own weights."""
    import gc

    import mlx.core as mx

    checkpoint = quantized_checkpoint("llama", vocab_size=2048)  # the matrices are most of the bytes

    def built(levers: str):  # noqa: ANN202 - the runner and the build's peak above what was alive before it
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()  # earlier tests' arrays still alive count in MLX's peak
        runner = mlx_runner(checkpoint, levers)
        return runner, mx.get_peak_memory() - before

    stock, stock_peak = built("")
    stock_bytes = stock.held_bytes()
    del stock
    levered, peak = built("quantized")
    assert peak < 0.6 * stock_bytes <= 0.6 * stock_peak, (peak, stock_bytes, stock_peak)
    assert greedy(levered) == greedy(mlx_runner(checkpoint, "quantized"))  # evaluated, and it runs


def test_quantized_logits_are_the_dequantized_models_up_to_summation_order() -> None:
    checkpoint = quantized_checkpoint("llama", projections="Q4_0")
    stock, levered = mlx_runner(checkpoint), mlx_runner(checkpoint, "quantized")
    a, _ = stock.forced_logits(PROMPT, None, 8)
    b, _ = levered.forced_logits(PROMPT, None, 8)
    assert np.linalg.norm(b - a) / np.linalg.norm(a) < 1e-5  # the same function (on the CPU even bit for bit)


@pytest.mark.parametrize(("levers", "dtype", "checkpoint", "message"), [
    ("graphs", "float32", "tiny", "runs on the torch backend, not mlx"),
    ("sdpa_backend=flash", "float32", "tiny", "runs on the torch backend, not mlx"),
    ("compile=max-autotune-no-cudagraphs", "float32", "tiny", "takes compile=default on mlx"),  # the table's `only`
    ("quantized", "float32", "tiny", "holds no Q4_0, Q4_1, Q8_0 weights"),
    ("quantized", "bfloat16", "quantized", "float16 scales would be rounded in bfloat16"),
])
def test_levers_that_cannot_apply_say_why(levers: str, dtype: str, checkpoint: str, message: str) -> None:
    weights = quantized_checkpoint() if checkpoint == "quantized" else tiny_checkpoint()
    with pytest.raises(InputError, match=message):
        mlx_runner(weights, levers, dtype=dtype)


NORM_CALLS = []


def _norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return weight * mx.fast.rms_norm(x.astype(mx.float32), None, eps).astype(x.dtype)


def _metal_double(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    kernel = mx.fast.metal_kernel(name="double", input_names=["x"], output_names=["out"],
                                  source="uint i = thread_position_in_grid.x; out[i] = 2 * x[i];")
    return kernel(inputs=[x], grid=(x.size, 1, 1), threadgroup=(32, 1, 1), output_shapes=[x.shape],
                  output_dtypes=[x.dtype])[0]


COMPOSED = Kernel("norm", _norm, name="composed rms_norm")
METAL = Kernel("norm", _metal_double, name="metal double")


def test_a_custom_kernel_runs_at_its_seam_and_counts() -> None:
    checkpoint = tiny_checkpoint("qwen3")  # q_norm and k_norm are norms too
    runner = mlx_runner(checkpoint, f"kernel={__name__}:COMPOSED")
    assert greedy(runner) == greedy(mlx_runner(checkpoint))
    assert runner.counters[f"kernel={__name__}:COMPOSED"] > 0


@pytest.mark.skipif(mx.metal.is_available(), reason="checks the refusal where Metal is absent")
def test_a_metal_kernel_is_refused_where_mlx_has_no_metal() -> None:
    with pytest.raises(InputError, match="does not run on MLX's cpu device here .*No Metal back-end"):
        mlx_runner(tiny_checkpoint(), f"kernel={__name__}:METAL")


def test_a_prefill_is_queued_when_it_returns() -> None:
    """MLX is lazy: a prefill timed between synchronized clocks must time the work, not the graph's building (the
    harness reads the first token after it: that read must be nearly free)."""
    from kerneltriage.bench.harness import prefill_sample
    from kerneltriage.bench.workloads import Tokens

    runner = mlx_runner(tiny_checkpoint("llama", max_context=512))
    runner.reset_cache(300)
    prefill_sample(runner, Tokens((), tuple(range(1, 257))))  # warm-up
    sample = prefill_sample(runner, Tokens((), tuple(range(1, 257))))
    assert sample.timed > 0.5 * sample.first_token
