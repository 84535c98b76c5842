"""`compile=blocks` on MLX: each layer's fixed-shape parts of a one-token decode step through `mx.compile`, the cache
write and attention between them eager.

`compile=default` traces the whole step, which fixes the keys' shape: it attends over a window of a static cache
under a mask, and a mask keeps MLX's CUDA attention off its fused kernels (`kernel_rules.cuda_sdpa`). Around
attention, though, a decode step's shapes never change: the norm, the q/k/v projection and RoPE before it (the
position an array argument), the output projection, the residuals and the MLP after it. Those two parts of each
layer are traced once and replayed: the graph of about ten ops each is built in C++ from the trace instead of op by
op in Python, where a host-bound step (a small model on a GPU) spends its time. The cache and attention stay as the
eager step has them (the filled prefix, no mask: the fused one-query kernel). Prompts and verifies (T > 1) run the
layers as they are. Llama-family layers (llama, qwen2, qwen3); counting follows `counting.py`, per layer call.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.models.llama import Step, TransformerBlock, apply_rope
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.core.errors import InputError

LEVER = "compile=blocks"


class _Traced:
    """One compiled part: counts the levers traced into it at each call (`counting.ran` reports to it)."""

    def __init__(self, runner: Runner, fn: Callable) -> None:
        self.runner, self.compiled, self.inside = runner, mx.compile(fn), set()

    def __call__(self, *args: mx.array) -> Any:
        counting.TRACING.append(self)
        try:
            out = self.compiled(*args)
        finally:
            counting.TRACING.pop()
        for lever in self.inside:
            self.runner.counters[lever] += 1
        return out


class CompiledBlock(TransformerBlock):
    """A llama-family layer whose one-token calls run as compiled `before` (x, position → q, k, v) and `after`
    (x, attention's output → the layer's output) around the eager cache write and attention. The lever turns each
    layer into one in place (its class swapped, its modules and arrays the same: every reader of `layers[i].self_attn`
    still finds them)."""

    parts: "_Parts"
    runner: Runner

    def __call__(self, x: mx.array, layer: int, step: Step) -> mx.array:
        if x.shape[:2] != (1, 1) or step.pos.mask is not None or step.pos.start is None:
            return super().__call__(x, layer, step)  # a prompt, a verify or a windowed step: the layer as it is
        self.runner.counters[LEVER] += 1
        q, k, v = self.parts.before(x, _position(step.pos.start), step.freqs)
        keys, values = step.cache.update(layer, step.pos, k, v)
        return self.parts.after(x, step.attention(q, keys, values, step.pos))


def _parts(block: TransformerBlock, runner: Runner) -> "_Parts":
    """The layer's two compiled parts, closing over its modules (a trace holds their arrays)."""
    attn = block.self_attn
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim

    def before(x: mx.array, position: mx.array, freqs: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        q, k, v = attn.qkv(block.input_layernorm(x))
        q = q.reshape(1, 1, heads, dim).transpose(0, 2, 1, 3)
        k = k.reshape(1, 1, kv_heads, dim).transpose(0, 2, 1, 3)
        v = v.reshape(1, 1, kv_heads, dim).transpose(0, 2, 1, 3)
        q, k = attn.qk_norm(q, k)
        return apply_rope(q, position, freqs), apply_rope(k, position, freqs), v

    def after(x: mx.array, out: mx.array) -> mx.array:
        h = x + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, 1, heads * dim))
        return h + block.mlp(block.post_attention_layernorm(h))

    return _Parts(_Traced(runner, before), _Traced(runner, after))


class _Parts:
    """The compiled parts, held outside the module tree (their traces hold the block's own arrays)."""

    def __init__(self, before: _Traced, after: _Traced) -> None:
        self.before, self.after = before, after


_POSITIONS: dict[int, mx.array] = {}


def _position(start: int) -> mx.array:
    """RoPE's position as the (1,) int32 array a trace takes, made once per position and shared by the layers."""
    if start not in _POSITIONS:
        _POSITIONS.clear()  # only the current step's is needed
        _POSITIONS[start] = mx.array([start], dtype=mx.int32)
    return _POSITIONS[start]


def compile_blocks(runner: Runner) -> None:
    """dispatch: each layer's fixed-shape parts of a decode step through mx.compile."""
    layers = runner.model.layers
    if not all(type(block) is TransformerBlock for block in layers):
        raise InputError(f"--levers {LEVER}: takes llama-family layers (llama, qwen2, qwen3), not "
                         f"{runner.config.arch}'s")
    for block in layers:
        parts = _parts(block, runner)  # closes over the block's modules as they are now
        block.__class__ = CompiledBlock
        object.__setattr__(block, "parts", parts)  # outside the module tree: not parameters
        object.__setattr__(block, "runner", runner)
