"""Hugging Face folders: config.json + safetensors shards (f32 and bf16) read back under internal names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from kerneltriage.core.errors import InputError
from kerneltriage.engine.safetensors_dir import INDEX_NAME, read_safetensors_dir

CONFIG = {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 4}


def shard_tensors() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    first = {
        "model.embed_tokens.weight": torch.randn(4, 8, generator=gen),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=gen).bfloat16(),
    }
    second = {
        "model.norm.weight": torch.randn(8, generator=gen),
        "model.layers.0.mlp.up_proj.weight": torch.randn(16, 8, generator=gen).half(),
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.randn(4, generator=gen),  # not ours: skipped
    }
    return first, second


def write_folder(path: Path, with_index: bool = True) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    first, second = shard_tensors()
    save_file(first, str(path / "model-00001-of-00002.safetensors"))
    save_file(second, str(path / "model-00002-of-00002.safetensors"))
    if with_index:
        weight_map = {name: "model-00001-of-00002.safetensors" for name in first}
        weight_map |= {name: "model-00002-of-00002.safetensors" for name in second}
        (path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.mark.parametrize("with_index", [True, False])
def test_reads_config_and_tensors(tmp_path, with_index):
    config, tensors = read_safetensors_dir(write_folder(tmp_path / "m", with_index))
    assert config == CONFIG
    assert set(tensors) == {"embed", "layers.0.q", "norm", "layers.0.up"}
    first, second = shard_tensors()
    embed, q, up = tensors["embed"], tensors["layers.0.q"], tensors["layers.0.up"]
    assert (embed.qtype, embed.shape) == ("F32", (4, 8))
    np.testing.assert_array_equal(embed.data, first["model.embed_tokens.weight"].numpy())
    assert (q.qtype, q.shape, q.data.dtype) == ("BF16", (8, 8), np.uint16)
    as_bf16 = torch.from_numpy(q.data.view(np.int16).copy()).view(torch.bfloat16)
    assert torch.equal(as_bf16, first["model.layers.0.self_attn.q_proj.weight"])
    assert up.qtype == "F16"
    np.testing.assert_array_equal(up.data, second["model.layers.0.mlp.up_proj.weight"].numpy())
    assert isinstance(embed.data, np.memmap)


def test_missing_folder(tmp_path):
    with pytest.raises(InputError, match=r"model folder .*absent: not found"):
        read_safetensors_dir(tmp_path / "absent")


def test_missing_config(tmp_path):
    path = write_folder(tmp_path / "m")
    (path / "config.json").unlink()
    with pytest.raises(InputError, match=r"config\.json: not found"):
        read_safetensors_dir(path)


def test_no_shards(tmp_path):
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(InputError, match=r"no \*\.safetensors files"):
        read_safetensors_dir(path)


def test_tensor_named_in_index_but_missing(tmp_path):
    path = write_folder(tmp_path / "m")
    index = json.loads((path / INDEX_NAME).read_text())
    index["weight_map"]["model.layers.0.mlp.down_proj.weight"] = "model-00002-of-00002.safetensors"
    (path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight' should be in model-00002"):
        read_safetensors_dir(path)


def test_shard_named_in_index_but_missing(tmp_path):
    path = write_folder(tmp_path / "m")
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InputError, match=r"names shard model-00002-of-00002\.safetensors"):
        read_safetensors_dir(path)


def test_truncated_shard(tmp_path):
    path = write_folder(tmp_path / "m", with_index=False)
    shard = path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(InputError, match=r"model-00001-of-00002\.safetensors: tensor .* don't fit"):
        read_safetensors_dir(path)


def test_not_a_safetensors_file(tmp_path):
    path = write_folder(tmp_path / "m", with_index=False)
    (path / "model-00001-of-00002.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match="not a safetensors file"):
        read_safetensors_dir(path)


def test_unsupported_dtype_of_a_used_tensor(tmp_path):
    path = write_folder(tmp_path / "m", with_index=False)
    save_file({"model.norm.weight": torch.zeros(8, dtype=torch.int64)}, str(path / "model-00002-of-00002.safetensors"))
    with pytest.raises(InputError, match=r"'model\.norm\.weight' has dtype I64; supported: F32, F16, BF16"):
        read_safetensors_dir(path)


def _rewrite_header(shard: Path, change) -> None:  # noqa: ANN001 - change(header dict) -> None
    """Rewrite a shard's JSON header in place, keeping its length (padded with spaces, as the format allows)."""
    raw = shard.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    shard.write_bytes(raw[:8] + text.ljust(length) + raw[8 + length:])


def test_overlapping_tensors_are_refused(tmp_path):
    path = write_folder(tmp_path / "m", with_index=False)
    shard = path / "model-00002-of-00002.safetensors"

    def onto_the_first(header: dict) -> None:
        names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
        header[names[1]]["data_offsets"] = list(header[names[0]]["data_offsets"])
        header[names[1]]["shape"], header[names[1]]["dtype"] = header[names[0]]["shape"], header[names[0]]["dtype"]
    _rewrite_header(shard, onto_the_first)
    with pytest.raises(InputError, match="overlap"):
        read_safetensors_dir(path)


def test_a_negative_offset_into_the_header_is_refused(tmp_path):
    path = write_folder(tmp_path / "m", with_index=False)
    shard = path / "model-00002-of-00002.safetensors"

    def before_the_data(header: dict) -> None:
        begin, end = header["model.norm.weight"]["data_offsets"]
        header["model.norm.weight"]["data_offsets"] = [begin - end, 0]  # its 32 bytes end where the data starts
    _rewrite_header(shard, before_the_data)
    with pytest.raises(InputError, match="don't fit"):
        read_safetensors_dir(path)
