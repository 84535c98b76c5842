"""Stage 0 of triage: the device's ceilings, the model's bytes and FLOPs, the roofline floors of the
workload, and the measured prefill and decode (through the bench harness), as % of roofline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kerneltriage.bench.workloads import Test, tokens_for
from kerneltriage.core import roofline

WARMUP_PROMPT, WARMUP_STEPS = 8, 2  # a short untimed run first: allocations and lazy inits stay out


@dataclass(frozen=True)
class Workload:
    """pp `prompt` and tg `gen` at context depth `depth`, with the tokens every stage uses."""

    prompt: int
    gen: int
    depth: int

    @property
    def prefill_test(self) -> Test:
        return Test("pp", self.prompt, self.depth)

    @property
    def decode_test(self) -> Test:
        return Test("tg", self.gen, self.depth)

    def prefill_tokens(self, vocab_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prefix filled untimed, the prompt) of the prefill test."""
        tokens = tokens_for(self.prefill_test, vocab_size)
        return tokens.prefix, tokens.prompt

    def decode_prefix(self, vocab_size: int) -> tuple[int, ...]:
        return tokens_for(self.decode_test, vocab_size).prefix


@dataclass(frozen=True)
class Budget:
    """How much measuring each stage does on one device type."""

    repeats: int  # timed samples of the setup tests
    warmups: int  # untimed runs before them (and before each lever A/B)
    profile_steps: int  # decode tokens under the profiler
    lever_pairs: int  # interleaved A/B pairs per lever
    lever_tokens: int  # decode tokens per lever sample, at most (a ratio needs fewer than the setup's number)
    lever_prompt: int  # prompt tokens per prefill lever sample, at most
    census_prompt: int  # prompt tokens of the op census's prefill
    census_tokens: int  # decode tokens under the op census
    context_depth: int  # decode's cost of context is timed from this depth against depth 0


# The CPU budget keeps triage of the default model inside 5 minutes on 2 cores; CUDA's inside 60 s on an H200.
# On the H200 (2026-11-29) eager decode is host-bound at ~21 ms/token for both the default model and 8B, and
# triage took > 90 s with 3 setup repeats and 3 pairs of tg64 per lever; 2 repeats and 2 pairs of tg16 are
# predicted at ~45 s for the default model (GPU ratios are tight enough for 16 tokens).
BUDGETS = {"cuda": Budget(2, 1, 8, 2, 16, 4096, 16, 4, 2048), "cpu": Budget(1, 0, 4, 2, 8, 128, 16, 2, 512)}


def budget_for(device: Any) -> Budget:
    """The budget of this device's type."""
    return BUDGETS["cuda" if device.type == "cuda" else "cpu"]


def warm_up(runner: Any) -> None:
    """A short prefill and two decode steps, untimed."""
    import torch

    with torch.inference_mode():
        runner.reset_cache(WARMUP_PROMPT + WARMUP_STEPS)
        tokens = torch.arange(WARMUP_PROMPT, device=runner.device).view(1, -1) % runner.config.vocab_size
        logits = runner.prefill(runner.model, tokens, 0)
        list(runner.decode_loop(runner, logits, WARMUP_PROMPT, WARMUP_STEPS, _greedy(), None))


def _greedy() -> Any:
    from kerneltriage.engine.sampling import SamplingParams

    return SamplingParams()


def measure_setup(runner: Any, workload: Workload, budget: Budget) -> tuple[dict[str, Any], list]:
    """Ceilings, model costs, floors and the measured prefill and decode; the harness's TestResults."""
    from kerneltriage.backends.torch import ceilings as ceilings_mod
    from kerneltriage.bench.harness import Settings, run_test

    ceilings = ceilings_mod.get_ceilings(runner.device, runner.dtype)
    warm_up(runner)
    settings = Settings(budget.repeats, budget.warmups)
    results = [run_test(runner, test, settings) for test in (workload.prefill_test, workload.decode_test)]
    setup = {"device": ceilings.device or str(runner.device), "dtype": str(runner.dtype).removeprefix("torch."),
             "ceilings": asdict(ceilings), "model": model_costs(runner.config, runner.dtype.itemsize, workload)}
    for result in results:
        setup[result.test.phase] = phase_numbers(result, runner.config, runner.dtype.itemsize, ceilings)
    return setup, results


def model_costs(config: Any, dtype_bytes: int, workload: Workload) -> dict[str, Any]:
    """Parameters, weight bytes read per token, and the bytes/FLOPs of the workload's two tests."""
    weights = roofline.engine_weight_bytes(config, dtype_bytes)
    prefill = roofline.prefill_cost(config, workload.prompt, workload.depth, weights, dtype_bytes)
    decode = roofline.decode_cost(config, workload.gen, workload.decode_test.prefix_length, weights, dtype_bytes)
    return {"params": roofline.param_counts(config).total, "weight_bytes_per_token": weights,
            "prefill": asdict(prefill), "decode": asdict(decode)}


def phase_numbers(result: Any, config: Any, dtype_bytes: int, ceilings: roofline.Ceilings) -> dict[str, Any]:
    """Measured seconds per forward pass, rate, floor and % of roofline of one test."""
    from kerneltriage.bench.table import Traffic, floor_of

    test, m = result.test, result.timed
    floor = floor_of(test, config, Traffic(roofline.engine_weight_bytes(config, dtype_bytes), dtype_bytes), ceilings)
    per_sample = m.total_time / m.n
    passes = 1 if test.kind == "pp" else test.n
    return {"test": test.name, "rate": m.rate, "seconds_per_pass": m.median / passes,
            "floor_seconds_per_pass": floor.seconds / passes, "bound": floor.bound,
            "roofline_pct": roofline.percent_of_roofline(per_sample, floor.seconds),
            "first_token_seconds": None if result.first_token is None else result.first_token.median,
            "samples": list(m.samples)}
