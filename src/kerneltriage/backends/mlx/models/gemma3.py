"""Gemma-3 for MLX: the torch file's classes, one for one (diff `backends/torch/models/gemma3.py` against this one).

What differs from llama (engine/architectures.py records it): (1 + w) norms in float32, four a layer (each
sublayer's output normed before its residual add); the embedding scaled by sqrt(hidden) in the model's dtype (the
tied head reads it unscaled); a GELU-tanh gate; sliding layers over the last `sliding_window` positions with their
own RoPE base; scores scaled by query_pre_attn_scalar^-1/2; logits soft-capped where the config has a cap.
"""

from __future__ import annotations

import math
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from kerneltriage.backends.mlx.cache import Positions
from kerneltriage.backends.mlx.models import llama
from kerneltriage.backends.mlx.models.llama import LOCAL_ROPE, SDPA, AttentionFn, SdpaFn, Step
from kerneltriage.engine.config import ModelConfig


def window_mask(pos: Positions, keys: int, window: int) -> mx.array:
    """(T, S) bool: query at position p sees key j when p - window < j <= p (and where the cache's mask allows)."""
    rows = pos.ids[:, None]  # (T, 1)
    cols = mx.arange(keys, dtype=mx.int32)[None, :]  # (1, S)
    visible = cols <= rows if pos.mask is None else pos.mask[:, :keys]
    return visible & (cols > rows - window)


def windowed(attention: AttentionFn, window: int) -> AttentionFn:
    """`attention` restricted to the last `window` positions of each query. While the keys are no more than the
    window, each query already sees only positions inside it, so the call goes whole to `attention` (the stock
    function or a lever's); past that, SDPA under the band mask."""

    def attend(q: mx.array, k: mx.array, v: mx.array, pos: Positions, **kwargs: SdpaFn) -> mx.array:
        if k.shape[2] <= window:
            return attention(q, k, v, pos, **kwargs)  # as the model calls it (a probe may take no `sdpa`)
        sdpa = kwargs.get("sdpa", SDPA)
        return sdpa(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), mask=window_mask(pos, k.shape[2], window))

    return attend


@partial(mx.compile, shapeless=True)
def geglu(gate: mx.array, up: mx.array) -> mx.array:
    """GELU-tanh(gate) · up: 0.5·g·(1 + tanh(sqrt(2/π)·(g + 0.044715·g³))) · up, one fused kernel."""
    return nn.gelu_approx(gate) * up


class RMSNorm(nn.Module):
    """x / rms(x) · (1 + w), all in float32, then the model's dtype (Gemma's norm; not llama's x̂ · w)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.zeros((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        scale = 1.0 + self.weight.astype(mx.float32)
        return mx.fast.rms_norm(x.astype(mx.float32), scale, self.eps).astype(x.dtype)


class Attention(llama.Attention):
    """llama's, with Gemma's (1 + w) norms as its q/k norms (the record's qk_norm) and q scaled after them."""

    QK_NORM = RMSNorm

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        # SDPA is given head_dim^-1/2; scaling q by sqrt(head_dim / s) makes that s^-1/2
        self.q_scale = (self.head_dim / (config.query_pre_attn_scalar or self.head_dim)) ** 0.5

    def qk_norm(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        q, k = super().qk_norm(q, k)
        return (q if self.q_scale == 1.0 else q * self.q_scale), k


class MLP(llama.MLP):
    def __call__(self, x: mx.array) -> mx.array:
        gate, up = self.gate_up(x)
        return self.down_proj(geglu(gate, up))


class TransformerBlock(nn.Module):
    """Norms around each sublayer's output too; names as transformers' (post_attention_layernorm is the
    attention's output norm here, the MLP's input norm in llama)."""

    ATTENTION: type[Attention] = Attention

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = self.ATTENTION(config)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def __call__(self, x: mx.array, layer: int, step: Step) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), layer, step))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Model(llama.Model):
    BLOCK = TransformerBlock  # type: ignore[assignment] - Gemma's block is no llama block

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_eps)  # type: ignore[assignment]
        setattr(self, LOCAL_ROPE, mx.zeros((config.head_dim // 2,), dtype=mx.float32))  # the sliding layers' RoPE

    def steps(self, pos: Positions) -> tuple[Step, Step]:
        """(global, sliding): the sliding layers' RoPE frequencies and attention are their own."""
        assert self.cache is not None  # hidden() checked it
        offset, freqs = self.rope(pos)
        window = self.config.sliding_window or self.config.max_context
        return (Step(pos, offset, freqs, self.cache, self.attention),
                Step(pos, offset, getattr(self, LOCAL_ROPE), self.cache, windowed(self.attention, window)))

    def hidden(self, tokens: mx.array, start: int | None) -> mx.array:
        """Final-normed hidden states (B, T, hidden) for `tokens` (B, T) at positions start…; fills the cache."""
        if self.cache is None:
            raise RuntimeError("Model.cache is not set: attach a KVCache before running the model")
        x = self.embed_tokens(tokens)
        x = x * mx.array(self.config.hidden_size ** 0.5, dtype=x.dtype)  # the scale in x's dtype
        pos = self.cache.positions(start, tokens.shape[1])
        steps = self.steps(pos)
        for index, block in enumerate(self.layers):
            x = block(x, index, steps[self.config.sliding(index)])
        return self.norm(x)

    def logits(self, hidden: mx.array) -> mx.array:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else mx.tanh(logits / cap) * cap
