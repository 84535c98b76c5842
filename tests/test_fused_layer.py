"""The `fused_layer` lever (kernels/fused_layer.py) against the stock layer: the same outputs and the same cache
writes for decode and verify rows at several depths, in the eager and the static (graph) cache layouts; the same
greedy tokens through the model; refusals where it cannot run. On a machine without CUDA the kernels run in
Triton's interpreter (conftest); their speed is judged on a GPU with `ab`."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_checkpoint, tiny_runner
from kerneltriage.backends.torch import levers
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.backends.torch.cache import KVCache, StaticKVCache
from kerneltriage.backends.torch.models.llama import Step
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # in the GPU suite too: on CUDA its kernels run compiled (here, in the interpreter)


def _runner(levers_text: str = "", arch: str = "llama", **changes: object):  # noqa: ANN202
    return BACKEND.build(tiny_checkpoint(arch, max_context=512, **changes), RunConfig.from_flags(levers_text),
                         DEVICE, "float32")


def _fused(runner):  # noqa: ANN001, ANN202 - the runner with the lever applied (on the CPU too: the interpreter)
    levers.APPLIERS["fused_layer"](runner, None)
    return runner


def _layer_run(runner, cache_type: type, rows: int, depth: int, window: int | None):  # noqa: ANN001, ANN202
    """Layer 0's output and cache for `rows` new rows after `depth` random cached positions."""
    model = runner.model
    gen = torch.Generator().manual_seed(rows * 1000 + depth)
    shape = model.cache_shape(256)  # room past the window
    cache = cache_type(shape, torch.device(DEVICE), torch.float32)
    cache.keys.copy_(torch.randn(shape, generator=gen))
    cache.values.copy_(torch.randn(shape, generator=gen))
    x = torch.randn(1, rows, model.config.hidden_size, generator=gen).to(DEVICE)
    if window is not None:
        cache.window, cache.position = window, torch.tensor(depth, device=DEVICE)
    pos = cache.positions(depth, rows)
    cos, sin = model.rope(pos.ids, x.dtype)
    with torch.inference_mode():
        out = model.layers[0](x, 0, Step(pos, cos, sin, cache, model.attention))
    return out, cache


# decode rows and verify rows (17: past one 16-row tile) at depths 0 and past a tile, in the eager and the static
# (graph) cache layout; qwen2: biases on q, k and v; qwen3: per-head q/k norms (one head per program)
@pytest.mark.parametrize(("arch", "rows", "depth", "static"), [
    ("llama", 1, 0, False), ("llama", 1, 70, True), ("llama", 9, 70, False), ("llama", 17, 33, True),
    ("qwen2", 1, 70, False), ("qwen2", 5, 0, True), ("qwen3", 1, 70, True), ("qwen3", 17, 33, False)])
def test_layer_matches_stock(arch: str, rows: int, depth: int, static: bool) -> None:
    stock, fused = _runner(arch=arch), _fused(_runner(arch=arch))
    cache_type, window = (StaticKVCache, 128) if static else (KVCache, None)
    want, want_cache = _layer_run(stock, cache_type, rows, depth, window)
    got, got_cache = _layer_run(fused, cache_type, rows, depth, window)
    assert fused.counters["fused_layer"] == 1
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < 2e-5
    for name in ("keys", "values"):  # this layer's rows written at their positions, nothing else touched
        assert torch.allclose(getattr(got_cache, name), getattr(want_cache, name), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "dot_bk", "tile", "partial", "programs"), [
    (1, 32, 64, False, 0), (17, 32, 64, False, 0), (1, 64, 256, True, 0), (17, 64, 256, True, 0),
    (17, 16, 64, False, 12), (17, 16, 64, False, 10**6), (17, 64, 256, True, 10**6)])
