"""The MLX appliers of the lever table (`engine/levers.py`): one per lever name, applied to a Runner from outside
the model in the table's order, after checking that the lever runs on this backend, on this device and on this
model's seams. The projection levers live here; quantized weights in `quant_lever.py`, the CPU's row split across
streams in `cpu_streams.py`, attention's in
`attention_levers.py`, compile in `accelerate.py`, custom kernels in `kernel_lever.py`.
"""

from __future__ import annotations

import copy
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from kerneltriage.backends.mlx import (accelerate, attention_levers, counting, cpu_streams, kernel_lever, quant_lever,
                                       vocab_compact)
from kerneltriage.backends.mlx.load import keep_stock_weights
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.decoding import pipelined_loop
from kerneltriage.engine.levers import check_applies

Applier = Callable[[Runner, str | None], None]  # (runner, the setting's value)


def last_logits(runner: Runner, value: str | None = None) -> None:
    """delete: the prefill's output projection for the last prompt position only."""

    def prefill(model: nn.Module, tokens: mx.array, start: int) -> mx.array:
        runner.counters["last_logits"] += 1
        return model.logits(model.hidden(tokens, start)[:, -1])  # (1, hidden) → (1, V)

    runner.prefill_step = prefill


def one_sync(runner: Runner, value: str | None = None) -> None:
    """dispatch: one host readback per token, and step n+1 scheduled (`mx.async_eval`, in the sampler) before
    token n is read: the pipelining mlx-lm's generate_step does."""
    runner.use_loop(pipelined_loop)


def _stacked(parts: list[nn.Module]) -> nn.Module:
    """One module holding the arrays of `parts` stacked by rows, of the first part's class and settings: a Linear,
    or a QuantizedLinear of the blocks as they are (the same values, one matmul)."""
    module = copy.copy(parts[0])
    for name in ("weight", "scales", "biases", "bias"):
        if name in parts[0]:
            module[name] = mx.concatenate([p[name] for p in parts])
    return module


def _packed(runner: Runner, lever: str, module: nn.Module, names: tuple[str, ...]) -> Callable:
    """Replace the projections `names` of `module` by one stacked module (the originals go: their stock weights
    are kept for copies), and return the function that splits its output back."""
    parts = [module[name] for name in names]
    sizes = [p.weight.shape[0] for p in parts]
    splits = [sum(sizes[:i + 1]) for i in range(len(sizes) - 1)]  # where each part's rows end
    key = f"packed_{'_'.join(names)}"
    for name in names:
        module.pop(name)
    module[key] = _stacked(parts)

    def forward(x: mx.array) -> tuple[mx.array, ...]:
        counting.ran(runner, lever)
        return tuple(mx.split(module[key](x), splits, axis=-1))  # looked up each call: a later lever may wrap it

    return forward


def packed_qkv(runner: Runner, value: str | None = None) -> None:
    """dispatch: q, k and v from one matmul instead of three."""
    keep_stock_weights(runner.model)
    for layer in runner.model.layers:
        layer.self_attn.qkv = _packed(runner, "packed_qkv", layer.self_attn, ("q_proj", "k_proj", "v_proj"))


def packed_gate_up(runner: Runner, value: str | None = None) -> None:
    """dispatch: gate and up from one matmul instead of two."""
    keep_stock_weights(runner.model)
    for layer in runner.model.layers:
        layer.mlp.gate_up = _packed(runner, "packed_gate_up", layer.mlp, ("gate_proj", "up_proj"))


APPLIERS: dict[str, Applier] = {
    "quantized": quant_lever.quantized,
    "packed_qkv": packed_qkv, "packed_gate_up": packed_gate_up,
    "cpu_streams": cpu_streams.cpu_streams,
    "sdpa_unfused": lambda runner, value: attention_levers.sdpa_unfused(runner),
    "kernel": kernel_lever.install,
    "last_logits": last_logits,
    "compile": accelerate.compile_steps,
    "vocab_compact": vocab_compact.vocab_compact,
    "one_sync": one_sync,
}


def apply_config(runner: Runner, config: RunConfig) -> Runner:
    """Apply the configuration's levers in the table's order (the model's modules, then the steps, then the loop),
    then speculation (it wraps whatever verify step the levers installed); the runner remembers the configuration."""
    on = runner.run_config.levers + config.levers
    for setting in config.levers:
        check_applies(runner.place, setting, on)
    for setting in config.levers:
        APPLIERS[setting.name](runner, setting.value)
    runner.run_config = RunConfig(runner.run_config.levers + config.levers, runner.run_config.speculation)
    if config.speculation is not None:
        from kerneltriage.backends.mlx.speculative import install_speculation

        install_speculation(runner, config.speculation)
        runner.run_config = RunConfig(runner.run_config.levers, config.speculation)
    return runner
