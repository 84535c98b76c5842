"""Llama-family decoder (llama, qwen2, qwen3) for PyTorch.

No feature flags in `forward`: levers swap whole functions or modules from outside (the attention
function on `Model.attention`, projections, the step functions that call the model).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kerneltriage.backends.torch.cache import KVCache
from kerneltriage.engine.config import ModelConfig

# (q (B,H,T,D), k (B,Hkv,S,D), v (B,Hkv,S,D), start, T) -> (B,H,T,D)
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """Attention of `length` new queries at positions start… over keys 0…start+length-1.

    A fresh prompt needs only `is_causal`; one new token sees every key; a block of new tokens after a
    filled cache (chunked prefill, speculative verify) needs an explicit mask: query i sees keys ≤ start+i.
    """
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=length > 1, enable_gqa=True)
    if length == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    rows = torch.arange(length, device=q.device).unsqueeze(1) + start
    mask = torch.arange(k.shape[2], device=q.device).unsqueeze(0) <= rows  # (T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class Step(NamedTuple):
    """What every layer needs to know about the current forward pass."""

    start: int  # position of the first new token
    cos: torch.Tensor  # (T, D)
    sin: torch.Tensor  # (T, D)
    cache: KVCache
    attention: AttentionFn


def rope_inv_freq(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies θ^(-2i/D), with Llama-3 scaling (from config.json) or GGUF `rope_freqs`."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if freq_factors is not None:
        return (inv_freq / freq_factors.double()).float()
    rs = config.rope_scaling
    if rs is None:
        return inv_freq.float()
    # Llama-3: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    blended = (1 - smooth) * inv_freq / rs.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (HF/NeoX layout): x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the reference implementations, then scale in the model dtype.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * normed


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_eps)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, layer: int, step: Step) -> torch.Tensor:
        cfg = self.config
        batch, length, _ = x.shape
        q, k, v = self.qkv(x)
        # (B, T, H*D) → (B, H, T, D)
        q = q.view(batch, length, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(batch, length, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(batch, length, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, step.cos, step.sin), apply_rope(k, step.cos, step.sin)
        keys, values = step.cache.update(layer, step.start, k, v)  # (B, Hkv, start+T, D)
        out = step.attention(q, keys, values, step.start, length)
        # (B, H, T, D) → (B, T, H*D)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, cfg.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_proj(x), self.up_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, layer: int, step: Step) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), layer, step)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    """`hidden(tokens, start)` runs the decoder over the cache; `logits(h)` applies the output head.

    They are apart so that callers (and levers) decide which positions need logits.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", torch.empty(config.head_dim // 2, dtype=torch.float32), persistent=False)
        self.attention: AttentionFn = sdpa_attention
        self.cache: KVCache | None = None

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def rope(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + length, device=self.inv_freq.device, dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq)  # (T, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, D)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def hidden(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Final-normed hidden states (B, T, hidden) for `tokens` (B, T) at positions start…; fills the cache."""
        if self.cache is None:
            raise RuntimeError("Model.cache is not set: attach a KVCache before running the model")
        x = self.embed_tokens(tokens)
        cos, sin = self.rope(start, tokens.shape[1], x.dtype)
        step = Step(start, cos, sin, self.cache, self.attention)
        for index, block in enumerate(self.layers):
            x = block(x, index, step)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Logits for every position: (B, T, vocab)."""
        return self.logits(self.hidden(tokens, start))