def test_layer_matches_stock_with_k_in_several_rounds(rows: int, dot_bk: int, tile: int, partial: bool, programs: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """K read in several rounds (the tiny model's K fits one): the RMS over rounds, a decode row's products summed in
    place over pipelined rounds, and the pipelined tl.dot loop (rounds of 16 or 32: the hidden 64 in 2–4 rounds),
    or a last round only partly inside K (96 in 64 + 32); and K
    split over programs (`programs`: SPLIT_PROGRAMS), each split's share summed by the block's last arriver, the
    semaphores left at zero for the next launch."""
    from kerneltriage.kernels import fused_layer

    monkeypatch.setattr(fused_layer, "DOT_BK", dot_bk)
    monkeypatch.setattr(fused_layer, "DECODE_BK", dot_bk)  # a decode row's rounds: summed in place (`_gemv2` DEFER)
    monkeypatch.setattr(fused_layer, "TILE", tile)
    monkeypatch.setattr(fused_layer, "SPLIT_PROGRAMS", programs)
    hidden, inter = fused_layer._tiles(rows, 96, 64), fused_layer._tiles(rows, 64, 96)  # K = 64, K = 96
    whole = hidden.rounds * hidden.splits, inter.rounds * inter.splits
    if partial:
        assert whole[1] == 2 and 96 % inter.bk and (programs or whole[0] == 1)
    else:
        assert whole[0] >= 2 and 96 % inter.bk == 0
    if programs:  # 6 and 4 column blocks split in 2 and 3 (the fewest that make 12 programs), or in every round
        assert (hidden.splits, inter.splits) == ((2, 3) if programs == 12 else whole)
    stock, fused = _runner(), _fused(_runner())
    want, _ = _layer_run(stock, StaticKVCache, rows, 33, 128)
    got, _ = _layer_run(fused, StaticKVCache, rows, 33, 128)
    assert (got - want).abs().max() / want.abs().max() < 2e-5
    assert not fused_layer._semaphores(torch.device(DEVICE)).any()


@pytest.mark.parametrize(("rows", "tile", "head_rounds", "split"), [
    (1, 256, 1, 4), (1, 256, 2, 2), (1, 512, 1, 2), (17, 8192, 1, 1)])
def test_qwen3_heads_with_k_in_several_rounds(rows: int, tile: int, head_rounds: int, split: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode's head tile reads K (64) in rounds of 16 or 32, split over 4 or 2 programs per head (one or two
    rounds each), each split's share summed by the head's last arriver before its norm; a verify's in one round
    through tl.dot. The q/k norm weights are far from the tiny model's near-1 ones, so a weight misapplied or left
    out shows."""
    from kerneltriage.kernels import fused_layer

    monkeypatch.setattr(fused_layer, "TILE", tile)
    monkeypatch.setattr(fused_layer, "HEAD_ROUNDS", head_rounds)
    tiles = fused_layer._head_tiles(rows, 8, 16, 64)
    assert (tiles.bn, tiles.splits, tiles.rounds * tiles.splits) == (16, split, 64 // tiles.bk)
    stock, fused = _runner(arch="qwen3"), _fused(_runner(arch="qwen3"))
    for runner in (stock, fused):  # the same norm weights in both, far from the tiny model's near-1 ones
        for norm in (runner.model.layers[0].self_attn.q_norm, runner.model.layers[0].self_attn.k_norm):
            norm.weight.data.copy_(torch.linspace(0.2, 3.0, norm.weight.numel()))  # in place: the kernels' view
    want, _ = _layer_run(stock, StaticKVCache, rows, 33, 128)
    got, _ = _layer_run(fused, StaticKVCache, rows, 33, 128)
    assert (got - want).abs().max() / want.abs().max() < 2e-5
    assert not fused_layer._semaphores(torch.device(DEVICE)).any()


def test_head_tiles_at_qwen3_shapes() -> None:
    """qwen3-0.6b's decode (32 heads of 64 pairs, K 1024): 256 programs of one round of 128; a verify's tl.dot
    tiles split K in 2 (64 programs, as llama's) and keep 3 rounds of 64 in flight (float32: 3 × 32 KB of shared
    memory)."""
    from kerneltriage.kernels.fused_layer import _head_tiles

    decode, verify = _head_tiles(1, 32, 64, 1024), _head_tiles(16, 32, 64, 1024)
    assert (decode.bn, decode.bk, decode.rounds, decode.splits, decode.grid(32 * 64)) == (64, 128, 1, 8, (32, 8))
    assert (verify.bn, verify.bk, verify.rounds, verify.stages, verify.grid(32 * 64)) == (64, 64, 8, 3, (32, 2))


def test_greedy_tokens_and_counts_through_the_model() -> None:
    prompt = list(range(3, 40))  # a prompt longer than 32 rows: prefill takes the stock layer
    plain = list(generate_step(_runner(), prompt, SamplingParams(), 5))
    runner = _fused(_runner())
    assert list(generate_step(runner, prompt, SamplingParams(), 5)) == plain
    assert runner.counters["fused_layer"] == 4 * 2  # every decode step, both layers; the prefill none


def test_speculative_verify_rows_keep_greedy_tokens() -> None:
    prompt = [5, 6, 7, 8] * 9  # 36 rows: the prompt takes the stock layer, verifies the fused one
    plain = list(generate_step(_runner(num_layers=1), prompt, SamplingParams(), 8))
    runner = _fused(_runner(num_layers=1))
    from kerneltriage.backends.torch.speculative import install_speculation
    from kerneltriage.engine.configuration import parse_speculation

    install_speculation(runner, parse_speculation("ngram:4"))
    assert list(generate_step(runner, prompt, SamplingParams(), 8)) == plain
    assert runner.counters["fused_layer"] > 0


def test_qwen3_greedy_tokens_through_the_model() -> None:
    prompt = list(range(3, 40))
    plain = list(generate_step(_runner(arch="qwen3"), prompt, SamplingParams(), 5))
    runner = _fused(_runner(arch="qwen3"))
    assert list(generate_step(runner, prompt, SamplingParams(), 5)) == plain
    assert runner.counters["fused_layer"] == 4 * 2


@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.get_device_capability()[0] < 9, reason="graphs and pdl: sm_90")
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_graphed_pdl_keeps_greedy_tokens_across_a_window(arch: str) -> None:
    """Compiled kernels (not the interpreter), launched with PDL and replayed from graphs, across the 256-slot
    window boundary: the greedy tokens of the stock model."""
    prompt = [3 + (7 * i) % 290 for i in range(250)]
    plain = list(generate_step(_runner(arch=arch), prompt, SamplingParams(), 12))
    assert len(set(plain)) >= 3
    runner = _runner("fused_layer,pdl,graphs", arch=arch)
    assert list(generate_step(runner, prompt, SamplingParams(), 12)) == plain
    assert runner.counters["fused_layer"] > 0 and runner.counters["pdl"] > 0


def _blocks_runner(qtype: str, levers_text: str, arch: str = "llama"):  # noqa: ANN202
    """A tiny model whose layer projections are `qtype` GGUF blocks (as a quantized GGUF's), with `levers_text`."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from kerneltriage.engine.checkpoint import Checkpoint, RawTensor

    checkpoint = tiny_checkpoint(arch, max_context=512)
    tensors = dict(checkpoint.tensors)
    for name, raw in checkpoint.tensors.items():
        if name.startswith("layers.") and name.split(".")[-1] in ("q", "k", "v", "o", "gate", "up", "down"):
            values = np.asarray(raw.data, dtype=np.float32)
            tensors[name] = RawTensor(qtype, values.shape, quantize(values, getattr(GGMLQuantizationType, qtype)))
    blocks = Checkpoint(checkpoint.config, tensors, checkpoint.tokenizer, source=f"tiny {arch} ({qtype})")
    return BACKEND.build(blocks, RunConfig.from_flags(levers_text), DEVICE, "float32")


# Beside quantized: a decode row reads the layer's Q4 blocks in place (K in one round, and in 2–3 rounds of 32:
# the RMS over rounds and the products summed across blocks after the loop); q/k/v stacked by packed_qkv or by the
# lever itself; the same output and cache as the stock layer over the same blocks (their GEMVs)
@pytest.mark.parametrize(("qtype", "arch", "packed", "quant_bk", "depth", "static"), [
    ("Q4_0", "llama", "", 2048, 0, False), ("Q4_1", "llama", "packed_qkv,packed_gate_up", 2048, 70, True),
    ("Q4_0", "qwen2", "", 32, 70, True), ("Q4_1", "llama", "packed_qkv", 32, 33, False)])
def test_a_decode_row_reads_the_blocks_in_place(qtype: str, arch: str, packed: str, quant_bk: int, depth: int,
                                                static: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from kerneltriage.kernels import fused_layer

    monkeypatch.setattr(fused_layer, "QUANT_BK", quant_bk)
    sets = "quantized" + (f",{packed}" if packed else "")
    stock, fused = _blocks_runner(qtype, sets, arch), _fused(_blocks_runner(qtype, sets, arch))
    assert type(fused.model.layers[0].self_attn.o_proj).__name__ == "QuantLinear"  # the blocks, no values
    cache_type, window = (StaticKVCache, 128) if static else (KVCache, None)
    want, want_cache = _layer_run(stock, cache_type, 1, depth, window)
    got, got_cache = _layer_run(fused, cache_type, 1, depth, window)
    assert (got - want).abs().max() / want.abs().max() < 2e-5
    for name in ("keys", "values"):
        assert torch.allclose(getattr(got_cache, name), getattr(want_cache, name), rtol=1e-5, atol=1e-5)
    assert fused.counters["fused_layer"] == 1
    _layer_run(fused, KVCache, 5, 33, None)  # verify rows: the stock layer over the blocks
    assert fused.counters["fused_layer"] == 1 and fused.counters["quantized"] > 0


# With q8_dot: each GEMV's x rounded to int8 words first (the norm in that kernel), the products in integers; K in 2
# rounds of 32 (Q4_0, packed: the 8B's case) and in one (Q4_1, q/k/v stacked by the lever)
@pytest.mark.parametrize(("qtype", "packed", "q8_bk", "depth"), [
    ("Q4_0", "packed_qkv,packed_gate_up", 32, 70), ("Q4_1", "", 2048, 33)])
def test_with_q8_dot_a_decode_row_reads_x_as_int8_words(qtype: str, packed: str, q8_bk: int, depth: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from kerneltriage.kernels import fused_layer

    monkeypatch.setattr(fused_layer, "Q8_BK", q8_bk)
    monkeypatch.setattr(fused_layer, "Q8_ROWS", 32)  # fewer programs: the interpreter runs them one after another
    sets = "quantized" + (f",{packed}" if packed else "")
    floats, ints = _fused(_blocks_runner(qtype, sets)), _blocks_runner(qtype, sets)
    levers.APPLIERS["q8_dot"](ints, None)
    _fused(ints)
    assert ints.model.layers[0].forward.weights.q8 and not floats.model.layers[0].forward.weights.q8
    want, want_cache = _layer_run(floats, KVCache, 1, depth, None)
    got, got_cache = _layer_run(ints, KVCache, 1, depth, None)
    for name in ("keys", "values"):  # the new row: x normed and rounded, times the blocks
        a, b = getattr(want_cache, name)[0, :, :, depth], getattr(got_cache, name)[0, :, :, depth]
        assert 0 < (b - a).norm() < 0.03 * a.norm(), name
        assert torch.equal(getattr(got_cache, name)[0, :, :, :depth], getattr(want_cache, name)[0, :, :, :depth])
    assert 0 < (got - want).abs().max() < 0.03 * want.abs().max()
    assert ints.counters["q8_dot"] == 1 and ints.counters["fused_layer"] == 1


def test_the_block_reading_layer_keeps_greedy_tokens_and_refuses_what_it_cannot_read() -> None:
    pytest.importorskip("gguf")
    prompt = list(range(3, 23))  # 20 rows: the stock layers over the dequantized blocks (past the GEMV's 16 rows)
    stock = _blocks_runner("Q4_0", "quantized,packed_qkv,packed_gate_up")
    fused = _fused(_blocks_runner("Q4_0", "quantized,packed_qkv,packed_gate_up"))
    want = list(generate_step(stock, prompt, SamplingParams(), 4))
    assert list(generate_step(fused, prompt, SamplingParams(), 4)) == want
    assert fused.counters["fused_layer"] == 3 * 2  # every decode step, both layers; the prefill none
    with pytest.raises(InputError, match="Q8_0 blocks"):
        _fused(_blocks_runner("Q8_0", "quantized"))
    with pytest.raises(InputError, match="per-head q/k norms beside quantized"):
        _fused(_blocks_runner("Q4_0", "quantized", "qwen3"))


def test_refuses_other_norms_and_compile() -> None:
    runner = _runner(arch="qwen3")
    runner.model.layers[1].self_attn.k_norm.eps = 1e-3
    with pytest.raises(InputError, match="eps differs"):
        _fused(runner)
    with pytest.raises(InputError, match="not a power of two"):
        _fused(_runner(arch="qwen3", head_dim=24))
    # past the lever table's refusal: gemma3's q/k norms are llama's attribute names over Gemma's (1 + w) norms
    with pytest.raises(InputError, match="a gemma3 model has per-head q/k norms other than qwen3's"):
        _fused(_runner(arch="gemma3"))
    runner = _fused(_runner())
    from kerneltriage.backends.torch.accelerate import compile_steps

    with pytest.raises(InputError, match="drop compile"):
        compile_steps(runner, "default")


def test_the_lever_table_takes_it_on_cuda_only() -> None:
    if DEVICE == "cuda":  # through the table, as --levers applies it: every layer fused
        runner = BACKEND.build(tiny_checkpoint("llama"), RunConfig.from_flags("fused_layer"), "cuda", "float32")
        assert all(type(block.forward).__name__ == "FusedForward" for block in runner.model.layers)
    else:
        with pytest.raises(InputError, match="CUDA"):
            tiny_runner("llama", "fused_layer")


def test_packed_qkv_weights_are_not_copied_again() -> None:
    runner = _runner("packed_qkv")
    attn = runner.model.layers[0].self_attn
    before = attn.q_proj.weight.data_ptr()
    _fused(runner)
    assert attn.q_proj.weight.data_ptr() == before  # the stack packed_qkv made is the one the kernels read


def test_a_compiled_prefill_traces_the_stock_layers_even_for_short_prompts() -> None:
    from kerneltriage.backends.torch.accelerate import compile_prefill

    runner = _fused(_runner(num_layers=1))  # one layer: a third of the CPU compile time
    compile_prefill(runner)
    for prompt in ([5, 6, 7, 8] * 10, [5, 6, 7, 8] * 2):  # 40 rows and 8: both the stock layer, compiled
        assert list(generate_step(runner, prompt, SamplingParams(), 3)) == list(
            generate_step(_runner(num_layers=1), prompt, SamplingParams(), 3))
    assert runner.counters["compile_prefill"] == 2
    assert runner.counters["fused_layer"] == 2 * 2  # the decode steps' layer only: no graph break per layer


def test_pdl_needs_fused_layer_and_cuda() -> None:
    with pytest.raises(InputError, match="expected fused_layer"):
        levers.APPLIERS["pdl"](_runner(), None)
    if DEVICE == "cpu":
        with pytest.raises(InputError, match="CUDA"):
            tiny_runner("llama", "fused_layer,pdl")


# Every fused kernel built for sm_90 (Triton's compiler and its bundled ptxas; no GPU needed) with PDL on and off,
# in one process: the GPU build the interpreter never runs. Pointers and ints are taken 16-divisible, as a launch
# specialises them (without that Triton neither vectorises nor pipelines the loads). The verify tiles' K rounds must be
# pipelined (cp.async) with PDL's wait ahead of every load of x. Run apart from this process, where conftest may have
# set the interpreter.
SM90_BUILD = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kerneltriage.kernels import fused_layer as f

FP32, I64, I32 = ("m_ptr", "l_ptr", "acc_ptr", "ws_ptr"), ("ids_ptr",), ("sem_ptr",)
# a decode row (CUDA-core sums), a k = 15 verify (tl.dot, K rounds pipelined), the same with K split in 3 (the
# attention kernels do not depend on the GEMV tiles: built once per row count); then qwen3-0.6b's q/k/v with its
# per-head norms, one head per program, K split (a decode row and a verify)
SPLIT = f.SPLIT_PROGRAMS
for pdl, rows, programs in ((pdl, rows, programs) for pdl in (False, True)
                            for rows, programs in ((1, 0), (16, 0), (16, 100), (1, -1), (16, -1))):
    heads = programs < 0
    f.SPLIT_PROGRAMS = SPLIT if heads else programs
    t = f._head_tiles(rows, 32, 64, 1024) if heads else f._tiles(rows, 576, 576)
    assert (t.splits > 1) == bool(programs)
    consts_all = {"T": rows, "ROWS": t.rows, "G": 3, "RP": 64, "DP": 64, "SP": 4, "BN": t.bn, "BK": t.bk,
                  "ROUNDS": t.rounds, "STAGES": t.stages, "SPLITS": t.splits, "BLOCK": 64, "HQ": 16 if heads else 9,
                  "HKV": 8 if heads else 3, "DIM": 128 if heads else 64, "BP": t.bn, "HAS_BIAS": False,
                  "QK_NORM": heads, "PDL": pdl, "QK": 0, "Q8": False}
    kernels = (f._qkv_rope_cache,) + (() if heads else (f._gemv_residual, f._gate_up)) + (
        (f._attend, f._combine) if programs == 0 else ())
    for fn in kernels:
        names = fn.arg_names
        consts = {n: consts_all[n] for n in names if n in consts_all}
        sig = {n: "constexpr" if n in consts else "*fp32" if n in FP32 else "*i64" if n in I64 else "*i32"
               if n in I32 else "*bf16" if n.endswith("_ptr") else "fp32" if n in ("eps", "scale") else "i32"
               for n in names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] not in ("constexpr", "fp32")}
        kernel = triton.compile(ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl})
        ptx = kernel.asm["ptx"].splitlines()
        waits = [i for i, line in enumerate(ptx) if "griddepcontrol.wait" in line]
        assert bool(waits) == pdl, fn.__name__
        copies = [i for i, line in enumerate(ptx) if "cp.async.cg" in line or "cp.async.ca" in line]
        gemv = fn.__name__ not in ("_attend", "_combine")
        if rows > 1 and gemv:
            assert t.rounds > 1 and copies, (fn.__name__, "K rounds not pipelined")
            assert not pdl or waits[0] < copies[0], (fn.__name__, "a pipelined load ahead of PDL's wait")
        counts = [i for i, line in enumerate(ptx) if "atom.global" in line]
        assert bool(counts) == (gemv and t.splits > 1), fn.__name__
        if counts:  # the shares stored by every thread before the count, which releases and acquires at gpu scope
            assert "atom.global.gpu.acq_rel" in ptx[counts[0]], ptx[counts[0]]
            shares = max(i for i in range(counts[0]) if "st.global" in ptx[i])  # the last share stored
            assert any("bar.sync" in line for line in ptx[shares:counts[0]]), (fn.__name__, "count before shares")
        print(fn.__name__, pdl, rows, len(kernel.asm["cubin"]), len(copies))
# an 8B's decode row (K = 4,096 in several rounds), its weights as values (bf16) or as Q4_0 / Q4_1 blocks (quants
# bytes, float16 scales and mins: quantized beside it): the rounds pipelined, the products summed in place (a block's
# in its thread), across the threads once after the loop (a shuffle tree per output, not per round)
BLOCKS = ("s_ptr", "m_ptr", "sg_ptr", "su_ptr", "mg_ptr", "mu_ptr")
for pdl, qk in ((pdl, qk) for pdl in (False, True) for qk in (0, 1, 2)):
    t = f._tiles(1, 4096, 4096, bool(qk))
    assert t.rounds > 1 and t.stages > 1, t
    consts = {"T": 1, "ROWS": 1, "BN": t.bn, "BP": t.bn, "BK": t.bk, "ROUNDS": t.rounds, "STAGES": t.stages,
              "SPLITS": 1, "PDL": pdl, "QK": qk, "HQ": 32, "HKV": 8, "DIM": 128, "HAS_BIAS": False, "QK_NORM": False,
              "Q8": False}
    for fn in ((f._qkv_rope_cache,) if qk else ()) + (f._gemv_residual, f._gate_up):
        names = fn.arg_names
        sig = {n: "constexpr" if n in consts else "*fp32" if n in FP32 else "*i64" if n in I64 else "*i32"
               if n in I32 else "*u8" if qk and n in ("w_ptr", "wg_ptr", "wu_ptr") else "*fp16"
               if qk and n in BLOCKS else "*bf16" if n.endswith("_ptr") else "fp32" if n == "eps" else "i32"
               for n in names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] not in ("constexpr", "fp32")}
        kernel = triton.compile(ASTSource(fn, signature=sig, constexprs={n: consts[n] for n in names if n in consts},
                                          attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl})
        lines = kernel.asm["ptx"].splitlines()
        assert any("cp.async" in line for line in lines), (fn.__name__, qk, "decode rounds not pipelined")
        assert any("griddepcontrol.wait" in line for line in lines) == pdl, fn.__name__
        labels = {m.group(1): i for i, line in enumerate(lines) for m in [re.match(r"(\\$L\\w+):", line.strip())] if m}
        branches = [(i, re.search(r"bra(?:\\.uni)?\\s+([^;]+);", line)) for i, line in enumerate(lines)]
        loops = [(labels[m.group(1)], i) for i, m in branches
                 if m and labels.get(m.group(1), i) < i]  # back edges: a branch to a label above it
        assert loops, (fn.__name__, qk, "no loop over the rounds")
        inside = [i for start, end in loops for i in range(start, end) if "shfl.sync" in lines[i]]
        assert not inside, (fn.__name__, qk, len(inside), "shuffles inside the rounds' loop")
        print(fn.__name__, pdl, "decode-8b", qk, len(kernel.asm["cubin"]), len(loops))
# with q8_dot: x rounded to int8 words by `_quantize_row` (normed and not), the 8B's GEMVs against them by dp4a,
# unpipelined (no cp.async: its loads bypass L1, which serves the rows' repeated reads of x)
for pdl, qk in ((pdl, qk) for pdl in (False, True) for qk in (1, 2)):
    for fn, two in ((f._qkv_rope_cache, 2), (f._gemv_residual, 1), (f._gate_up, 2)):
        t = f._tiles(1, 4096, 4096, True, two)
        consts = {"T": 1, "ROWS": 1, "BN": t.bn, "BP": t.bn, "BK": t.bk, "ROUNDS": t.rounds, "STAGES": t.stages,
                  "SPLITS": 1, "PDL": pdl, "QK": qk, "HQ": 32, "HKV": 8, "DIM": 128, "HAS_BIAS": False,
                  "QK_NORM": False, "Q8": True}
        names = fn.arg_names
        sig = {n: "constexpr" if n in consts else "*fp32" if n in FP32 + ("dx_ptr",) else "*i64" if n in I64
               else "*i32" if n in I32 + ("xw_ptr", "xs_ptr", "w_ptr", "wg_ptr", "wu_ptr") else "*fp16"
               if n in BLOCKS else "*bf16" if n.endswith("_ptr") else "fp32" if n == "eps" else "i32" for n in names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] not in ("constexpr", "fp32")}
        kernel = triton.compile(ASTSource(fn, signature=sig, constexprs={n: consts[n] for n in names if n in consts},
                                          attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl})
        ptx = kernel.asm["ptx"]
        assert "dp4a.s32.s32" in ptx and "cp.async" not in ptx, (fn.__name__, qk)
        assert ("griddepcontrol.wait" in ptx) == pdl, fn.__name__
        print(fn.__name__, pdl, "decode-8b-q8", qk, len(kernel.asm["cubin"]))
