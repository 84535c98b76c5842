"""Llama for MLX, and qwen2 and qwen3 with it: their differences (q/k/v biases, per-head q/k norms) are what their
architecture records say (engine/architectures.py), read at construction. Gemma-3 subclasses it.

The torch file's classes, one for one (diff `backends/torch/models/llama.py` against this one): no feature flags
in `__call__`; levers swap whole functions or modules from outside (the attention function on `Model.attention`,
projections, the step functions that call the model). MLX is lazy: these functions build a graph, and the
runner decides when it is evaluated.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, NamedTuple

import mlx.core as mx
import mlx.nn as nn

from kerneltriage.backends.mlx.cache import KVCache, Positions
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.model_base import ModelBase


def SDPA(*args: Any, **kwargs: Any) -> mx.array:  # noqa: N802 - stands for mx.fast.scaled_dot_product_attention
    """mx.fast.scaled_dot_product_attention, looked up at each call (a probe may wrap it for a while). It runs a
    fused kernel where MLX has one for the shapes (Metal, CUDA) and its own composed ops otherwise (the CPU)."""
    return mx.fast.scaled_dot_product_attention(*args, **kwargs)

# sdpa(q (B,H,T,D), k (B,Hkv,S,D), v, *, scale, mask=None | "causal" | (T, S) bool) -> (B,H,T,D)
SdpaFn = Callable[..., mx.array]
# (q (B,H,T,D), k (B,Hkv,S,D), v (B,Hkv,S,D), positions, sdpa=SDPA) -> (B,H,T,D); a wrapper passes `sdpa` on
AttentionFn = Callable[..., mx.array]
ROPE = "freqs"  # the Model's RoPE frequencies: a parameter no checkpoint holds, float32 in every dtype
LOCAL_ROPE = "freqs_local"  # Gemma-3's sliding layers' own
ROPES = (ROPE, LOCAL_ROPE)


def sdpa_attention(q: mx.array, k: mx.array, v: mx.array, pos: Positions, sdpa: SdpaFn = SDPA) -> mx.array:
    """Attention of T new queries over the keys the cache returned (GQA: MLX's SDPA takes Hkv < H as it is).

    A static cache supplies its mask. Otherwise the keys are exactly the filled prefix, S = start + T: one new token
    sees every key (no mask), and a block of T rows (a prompt, a chunk after a filled cache, a speculative verify)
    is causal from the bottom right, query i seeing keys ≤ start + i — MLX's "causal" (unlike torch's `is_causal`,
    which aligns top left). A mask array would keep MLX's CUDA attention off its fused kernels (`kernel_rules`).
    """
    length, scale = q.shape[2], 1.0 / math.sqrt(q.shape[-1])
    if pos.mask is not None:
        return sdpa(q, k, v, scale=scale, mask=pos.mask)
    return sdpa(q, k, v, scale=scale, mask="causal" if length > 1 else None)


class Step(NamedTuple):
    """What every layer needs to know about the current forward pass."""

    pos: Positions
    offset: int | mx.array  # RoPE's first position: the host's int, or (1,) int32 under compile (torch: cos, sin)
    freqs: mx.array  # (D/2,) float32: RoPE's frequencies, the reciprocals of the angles' inverse frequencies
    cache: KVCache
    attention: AttentionFn


def apply_rope(x: mx.array, offset: int | mx.array, freqs: mx.array) -> mx.array:
    """Rotate the two halves of each head (HF/NeoX layout): x·cos + rotate_half(x)·sin at angles position·(1/freqs).

    One `mx.fast.rope` kernel on a GPU (five composed ops before); on the CPU MLX composes it as the torch model does,
    x1·cos − x2·sin and x1·sin + x2·cos with the angles in float32, cos and sin rounded to x's dtype: bit for bit the
    composed form, since the inverse frequencies are the float32 reciprocals of `freqs` (engine/rope.py)."""
    return mx.fast.rope(x, x.shape[-1], traditional=False, base=None, scale=1.0, offset=offset, freqs=freqs)


@partial(mx.compile, shapeless=True)
def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """SiLU(gate) · up as one fused elementwise kernel (nn.silu alone is one, and the product a second): the same
    values bit for bit, one kernel a layer fewer on a GPU (as mlx-lm's own swiglu)."""
    return nn.silu(gate) * up


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.ones((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        # One call with the weight: MLX normalises in float32, rounds to the model dtype, then scales, as the
        # reference implementations do (w · dtype(x·rsqrt(mean(x²)+eps))); bit for bit the composed form on the
        # CPU, and one kernel instead of four (two casts, the norm, the scale) on a GPU in float16.
        return mx.fast.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Biases on q, k and v where the record says so (qwen2) or the checkpoint's config does (a llama may);
    q_norm and k_norm, RMSNorms over each head of q and k before RoPE, where the record says so (qwen3, gemma3:
    QK_NORM is the norm's class), else None."""

    QK_NORM: Callable[[int, float], nn.Module] = RMSNorm

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        record = config.architecture
        bias = record.attention_bias or config.attention_bias
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if record.qk_norm:
            self.q_norm = self.QK_NORM(self.head_dim, config.rms_eps)
            self.k_norm = self.QK_NORM(self.head_dim, config.rms_eps)

    def qkv(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def qk_norm(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        """Per-head norms of q and k before RoPE, where the architecture has them (none in llama and qwen2)."""
        if self.q_norm is None or self.k_norm is None:
            return q, k
        return self.q_norm(q), self.k_norm(k)

    def __call__(self, x: mx.array, layer: int, step: Step) -> mx.array:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x)
        # (B, T, H*D) → (B, H, T, D)
        q = q.reshape(batch, length, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)
        k = k.reshape(batch, length, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = v.reshape(batch, length, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = self.qk_norm(q, k)
        q, k = apply_rope(q, step.offset, step.freqs), apply_rope(k, step.offset, step.freqs)
        keys, values = step.cache.update(layer, step.pos, k, v)  # (B, Hkv, S, D)
        out = step.attention(q, keys, values, step.pos)
        # (B, H, T, D) → (B, T, H*D)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def gate_up(self, x: mx.array) -> tuple[mx.array, mx.array]:
        return self.gate_proj(x), self.up_proj(x)

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = self.gate_up(x)
        return self.down_proj(swiglu(gate, up))


class TransformerBlock(nn.Module):
    ATTENTION: type[Attention] = Attention

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.self_attn = self.ATTENTION(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.mlp = MLP(config)

    def __call__(self, x: mx.array, layer: int, step: Step) -> mx.array:
        x = x + self.self_attn(self.input_layernorm(x), layer, step)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(ModelBase, nn.Module):
    """`hidden(tokens, start)` runs the decoder over the cache; `logits(h)` applies the output head.

    They are apart so that callers (and levers) decide which positions need logits. Building one allocates
    nothing: MLX's initializers are lazy, and `load.py` replaces every weight before anything is evaluated.
    """

    BLOCK: type[TransformerBlock] = TransformerBlock
    # the named seams where a lever or a custom kernel may replace the stock op (engine/levers.py: SEAMS)
    SEAMS = ("norm", "qkv", "attn.decode", "attn.prefill", "o_proj", "gate_up", "down", "lm_head", "linear.gemv")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = [self.BLOCK(config) for _ in range(config.num_layers)]
        self.norm = RMSNorm(config.hidden_size, config.rms_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.freqs = mx.zeros((config.head_dim // 2,), dtype=mx.float32)  # RoPE's (torch: inv_freq, their reciprocals)
        self.attention: AttentionFn = sdpa_attention
        self.cache: KVCache | None = None

    def rope(self, pos: Positions) -> tuple[int | mx.array, mx.array]:
        """RoPE's first position and frequencies: the angles are computed inside `mx.fast.rope`."""
        return (pos.ids[:1] if pos.start is None else pos.start), self.freqs

    def hidden(self, tokens: mx.array, start: int | None) -> mx.array:
        """Final-normed hidden states (B, T, hidden) for `tokens` (B, T) at positions start…; fills the cache."""
        if self.cache is None:
            raise RuntimeError("Model.cache is not set: attach a KVCache before running the model")
        x = self.embed_tokens(tokens)
        pos = self.cache.positions(start, tokens.shape[1])
        offset, freqs = self.rope(pos)
        step = Step(pos, offset, freqs, self.cache, self.attention)
        for index, block in enumerate(self.layers):
            x = block(x, index, step)
        return self.norm(x)

    def logits(self, hidden: mx.array) -> mx.array:
        return self.lm_head(hidden)

    def __call__(self, tokens: mx.array, start: int | None) -> mx.array:
        """Logits for every position: (B, T, vocab)."""
        return self.logits(self.hidden(tokens, start))
