"""Qwen2 for MLX: llama with biases on the q, k and v projections."""

from __future__ import annotations

from kerneltriage.backends.mlx.models import llama


class Attention(llama.Attention):
    BIAS = True


class TransformerBlock(llama.TransformerBlock):
    ATTENTION = Attention


class Model(llama.Model):
    BLOCK = TransformerBlock
