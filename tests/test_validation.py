"""Validate before allocating: every header field against the tensor table and sane bounds, the memory
estimate against the device, config.json's values — each case the issue found, as one InputError, fast."""

from __future__ import annotations

import argparse
import json
import math
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_mutate import set_scalar, set_tensor_field, set_value_type
from kerneltriage.core.errors import InputError
from kerneltriage.engine.config import MAX_CONTEXT, ModelConfig
from kerneltriage.engine.converted import list_converted
from kerneltriage.engine.gguf_header import read_header
from kerneltriage.engine.memory import estimate_memory
from kerneltriage.engine.presets import PRESETS
from kerneltriage.engine import names
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.engine.validate import check_tensors, expected_shapes
from tiny_gguf import HIDDEN, write_tiny_gguf

FAST_S = 2.0  # the bound for a one-line error


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELTRIAGE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def mutated(tiny: Path, tmp_path: Path, change) -> Path:  # noqa: ANN001 - change(data, header) -> bytes
    path = tmp_path / "mutant.gguf"
    path.write_bytes(change(tiny.read_bytes(), read_header(tiny)))
    return path


def refused(path: Path, *needles: str) -> str:
    """load_checkpoint's InputError for `path`, on one line, within FAST_S, naming every needle."""
    started = time.perf_counter()
    with pytest.raises(InputError) as info:
        load_checkpoint(str(path))
    message = str(info.value)
    assert time.perf_counter() - started < FAST_S and "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_the_good_tiny_file_loads(tiny: Path) -> None:
    assert load_checkpoint(str(tiny)).config.hidden_size == HIDDEN


@pytest.mark.parametrize(("key", "value", "needles"), [
    ("llama.block_count", 2_949_150, ("block_count = 2,949,150", "layers 0..0")),  # the hang
    ("llama.embedding_length", 2**30, ("token_embd.weight", "imply")),
    ("llama.feed_forward_length", 2**31 - 1, ("ffn_gate", "imply")),
    ("llama.vocab_size", 2**31 - 1, ("token_embd.weight", "imply")),
    ("llama.attention.head_count", 0, ("head_count=0", "positive integer")),
    ("llama.attention.head_count_kv", 3, ("num_heads=4 is not a multiple of num_kv_heads=3",)),
    ("llama.rope.freq_base", math.nan, ("freq_base=nan", "finite positive")),
    ("llama.rope.freq_base", math.inf, ("freq_base=inf", "finite positive")),
    ("llama.attention.layer_norm_rms_epsilon", math.nan, ("layer_norm_rms_epsilon=nan",)),
    ("llama.context_length", 2**31 - 1, (f"at most {MAX_CONTEXT:,}",)),
    ("tokenizer.ggml.eos_token_id", 2**31 - 1, ("outside the vocabulary",)),
])
def test_a_bad_header_value_is_named(tiny: Path, tmp_path: Path, key: str, value: float,
                                     needles: tuple[str, ...]) -> None:
    refused(mutated(tiny, tmp_path, lambda data, h: set_scalar(data, h, key, value)), *needles)


def test_a_value_type_rewritten_to_a_huge_array_is_refused_not_looped_over(tiny: Path, tmp_path: Path) -> None:
    """gguf-py's reader looped forever on this (reads past the end return empty slices); the issue's hang."""
    def to_array(data: bytes, header) -> bytes:  # noqa: ANN001
        out = bytearray(set_value_type(data, header, "llama.block_count", 9))  # ARRAY
        struct.pack_into("<IQ", out, header.value_type_at["llama.block_count"] + 4, 0, 2**40)  # of 2^40 uint8
        return bytes(out)
    refused(mutated(tiny, tmp_path, to_array), "array llama.block_count", "past the end of the file")


def test_a_value_of_the_wrong_type_is_named(tiny: Path, tmp_path: Path) -> None:
    # block_count's 4 bytes read as a float32 now: a tiny denormal, not a layer count.
    path = mutated(tiny, tmp_path, lambda data, h: set_value_type(data, h, "llama.block_count", 6))
    refused(path, "llama.block_count=", "expected a positive integer")


def test_tensor_offsets_overlapping_or_off_alignment(tiny: Path, tmp_path: Path) -> None:
    header = read_header(tiny)
    first, second = sorted(header.tensors, key=lambda t: t.offset)[:2]
    onto_first = first.offset - header.data_offset
    refused(mutated(tiny, tmp_path, lambda d, h: set_tensor_field(d, h, second.name, "offset", onto_first)),
            "overlaps")
    refused(mutated(tiny, tmp_path, lambda d, h: set_tensor_field(d, h, second.name, "offset",
                                                                  second.offset - h.data_offset + 4)),
            "32-byte alignment")


def test_a_tensor_type_rewritten_to_a_smaller_one_leaves_a_gap(tiny: Path, tmp_path: Path) -> None:
    name = "blk.0.ffn_gate.weight"  # F32 (48, 32) → F16: the same shape now needs half the bytes
    refused(mutated(tiny, tmp_path, lambda d, h: set_tensor_field(d, h, name, "type", 1)),
            "belong to no tensor", "ffn_gate")


def test_tensor_shapes_against_the_header() -> None:
    config = PRESETS["smollm2-135m"].replace(num_layers=2)
    shapes = expected_shapes(config)
    check_tensors("m", config, shapes)
    with pytest.raises(InputError, match=r"'blk.1.ffn_up.weight' has shape \(768, 576\); .* imply \(1536, 576\)"):
        check_tensors("m", config, {**shapes, "layers.1.up": (768, 576)}, names.GGUF)
    with pytest.raises(InputError, match=r"1 tensor\(s\) missing, e.g. 'model.norm.weight'"):
        check_tensors("m", config, {k: v for k, v in shapes.items() if k != "norm"}, names.HF)
    with pytest.raises(InputError, match=r"'layers.0.q_bias' has no place in a llama model"):
        check_tensors("m", config, {**shapes, "layers.0.q_bias": (576,)})
    with pytest.raises(InputError, match=r"num_hidden_layers = 3 but the file has tensors for layers 0..1"):
        check_tensors("m", config.replace(num_layers=3), shapes, names.HF)


