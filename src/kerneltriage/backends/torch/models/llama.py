"""Llama for PyTorch, and qwen2 and qwen3 with it: their differences (q/k/v biases, per-head q/k norms) are what
their architecture records say (engine/architectures.py), read at construction. Gemma-3 subclasses it.

No feature flags in `forward`: levers swap whole functions or modules from outside (the attention function on
`Model.attention`, projections, the step functions that call the model). Attention and the KV cache keep their
own head counts, so a transform (sharding, a MoE block) can change them per module.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kerneltriage.backends.torch.cache import KVCache, Positions
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.model_base import ModelBase

Device = torch.device | str | None
# F.scaled_dot_product_attention or a replacement with its signature (a lever may pin its backend)
SdpaFn = Callable[..., torch.Tensor]


def SDPA(*args: object, **kwargs: object) -> torch.Tensor:  # noqa: N802 - stands for F.scaled_dot_product_attention
    """F.scaled_dot_product_attention, looked up at each call (a probe may wrap it for a while)."""
    return F.scaled_dot_product_attention(*args, **kwargs)

# (q (B,H,T,D), k (B,Hkv,S,D), v (B,Hkv,S,D), positions, sdpa=SDPA) -> (B,H,T,D); a wrapper passes `sdpa` on
AttentionFn = Callable[..., torch.Tensor]
# (final-normed hidden states (B, T, hidden), their positions) -> None: what a forward's last hidden states are shown
HiddenFn = Callable[[torch.Tensor, Positions], None]


def unobserved(hidden: torch.Tensor, pos: Positions) -> None:
    """The stock `Model.observe_hidden`: nobody reads the hidden states (an EAGLE head's feature store does)."""


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      sdpa: SdpaFn = SDPA) -> torch.Tensor:
    """GQA as plain attention under a (T, S) mask: each KV head's G query heads are folded into the query axis,
    so no backend needs GQA support and K/V are never expanded (math-backend GQA copies them G times)."""
    batch, heads, length, dim = q.shape
    groups = heads // k.shape[1]
    # (B, H, T, D) → (B, Hkv, G*T, D): query head j*G+i belongs to KV head j
    folded = q.reshape(batch, k.shape[1], groups * length, dim)
    out = sdpa(folded, k, v, attn_mask=mask.repeat(groups, 1))  # mask (G*T, S)
    return out.reshape(batch, heads, length, dim)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Positions,
                   sdpa: SdpaFn = SDPA) -> torch.Tensor:
    """Attention of T new queries over the keys the cache returned.

    A static cache supplies its mask. Otherwise: a fresh prompt needs only `is_causal`; one new token sees
    every key; a block after a filled cache (chunked prefill, speculative verify) needs an explicit mask.
    """
    length = q.shape[2]
    if pos.mask is not None:
        return grouped_attention(q, k, v, pos.mask, sdpa)
    if pos.start == 0:
        # causal whatever the length (one row sees its one key either way): a compiled prefill's length is symbolic
        return sdpa(q, k, v, is_causal=True, enable_gqa=True)
    if length == 1:
        return sdpa(q, k, v, enable_gqa=True)
    rows = torch.arange(length, device=q.device).unsqueeze(1) + pos.start
    mask = torch.arange(k.shape[2], device=q.device).unsqueeze(0) <= rows  # (T, S): query i sees keys ≤ start+i
    return grouped_attention(q, k, v, mask, sdpa)


class Step(NamedTuple):
    """What every layer needs to know about the current forward pass."""

    pos: Positions
    cos: torch.Tensor  # (T, D)
    sin: torch.Tensor  # (T, D)
    cache: KVCache
    attention: AttentionFn


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (HF/NeoX layout): x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device: Device = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the reference implementations, then scale in the model dtype.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * normed


