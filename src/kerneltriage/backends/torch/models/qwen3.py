"""Qwen3 for PyTorch: llama with an RMSNorm on each head's q and k before RoPE (and head_dim ≠ hidden/heads)."""

from __future__ import annotations

import torch

from kerneltriage.backends.torch.models import llama
from kerneltriage.engine.config import ModelConfig


class Attention(llama.Attention):
    def __init__(self, config: ModelConfig, device: llama.Device = None) -> None:
        super().__init__(config, device)
        self.q_norm = llama.RMSNorm(self.head_dim, config.rms_eps, device)
        self.k_norm = llama.RMSNorm(self.head_dim, config.rms_eps, device)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class TransformerBlock(llama.TransformerBlock):
    ATTENTION = Attention


class Model(llama.Model):
    BLOCK = TransformerBlock
