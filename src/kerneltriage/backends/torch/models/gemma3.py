"""Gemma-3 for PyTorch: llama's attention with per-head q/k norms before RoPE (as qwen3) in Gemma's own layer.

What differs from llama (engine/architectures.py records it):
- every norm scales by (1 + w) in float32, and a layer has four: before and after the attention, before and after
  the MLP, each output normed before its residual add;
- the embedding rows are scaled by sqrt(hidden), rounded to the model's dtype first (as transformers does); the tied
  output head reads them unscaled;
- the gate's activation is GELU (tanh approximation);
- sliding layers attend over the last `sliding_window` positions (their own included) and rotate with their own
  RoPE base; every `sliding_pattern`-th layer is global;
- attention scores are scaled by query_pre_attn_scalar^-1/2 (head_dim's in Gemma-3-270M: SDPA's default);
- logits are soft-capped, c·tanh(logits / c), where the config has a cap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kerneltriage.backends.torch.cache import Positions
from kerneltriage.backends.torch.models import llama
from kerneltriage.backends.torch.models.llama import SDPA, AttentionFn, Device, SdpaFn, Step, grouped_attention
from kerneltriage.engine.config import ModelConfig


def window_mask(pos: Positions, keys: int, window: int) -> torch.Tensor:
    """(T, S) bool: query at position p sees key j when p - window < j <= p (and where the cache's mask allows)."""
    rows = pos.ids.unsqueeze(1)  # (T, 1)
    cols = torch.arange(keys, device=rows.device).unsqueeze(0)  # (1, S)
    visible = cols <= rows if pos.mask is None else pos.mask[:, :keys]
    return visible & (cols > rows - window)


def windowed(attention: AttentionFn, window: int) -> AttentionFn:
    """`attention` restricted to the last `window` positions of each query. While the keys are no more than the
    window, each query already sees only positions inside it, so the call goes whole to `attention` (the stock
    function or a lever's); past that, grouped attention under the band mask."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Positions, **kwargs: SdpaFn) -> torch.Tensor:
        if k.shape[2] <= window:
            return attention(q, k, v, pos, **kwargs)  # as the model calls it (a probe may take no `sdpa`)
        return grouped_attention(q, k, v, window_mask(pos, k.shape[2], window), kwargs.get("sdpa", SDPA))

    return attend


class RMSNorm(nn.Module):
    """x / rms(x) · (1 + w), all in float32, then the model's dtype (Gemma's norm; not llama's x̂ · w)."""

    def __init__(self, dim: int, eps: float, device: Device = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class Attention(llama.Attention):
    """llama's, with Gemma's (1 + w) norms as its q/k norms (the record's qk_norm) and q scaled after them."""

    QK_NORM = RMSNorm

    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        super().__init__(config, device)
        # SDPA scales by head_dim^-1/2; scaling q by sqrt(head_dim / s) makes that s^-1/2
        self.q_scale = (self.head_dim / (config.query_pre_attn_scalar or self.head_dim)) ** 0.5

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super().qk_norm(q, k)
        return (q if self.q_scale == 1.0 else q * self.q_scale), k


class MLP(llama.MLP):
    def act(self, x: torch.Tensor) -> torch.Tensor:
        """The `gate_up` seam: GELU-tanh(x Wgᵀ) · (x Wuᵀ), (B, T, hidden) → (B, T, intermediate)."""
        gate, up = self.gate_up(x)
        return F.gelu(gate, approximate="tanh") * up


class TransformerBlock(nn.Module):
    """Norms around each sublayer's output too; names as transformers' (post_attention_layernorm is the
    attention's output norm here, the MLP's input norm in llama)."""

    ATTENTION: type[Attention] = Attention

    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_eps
        self.input_layernorm = RMSNorm(hidden, eps, device)
        self.self_attn = self.ATTENTION(config, device)
        self.post_attention_layernorm = RMSNorm(hidden, eps, device)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, device)
        self.mlp = MLP(config, device)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, device)

    def forward(self, x: torch.Tensor, layer: int, step: Step) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), layer, step))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Model(llama.Model):
    BLOCK = TransformerBlock  # type: ignore[assignment] - Gemma's block is no llama block

    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        super().__init__(config, device)
        self.norm = RMSNorm(config.hidden_size, config.rms_eps, device)  # type: ignore[assignment]
        inv_freq_local = torch.empty(config.head_dim // 2, dtype=torch.float32, device=device)
        self.register_buffer("inv_freq_local", inv_freq_local, persistent=False)
        # sqrt(hidden) rounded to each dtype, as transformers rounds it (a constant to a compiled step, no sync)
        self.embed_scale = {dtype: torch.tensor(config.hidden_size ** 0.5, dtype=dtype).item()
                            for dtype in (torch.float32, torch.float16, torch.bfloat16)}

    def steps(self, pos: Positions, dtype: torch.dtype) -> tuple[Step, Step]:
        """(global, sliding): the sliding layers' RoPE table and attention are their own."""
        assert self.cache is not None  # hidden() checked it
        cos, sin = self.rope(pos.ids, dtype)
        angles = torch.outer(pos.ids.float(), self.inv_freq_local)  # (T, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, D)
        window = self.config.sliding_window or self.config.max_context
        return (Step(pos, cos, sin, self.cache, self.attention),
                Step(pos, angles.cos().to(dtype), angles.sin().to(dtype), self.cache,
                     windowed(self.attention, window)))

    def hidden(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Final-normed hidden states (B, T, hidden) for `tokens` (B, T) at positions start…; fills the cache."""
        if self.cache is None:
            raise RuntimeError("Model.cache is not set: attach a KVCache before running the model")
        x = self.embed_tokens(tokens)
        x = x * self.embed_scale[x.dtype]
        pos = self.cache.positions(start, tokens.shape[1])
        steps = self.steps(pos, x.dtype)
        for index, block in enumerate(self.layers):
            x = block(x, index, steps[self.config.sliding(index)])
        hidden = self.norm(x)
        self.observe_hidden(hidden, pos)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
