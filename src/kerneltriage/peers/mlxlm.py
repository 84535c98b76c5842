"""The mlx-lm peer: mlx-lm's own model classes and its own token loop (`generate_step`, which pipelines with
`mx.async_eval`), on the same weights and tokens as kerneltriage.

What it needs to load them: an HF safetensors folder goes through mlx-lm's own loader (`mlx_lm.load`). A GGUF it
cannot read: its model class is built from our config (`ModelArgs.from_dict`), and it gets the GGUF's weights as
MLX itself reads them (`mx.load` of a .gguf: Q4_0/Q4_1/Q8_0 kept as 32-value blocks, the same arrays our
`backends/mlx/quant.py` repacks), under HF names, llama's Q/K rows un-permuted (our reader's), the quantized
layers set up by `nn.quantize` with each tensor's own bits; other tensors dequantized. Scales and float tensors
are held in the runner's dtype, as kerneltriage's `--levers quantized` holds them, so both compute alike. A preset
has no weights to load; a GGUF with llama's `rope_freqs` factors has no mlx-lm spelling.

pp: one forward of N tokens over mlx-lm's cache holding the d-token prefix (trimmed back to it each sample), the
greedy token read. tg: `generate_step` for N + 1 tokens after the prefix, greedy; the first token is the prefill's.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from pathlib import Path
from typing import Any, Callable

from kerneltriage.bench.compare import NOT_INSTALLED, PeerRun
from kerneltriage.bench.harness import Sample
from kerneltriage.bench.workloads import Test, Tokens
from kerneltriage.engine.backend import Runner
from kerneltriage.engine.checkpoint import Checkpoint

NAME = "mlx-lm"


def hf_config(checkpoint: Checkpoint) -> dict[str, Any]:
    """Our ModelConfig as the HF config.json mlx-lm's ModelArgs read."""
    return checkpoint.config.to_hf()


def gguf_weights(checkpoint: Checkpoint, dtype: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """HF name → MLX array (a quantized tensor as weight/scales/biases), and the bits of each quantized layer."""
    from kerneltriage.backends.mlx.dequant import dequantize
    from kerneltriage.backends.mlx.quant import NATIVE_TYPES, pack
    from kerneltriage.engine.names import HF, from_internal

    weights, bits = {}, {}
    for internal, raw in checkpoint.tensors.items():
        name = from_internal(internal, HF, checkpoint.config.arch)
        if raw.qtype not in NATIVE_TYPES:
            weights[name] = dequantize(raw, dtype)
            continue
        packed, layer = pack(raw), name.removesuffix(".weight")
        weights |= {name: packed.weight, f"{layer}.scales": packed.scales.astype(dtype),
                    f"{layer}.biases": packed.biases.astype(dtype)}
        bits[layer] = packed.bits
    return weights, bits


def load_gguf_model(checkpoint: Checkpoint, dtype: Any) -> Any:
    """mlx-lm's model for the checkpoint's architecture over the GGUF's blocks, evaluated."""
    import mlx.core as mx
    import mlx.nn as nn

    # mlx-lm's model files are named after the HF model_type, each with a `Model` and its `ModelArgs`
    architecture = importlib.import_module(f"mlx_lm.models.{checkpoint.config.architecture.hf_model_type}")
    model = architecture.Model(architecture.ModelArgs.from_dict(hf_config(checkpoint)))
    weights, bits = gguf_weights(checkpoint, dtype)
    nn.quantize(model, class_predicate=lambda path, module: (
        {"group_size": 32, "bits": bits[path]} if path in bits else False))
    model.load_weights(list(model.sanitize(weights).items()), strict=True)
    mx.eval(model.parameters())
    return model


def why_not(checkpoint: Checkpoint) -> str | None:
    """Why mlx-lm cannot run these weights here, or None."""
    if importlib.util.find_spec("mlx_lm") is None:
        return NOT_INSTALLED
    if checkpoint.config.random_weights:
        return "a preset has no weights for mlx-lm to load"
    if "rope_freqs" in checkpoint.tensors:
        return "the GGUF's rope_freqs factors have no mlx-lm spelling"
    return None


def open_mlx_lm(runner: Runner) -> PeerRun:
    """mlx-lm loaded on the runner's weights, ready to be interleaved; or why it cannot run."""
    why = why_not(runner.checkpoint)
    if why is not None:
        return PeerRun(NAME, unavailable=why)
    import mlx.core as mx

    source = Path(runner.checkpoint.source)
    dtype = getattr(mx, runner.dtype)
    if source.is_dir():
        from mlx_lm import load

        model, _ = load(str(source))
        note = "mlx_lm.load of the HF folder"
    else:
        model = load_gguf_model(runner.checkpoint, dtype)
        note = (f"mlx-lm's {runner.config.arch} model over the GGUF's native blocks (as mx.load reads them), "
                f"scales in {runner.dtype}, on MLX's {mx.default_device()}")
    return PeerRun(NAME, engine=MlxLmEngine(model), note=note)


class MlxLmEngine:
    """mlx-lm's model, cache and generate_step as the harness times them."""

    name = NAME
    params: dict = {}

    def __init__(self, model: Any) -> None:
        self.model = model

    def supports(self, test: Test) -> str | None:
        return None

    def prepare(self, test: Test, tokens: Tokens) -> Callable[[], Sample]:
        return self._prefill_fn(tokens) if test.kind == "pp" else self._decode_fn(tokens, test.n)

    def _prefill_fn(self, tokens: Tokens) -> Callable[[], Sample]:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        cache = make_prompt_cache(self.model)
        if tokens.prefix:
            mx.eval(self.model(mx.array([list(tokens.prefix)]), cache=cache))  # the depth, untimed

        def run_sample() -> Sample:
            trim_prompt_cache(cache, cache[0].offset - len(tokens.prefix))
            start = time.perf_counter()
            logits = self.model(mx.array([list(tokens.prompt)]), cache=cache)
            mx.argmax(logits[:, -1], axis=-1).item()  # the greedy token read: everything before it has run
            seconds = time.perf_counter() - start
            return Sample(seconds, seconds)

        return run_sample

    def _decode_fn(self, tokens: Tokens, count: int) -> Callable[[], Sample]:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        def run_sample() -> Sample:
            start = time.perf_counter()
            steps = generate_step(mx.array(list(tokens.prefix)), self.model, max_tokens=count + 1,
                                  sampler=lambda logits: mx.argmax(logits, axis=-1),
                                  prompt_cache=make_prompt_cache(self.model))
            generated = [int(next(steps)[0])]
            first = time.perf_counter()
            generated += [int(token) for token, _ in steps]
            return Sample(time.perf_counter() - first, first - start, tuple(generated))

        return run_sample

    def start_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None  # MLX's allocator is shared with kerneltriage's MLX runner in this process: no reading of its own

    def close(self) -> None:
        self.model = None
