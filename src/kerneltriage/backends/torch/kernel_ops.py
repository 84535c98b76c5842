"""The stock op at each wired seam with a kernel's signature (`fn(*inputs, out=out)`), and inputs at a model's real
shapes for a given number of rows and cache depth: what a custom kernel is checked and timed against."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from kerneltriage.backends.torch.models import Model

Inputs = tuple[Any, ...]


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm: normalised in float32, cast back, times the weight."""
    return out.copy_(weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype))


def gate_up(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              out: torch.Tensor) -> torch.Tensor:
    return out.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(F.linear(x, weight))


STOCK: dict[str, Callable[..., torch.Tensor]] = {"norm": norm, "gate_up": gate_up, "attn.decode": attention,
                                                  "attn.prefill": attention, "lm_head": linear, "linear.gemv": linear}


def _randn(gen: torch.Generator, like: torch.Tensor, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=like.device).to(like.dtype)


def causal(rows: int, keys: int, device: torch.device) -> torch.Tensor:
    """(T, S) bool: the last `rows` of `keys` positions, query i sees keys ≤ keys − rows + i."""
    return torch.arange(keys, device=device).unsqueeze(0) <= (torch.arange(rows, device=device).unsqueeze(1)
                                                               + keys - rows)


def inputs(model: Model, seam: str, rows: int, depth: int, gen: torch.Generator) -> list[Inputs]:
    """Fresh random inputs for `seam` at the model's shapes: one tuple per distinct shape the seam sees (every
    projection size for linear.gemv), `rows` query rows after `depth` cached positions for attention."""
    layer, weight = model.layers[0], model.embed_tokens.weight
    hidden = _randn(gen, weight, 1, rows, weight.shape[1])
    if seam == "norm":
        return [(hidden, layer.input_layernorm.weight, layer.input_layernorm.eps)]
    if seam == "gate_up":
        return [(hidden, layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)]
    if seam in ("attn.decode", "attn.prefill"):
        attn = layer.self_attn
        keys = depth + rows
        q = _randn(gen, weight, 1, attn.num_heads, rows, attn.head_dim)  # (B, Hq, T, D)
        k, v = (_randn(gen, weight, 1, attn.num_kv_heads, keys, attn.head_dim) for _ in range(2))  # (B, Hkv, S, D)
        mask = causal(rows, keys, weight.device) if rows > 1 else None
        return [(q, k, v, mask)]
    if seam == "lm_head":
        return [(hidden[0], model.lm_head.weight)]
    shapes = {tuple(m.weight.shape): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return [(_randn(gen, weight, rows, w.shape[1]), w) for w in shapes.values()]


def output(seam: str, args: Inputs, poison: bool = True) -> torch.Tensor:
    """An output buffer of the stock op's result shape and dtype; poisoned (NaN, or the largest value, everywhere)
    so that an element a kernel leaves unwritten shows, or left empty (the model's own calls)."""
    like = {"norm": lambda: args[0], "gate_up": lambda: args[0].new_empty(*args[0].shape[:-1], args[1].shape[0]),
            "attn.decode": lambda: args[0], "attn.prefill": lambda: args[0],
            "lm_head": lambda: args[0].new_empty(args[0].shape[0], args[1].shape[0]),
            "linear.gemv": lambda: args[0].new_empty(args[0].shape[0], args[1].shape[0])}[seam]()
    if not poison:
        return torch.empty_like(like)
    return torch.full_like(like, float("nan") if like.dtype.is_floating_point else torch.iinfo(like.dtype).max)
