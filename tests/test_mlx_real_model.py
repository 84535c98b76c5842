"""The MLX backend on the real default model (SmolLM2-135M Q4_1): the same greedy tokens as the torch backend
(dequantized weights, float32, CPU), the same tokens again with the blocks kept quantized, and the blocks
themselves the arrays MLX's own GGUF reader makes."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from kerneltriage.engine.configuration import RunConfig  # noqa: E402
from kerneltriage.engine.generation import generate_step  # noqa: E402
from kerneltriage.engine.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.real_model

TEXT = ("The history of computing is a story of layers: transistors become gates, gates become "
        "processors, and processors run programs that people write to solve their problems quickly, cheaply and "
        "reliably, on machines that keep getting faster every single year.")
NEW = 16


@pytest.fixture(scope="module")
def prompt(default_checkpoint) -> list[int]:  # noqa: ANN001
    return default_checkpoint.tokenizer.encode(TEXT)[:32]


@pytest.fixture(scope="module")
def mlx_tokens(default_checkpoint, prompt) -> list[int]:  # noqa: ANN001
    from kerneltriage.backends.mlx.backend import BACKEND

    runner = BACKEND.build(default_checkpoint, RunConfig(), "cpu", "float32")
    return list(generate_step(runner, prompt, SamplingParams(), NEW))


def test_torch_and_mlx_emit_the_same_greedy_tokens(default_checkpoint, prompt, mlx_tokens) -> None:  # noqa: ANN001
    from kerneltriage.backends.torch.backend import BACKEND

    runner = BACKEND.build(default_checkpoint, RunConfig(), "cpu", "float32")
    torch_tokens = list(generate_step(runner, prompt, SamplingParams(), NEW))
    assert len(set(mlx_tokens)) >= 8 and mlx_tokens == torch_tokens


def test_the_kept_blocks_emit_the_dequantized_models_tokens(default_checkpoint, prompt, mlx_tokens) -> None:  # noqa: ANN001
    from kerneltriage.backends.mlx.backend import BACKEND

    runner = BACKEND.build(default_checkpoint, RunConfig.from_flags("quantized"), "cpu", "float32")
    assert list(generate_step(runner, prompt, SamplingParams(), NEW)) == mlx_tokens
    assert runner.counters["quantized"] > 0


def test_repacked_blocks_are_mlx_loads_own(default_gguf, default_checkpoint) -> None:  # noqa: ANN001
    """Every quantized tensor of the file, as our reader hands it over (llama's Q/K rows un-permuted), equals
    `mx.load`'s arrays with the same rows un-permuted."""
    from kerneltriage.backends.mlx.quant import NATIVE_TYPES, pack
    from kerneltriage.engine.names import GGUF, from_internal, gguf_unpermute_rows

    native, config = mx.load(str(default_gguf)), default_checkpoint.config
    heads = {"q": config.num_heads, "k": config.num_kv_heads}
    checked = 0
    for internal, raw in default_checkpoint.tensors.items():
        if raw.qtype not in NATIVE_TYPES:
            continue
        stem, packed = from_internal(internal, GGUF).removesuffix(".weight"), pack(raw)
        for field, key in (("weight", f"{stem}.weight"), ("scales", f"{stem}.scales"), ("biases", f"{stem}.biases")):
            theirs = np.array(native[key])
            n_head = heads.get(internal.rsplit(".", 1)[-1])
            theirs = theirs if n_head is None else gguf_unpermute_rows(theirs, n_head)
            assert np.array_equal(np.array(getattr(packed, field)), theirs), (internal, field)
        checked += 1
    assert checked == 211  # 210 Q4_1 projections and the Q8_0 embedding
