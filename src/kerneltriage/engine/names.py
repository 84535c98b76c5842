"""Explicit tensor-name maps: GGUF ↔ Hugging Face ↔ internal, and the GGUF rotary permutation.

Internal names are short and framework-free: `embed`, `norm`, `lm_head`, `rope_freqs`, and per layer
`layers.{i}.{attn_norm,q,k,v,o,q_bias,k_bias,v_bias,q_norm,k_norm,mlp_norm,gate,up,down}`.
"""

from __future__ import annotations

import re

import numpy as np

# internal suffix → (GGUF name, HF name); `{i}` is the layer index.
LAYER_NAMES: dict[str, tuple[str, str]] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    "q": ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    "k": ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    "v": ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    "o": ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    "q_bias": ("blk.{i}.attn_q.bias", "model.layers.{i}.self_attn.q_proj.bias"),
    "k_bias": ("blk.{i}.attn_k.bias", "model.layers.{i}.self_attn.k_proj.bias"),
    "v_bias": ("blk.{i}.attn_v.bias", "model.layers.{i}.self_attn.v_proj.bias"),
    "q_norm": ("blk.{i}.attn_q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight"),
    "k_norm": ("blk.{i}.attn_k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"),
    "mlp_norm": ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    "gate": ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    "up": ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    "down": ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
}

GLOBAL_NAMES: dict[str, tuple[str, str]] = {
    "embed": ("token_embd.weight", "model.embed_tokens.weight"),
    "norm": ("output_norm.weight", "model.norm.weight"),
    "lm_head": ("output.weight", "lm_head.weight"),
    "rope_freqs": ("rope_freqs.weight", ""),
}

GGUF, HF = 0, 1


def _build_reverse(which: int) -> tuple[dict[str, str], list[tuple[re.Pattern[str], str]]]:
    fixed = {names[which]: internal for internal, names in GLOBAL_NAMES.items() if names[which]}
    patterns = []
    for suffix, names in LAYER_NAMES.items():
        regex = re.escape(names[which]).replace(re.escape("{i}"), r"(\d+)")
        patterns.append((re.compile(f"^{regex}$"), suffix))
    return fixed, patterns


_REVERSE = {which: _build_reverse(which) for which in (GGUF, HF)}


def to_internal(name: str, which: int) -> str | None:
    """Map a GGUF (`which=GGUF`) or HF (`which=HF`) tensor name to ours; None if we don't use it."""
    fixed, patterns = _REVERSE[which]
    if name in fixed:
        return fixed[name]
    for pattern, suffix in patterns:
        match = pattern.match(name)
        if match:
            return f"layers.{match.group(1)}.{suffix}"
    return None


def from_internal(name: str, which: int) -> str:
    """Map an internal name to its GGUF or HF spelling."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name][which]
    _, index, suffix = name.split(".", 2)
    return LAYER_NAMES[suffix][which].format(i=index)


def param_name(internal: str) -> str | None:
    """An internal name → the parameter path in either backend's Model: its HF name without `model.` (None for a
    tensor that is no parameter: rope_freqs, which the loaders turn into `inv_freq`)."""
    return from_internal(internal, HF).removeprefix("model.") or None


def gguf_unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the Q/K row permutation that llama.cpp's converter applies to `llama` models.

    HF rotates the two halves of each head (NeoX style); GGUF `llama` rotates adjacent pairs, so the
    converter interleaves each head's rows: HF row (h, s, j) ↦ GGUF row (h, j, s) with s∈{0,1}, j<D/2.
    Rows are whole, so this works on raw quantized blocks as well as on floats.
    """
    out = rows.shape[0]
    half = out // n_head // 2
    rest = rows.shape[1:]
    # (H, D/2, 2, …) → (H, 2, D/2, …)
    return rows.reshape(n_head, half, 2, *rest).swapaxes(1, 2).reshape(out, *rest)
