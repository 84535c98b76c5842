"""The MLX model on tiny models of every architecture: the files mirror torch's class for class, the same greedy
text as the torch backend, cache consistency and trim, and weights that are the checkpoint's values exactly."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from conftest import ARCHS, tiny_checkpoint, tiny_runner  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.backends.mlx import quant  # noqa: E402
from kerneltriage.backends.mlx.dequant import dequantize  # noqa: E402
from kerneltriage.backends.mlx.models import MODELS  # noqa: E402
from kerneltriage.backends.torch.models import MODELS as TORCH_MODELS  # noqa: E402
from kerneltriage.engine.generation import generate_step  # noqa: E402
from kerneltriage.engine.sampling import SamplingParams  # noqa: E402

PROMPT = [9, 10, 11, 12]


def _classes(module: object) -> list[str]:
    return sorted(name for name, value in vars(module).items()
                  if inspect.isclass(value) and value.__module__ == module.__name__)


@pytest.mark.parametrize("arch", ARCHS)
def test_model_files_mirror_torch_class_for_class(arch: str) -> None:
    ours, theirs = inspect.getmodule(MODELS[arch]), inspect.getmodule(TORCH_MODELS[arch])
    assert _classes(ours) == _classes(theirs)
    assert MODELS[arch].SEAMS == TORCH_MODELS[arch].SEAMS


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_text_varies_and_equals_torchs(arch: str) -> None:
    """Same weights, float32, CPU: the two backends emit the same greedy tokens (and those vary)."""
    ours = list(generate_step(mlx_runner(tiny_checkpoint(arch)), PROMPT, SamplingParams(), 24))
    assert len(set(ours)) >= 4, ours
    assert ours == list(generate_step(tiny_runner(arch), PROMPT, SamplingParams(), 24))


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_decode_equals_full_forward(arch: str) -> None:
    runner = mlx_runner(tiny_checkpoint(arch))
    tokens = mx.array(np.random.default_rng(1).integers(0, 300, (1, 24)), dtype=mx.int32)
    runner.reset_cache(64)
    full = np.array(runner.model(tokens, 0))  # (1, 24, V)
    runner.reset_cache(64)
    steps = [runner.model(tokens[:, :10], 0)] + [runner.model(tokens[:, i:i + 1], i) for i in range(10, 16)]
    steps.append(runner.model(tokens[:, 16:], 16))  # a block after a filled cache: the masked path
    stepped = np.concatenate([np.array(s) for s in steps], axis=1)
    np.testing.assert_allclose(stepped, full, rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_trim_then_decode_again_gives_the_same_tokens() -> None:
    runner = mlx_runner(tiny_checkpoint("qwen3"))
    cache = runner.reset_cache(64)
    first = runner.greedy(runner.prefill(list(range(5, 17)), 0))

    def greedy(token: int, start: int, count: int) -> list[int]:
        out = []
        for position in range(start, start + count):
            token = runner.greedy(runner.decode(token, position))
            out.append(token)
        return out

    reference = greedy(first, 12, 8)
    runner.prefill([1, 2, 3, 4, 5], 12)  # 5 junk positions, rolled back
    cache.trim(12)
    assert greedy(first, 12, 8) == reference and cache.length == 20
    with pytest.raises(ValueError):
        cache.trim(30)


def test_weights_are_the_checkpoint_tensors() -> None:
    checkpoint = tiny_checkpoint("qwen3")
    model = mlx_runner(checkpoint).model
    assert np.array_equal(np.array(model.embed_tokens.weight), checkpoint.tensors["embed"].data)
    assert np.array_equal(np.array(model.layers[1].self_attn.k_norm.weight), checkpoint.tensors["layers.1.k_norm"].data)
    assert model.lm_head.weight is model.embed_tokens.weight  # tied: one array
    assert model.freqs.dtype == mx.float32


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rms_norm_with_its_weight_is_the_composed_norm_bit_for_bit(dtype: str) -> None:
    """One mx.fast.rms_norm call with the weight computes torch's w · dtype(norm(float32(x))) exactly."""
    from kerneltriage.backends.mlx.models.llama import RMSNorm

    rng = np.random.default_rng(0)
    x = mx.array(3 * rng.standard_normal((2, 5, 64))).astype(getattr(mx, dtype))
    norm = RMSNorm(64, 1e-6)
    norm.weight = mx.array(1 + 0.1 * rng.standard_normal(64)).astype(x.dtype)
    composed = norm.weight * mx.fast.rms_norm(x.astype(mx.float32), None, norm.eps).astype(x.dtype)
    assert norm(x).dtype == x.dtype
    assert np.array_equal(np.array(norm(x)), np.array(composed))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_swiglu_is_silu_times_up_bit_for_bit(dtype: str) -> None:
    import mlx.nn as nn

    from kerneltriage.backends.mlx.models.llama import swiglu

    rng = np.random.default_rng(1)
    gate, up = (mx.array(4 * rng.standard_normal((2, 3, 96))).astype(getattr(mx, dtype)) for _ in range(2))
    assert np.array_equal(np.array(swiglu(gate, up)), np.array(nn.silu(gate) * up))


@pytest.mark.parametrize("qtype", quant.NATIVE_TYPES)
def test_native_blocks_dequantize_to_llama_cpps_values_bit_for_bit(qtype: str) -> None:
    """MLX's dequantize of the repacked blocks is llama.cpp's reference (gguf.quants) exactly, in float32."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as reference

    raw = quantized_checkpoint("llama", projections=qtype).tensors["layers.0.gate"]
    expected = reference(np.asarray(raw.data), GGMLQuantizationType[qtype]).reshape(raw.shape)
    assert np.array_equal(np.array(dequantize(raw, mx.float32)), expected)


def test_quantized_checkpoints_load_as_torch_loads_them() -> None:
    """Q4_1/Q8_0 checkpoints of every architecture, dequantized at load on both backends: the same greedy text."""
    from kerneltriage.backends.torch.backend import BACKEND as TORCH
    from kerneltriage.engine.configuration import RunConfig

    for arch in ARCHS:
        checkpoint = quantized_checkpoint(arch)
        torch_tokens = list(generate_step(TORCH.build(checkpoint, RunConfig(), "cpu", "float32"), PROMPT,
                                          SamplingParams(), 16))
        assert list(generate_step(mlx_runner(checkpoint), PROMPT, SamplingParams(), 16)) == torch_tokens, arch


def test_repacked_blocks_are_the_arrays_mlx_reads_from_the_gguf(tmp_path) -> None:  # noqa: ANN001
    """Our repacking of GGUF blocks equals MLX's own GGUF reader (`mx.load`), array for array."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from kerneltriage.engine.gguf_file import read_gguf

    path, rng = tmp_path / "blocks.gguf", np.random.default_rng(3)
    writer = GGUFWriter(path, "llama")
    for qtype in quant.NATIVE_TYPES:
        blocks = quantize(rng.standard_normal((8, 96)).astype(np.float32), GGMLQuantizationType[qtype])
        writer.add_tensor(f"{qtype}.weight", blocks, raw_dtype=GGMLQuantizationType[qtype])
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    native, ours = mx.load(str(path)), read_gguf(path).tensors
    for qtype in quant.NATIVE_TYPES:
        packed = quant.pack(ours[f"{qtype}.weight"])
        assert packed.bits == (8 if qtype == "Q8_0" else 4)
        for field in ("weight", "scales", "biases"):
            assert np.array_equal(np.array(getattr(packed, field)), np.array(native[f"{qtype}.{field}"])), field
