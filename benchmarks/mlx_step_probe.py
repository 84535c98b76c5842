"""One decode step of kerneltriage's MLX runner beside mlx-lm's on the same blocks: the ops in its graph (by
primitive), the host time to build it, when `mx.async_eval` hands control back, and the wait for the token after
it, interleaved step by step. On the CPU MLX lowers its fast ops (rms_norm, rope, SDPA) to composed ops when the
graph is built, so the counts there are of composed ops; on a GPU each is one primitive.

    PYTHONPATH=src:tests python benchmarks/mlx_step_probe.py [default|tiny] [levers] [steps]

A diagnostic, not a measurement of record (bench/ keeps those): medians of interleaved steps after a warm-up.
"""

from __future__ import annotations

import io
import re
import statistics
import sys
import time
from collections import Counter

import mlx.core as mx


def op_counts(*outputs: mx.array) -> Counter:
    """Primitives in the unevaluated graph behind `outputs` (MLX's own dot export, one rectangle per primitive)."""
    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return Counter(re.findall(r'label ="([^"]+)", shape=rectangle', dot.getvalue()))


def checkpoint_of(name: str):  # noqa: ANN201
    if name == "tiny":
        from mlx_helpers import quantized_checkpoint

        return quantized_checkpoint("llama", num_layers=8, max_context=512)
    from kerneltriage.engine.sources import load_checkpoint

    return load_checkpoint()


class Ours:
    def __init__(self, runner, prompt: list[int]) -> None:  # noqa: ANN001
        self.runner, self.position = runner, len(prompt)
        runner.reset_cache(len(prompt) + 512)
        self.token = mx.argmax(runner.prefill(prompt, 0), axis=-1).astype(mx.int32)
        mx.eval(self.token)

    def build(self) -> mx.array:
        logits = self.runner.decode_step(self.runner.model, self.token.reshape(1, 1), self.position)
        self.position += 1
        self.token = mx.argmax(logits, axis=-1).astype(mx.int32)
        return self.token


class Theirs:
    def __init__(self, model, prompt: list[int]) -> None:  # noqa: ANN001
        from mlx_lm.models.cache import make_prompt_cache

        self.model, self.cache = model, make_prompt_cache(model)
        self.token = mx.argmax(model(mx.array([prompt]), cache=self.cache)[:, -1, :], axis=-1)
        mx.eval(self.token)

    def build(self) -> mx.array:
        logits = self.model(self.token[None], cache=self.cache)[:, -1, :]
        self.token = mx.argmax(logits, axis=-1)
        return self.token


PHASES = ("build", "async_eval returns", "wait for the token")


def timed_step(engine) -> tuple[float, float, float]:  # noqa: ANN001
    """Seconds to build the step's graph, for `mx.async_eval` to return, then for the token to be readable."""
    start = time.perf_counter()
    out = engine.build()
    built = time.perf_counter()
    mx.async_eval(out)
    queued = time.perf_counter()
    out.item()
    return built - start, queued - built, time.perf_counter() - queued


def main(name: str = "default", levers: str = "quantized", steps: int = 20) -> None:
    from kerneltriage.backends.mlx.backend import BACKEND
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.peers.mlxlm import load_gguf_model

    checkpoint = checkpoint_of(name)
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cpu", "float32")
    prompt = [(7 * i + 3) % checkpoint.config.vocab_size for i in range(64)]
    engines = {"ours": Ours(runner, prompt), "mlx-lm": Theirs(load_gguf_model(checkpoint, mx.float32), prompt)}
    for label, engine in engines.items():
        counts = op_counts(engine.build())
        mx.eval(engine.token)
        print(f"{label}: {sum(counts.values())} ops  {dict(counts.most_common())}")
    times = {label: [] for label in engines}
    for _ in range(int(steps)):
        for label, engine in engines.items():
            times[label].append(timed_step(engine))
    for label, samples in times.items():
        medians = [statistics.median(s[i] for s in samples) * 1e3 for i in range(len(PHASES))]
        phases = "  ".join(f"{name} {ms:.2f} ms" for name, ms in zip(PHASES, medians))
        print(f"{label}: {phases}  step {sum(medians):.2f} ms")


if __name__ == "__main__":
    main(*sys.argv[1:])
