"""`kerneltriage gguf write` (engine/gguf_write.py): a GGUF of a config's shapes with random blocks that kerneltriage's
own loader accepts (header, tensor table, key names, vocabulary), with the config it was written from, values of the
intended spread, Llama-3 rope factors that reproduce the preset's frequencies, and no file left by a failed write;
`gguf meta` and `gguf write --like`: another file's shapes and vocabulary, from the file or its metadata alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_config
from kerneltriage.backends.torch.dequant import dequantize
from kerneltriage.cli.main import main
from kerneltriage.core.errors import InputError
from kerneltriage.engine.gguf_header import read_header
from kerneltriage.engine.gguf_write import INIT_STD, TIED, TYPES, synthetic_vocabulary, write_gguf, write_like
from kerneltriage.engine.rope import rope_inv_freq
from kerneltriage.engine.sources import load_checkpoint

SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
         "max_context", "rope_theta", "tie_embeddings", "qk_norm")


@pytest.mark.parametrize("qtype", TYPES)
def test_a_written_file_loads_with_the_config_it_was_written_from(tmp_path: Path, qtype: str) -> None:
    config = tiny_config("llama", vocab_size=320)  # untied, Llama-3 rope scaling
    written = write_gguf(config, qtype, tmp_path / "tiny.gguf")
    checkpoint = load_checkpoint(str(written.path))
    for size in SIZES:
        assert getattr(checkpoint.config, size) == getattr(config, size), size
    assert checkpoint.tensors["layers.1.gate"].qtype == qtype and checkpoint.tensors["norm"].qtype == "F32"
    values = dequantize(checkpoint.tensors["layers.0.down"], "cpu", torch.float32)  # centred, the presets' spread
    assert abs(float(values.mean())) < 0.2 * INIT_STD and 0.5 * INIT_STD < float(values.std()) < 1.5 * INIT_STD
    factors = checkpoint.tensors["rope_freqs"].data  # llama.cpp's form of the preset's rope scaling
    inv_freq = rope_inv_freq(config.replace(rope_scaling=None), np.asarray(factors))
    np.testing.assert_allclose(inv_freq, rope_inv_freq(config), rtol=1e-6)
    tokens = checkpoint.tokenizer.encode("abc ab")  # the synthetic vocabulary tokenizes and decodes text
    assert checkpoint.tokenizer.decode(tokens, skip_special=True).strip() == "abc ab"


def test_qwen3_shapes_and_a_deterministic_file(tmp_path: Path) -> None:
    config = tiny_config("qwen3")  # tied, per-head q/k norms, head_dim ≠ hidden / heads
    first, again = write_gguf(config, "Q4_0", tmp_path / "a.gguf"), write_gguf(config, "Q4_0", tmp_path / "b.gguf")
    assert first.path.read_bytes() == again.path.read_bytes()
    checkpoint = load_checkpoint(str(first.path))
    assert checkpoint.config.tie_embeddings and checkpoint.config.head_dim == config.head_dim
    assert "layers.1.q_norm" in checkpoint.tensors and "lm_head" not in checkpoint.tensors


def test_bad_requests_are_one_line_errors_and_leave_no_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "x.gguf"
    assert main(["gguf", "write", "--preset", "smollm2-135m", "--type", "Q5_K", str(out)]) == 2
    assert main(["gguf", "write", "--preset", "no-such", str(out)]) == 2
    with pytest.raises(InputError, match="not whole Q4_0 blocks"):
        write_gguf(tiny_config("llama", intermediate_size=80), "Q4_0", out)  # down's rows: 80 values
    assert list(tmp_path.iterdir()) == []
    errors = capsys.readouterr().err.splitlines()
    assert "Q5_K" in errors[0] and "no-such" in errors[1]
    assert len(set(synthetic_vocabulary(5000))) == 5000


@pytest.mark.parametrize("arch", ["qwen3", "llama"])  # tied embeddings; untied with rope scaling
def test_a_file_like_another_from_its_metadata_alone(tmp_path: Path, arch: str) -> None:
    source = write_gguf(tiny_config(arch), "Q4_0", tmp_path / "source.gguf").path
    assert main(["gguf", "meta", str(source), str(tmp_path / "meta.gguf")]) == 0
    meta = read_header(tmp_path / "meta.gguf")
    assert not meta.tensors and meta.meta[TIED] == (arch == "qwen3")
    assert meta.meta["tokenizer.ggml.tokens"] == read_header(source).meta["tokenizer.ggml.tokens"]
    assert main(["gguf", "write", "--like", str(tmp_path / "meta.gguf"), "--type", "Q8_0",
                 str(tmp_path / "like.gguf")]) == 0
    like, original = load_checkpoint(str(tmp_path / "like.gguf")), load_checkpoint(str(source))
    for size in SIZES:
        assert getattr(like.config, size) == getattr(original.config, size), size
    assert {n: t.shape for n, t in like.tensors.items()} == {n: t.shape for n, t in original.tensors.items()}
    assert like.tensors["layers.0.down"].qtype == "Q8_0" and TIED not in read_header(tmp_path / "like.gguf").meta
    assert like.tokenizer.encode("abc ab") == original.tokenizer.encode("abc ab")
    if arch == "llama":  # Llama-3 scaling travels as a tensor, carried through the metadata-only copy
        np.testing.assert_array_equal(like.tensors["rope_freqs"].data, original.tensors["rope_freqs"].data)
    direct = write_like(source, "Q8_0", tmp_path / "direct.gguf")  # from the whole file: the same tensors
    assert read_header(direct.path).tensors == read_header(tmp_path / "like.gguf").tensors


def test_meta_and_like_refuse_a_missing_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["gguf", "meta", str(tmp_path / "none.gguf"), str(tmp_path / "m.gguf")]) == 2
    assert main(["gguf", "write", "--like", str(tmp_path / "none.gguf"), str(tmp_path / "x.gguf")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all("none.gguf: no such file (expected a GGUF)" in e for e in errors)
    assert list(tmp_path.iterdir()) == []
