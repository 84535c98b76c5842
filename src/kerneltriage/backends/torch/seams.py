"""Per-op checks at the model's real shapes: a levered model's op at a seam against the stock op in float32.

For each seam a lever replaces, fresh random inputs of the model's own shapes (a decode row and a short block
of rows) go through the levered model's op and through a stock copy's, in the run dtype and in float32; the
levered op's error and stock's, each relative to the float32 output's largest magnitude, are what `ab`
compares (a lever may round differently, not be less exact than stock).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from kerneltriage.backends.torch.cache import Positions
from kerneltriage.backends.torch.load import stock_copy
from kerneltriage.backends.torch.models import Model

BLOCK_ROWS = 16  # the block of rows besides the decode row: a short prompt, a verify
KEYS = 64  # cached positions a decode row attends over
SEED = 0


def _hidden(model: Model, rows: int, gen: torch.Generator) -> tuple[torch.Tensor]:
    weight = model.embed_tokens.weight
    return (torch.randn(1, rows, weight.shape[1], generator=gen, device=weight.device).to(weight.dtype),)


def _attention_inputs(model: Model, rows: int, gen: torch.Generator, decode: bool) -> tuple[Any, ...]:
    attn, weight = model.layers[0].self_attn, model.embed_tokens.weight
    keys = KEYS if decode else rows
    q_rows = 1 if decode else rows

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=weight.device).to(weight.dtype)

    q = randn(1, attn.num_heads, q_rows, attn.head_dim)  # (B, H, T, D)
    k, v = randn(1, attn.num_kv_heads, keys, attn.head_dim), randn(1, attn.num_kv_heads, keys, attn.head_dim)
    start = keys - q_rows
    return q, k, v, Positions(start, torch.arange(start, keys, device=weight.device), None)


def _logits_input(model: Model, rows: int, gen: torch.Generator) -> tuple[torch.Tensor]:
    return (_hidden(model, rows, gen)[0][0],)  # (T, hidden)


def _cat(out: Any) -> torch.Tensor:
    return torch.cat(out, dim=-1) if isinstance(out, tuple) else out


# seam → (inputs at the model's shapes for `rows`, the op of a given model)
SEAM_OPS: dict[str, tuple[Callable[..., tuple], Callable[[Model, tuple], torch.Tensor]]] = {
    "norm": (_hidden, lambda m, a: m.layers[0].input_layernorm(*a)),
    "qkv": (_hidden, lambda m, a: _cat(m.layers[0].self_attn.qkv(*a))),
    "gate_up": (_hidden, lambda m, a: _cat(m.layers[0].mlp.gate_up(*a))),
    "attn.decode": (lambda m, r, g: _attention_inputs(m, r, g, True), lambda m, a: m.attention(*a)),
    "attn.prefill": (lambda m, r, g: _attention_inputs(m, r, g, False), lambda m, a: m.attention(*a)),
    "lm_head": (_logits_input, lambda m, a: m.logits(*a)),
}


def _relative(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item()


@torch.inference_mode()
def seam_errors(model: Model, seams: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """seam → (the levered op's error, the stock op's error) against stock in float32, worst over the rows."""
    stock = stock_copy(model, layers=1)  # the ops read layer 0, the embedding and the head
    # float32 from the source (`quantized` holds its blocks' exact values, a bf16 stock copy their roundings): an
    # upcast of the bf16 copy charged each of its roundings to the lever (CPU ab: qkv 3.7e-3 against stock's 2.0e-3)
    reference = stock_copy(model, torch.float32, layers=1)
    errors = {}
    for seam in (s for s in seams if s in SEAM_OPS):
        make, op = SEAM_OPS[seam]
        worst = [0.0, 0.0]
        for rows in (1, BLOCK_ROWS):
            gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(SEED + rows)
            args = make(model, rows, gen)
            ref = op(reference, tuple(a.float() if torch.is_tensor(a) else a for a in args)).float()
            worst = [max(worst[0], _relative(op(model, args), ref)), max(worst[1], _relative(op(stock, args), ref))]
        errors[seam] = (worst[0], worst[1])
    return errors
