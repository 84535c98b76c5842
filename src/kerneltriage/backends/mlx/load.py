"""Build an MLX Model from a Checkpoint: stored tensors dequantized to the run dtype, or random weights for
presets. The stock model holds plain (dequantized) weights, as the torch backend's does; the `quantized` lever
keeps GGUF blocks instead (`quant.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from kerneltriage.backends.mlx import device as devices
from kerneltriage.backends.mlx.dequant import dequantize
from kerneltriage.backends.mlx.models import Model, model_class
from kerneltriage.backends.mlx.models.llama import LOCAL_ROPE, ROPE, ROPES
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.presets import PRESET_SEED
from kerneltriage.engine.rope import rope_frequencies

INIT_STD = 0.02


def build_runner(checkpoint: Checkpoint, device: str, dtype: str, evaluate: bool = True) -> Runner:
    """A stock runner: the checkpoint's weights, dequantized, on `device` in `dtype`, no levers. MLX runs on its
    default device, so that is set here (one process runs one MLX device). `evaluate`: load_model."""
    mx.set_default_device(devices.mx_device(device))
    model = load_model(checkpoint, getattr(mx, dtype), evaluate)
    return Runner(model, checkpoint, device, devices.device_type(device), dtype)


def load_model(checkpoint: Checkpoint, dtype: mx.Dtype, evaluate: bool = True) -> Model:
    """A ready Model in `dtype` (norm weights too), weights tied where the config says so, RoPE frequencies in
    float32; evaluated, unless `evaluate` is off: then its weights are lazy graphs, and a lever that replaces
    modules before anything evaluates them (`quantized`) keeps their dequantized values from ever being made."""
    config = checkpoint.config
    model = model_class(config.arch)(config)
    weights = _random(model, dtype) if config.random_weights else _from_checkpoint(model, checkpoint, dtype)
    freq_factors = checkpoint.tensors.get("rope_freqs")
    factors = None if freq_factors is None else np.array(dequantize(freq_factors, mx.float32))
    weights[ROPE] = mx.array(rope_frequencies(config, factors))
    if config.rope_local_theta is not None:  # sliding layers' own base, unscaled (transformers scales global ones)
        weights[LOCAL_ROPE] = mx.array(rope_frequencies(config.replace(rope_theta=config.rope_local_theta,
                                                                       rope_scaling=None)))
    _fill(model, weights)
    if evaluate:
        mx.eval(model.parameters())
    return model


def stock_copy(model: Model, dtype: mx.Dtype | None = None) -> Model:
    """A stock Model over `model`'s weights (in `dtype`, cast exactly upward when it differs): none of the levers
    applied to `model` (packed or quantized projections, attention functions, compiled steps) come along. The
    stock weights are shared, not copied: MLX arrays are values that no lever writes to."""
    copy = model_class(model.config.arch)(model.config)
    weights = stock_weights(model)
    if dtype is not None:
        weights = {name: value if name in ROPES else value.astype(dtype) for name, value in weights.items()}
    _fill(copy, weights)
    return copy


@dataclass(frozen=True)
class StockWeights:
    """The stock parameters of a model whose modules a lever replaced (`Model.stock`): what `stock_copy` uses.
    Each is an array, or a function that makes it on demand (a fresh lazy graph per copy, so a weight a lever
    stopped holding, such as a dequantized matrix `quantized` keeps as blocks, is not held for copies' sake).
    (A plain object: an MLX Module would take a dict attribute for a tree of parameters.)"""

    weights: dict[str, mx.array | Callable[[], mx.array]]


def stock_weights(model: Model) -> dict[str, mx.array]:
    """The stock parameters of `model` by path, the RoPE frequencies included; the originals a lever kept where it
    replaced modules (`model.stock`), else the parameters a stock skeleton has."""
    kept = getattr(model, "stock", None)
    if kept is not None:
        return {name: value() if callable(value) else value for name, value in kept.weights.items()}
    names = dict(tree_flatten(model_class(model.config.arch)(model.config).parameters()))
    current = dict(tree_flatten(model.parameters()))
    return {name: current[name] for name in names}


def keep_stock_weights(model: Model, made: dict[str, Callable[[], mx.array]] | None = None) -> None:
    """Record the stock parameters before a lever replaces modules (once: the first lever's view is the stock one);
    `made`: the ones to make on demand instead of holding."""
    if getattr(model, "stock", None) is None:
        model.stock = StockWeights(stock_weights(model) | (made or {}))


def _fill(model: Model, weights: dict[str, mx.array]) -> None:
    """Every parameter from `weights`; a tied output head takes the embedding's array."""
    if model.config.tie_embeddings:
        weights = weights | {"lm_head.weight": weights["embed_tokens.weight"]}
    model.load_weights(list(weights.items()), strict=True)


def _expected(model: Model) -> dict[str, tuple[int, ...]]:
    """Every parameter path the checkpoint must fill, with its shape (the tied output head excluded)."""
    shapes = {name: tuple(value.shape) for name, value in tree_flatten(model.parameters()) if name not in ROPES}
    if model.config.tie_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def _from_checkpoint(model: Model, checkpoint: Checkpoint, dtype: mx.Dtype) -> dict[str, mx.array]:
    return {name: dequantize(raw, dtype) for name, raw in checkpoint.by_parameter(_expected(model)).items()}


def _random(model: Model, dtype: mx.Dtype) -> dict[str, mx.array]:
    """Deterministic N(0, 0.02) weights (norms at 1, biases at 0), generated on the device itself."""
    key, weights = mx.random.key(PRESET_SEED), {}
    for name, shape in _expected(model).items():
        if name.endswith("norm.weight"):  # scales by 1 (Gemma's: by 1 + w)
            weights[name] = mx.full(shape, 1.0 - model.config.architecture.norm_offset, dtype=dtype)
        elif name.endswith(".bias"):
            weights[name] = mx.zeros(shape, dtype=dtype)
        else:
            key, sub = mx.random.split(key)
            weights[name] = INIT_STD * mx.random.normal(shape, dtype=dtype, key=sub)  # no float32 copy of a bf16 model
    return weights