class Attention(nn.Module):
    """Biases on q, k and v where the record says so (qwen2) or the checkpoint's config does (a llama may);
    q_norm and k_norm, RMSNorms over each head of q and k before RoPE, where the record says so (qwen3, gemma3:
    QK_NORM is the norm's class), else None."""

    QK_NORM: Callable[[int, float, Device], nn.Module] = RMSNorm

    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        record = config.architecture
        bias = record.attention_bias or config.attention_bias
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=bias, device=device)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=bias, device=device)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=bias, device=device)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False, device=device)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if record.qk_norm:
            self.q_norm = self.QK_NORM(self.head_dim, config.rms_eps, device)
            self.k_norm = self.QK_NORM(self.head_dim, config.rms_eps, device)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head norms of q and k before RoPE, where the architecture has them (none in llama and qwen2)."""
        if self.q_norm is None or self.k_norm is None:
            return q, k
        return self.q_norm(q), self.k_norm(k)

    def forward(self, x: torch.Tensor, layer: int, step: Step) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x)
        # (B, T, H*D) → (B, H, T, D)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.qk_norm(q, k)
        q, k = apply_rope(q, step.cos, step.sin), apply_rope(k, step.cos, step.sin)
        keys, values = step.cache.update(layer, step.pos, k, v)  # (B, Hkv, S, D)
        out = step.attention(q, keys, values, step.pos)
        # (B, H, T, D) → (B, T, H*D)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inter, bias=False, device=device)
        self.up_proj = nn.Linear(hidden, inter, bias=False, device=device)
        self.down_proj = nn.Linear(inter, hidden, bias=False, device=device)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_proj(x), self.up_proj(x)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """The `gate_up` seam: SiLU(x Wgᵀ) · (x Wuᵀ), (B, T, hidden) → (B, T, intermediate)."""
        gate, up = self.gate_up(x)
        return F.silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(x))


class TransformerBlock(nn.Module):
    ATTENTION: type[Attention] = Attention

    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_eps, device)
        self.self_attn = self.ATTENTION(config, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_eps, device)
        self.mlp = MLP(config, device)

    def forward(self, x: torch.Tensor, layer: int, step: Step) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), layer, step)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(ModelBase, nn.Module):
    """`hidden(tokens, start)` runs the decoder over the cache; `logits(h)` applies the output head.

    They are apart so that callers (and levers) decide which positions need logits.
    """

    BLOCK: type[TransformerBlock] = TransformerBlock
    # the named seams where a lever or a custom kernel may replace the stock op (engine/levers.py: SEAMS)
    SEAMS = ("norm", "qkv", "attn.decode", "attn.prefill", "o_proj", "gate_up", "down", "lm_head", "linear.gemv")

    def __init__(self, config: ModelConfig, device: Device = None) -> None:
        """`device="meta"` builds the skeleton without memory; `load.py` then fills it on the real device."""
        super().__init__()
        self.config = config
        # from_pretrained skips the random init (on meta, normal_ alone would import torch's compiler: 2 s)
        embed = torch.empty(config.vocab_size, config.hidden_size, device=device)
        self.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.layers = nn.ModuleList(self.BLOCK(config, device) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_eps, device)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device)
        inv_freq = torch.empty(config.head_dim // 2, dtype=torch.float32, device=device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention: AttentionFn = sdpa_attention
        self.observe_hidden: HiddenFn = unobserved
        self.cache: KVCache | None = None

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.outer(positions.float(), self.inv_freq)  # (T, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, D)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def hidden(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Final-normed hidden states (B, T, hidden) for `tokens` (B, T) at positions start…; fills the cache."""
        if self.cache is None:
            raise RuntimeError("Model.cache is not set: attach a KVCache before running the model")
        x = self.embed_tokens(tokens)
        pos = self.cache.positions(start, tokens.shape[1])
        cos, sin = self.rope(pos.ids, x.dtype)
        step = Step(pos, cos, sin, self.cache, self.attention)
        for index, block in enumerate(self.layers):
            x = block(x, index, step)
        hidden = self.norm(x)
        self.observe_hidden(hidden, pos)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Logits for every position: (B, T, vocab)."""
        return self.logits(self.hidden(tokens, start))
