"""Qwen3 for MLX: llama with an RMSNorm on each head's q and k before RoPE (and head_dim ≠ hidden/heads)."""

from __future__ import annotations

import mlx.core as mx

from kerneltriage.backends.mlx.models import llama
from kerneltriage.engine.config import ModelConfig


class Attention(llama.Attention):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.q_norm = llama.RMSNorm(self.head_dim, config.rms_eps)
        self.k_norm = llama.RMSNorm(self.head_dim, config.rms_eps)

    def qk_norm(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        return self.q_norm(q), self.k_norm(k)


class TransformerBlock(llama.TransformerBlock):
    ATTENTION = Attention


class Model(llama.Model):
    BLOCK = TransformerBlock
