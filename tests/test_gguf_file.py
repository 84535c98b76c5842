"""GGUF reading: metadata and tensors (equal to gguf-py's reader), bad files, and llama's Q/K unpermutation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from kerneltriage.core.errors import InputError
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.gguf_file import gguf_to_internal, read_gguf
from kerneltriage.engine.gguf_header import read_header

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16
TOKENS = ["<s>", "</s>", "a", "b", "ab", "c", "d", "cd"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELTRIAGE_CACHE", str(tmp_path / "cache"))


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: HF (NeoX-halves) Q/K rows → GGUF `llama` (interleaved pairs)."""
    # (H, 2, D/2, …) → (H, D/2, 2, …)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.fixture
def hf_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((len(TOKENS), HIDDEN)).astype(np.float32),
        "q": rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
        "q_bias": rng.standard_normal(HEADS * HEAD_DIM).astype(np.float32),
        "k": rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
        "v": rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float16),
        "norm": rng.standard_normal(HIDDEN).astype(np.float32),
    }


def write_gguf(path: Path, hf: dict[str, np.ndarray], extra: dict | None = None) -> Path:
    """A one-layer llama GGUF with Q stored as Q8_0, K/V/bias as floats, Q/K permuted as the converter does."""
    w = GGUFWriter(path, "llama")
    for add, value in [(w.add_block_count, 1), (w.add_context_length, 128), (w.add_embedding_length, HIDDEN),
                       (w.add_feed_forward_length, 128), (w.add_head_count, HEADS), (w.add_head_count_kv, KV_HEADS),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_vocab_size, len(TOKENS)), (w.add_token_list, TOKENS),
                       (w.add_token_merges, ["a b", "c d"]), (w.add_token_types, [3, 3, 1, 1, 1, 1, 1, 1]),
                       (w.add_add_bos_token, False), (w.add_eos_token_id, 1)]:
        add(value)
    q8 = quantize(permute(hf["q"], HEADS), GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", hf["embed"])
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.bias", permute(hf["q_bias"], HEADS))
    w.add_tensor("blk.0.attn_k.weight", permute(hf["k"], KV_HEADS))
    w.add_tensor("blk.0.attn_v.weight", hf["v"])
    w.add_tensor("output_norm.weight", hf["norm"])
    w.add_tensor("blk.0.unused_extra.weight", np.zeros(4, np.float32))
    for name, (data, qtype) in (extra or {}).items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def model_file(tmp_path, hf_weights) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", hf_weights)


def test_reads_metadata_as_plain_values(model_file):
    meta = read_gguf(model_file).meta
    assert meta["general.architecture"] == "llama"
    assert meta["llama.attention.head_count_kv"] == KV_HEADS
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert meta["tokenizer.ggml.tokens"] == TOKENS
    assert meta["tokenizer.ggml.merges"] == ["a b", "c d"]
    assert meta["tokenizer.ggml.token_type"] == [3, 3, 1, 1, 1, 1, 1, 1]
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert not any(key.startswith("GGUF.") for key in meta)


def test_reads_tensors_as_memmap_views(model_file, hf_weights):
    tensors = read_gguf(model_file).tensors
    embed, q, v = tensors["token_embd.weight"], tensors["blk.0.attn_q.weight"], tensors["blk.0.attn_v.weight"]
    assert (embed.qtype, embed.shape) == ("F32", (len(TOKENS), HIDDEN))
    np.testing.assert_array_equal(embed.data, hf_weights["embed"])
    assert isinstance(embed.data, np.memmap)
    assert (v.qtype, v.data.dtype) == ("F16", np.float16)
    q_rows = HEADS * HEAD_DIM
    assert (q.qtype, q.shape, q.data.shape) == ("Q8_0", (q_rows, HIDDEN), (q_rows, HIDDEN // 32 * 34))
    expected = quantize(permute(hf_weights["q"], HEADS), GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(q.data, expected)


def _reference(reader: GGUFReader) -> tuple[dict, list[tuple]]:
    """gguf-py's GGUFReader's view of a file: metadata, and (name, type, shape, offset, bytes) per tensor."""
    meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    table = [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.data_offset),
              int(t.n_bytes)) for t in reader.tensors]
    return meta, table


def _ours(path: Path) -> tuple[dict, list[tuple]]:
    header = read_header(path)
    return header.meta, [(t.name, t.qtype, t.shape, t.offset, t.nbytes) for t in header.tensors]


def test_header_equals_gguf_readers(model_file):
    meta, table = _ours(model_file)
    reference = _reference(GGUFReader(model_file))
    assert (meta, table) == reference
    assert [type(v) for v in meta.values()] == [type(v) for v in reference[0].values()]


@pytest.mark.real_model
def test_default_models_header_equals_gguf_readers(default_gguf, default_gguf_reader):
    assert _ours(default_gguf) == _reference(default_gguf_reader)


def test_reading_caches_nothing(model_file, tmp_path):
    read_gguf(model_file)
    assert not (tmp_path / "cache").exists()


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"model file .*nope\.gguf: not found"):
        read_gguf(tmp_path / "nope.gguf")


def test_wrong_magic(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(InputError, match=r"model\.gguf: not a GGUF file \(magic b'PK\\x03\\x04'; expected 'GGUF'\)"):
        read_gguf(path)


@pytest.mark.parametrize("where", ["header_start", "header_kv", "header_end", "data"])
def test_truncated_file(model_file, tmp_path, where):
    header = GGUFReader(model_file).data_offset  # end of header, start of tensor data
    cut = {"header_start": 10, "header_kv": header // 3, "header_end": header - 20, "data": header + 300}[where]
    path = tmp_path / f"cut_{where}.gguf"
    path.write_bytes(model_file.read_bytes()[:cut])
    with pytest.raises(InputError, match="truncated") as info:
        read_gguf(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_unsupported_tensor_type_is_named(tmp_path, hf_weights):
    q2k = np.zeros((2, 84), np.uint8)  # two Q2_K blocks of 256 values
    path = write_gguf(tmp_path / "q2k.gguf", hf_weights, {"blk.0.ffn_down.weight": (q2k, GGMLQuantizationType.Q2_K)})
    with pytest.raises(InputError, match=r"'blk\.0\.ffn_down\.weight' has type Q2_K; supported types: F32, .*Q6_K"):
        read_gguf(path)


def _config(model_file: Path) -> ModelConfig:
    contents = read_gguf(model_file)
    return ModelConfig.from_gguf(contents.meta, has_output_tensor="output.weight" in contents.tensors)


def test_llama_q_and_k_are_unpermuted_to_hf_layout(model_file, hf_weights):
    config = _config(model_file)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    tensors = gguf_to_internal(read_gguf(model_file), config)
    assert "blk.0.unused_extra.weight" not in tensors and len(tensors) == 6
    # Quantization is per row, so unpermuting quantized rows equals quantizing the HF rows.
    np.testing.assert_array_equal(tensors["layers.0.q"].data, quantize(hf_weights["q"], GGMLQuantizationType.Q8_0))
    np.testing.assert_array_equal(tensors["layers.0.q_bias"].data, hf_weights["q_bias"])
    np.testing.assert_array_equal(tensors["layers.0.k"].data, hf_weights["k"])
    np.testing.assert_array_equal(tensors["layers.0.v"].data, hf_weights["v"])
    np.testing.assert_array_equal(tensors["embed"].data, hf_weights["embed"])


def test_qwen_tensors_are_not_permuted(model_file, hf_weights):
    config = _config(model_file).replace(arch="qwen2")
    tensors = gguf_to_internal(read_gguf(model_file), config)
    np.testing.assert_array_equal(tensors["layers.0.k"].data, permute(hf_weights["k"], KV_HEADS))
