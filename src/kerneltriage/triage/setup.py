"""Stage 0 of triage: the device's ceilings, the model's bytes and FLOPs, the roofline floors of the
workload, and the measured prefill and decode (through the bench harness), as % of roofline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kerneltriage.bench.workloads import Test, tokens_for
from kerneltriage.core import roofline
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.sampling import SamplingParams

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
    lever_pairs: int  # the most interleaved pairs of a climb's A/A or A/B block (at least core.verdict.MIN_PAIRS)
    lever_tokens: int  # decode tokens per lever sample, at most (a ratio needs fewer than the setup's number)
    lever_prompt: int  # prompt tokens per prefill lever sample, at most
    census_prompt: int  # prompt tokens of the op census's prefill
    census_tokens: int  # decode tokens under the op census
    context_depth: int  # decode's cost of context is timed from this depth against depth 0
    climb_seconds: dict[str, float] = field(default_factory=dict)  # --budget → seconds the climb may take …
    climb_seconds_per_gb: float = 0.0  # … plus this many per GB of weights (a bigger model's judgements cost more)

    def climb_limit(self, budget: str, weight_bytes: float) -> float:
        """Seconds the climb may take under `budget` for a model of `weight_bytes`."""
        return self.climb_seconds[budget] + self.climb_seconds_per_gb * weight_bytes / 1e9


# A climb's blocks are sized by the configuration's own speed (triage/trials.py): an eager decode sample on the H200
# is ~0.35 s and bimodal, a graphed one ~10 ms, so the most pairs (24) are reached only where they are cheap. The
# quick climb's seconds keep `triage` of the default model under 2 minutes on an H200 (an 8B under 3) and under 5 on
# 2 CPU cores; the setup's one CUDA repeat of the workload (pp512 + an eager tg128 is ~3.3 s a sample on the H200)
# describes the start, the climb's own A/Bs judge the levers.
BUDGETS = {
    "cuda": Budget(repeats=1, warmups=1, profile_steps=8, lever_pairs=24, lever_tokens=16, lever_prompt=4096,
                   census_prompt=16, census_tokens=4, context_depth=2048,
                   climb_seconds={"quick": 85.0, "full": 900.0}, climb_seconds_per_gb=2.5),
    "cpu": Budget(repeats=1, warmups=0, profile_steps=4, lever_pairs=12, lever_tokens=8, lever_prompt=128,
                  census_prompt=16, census_tokens=2, context_depth=512,
                  climb_seconds={"quick": 150.0, "full": 1800.0}),
}


def budget_for(device_type: str) -> Budget:
    """The budget of this device type."""
    return BUDGETS["cuda" if device_type == "cuda" else "cpu"]


def warm_up(runner: Runner) -> None:
    """A short prefill and two decode steps, untimed."""
    prompt = [i % runner.config.vocab_size for i in range(WARMUP_PROMPT)]
    runner.reset_cache(WARMUP_PROMPT + WARMUP_STEPS)
    logits = runner.prefill(prompt, 0)
    list(runner.loop(logits, WARMUP_PROMPT, WARMUP_STEPS, runner.sampler(SamplingParams(), prompt)))


def first_run_differs(runner: Runner) -> bool:
    """A full-size warm-up is needed before the workload's samples: some lever captures or compiles a step on its
    first use at a new shape (a step or loop lever, or one with a warm-up in the table). Otherwise `warm_up`'s short
    run has done the lazy inits (an eager tg128 on the H200 is ~3.3 s: a warm-up of it is worth skipping)."""
    return any(s.lever.stage != "model" or s.lever.warmup_seconds(runner.backend) > 0
               for s in runner.run_config.levers) or runner.speculation is not None


def measure_setup(backend: Backend, runner: Runner, workload: Workload, budget: Budget
                  ) -> tuple[dict[str, Any], list]:
    """Ceilings, model costs, floors and the measured prefill and decode; the harness's TestResults."""
    from kerneltriage.bench.harness import Settings, run_test

    ceilings = backend.ceilings(str(runner.device), runner.dtype)
    warm_up(runner)
    settings = Settings(budget.repeats, budget.warmups if first_run_differs(runner) else 0)
    results = [run_test(runner, test, settings) for test in (workload.prefill_test, workload.decode_test)]
    setup = {"device": ceilings.device or str(runner.device), "dtype": runner.dtype,
             "ceilings": asdict(ceilings), "model": model_costs(runner.config, runner.dtype_bytes, workload)}
    for result in results:
        setup[result.test.phase] = phase_numbers(result, runner.config, runner.dtype_bytes, ceilings)
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
