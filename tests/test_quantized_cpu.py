"""The `quantized` lever's CPU path (backends/torch/int4.py, quantized.Int4Linear): GGUF Q4_0/Q4_1/Q8_0 blocks
repacked for torch's int4 CPU matmul give the dequantized product within bf16 rounding; on a bf16 model the lever
takes the projections and the output projection, holds fewer bytes, and passes ab's logit checks (its float32
rebuild is stock float32 exactly; in bf16 no further from float32 than a bf16 model is); on a float32 model it keeps
stock's tokens. Conftest runs Triton's interpreter on the CPU (the CUDA path's tests); these tests leave it."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.backends.torch.dequant import dequantize
from kerneltriage.backends.torch.int4 import int4_product, pack
from kerneltriage.backends.torch import load
from kerneltriage.backends.torch.levers import apply_config
from kerneltriage.backends.torch.load import build_runner, stock_copy
from kerneltriage.backends.torch.quantized import Int4Linear, kept_as_blocks
from kerneltriage.bench import equivalence
from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402 - after the skip

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the lever's CPU path, not the Triton kernel's


def _quantize(values: np.ndarray, qtype: str) -> RawTensor:
    return RawTensor(qtype, values.shape, gguf_quants.quantize(values, getattr(GGMLQuantizationType, qtype)))


@pytest.mark.parametrize("qtype", ("Q4_0", "Q4_1", "Q8_0"))
def test_the_int4_product_is_the_dequantized_product_within_bf16_rounding(qtype: str) -> None:
    raw = _quantize(np.random.default_rng(2).standard_normal((48, 256)).astype(np.float32), qtype)
    exact = dequantize(raw, "cpu", torch.float32)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    reference = x.float() @ exact.T
    error = (int4_product(x, pack([raw])).float() - reference).norm() / reference.norm()
    stock = (torch.nn.functional.linear(x, exact.bfloat16()).float() - reference).norm() / reference.norm()
    assert error < 1.5 * stock  # a bf16 model's own rounding (weights and output) is the scale
    assert error > 0  # the kernel ran on rounded scales: an exact match would mean it never did


def _checkpoint() -> Checkpoint:
    """A tiny llama (untied head, 320 tokens: a multiple of 16) with Q4_1 projections and a Q8_0 head."""
    checkpoint = tiny_checkpoint("llama", vocab_size=320, max_context=128)
    tensors = dict(checkpoint.tensors)
    for name, raw in checkpoint.tensors.items():
        suffix = name.split(".")[-1]
        if name == "lm_head" or (name.startswith("layers.") and suffix in PROJECTIONS):
            tensors[name] = _quantize(np.asarray(raw.data, dtype=np.float32), "Q8_0" if name == "lm_head" else "Q4_1")
    return Checkpoint(checkpoint.config, tensors, checkpoint.tokenizer, source="tiny llama (Q4_1, Q8_0 head)")


def test_a_bf16_model_reads_its_blocks_and_passes_abs_logit_checks() -> None:
    checkpoint = _checkpoint()
    a = BACKEND.build(checkpoint, RunConfig(), "cpu", "bfloat16")
    b = BACKEND.build(checkpoint, RunConfig.from_flags("quantized"), "cpu", "bfloat16")
    assert isinstance(b.model.lm_head, Int4Linear) and b.held_bytes() < 0.8 * a.held_bytes()
    prompts = [list(range(5, 21))]
    fed = [list(generate_step(a, prompts[0], SamplingParams(), 6))[:5]]
    judged = equivalence.judge_logits(BACKEND, a, b, prompts, 5, True, fed)
    assert judged["semantic_error"] < equivalence.LOGIT_RTOL, judged  # in float32: stock's values and arithmetic
    assert judged["logit_error"] <= judged["tolerance"], judged  # bf16: no further from float32 than 1.5 × A
    for seam, (error, _, bound) in equivalence.seam_checks(BACKEND, b).items():  # per op, against exact float32
        assert error <= bound, (seam, error, bound)
    # prompt (16 rows: the int4 kernel) + 5 forced rows, 2 layers × 7 projections + the head each forward
    assert b.counters["quantized"] > 0
    exact = stock_copy(b.model, torch.float32)  # ab's float32 reference holds the blocks' exact values
    assert torch.equal(exact.lm_head.weight, dequantize(checkpoint.tensors["lm_head"], "cpu", torch.float32))


def test_a_float32_model_keeps_stocks_tokens() -> None:
    checkpoint = _checkpoint()
    stock = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    quant = BACKEND.build(checkpoint, RunConfig.from_flags("quantized"), "cpu", "float32")
    prompt = list(range(5, 21))
    expected = list(generate_step(stock, prompt, SamplingParams(), 5))
    assert len(set(expected)) > 1
    assert list(generate_step(quant, prompt, SamplingParams(), 5)) == expected
    assert quant.counters["quantized"] == 2 * 7 * 5  # the prompt and 4 decode steps; float32: no int4 kernel


def test_packed_levers_stack_the_blocks_into_one_int4_matmul() -> None:
    checkpoint = _checkpoint()
    alone = BACKEND.build(checkpoint, RunConfig.from_flags("quantized"), "cpu", "bfloat16")
    packed = BACKEND.build(checkpoint, RunConfig.from_flags("quantized,packed_qkv,packed_gate_up"), "cpu", "bfloat16")
    prompt = list(range(5, 21))
    expected = list(generate_step(alone, prompt, SamplingParams(), 6))
    assert len(set(expected)) > 1
    assert list(generate_step(packed, prompt, SamplingParams(), 6)) == expected  # each row's sum is unchanged
    assert packed.counters["packed_qkv"] > 0 and packed.counters["packed_gate_up"] > 0
    assert packed.held_bytes() <= alone.held_bytes()  # the parts gave their blocks up: held once
    # per forward, 2 layers × (qkv, o, gate_up, down) + the head: 9 int4 calls instead of 15
    assert packed.counters["quantized"] * 15 == alone.counters["quantized"] * 9
    exact = stock_copy(packed.model, torch.float32)  # ab's reference still reads each part's own blocks
    assert torch.equal(exact.layers[0].self_attn.k_proj.weight,
                       dequantize(checkpoint.tensors["layers.0.k"], "cpu", torch.float32))


@pytest.mark.parametrize("dtype", ("bfloat16", "float32"))
def test_a_build_with_the_lever_dequantizes_nothing_it_replaces(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = _checkpoint()
    config = RunConfig.from_flags("quantized")
    late = apply_config(build_runner(checkpoint, torch.device("cpu"), getattr(torch, dtype)), config)  # filled first
    filled = []
    real = load.dequantize
    monkeypatch.setattr(load, "dequantize", lambda raw, *args: filled.append(raw) or real(raw, *args))
    built = BACKEND.build(checkpoint, config, "cpu", dtype)
    projections = {id(raw) for name, raw in checkpoint.tensors.items() if name.split(".")[-1] in PROJECTIONS}
    head = id(checkpoint.tensors["lm_head"])
    assert projections and not projections & {id(raw) for raw in filled}  # none dequantized only to be dropped
    assert (head in {id(raw) for raw in filled}) == (dtype == "float32")  # the CPU keeps a bf16 head as blocks
    assert len(filled) > 1  # the embedding and the norms were
    prompt = list(range(5, 21))
    kept = kept_as_blocks(checkpoint, torch.device("cpu"), getattr(torch, dtype))
    bare = load.load_model(checkpoint, torch.device("cpu"), getattr(torch, dtype), kept)  # before the lever
    assert kept and all(bare.get_parameter(name).numel() == 0 for name in kept)  # no memory, let alone values
    assert bare.layers[0].input_layernorm.weight.numel() > 0
    for runner in (built, late):
        runner.reset_cache(32)
    assert torch.equal(built.prefill(prompt, 0), late.prefill(prompt, 0))  # what the lever replaced is not read


def test_the_fit_check_counts_what_stays_as_blocks(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A host with less memory than the bf16 model needs, more than it needs with its projections kept as Q4_0
    blocks: the stock build is refused in one line, the build with `quantized` is not (on the CPU what it keeps is
    never dequantized), and the CLI's early check leaves that case to the backend."""
    from kerneltriage.backends.torch import device as device_module
    from kerneltriage.cli import common
    from kerneltriage.core.errors import InputError
    from kerneltriage.engine.gguf_write import write_gguf
    from kerneltriage.engine import memory
    from kerneltriage.engine.memory import estimate_memory
    from kerneltriage.engine.presets import PRESETS
    from kerneltriage.engine.sources import load_checkpoint

    path = tmp_path / "smollm2-q4_0.gguf"
    write_gguf(PRESETS["smollm2-135m"], "Q4_0", path)
    checkpoint = load_checkpoint(str(path))
    needed = estimate_memory(checkpoint.config, 2).total
    saved = sum(np.prod(raw.shape) * 2 - np.asarray(raw.data).nbytes for name, raw in checkpoint.tensors.items()
                if name.startswith("layers.") and name.split(".")[-1] in PROJECTIONS)
    assert saved > 0.25 * needed  # the projections: most of the weights (a third with the cache and the transient)
    monkeypatch.setattr(device_module, "host_available_bytes", lambda: needed - saved // 2)
    with pytest.raises(InputError, match="in bfloat16 needs about"):
        BACKEND.build(checkpoint, RunConfig(), "cpu", "bfloat16")
    runner = BACKEND.build(checkpoint, RunConfig.from_flags("quantized"), "cpu", "bfloat16")
    assert isinstance(runner.model.layers[0].mlp.down_proj, Int4Linear)
    monkeypatch.setattr(memory, "host_available_bytes", lambda: needed - saved // 2)
    flags = argparse.Namespace(backend="auto", device="cpu", dtype="bf16")
    with pytest.raises(InputError, match="in bfloat16 needs about"):
        common.refuse_early(checkpoint, flags)
    common.refuse_early(checkpoint, flags, RunConfig.from_flags("quantized"))  # its blocks counted as blocks


def test_packing_in_row_chunks_is_packing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packer's layout is per 64 rows: chunks of PACK_ROWS (a multiple of 64) give the same bytes, a ragged tail
    (here 208 = 3 × 64 + 16 rows) included, with a fraction of the int32 values alive at once."""
    from kerneltriage.backends.torch import int4 as int4_cpu

    raw = _quantize(np.random.default_rng(3).standard_normal((208, 96)).astype(np.float32), "Q4_1")
    whole = pack([raw])
    monkeypatch.setattr(int4_cpu, "PACK_ROWS", 64)
    chunked = pack([raw])
    assert torch.equal(chunked.packed, whole.packed) and torch.equal(chunked.scale_zeros, whole.scale_zeros)
    monkeypatch.setattr(int4_cpu, "PACK_ROWS", 48)  # not a multiple of 64: the layout breaks (why the constant is)
    assert not torch.equal(pack([raw]).packed, whole.packed)
