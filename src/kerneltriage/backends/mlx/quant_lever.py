"""The `quantized` lever on MLX: the checkpoint's Q4_0/Q4_1/Q8_0 weights kept as their GGUF blocks, multiplied by
`mx.quantized_matmul` (the embedding dequantized row by row on lookup), instead of dequantized once at load.

What it changes: the bytes each token reads (4.5 or 8.5 bits per weight instead of 16 or 32) and the kernel
(MLX's quantized matmul family instead of its dense GEMM/GEMV). What it keeps: the function. The blocks hold
exactly the values the stock model dequantized (`quant.py`: scale·q + bias rounds once, as llama.cpp does), so
only the order of the sums differs: the table declares it `reorders`, judged by ab's logit tolerance and the
per-op checks at the projection seams. In bfloat16 the float16 scales would be rounded (bf16 keeps 8 mantissa
bits of their 11): that would approximate, so it is refused there.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.load import keep_stock_weights
from kerneltriage.backends.mlx.quant import NATIVE_TYPES, QuantizedEmbedding, QuantizedLinear, dequantize, pack
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.names import param_name

LEVER = "quantized"


class CountedLinear(QuantizedLinear):
    """A QuantizedLinear that counts its calls in its runner's counters (the lever's proof of execution)."""

    def __call__(self, x: mx.array) -> mx.array:
        counting.ran(self.runner, LEVER)
        return super().__call__(x)


class CountedEmbedding(QuantizedEmbedding):
    def __call__(self, tokens: mx.array) -> mx.array:
        counting.ran(self.runner, LEVER)
        return super().__call__(tokens)


def _owner(model: object, path: str) -> tuple[object, str]:
    """The module holding the parameter at `path` ("layers.3.mlp.up_proj.weight") and its own name in its parent:
    (parent, "up_proj")."""
    *parents, name, _ = path.split(".")
    node = model
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    return node, name


def _check(runner: Runner, native: dict) -> None:
    if runner.dtype == "bfloat16":
        raise InputError(f"--levers {LEVER}: the GGUF's float16 scales would be rounded in bfloat16; "
                         "run it with --dtype float16 or float32")
    if not native:
        raise InputError(f"--levers {LEVER}: {runner.checkpoint.source} holds no {', '.join(NATIVE_TYPES)} "
                         "weights to keep quantized (presets and float checkpoints have none)")


def quantized(runner: Runner, value: str | None = None) -> None:
    """delete: every Q4_0/Q4_1/Q8_0 weight of the checkpoint kept as its blocks (others stay dequantized); the tied
    output head multiplies by the embedding's own blocks."""
    arch = runner.config.arch
    native = {name: raw for name, raw in runner.checkpoint.tensors.items()
              if raw.qtype in NATIVE_TYPES and param_name(name, arch) is not None}
    _check(runner, native)
    model, blocks = runner.model, {param_name(name, arch): pack(raw) for name, raw in native.items()}
    # the stock (dequantized) weights are made again from the blocks for a copy, never held beside them
    made = {path: functools.partial(dequantize, packed, runner.mx_dtype) for path, packed in blocks.items()}
    if model.config.tie_embeddings and "embed_tokens.weight" in made:
        made["lm_head.weight"] = made["embed_tokens.weight"]
    keep_stock_weights(model, made)
    for path, packed in blocks.items():
        parent, name = _owner(model, path)
        cls = CountedEmbedding if name == "embed_tokens" else CountedLinear
        module = cls.of(packed, runner.mx_dtype, parent[name].get("bias"))
        module.runner = runner
        parent[name] = module
    if model.config.tie_embeddings and isinstance(model.embed_tokens, QuantizedEmbedding):
        embed = model.embed_tokens
        model.lm_head = CountedLinear(embed.weight, embed.scales, embed.biases, embed.bits)  # the same arrays
        model.lm_head.runner = runner
    mx.eval(model.parameters())
