"""The torch model on tiny models of every architecture: the registry, cache consistency, varied greedy text and
HF parity."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from conftest import ARCHS, tiny_checkpoint, tiny_config, tiny_runner
from kerneltriage.backends.torch.models import MODELS, gemma3, llama, model_class
from kerneltriage.engine import names
from kerneltriage.engine.architectures import ARCHITECTURES
from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams


def test_every_architecture_has_its_model_file() -> None:
    assert set(MODELS) == set(ARCHS)
    # llama's file builds qwen2 and qwen3 too: their records say what differs
    assert (model_class("llama"), model_class("qwen2"), model_class("qwen3")) == (llama.Model,) * 3
    assert model_class("gemma3") is gemma3.Model
    for arch in ARCHS:
        model = tiny_runner(arch).model
        assert type(model) is MODELS[arch] and isinstance(model, llama.Model)
        attention = model.layers[0].self_attn
        record = ARCHITECTURES[arch]
        assert (attention.q_proj.bias is not None) == record.attention_bias
        assert (attention.q_norm is not None) == (attention.k_norm is not None) == record.qk_norm
        # gemma3's own (1 + w) norms, built by llama's Attention once: no llama RMSNorm beside or under them
        norm = gemma3.RMSNorm if record.norm_offset else llama.RMSNorm
        norms = {name: type(module) for name, module in attention.named_modules() if name.endswith("_norm")}
        assert norms == ({"q_norm": norm, "k_norm": norm} if record.qk_norm else {})
        assert hasattr(model.layers[0], "post_feedforward_layernorm") == record.sandwich_norms


def test_the_cache_takes_its_shape_from_the_attention_layers() -> None:
    """Attention keeps its own head counts: a transform that changes them per module changes the cache too."""
    runner = tiny_runner("qwen3")
    assert runner.model.cache_shape(40) == (2, 1, 2, 40, 32)  # (L, B, Hkv, S, D): qwen3's head_dim 32 ≠ 64 / 4
    runner.model.layers[0].self_attn.num_kv_heads = 1
    assert runner.reset_cache(40).keys.shape == (2, 1, 1, 40, 32)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_text_of_every_tiny_model_varies(arch: str) -> None:
    """An equality test is only as strong as the outputs can differ: a tiny model that repeats one token (the
    N(0, 0.02) init mostly does) would let a broken lever pass every greedy comparison."""
    tokens = list(generate_step(tiny_runner(arch), [9, 10, 11, 12], SamplingParams(), 24))
    assert len(tokens) == 24 and len(set(tokens)) >= 4, tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_decode_equals_full_forward(arch: str) -> None:
    runner = tiny_runner(arch)
    model = runner.model
    tokens = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(1))
    runner.reset_cache(64)
    full = model(tokens, 0)  # (1, 24, V)
    runner.reset_cache(64)
    steps = [model(tokens[:, :10], 0)]
    steps += [model(tokens[:, i : i + 1], i) for i in range(10, 16)]
    steps.append(model(tokens[:, 16:], 16))  # a block after a filled cache: the masked path
    # float32 rounding of other GEMM shapes, relative to logits of magnitude ~10 (weights of std 0.3)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())


@pytest.mark.parametrize("arch", ARCHS)
def test_trim_then_decode_again_gives_the_same_tokens(arch: str) -> None:
    runner = tiny_runner(arch)
    model = runner.model
    cache = runner.reset_cache(64)
    prompt = torch.arange(5, 17).unsqueeze(0)

    def greedy(start_token: torch.Tensor, start: int, count: int) -> list[int]:
        out, token = [], start_token
        for pos in range(start, start + count):
            token = model(token.view(1, 1), pos)[:, -1].argmax(-1)
            out.append(int(token))
        return out

    first = model(prompt, 0)[:, -1].argmax(-1)
    reference = greedy(first, 12, 8)
    # Write 5 junk positions, roll them back, decode again from the same point.
    model(torch.tensor([[1, 2, 3, 4, 5]]), 12)
    cache.trim(12)
    assert greedy(first, 12, 8) == reference
    assert cache.length == 20


def test_trim_rejects_growing_the_cache() -> None:
    cache = tiny_runner("llama").reset_cache(16)
    with pytest.raises(ValueError):
        cache.trim(3)


GEMMA_KEYS = ("sliding_window", "layer_types", "rope_local_base_freq", "query_pre_attn_scalar",
              "final_logit_softcapping")


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_hugging_face(arch: str) -> None:
    """Same weights through HF names → our names → our model, against transformers' implementation."""
    import transformers  # a dependency of the project: its absence is a failure, not a skip
    config = tiny_config(arch)
    gemma = {key: value for key, value in config.to_hf().items() if key in GEMMA_KEYS}
    hf_config = transformers.AutoConfig.for_model(
        model_type=ARCHITECTURES[arch].hf_model_type, vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_context, rope_theta=config.rope_theta, rms_norm_eps=config.rms_eps,
        tie_word_embeddings=config.tie_embeddings,
        rope_scaling=None if config.rope_scaling is None else dict(
            rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=32),
        **gemma,
    )
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.1)
    tensors = {}
    for name, value in hf.state_dict().items():
        internal = names.to_internal(name, names.HF, arch)
        if internal is not None:
            tensors[internal] = RawTensor("F32", tuple(value.shape), value.numpy())
    from kerneltriage.backends.torch.backend import build_runner
    from kerneltriage.engine.tokenizer import Tokenizer

    checkpoint = Checkpoint(config, tensors, Tokenizer.synthetic(300), "hf")
    runner = build_runner(checkpoint, torch.device("cpu"), torch.float32)
    tokens = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    runner.reset_cache(64)
    with torch.no_grad():
        expected = hf(tokens).logits
    torch.testing.assert_close(runner.model(tokens, 0), expected, rtol=1e-4, atol=1e-4)


