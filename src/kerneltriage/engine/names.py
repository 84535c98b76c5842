"""Explicit tensor-name maps: GGUF ↔ Hugging Face ↔ internal, and the GGUF rotary permutation.

Internal names are short and framework-free: `embed`, `norm`, `lm_head`, `rope_freqs`, and per layer
`layers.{i}.{attn_norm,q,k,v,o,q_bias,k_bias,v_bias,q_norm,k_norm,mlp_norm,gate,up,down}`, and Gemma-3's
`attn_post_norm` and `mlp_post_norm`. HF spells a few of them per architecture (`Architecture.hf_names`: Gemma-3's
`post_attention_layernorm` is the attention's output norm, llama's the MLP's input norm); a backend's parameter path
is the HF name of its architecture without `model.`.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from kerneltriage.engine.architectures import ARCHITECTURES

# internal suffix → (GGUF name, HF name); `{i}` is the layer index.
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's projection matrices, by their internal names
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
    # HF names only where an architecture has them (Architecture.hf_names)
    "attn_post_norm": ("blk.{i}.post_attention_norm.weight", ""),
    "mlp_post_norm": ("blk.{i}.post_ffw_norm.weight", ""),
}

GLOBAL_NAMES: dict[str, tuple[str, str]] = {
    "embed": ("token_embd.weight", "model.embed_tokens.weight"),
    "norm": ("output_norm.weight", "model.norm.weight"),
    "lm_head": ("output.weight", "lm_head.weight"),
    "rope_freqs": ("rope_freqs.weight", ""),
}

GGUF, HF = 0, 1


def _layer_names(which: int, arch: str) -> dict[str, str]:
    """Internal layer suffix → its GGUF or HF name template (HF: as `arch` spells it)."""
    spelled = {suffix: pair[which] for suffix, pair in LAYER_NAMES.items()}
    if which == HF and arch:
        spelled |= {suffix: name for suffix, name in ARCHITECTURES[arch].hf_names}
    return spelled


@functools.lru_cache(maxsize=16)
def _reverse(which: int, arch: str) -> tuple[dict[str, str], list[tuple[re.Pattern[str], str]]]:
    fixed = {names[which]: internal for internal, names in GLOBAL_NAMES.items() if names[which]}
    patterns = []
    for suffix, name in _layer_names(which, arch).items():
        if name:
            regex = re.escape(name).replace(re.escape("{i}"), r"(\d+)")
            patterns.append((re.compile(f"^{regex}$"), suffix))
    return fixed, patterns


def to_internal(name: str, which: int, arch: str = "") -> str | None:
    """Map a GGUF (`which=GGUF`) or HF (`which=HF`, as `arch` spells it) tensor name to ours; None if unused."""
    fixed, patterns = _reverse(which, arch)
    if name in fixed:
        return fixed[name]
    for pattern, suffix in patterns:
        match = pattern.match(name)
        if match:
            return f"layers.{match.group(1)}.{suffix}"
    return None


def from_internal(name: str, which: int, arch: str = "") -> str:
    """Map an internal name to its GGUF or HF spelling (HF: as `arch` spells it; "" where it has none)."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name][which]
    _, index, suffix = name.split(".", 2)
    return _layer_names(which, arch)[suffix].format(i=index)


def param_name(internal: str, arch: str) -> str | None:
    """An internal name → the parameter path in either backend's `arch` Model: its HF name without `model.` (None
    for a tensor that is no parameter: rope_freqs, which the loaders turn into `inv_freq`)."""
    return from_internal(internal, HF, arch).removeprefix("model.") or None


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
