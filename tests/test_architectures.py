"""The architecture record (engine/architectures.py) against everything that must agree with it: both backends'
model registries (the model file each record names, with the biases and q/k norms the record says), the config
readers and writer, and the GGUF reader's Q/K un-permutation."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ARCHS, tiny_config
from kerneltriage.engine import names
from kerneltriage.engine.architectures import ARCHITECTURES, HF_MODEL_TYPES, ROPE_NORM, architecture
from kerneltriage.engine.checkpoint import RawTensor
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.gguf_file import GGUFContents, gguf_to_internal


def _torch_parameters(arch: str) -> set[str]:
    from kerneltriage.backends.torch.models import model_class

    config = tiny_config(arch, attention_bias=False, qk_norm=False)  # what the class adds by itself
    return {name for name, _ in model_class(arch)(config, device="meta").named_parameters()}


def _mlx_parameters(arch: str) -> set[str]:
    pytest.importorskip("mlx.core")
    from mlx.utils import tree_flatten

    from kerneltriage.backends.mlx.models import model_class

    config = tiny_config(arch, attention_bias=False, qk_norm=False)
    return {name for name, _ in tree_flatten(model_class(arch)(config).parameters())}


@pytest.mark.parametrize("parameters", [_torch_parameters, _mlx_parameters], ids=["torch", "mlx"])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_backends_model_is_what_its_record_says(arch: str, parameters) -> None:  # noqa: ANN001
    record, names_ = ARCHITECTURES[arch], parameters(arch)
    assert ("layers.0.self_attn.q_proj.bias" in names_) == record.attention_bias
    assert ("layers.0.self_attn.q_norm.weight" in names_) == record.qk_norm
    assert "layers.1.mlp.down_proj.weight" in names_ and "lm_head.weight" in names_


def test_both_registries_hold_every_architecture_and_nothing_else() -> None:
    from kerneltriage.backends.torch.models import MODELS as TORCH

    assert set(TORCH) == set(ARCHITECTURES)
    pytest.importorskip("mlx.core")
    from kerneltriage.backends.mlx.models import MODELS as MLX

    assert set(MLX) == set(ARCHITECTURES)
    assert all(model.__module__.rsplit(".", 1)[-1] == ARCHITECTURES[arch].model
               for arch, model in (*TORCH.items(), *MLX.items()))


@pytest.mark.parametrize("arch", ARCHS)
def test_config_json_round_trips_through_the_record(arch: str) -> None:
    config = tiny_config(arch, bos_token_id=1, eos_token_ids=(2, 3))
    hf = config.to_hf()
    assert hf["model_type"] == ARCHITECTURES[arch].hf_model_type and hf["architectures"][0].endswith("ForCausalLM")
    assert ModelConfig.from_hf(hf, name=config.name) == config
    unflagged = ModelConfig.from_hf({k: v for k, v in hf.items() if k != "attention_bias"})
    assert (unflagged.attention_bias, unflagged.qk_norm) == (ARCHITECTURES[arch].attention_bias,
                                                             ARCHITECTURES[arch].qk_norm)


def test_every_hf_model_type_is_read_as_its_architecture() -> None:
    config = tiny_config("llama", rope_scaling=None).to_hf()
    for model_type, record in HF_MODEL_TYPES.items():
        assert ModelConfig.from_hf(config | {"model_type": model_type}).arch == record.name
    with pytest.raises(ValueError, match="expected one of llama, qwen2, qwen3, gemma3"):
        architecture("gemma2")


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_q_rows_are_unpermuted_only_where_llama_cpp_permuted_them(arch: str) -> None:
    config = tiny_config(arch)
    rows = np.arange(config.q_size * 2, dtype=np.float32).reshape(config.q_size, 2)
    contents = GGUFContents({}, {"blk.0.attn_q.weight": RawTensor("F32", rows.shape[::-1], rows)})
    read = gguf_to_internal(contents, config)["layers.0.q"].data
    expected = names.gguf_unpermute_rows(rows, config.num_heads) if ARCHITECTURES[arch].gguf_rope == ROPE_NORM \
        else rows
    assert np.array_equal(read, expected) and (arch != "llama" or not np.array_equal(read, rows))
