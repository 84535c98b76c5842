"""`kerneltriage gguf write` (engine/gguf_write.py): a GGUF of a config's shapes with random blocks that kerneltriage's
own loader accepts (header, tensor table, key names, vocabulary), with the config it was written from, values of the
intended spread, Llama-3 rope factors that reproduce the preset's frequencies, and no file left by a failed write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_config
from kerneltriage.backends.torch.dequant import dequantize
from kerneltriage.cli.main import main
from kerneltriage.core.errors import InputError
from kerneltriage.engine.gguf_write import INIT_STD, TYPES, synthetic_vocabulary, write_gguf
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
