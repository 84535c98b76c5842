"""Per-op checks at the model's real shapes on MLX: a levered model's op at a seam against the stock op in float32
(the torch backend's `seams.py`, on MLX arrays).

For each seam a lever replaces, fresh random inputs of the model's own shapes (a decode row and a short block of
rows) go through the levered model's op and through a stock copy's, in the run dtype and in float32; the levered
op's error and stock's, each relative to the float32 output's largest magnitude, are what `ab` compares.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx

from kerneltriage.backends.mlx.cache import Positions
from kerneltriage.backends.mlx.load import stock_copy
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.runner import Runner

BLOCK_ROWS = 16  # the block of rows besides the decode row: a short prompt, a verify
KEYS = 64  # cached positions a decode row attends over
SEED = 0


def _randn(model: Model, key: mx.array, *shape: int) -> mx.array:
    return mx.random.normal(shape, key=key).astype(model.norm.weight.dtype)


def _hidden(model: Model, rows: int, key: mx.array) -> tuple[mx.array]:
    return (_randn(model, key, 1, rows, model.config.hidden_size),)


def _attention_inputs(model: Model, rows: int, key: mx.array, decode: bool) -> tuple[Any, ...]:
    config, keys = model.config, KEYS if decode else rows
    q_rows = 1 if decode else rows
    kq, kk, kv = mx.random.split(key, 3)
    q = _randn(model, kq, 1, config.num_heads, q_rows, config.head_dim)  # (B, H, T, D)
    k = _randn(model, kk, 1, config.num_kv_heads, keys, config.head_dim)  # (B, Hkv, S, D)
    v = _randn(model, kv, 1, config.num_kv_heads, keys, config.head_dim)
    start = keys - q_rows
    return q, k, v, Positions(start, mx.arange(start, keys), None)


def _cat(out: Any) -> mx.array:
    return mx.concatenate(out, axis=-1) if isinstance(out, tuple) else out


# seam → (inputs at the model's shapes for `rows`, the op of a given model)
SEAM_OPS: dict[str, tuple[Callable[..., tuple], Callable[[Model, tuple], mx.array]]] = {
    "norm": (_hidden, lambda m, a: m.layers[0].input_layernorm(*a)),
    "qkv": (_hidden, lambda m, a: _cat(m.layers[0].self_attn.qkv(*a))),
    "o_proj": (lambda m, r, k: (_randn(m, k, 1, r, m.config.q_size),), lambda m, a: m.layers[0].self_attn.o_proj(*a)),
    "gate_up": (_hidden, lambda m, a: _cat(m.layers[0].mlp.gate_up(*a))),
    "down": (lambda m, r, k: (_randn(m, k, 1, r, m.config.intermediate_size),),
             lambda m, a: m.layers[0].mlp.down_proj(*a)),
    "attn.decode": (lambda m, r, k: _attention_inputs(m, r, k, True), lambda m, a: m.attention(*a)),
    "attn.prefill": (lambda m, r, k: _attention_inputs(m, r, k, False), lambda m, a: m.attention(*a)),
    "lm_head": (lambda m, r, k: (_hidden(m, r, k)[0][0],), lambda m, a: m.logits(*a)),
}


def _relative(out: mx.array, reference: mx.array) -> float:
    return (mx.abs(out.astype(mx.float32) - reference).max() / mx.maximum(mx.abs(reference).max(), 1e-30)).item()


def _float32(args: tuple) -> tuple:
    return tuple(a.astype(mx.float32) if isinstance(a, mx.array) else a for a in args)


def seam_errors(runner: Runner, seams: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """seam → (the levered op's error, the stock op's error) against stock in float32, worst over the rows."""
    model = runner.model
    stock, reference = stock_copy(model), stock_copy(model, mx.float32)
    errors = {}
    for seam in (s for s in seams if s in SEAM_OPS):
        make, op = SEAM_OPS[seam]
        worst = [0.0, 0.0]
        for rows in (1, BLOCK_ROWS):
            args = make(model, rows, mx.random.key(SEED + rows))
            ref = op(reference, _float32(args)).astype(mx.float32)
            worst = [max(worst[0], _relative(op(model, args), ref)), max(worst[1], _relative(op(stock, args), ref))]
        errors[seam] = (worst[0], worst[1])
    return errors