def test_a_failed_load_leaves_nothing_in_the_converted_cache(tiny: Path, tmp_path: Path) -> None:
    refused(mutated(tiny, tmp_path, lambda d, h: set_scalar(d, h, "llama.block_count", 7)), "block_count = 7")
    assert list_converted() == []
    load_checkpoint(str(tiny))
    assert [(e.source, e.status) for e in list_converted()] == [(str(tiny.resolve()), "live")]


HF = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
      "intermediate_size": 48, "num_hidden_layers": 1, "vocab_size": 64, "rms_norm_eps": 1e-5}


@pytest.mark.parametrize(("change", "needles"), [
    ({"num_attention_heads": 0}, ("num_attention_heads=0", "positive integer")),  # was ZeroDivisionError
    ({"vocab_size": None}, ("missing vocab_size",)),
    ({"rms_norm_eps": math.nan}, ("rms_norm_eps=nan", "finite")),
    ({"num_hidden_layers": "30"}, ("num_hidden_layers='30'",)),
    ({"max_position_embeddings": 2**31 - 1}, (f"at most {MAX_CONTEXT:,}",)),
    ({"eos_token_id": [2, "x"]}, ("eos_token_id",)),
    ({"rope_scaling": "llama3"}, ("rope_scaling='llama3'", "an object")),
    ({"tie_word_embeddings": "yes"}, ("tie_word_embeddings", "true or false")),
])
def test_config_json_values_are_named(change: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(InputError) as info:
        ModelConfig.from_hf({**HF, **change})
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_config_json_nan_in_a_real_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**HF, "rope_theta": float("nan")}))  # json writes NaN
    with pytest.raises(InputError, match="rope_theta=nan"):
        ModelConfig.from_hf(json.loads((tmp_path / "config.json").read_text()))


def test_memory_estimate_of_an_8b_model_in_float32() -> None:
    estimate = estimate_memory(PRESETS["llama3-8b"], 4)
    assert 32.0e9 < estimate.weights < 32.2e9  # 8.03 B parameters × 4 bytes
    assert estimate.kv_cache == 2 * 32 * 8 * 4096 * 128 * 4
    assert "needs" not in estimate.describe() and "KV cache for 4,096 positions" in estimate.describe()


def test_a_model_that_cannot_fit_fails_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from kerneltriage.backends.torch import device as device_module
    from kerneltriage.backends.torch.backend import build_runner

    monkeypatch.setattr(device_module, "host_available_bytes", lambda: 16 * 10**9)
    started = time.perf_counter()
    with pytest.raises(InputError, match=r"llama3-8b in float32 needs about 35.3 GB .* but 16.0 GB is available"):
        build_runner(load_checkpoint("llama3-8b"), torch.device("cpu"), torch.float32)
    assert time.perf_counter() - started < FAST_S


def _flags(**values: str) -> argparse.Namespace:
    return argparse.Namespace(**{"backend": "auto", "device": "auto", "dtype": "auto", **values})


def test_the_cli_refuses_a_model_too_big_for_the_cpu_before_importing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from kerneltriage.cli import common
    from kerneltriage.engine import memory

    monkeypatch.setattr(memory, "host_available_bytes", lambda: 16 * 10**9)
    checkpoint = load_checkpoint("llama3-8b")
    with pytest.raises(InputError, match=r"llama3-8b in float32 needs about 35.3 GB .* but 16.0 GB is available"):
        common.refuse_early(checkpoint, _flags(device="cpu"))
    with pytest.raises(InputError, match=r"in bfloat16 needs about 18.7 GB"):  # the dtype flag is read, aliases too
        common.refuse_early(checkpoint, _flags(device="cpu", dtype="bf16"))
    monkeypatch.setattr(common, "_nvidia_device_nodes", lambda: True)
    common.refuse_early(checkpoint, _flags())  # auto goes to the GPU: the host's memory is not the limit
    monkeypatch.setattr(common, "_nvidia_device_nodes", lambda: False)
    with pytest.raises(InputError, match="in float32 needs about"):
        common.refuse_early(checkpoint, _flags())
    with pytest.raises(InputError, match=r"^--device cuda:1: no CUDA device on this machine"):
        common.refuse_early(load_checkpoint("smollm2-135m"), _flags(device="cuda:1"))


def test_the_early_refusal_imports_no_framework() -> None:
    code = ("import sys\nfrom argparse import Namespace\nfrom kerneltriage.cli.common import refuse_early\n"
            "from kerneltriage.engine.sources import load_checkpoint\n"
            "refuse_early(load_checkpoint('smollm2-135m'), Namespace(backend='auto', device='cpu', dtype='auto'))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_truncated_cached_tokenizer_is_rebuilt(tiny: Path) -> None:
    from kerneltriage.engine.paths import converted_dir

    first = load_checkpoint(str(tiny)).tokenizer.encode("hello world")
    cached = converted_dir(tiny) / "tokenizer.json"
    cached.write_text(cached.read_text()[:100])  # cut mid-file, as a full disk or a kill would leave it
    assert load_checkpoint(str(tiny)).tokenizer.encode("hello world") == first
    assert len(cached.read_text()) > 100
