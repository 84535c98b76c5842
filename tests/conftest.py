"""Shared fixtures: tiny random models of every architecture, and the real default model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.config import ModelConfig, RopeScaling

ARCHS = ("llama", "qwen2", "qwen3")


def tiny_config(arch: str, **changes: object) -> ModelConfig:
    """A 2-layer model of `arch` with GQA; llama gets Llama-3 rope scaling, qwen3 a head_dim ≠ hidden/heads."""
    base = dict(
        arch=arch, vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_context=128, rope_theta=10000.0, rms_eps=1e-6,
        tie_embeddings=arch != "llama", attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
        eos_token_ids=(), name=f"tiny-{arch}", random_weights=True,
    )
    if arch == "llama":
        base["rope_scaling"] = RopeScaling(4.0, 1.0, 4.0, 32)
    if arch == "qwen3":
        base["head_dim"] = 32
    base.update(changes)
    return ModelConfig(**base)


def tiny_runner(arch: str, **changes: object):
    from kerneltriage.backends.torch.runner import build_runner
    from kerneltriage.engine.tokenizer import Tokenizer

    config = tiny_config(arch, **changes)
    checkpoint = Checkpoint(config, {}, Tokenizer.synthetic(config.vocab_size), source=config.name)
    return build_runner(checkpoint, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF, fetched into the user cache on first use."""
    from kerneltriage.engine.fetch import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def default_checkpoint(default_gguf: Path) -> Checkpoint:
    from kerneltriage.engine.sources import load_checkpoint

    return load_checkpoint(str(default_gguf))