def test_tiny_weights_are_the_checkpoint_tensors() -> None:
    """Every parameter is the checkpoint's float32 tensor, exactly (tied ones once): runs are reproducible."""
    checkpoint = tiny_checkpoint("qwen3")
    a, b = tiny_runner("qwen3"), tiny_runner("qwen3")
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb), name
    assert a.model.lm_head.weight is a.model.embed_tokens.weight  # tied
    assert torch.equal(a.model.embed_tokens.weight, torch.from_numpy(checkpoint.tensors["embed"].data))
    assert torch.equal(a.model.layers[1].self_attn.k_norm.weight,
                       torch.from_numpy(checkpoint.tensors["layers.1.k_norm"].data))


def test_rope_frequencies_stay_float32_in_a_bf16_model() -> None:
    """Cast with the weights, bf16 frequencies were off by up to 0.4%: radians of angle by position 2048."""
    from kerneltriage.engine.rope import rope_inv_freq

    runner = tiny_runner("llama", dtype="bfloat16")
    model = runner.model
    assert runner.dtype == "bfloat16" and runner.torch_dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == model.norm.weight.dtype == torch.bfloat16
    assert model.inv_freq.dtype == torch.float32
    assert torch.equal(model.inv_freq, torch.from_numpy(rope_inv_freq(runner.config)))


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_tied_checkpoint_that_stores_its_head_too_loads_with_the_embedding_as_head(backend: str) -> None:
    """Some tied checkpoints store the head anyway (validation lets them): both backends load them, ignoring it."""
    from dataclasses import replace

    from kerneltriage.engine import backend as backends
    from kerneltriage.engine.configuration import RunConfig

    if backend == "mlx":
        pytest.importorskip("mlx.core")
    checkpoint = tiny_checkpoint("qwen2")  # tied
    stored = replace(checkpoint, tensors=checkpoint.tensors | {"lm_head": checkpoint.tensors["embed"]})
    engine = backends.get_backend(backend)
    runner = engine.build(stored, RunConfig(), "cpu", "float32")
    reference = engine.build(checkpoint, RunConfig(), "cpu", "float32")
    runner.reset_cache(8), reference.reset_cache(8)
    assert np.array_equal(runner.host_logits(runner.prefill([3, 1, 4], 0)),
                          reference.host_logits(reference.prefill([3, 1, 4], 0)))
