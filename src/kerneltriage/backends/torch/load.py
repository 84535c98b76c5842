"""Build a torch Model from a Checkpoint: stored tensors dequantized on the target device, or
random weights for presets, created there directly (no CPU round trip for 8B)."""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Mapping

import numpy as np
import torch
from torch import nn

from kerneltriage.backends.torch.dequant import dequantize
from kerneltriage.backends.torch.device import check_fits
from kerneltriage.backends.torch.models import Model, model_class
from kerneltriage.backends.torch.models.gemma3 import RMSNorm as GemmaRMSNorm
from kerneltriage.backends.torch.models.llama import RMSNorm
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.presets import PRESET_SEED
from kerneltriage.engine.rope import rope_inv_freq
from kerneltriage.engine.validate import check_tensors

INIT_STD = 0.02


def build_runner(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype,
                 unfilled: Mapping[str, RawTensor] = MappingProxyType({})) -> Runner:
    """A stock runner: the checkpoint's weights on `device` in `dtype`, no levers (`unfilled`: load_model)."""
    return Runner(load_model(checkpoint, device, dtype, unfilled), checkpoint, device, dtype)


def load_model(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype,
               unfilled: Mapping[str, RawTensor] = MappingProxyType({})) -> Model:
    """A ready Model on `device` in `dtype` (norm weights too), weights tied where the config says so. The
    parameters named in `unfilled` are allocated but not filled: a lever applied at once replaces them with the
    stored tensors given (quantized's `kept_as_blocks`), whose bytes the fit check counts instead."""
    config = checkpoint.config
    validate_before_allocating(checkpoint, device, dtype, unfilled)
    model = _skeleton(config, device, dtype, unfilled)
    if config.random_weights:
        _fill_random(model, device)
    else:
        _fill_from_checkpoint(model, checkpoint, device, dtype, unfilled)
    freq_factors = checkpoint.tensors.get("rope_freqs")
    factors = None if freq_factors is None else dequantize(freq_factors, device, torch.float32).cpu().numpy()
    model.inv_freq.copy_(torch.from_numpy(rope_inv_freq(config, factors)))
    if config.rope_local_theta is not None:  # sliding layers' own base, unscaled (transformers scales global ones)
        local = config.replace(rope_theta=config.rope_local_theta, rope_scaling=None)
        model.inv_freq_local.copy_(torch.from_numpy(rope_inv_freq(local)))
    return model.eval().requires_grad_(False)


def validate_before_allocating(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype,
                               unfilled: Mapping[str, RawTensor] = MappingProxyType({})) -> None:
    """Nothing is built for sizes that disagree with the tensors present, or for a model that cannot fit on
    the device (engine/validate.py, device.check_fits; what stays as blocks counted as its blocks): both fail in one
    line instead of an OOM or a hang."""
    if not checkpoint.config.random_weights:
        shapes = {name: raw.shape for name, raw in checkpoint.tensors.items()}
        check_tensors(checkpoint.source, checkpoint.config, shapes)
    saved = sum(math.prod(raw.shape) * dtype.itemsize - np.asarray(raw.data).nbytes for raw in unfilled.values())
    check_fits(checkpoint.config, device, dtype, saved)


def stock_copy(model: Model, dtype: torch.dtype | None = None, layers: int | None = None) -> Model:
    """A stock Model with a copy of `model`'s weights, made on its device (in `dtype`: exact upcasts; default, its
    own): none of the levers applied to `model` (packed projections, replaced norms, attention functions, a runner's
    graphs) come along. With `layers`, only the first that many layers (a per-op check reads layer 0: an 8B's
    float32 copy is 32 GB, one layer of it 0.9)."""
    weight = model.embed_tokens.weight
    config = model.config if layers is None else dataclasses.replace(model.config, num_layers=layers)
    copy = _skeleton(config, weight.device, dtype or weight.dtype)
    source = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, target in copy.named_parameters(remove_duplicate=False):
            target.copy_(source[name] if name in source else _stored_weight(model, name, target.dtype))
        copy.inv_freq.copy_(model.inv_freq)
        if hasattr(model, "inv_freq_local"):
            copy.inv_freq_local.copy_(model.inv_freq_local)
    return copy.eval().requires_grad_(False)


def _stored_weight(model: Model, name: str, dtype: torch.dtype) -> torch.Tensor:
    """A weight that is no parameter of `model`: a projection the `quantized` lever keeps as blocks (its
    dequantized values in `dtype`: in float32 exactly the values its GEMV sums)."""
    return model.get_submodule(name.removesuffix(".weight")).stock_weight(dtype)


def _skeleton(config: ModelConfig, device: torch.device, dtype: torch.dtype,
              unfilled: Mapping[str, RawTensor] = MappingProxyType({})) -> Model:
    """An unfilled Model on `device`: parameters allocated in `dtype` only (cast while still on meta, so no
    float32 copy ever exists on the device), tied where the config says so, RoPE frequencies kept in float32 (in
    bf16 they are off by 0.4%: 8 rad of angle at position 2048). The parameters named in `unfilled` get no memory
    at all (empty placeholders, until the lever that keeps them as blocks replaces their modules)."""
    model = model_class(config.arch)(config, device="meta").to(dtype)
    for name in unfilled:
        module = model.get_submodule(name.removesuffix(".weight"))
        module.weight = nn.Parameter(torch.empty(0, dtype=dtype, device="meta"), requires_grad=False)
    model.tie_weights()
    model = model.to_empty(device=device)
    model.tie_weights()
    model.inv_freq = torch.empty(config.head_dim // 2, dtype=torch.float32, device=device)
    if hasattr(model, "inv_freq_local"):
        model.inv_freq_local = torch.empty(config.head_dim // 2, dtype=torch.float32, device=device)
    return model


def _fill_from_checkpoint(model: Model, checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype,
                          unfilled: Mapping[str, RawTensor]) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    expected = {name: tuple(unfilled[name].shape) if name in unfilled else tuple(param.shape)
                for name, param in params.items() if name != "lm_head.weight" or not model.config.tie_embeddings}
    with torch.no_grad():
        for name, raw in checkpoint.by_parameter(expected).items():
            if name not in unfilled:
                params[name].copy_(dequantize(raw, device, dtype))


def _fill_random(model: Model, device: torch.device) -> None:
    """Deterministic N(0, 0.02) weights (norms at 1, biases at 0), generated on the device itself."""
    generator = torch.Generator(device=device)
    generator.manual_seed(PRESET_SEED)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, INIT_STD, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, (RMSNorm, GemmaRMSNorm)):  # scales by 1 (Gemma's: by 1 + w)
                module.weight.fill_(1.0 - model.config.architecture.norm_offset)

