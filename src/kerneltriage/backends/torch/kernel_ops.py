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
MATMUL = frozenset({"linear", "matmul", "mm", "addmm", "bmm", "baddbmm", "einsum"})
# The library call each stock op is made of (torch functions, by name): a candidate that calls one of them is calling
# the stock op (`stock-call`), whatever it wraps around it.
STOCK_CORE: dict[str, frozenset[str]] = {"norm": frozenset({"rms_norm"}), "gate_up": MATMUL,
                                         "attn.decode": frozenset({"scaled_dot_product_attention"}),
                                         "attn.prefill": frozenset({"scaled_dot_product_attention"}),
                                         "lm_head": MATMUL, "linear.gemv": MATMUL}
# Which inputs at each seam are activations (fresh every call in the model); the others are the model's weights.
ACTIVATIONS: dict[str, tuple[int, ...]] = {"norm": (0,), "gate_up": (0,), "attn.decode": (0, 1, 2),
                                           "attn.prefill": (0, 1, 2), "lm_head": (0,), "linear.gemv": (0,)}


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


def refill(seam: str, args: Inputs, gen: torch.Generator) -> Inputs:
    """New random values written into `args`' activations in place: same pointers, new contents."""
    for i in ACTIVATIONS[seam]:
        args[i].copy_(torch.randn(args[i].shape, generator=gen, device=args[i].device))
    return args


def work(seam: str, args: Inputs, out: torch.Tensor) -> tuple[float, float]:
    """(bytes one call must read and write, FLOPs it must compute): every input and the output once; 2 per
    multiply-add of the products (attention: QKᵀ and PV over every key)."""
    moved = sum(a.nbytes for a in args if torch.is_tensor(a)) + out.nbytes
    if seam in ("attn.decode", "attn.prefill"):
        q, k = args[0], args[1]
        return moved, 4.0 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
    if seam == "norm":
        return moved, 0.0
    rows = args[0].shape[:-1].numel()
    weights = sum(a.shape[0] * a.shape[1] for a in args[1:] if torch.is_tensor(a))
    return moved, 2.0 * rows * weights


FACTOR, FLOORS = 1.5, {torch.float32: 1e-5}  # a kernel's error ≤ max(1.5 × stock's own error, floor of the dtype)
DEFAULT_FLOOR = 1e-3


def floor(dtype: torch.dtype) -> float:
    """The error no kernel is asked to beat in `dtype`."""
    return FLOORS.get(dtype, DEFAULT_FLOOR)


def relative(out: torch.Tensor | None, reference: torch.Tensor) -> float:
    """max |out − reference| / max |reference| (an unwritten NaN, or no output at all, is infinitely far)."""
    if out is None:
        return float("inf")
    return ((out.float() - reference).abs().nan_to_num(float("inf")).max()
            / reference.abs().max().clamp_min(1e-30)).item()


def upcast(args: Inputs) -> Inputs:
    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def error_and_bound(seam: str, args: Inputs, out: torch.Tensor) -> tuple[float, float]:
    """`out`'s error against the stock op in float32 on `args`, and the bound it is held to."""
    stock = STOCK[seam]
    reference = stock(*upcast(args), out=output(seam, upcast(args)))
    base = stock(*args, out=output(seam, args))
    return relative(out, reference), max(FACTOR * relative(base, reference), floor(out.dtype))