for pdl, norm in ((pdl, norm) for pdl in (False, True) for norm in (False, True)):
    names = f._quantize_row.arg_names
    consts = {"NORM": norm, "BB": f.Q8_BLOCKS, "ROUNDS": 4, "PDL": pdl}
    sig = {n: "constexpr" if n in consts else "*fp32" if n == "dx_ptr" else "*i32" if n in ("words_ptr", "sums_ptr")
           else "*bf16" if n.endswith("_ptr") else "fp32" if n == "eps" else "i32" for n in names}
    kernel = triton.compile(ASTSource(f._quantize_row, signature=sig, constexprs=consts),
                            target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl})
    assert ("griddepcontrol.wait" in kernel.asm["ptx"]) == pdl
    print("_quantize_row", pdl, norm, len(kernel.asm["cubin"]))
"""


def test_every_kernel_builds_for_sm90() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", SM90_BUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # PDL off and on: 3 GEMV kernels × 3, attention × 2, qwen3's q/k/v × 2; the 8B's decode rows; with q8_dot, its
    # three GEMV kernels over Q4_0 and Q4_1 and the quantizing kernel with and without its norm
    assert len(done.stdout.splitlines()) == 2 * (3 * 3 + 2 * 2 + 2) + 2 * 2 + 2 * 2 * 3 + 2 * 2 * 3 + 2 * 2
