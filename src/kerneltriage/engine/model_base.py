"""The framework-free half of a backend's Model: what it computes from its own attributes alone, the same on
every framework (each backend's `models/llama.py` Model derives from it beside its framework's module class)."""

from __future__ import annotations

from typing import Any


class ModelBase:
    """The KV cache's shape and the tied head, from `config`, `layers`, `embed_tokens` and `lm_head`."""

    config: Any
    layers: Any
    embed_tokens: Any
    lm_head: Any

    def cache_shape(self, max_len: int, batch: int = 1) -> tuple[int, int, int, int, int]:
        """(L, B, Hkv, S, D): the KV cache this model's attention layers write."""
        attention = self.layers[0].self_attn
        return len(self.layers), batch, attention.num_kv_heads, max_len, attention.head_dim

    def tie_weights(self) -> None:
        """The output head is the embedding where the config ties them."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
