"""Time llama-bench tests: warm-ups apart, `repeats` device-synchronized samples, engines interleaved.

Every engine (kerneltriage's runner here, peers in peers.py) gets the same tokens; its warm-ups run
alone, then the timed samples of all engines alternate. What a sample is, for kerneltriage:

pp N @ d: the cache holds d prompt tokens (filled untimed, once); each sample trims it back to d and
  times `runner.prefill` of N tokens at position d between synchronized clocks. Time to first token adds
  reading the first (greedy) token.
tg N @ d: each sample prefills d tokens (1 at depth 0) and runs `runner.loop` — the token loop
  levers may replace — for N + 1 tokens: the first comes from the prefill's logits (time to first token),
  the N after it are N decode steps, timed from the first token on the host to the last. Rate = N / time.

A yielded token id is a host int, so the device work that made it has finished; the harness reads a
plain clock there. A synchronizing clock would also wait for work a pipelined loop has already queued for
the NEXT token and charge it to the wrong side (time to first token instead of decode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence

from kerneltriage.bench.workloads import WORKLOAD_SEED, Test, Tokens, tokens_for
from kerneltriage.engine.backend import Runner
from kerneltriage.core.environment import Snapshot, take_snapshot
from kerneltriage.core.measurement import Measurement, MeasurementSpec
from kerneltriage.engine.sampling import SamplingParams

ENGINE = "kerneltriage"
host_clock = time.perf_counter  # the plain host clock of the samples (a test puts a fake clock here)
DEFAULT_WARMUPS = 1
GREEDY = SamplingParams()
# (samples done, what is running): called after every warm-up and timed sample
Progress = Callable[[int, str], None]


class Sample(NamedTuple):
    """One timed run: seconds of the timed phase, seconds to the first token (None where the engine does
    not report it), tokens generated (tg)."""

    timed: float
    first_token: float | None
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Settings:
    """How many warm-ups and timed samples each test gets, and the workload seed."""

    repeats: int
    warmups: int = DEFAULT_WARMUPS
    seed: int = WORKLOAD_SEED

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmups < 0:
            raise ValueError(f"bench settings: repeats ≥ 1 and warm-ups ≥ 0, got {self.repeats}, {self.warmups}")


@dataclass(frozen=True)
class TestResult:
    """One engine on one test: the timed phase (prefill for pp, decode for tg), time to first token and
    peak memory (None where the engine does not report them), and the tokens of the first timed sample."""

    engine: str
    test: Test
    timed: Measurement
    first_token: Measurement | None
    peak_memory: int | None
    tokens: tuple[int, ...] = ()

    @property
    def measurements(self) -> tuple[Measurement, ...]:
        return (self.timed,) if self.first_token is None else (self.timed, self.first_token)


class Engine(Protocol):
    """Anything the harness can time: kerneltriage's runner, or a peer on the same weights."""

    name: str
    params: dict

    def supports(self, test: Test) -> str | None:
        """None when the engine runs `test`, else why it does not."""

    def prepare(self, test: Test, tokens: Tokens) -> Callable[[], Sample]:
        """Untimed setup for `test` (e.g. fill the cache to its depth); returns one timed sample's function."""

    def start_memory(self) -> None:
        """Mark the memory in use now: the warm-ups' peak is read against it."""

    def peak_memory(self) -> int | None:
        """Peak bytes during the warm-ups since `start_memory`: what the engine holds plus its transient peak
        (None where the engine cannot tell)."""

    def close(self) -> None:
        """Free what the engine holds."""


def run_interleaved(engines: Sequence[Engine], test: Test, tokens: Tokens, settings: Settings,
                    gpu: int | None, progress: Progress | None = None) -> list[TestResult]:
    """`test` on every engine, all fed `tokens`: each engine's warm-ups apart (its peak memory is read
    there), then the timed samples interleaved A B, B A, A B … so drift in the machine's load hits every
    engine alike and their ratio stays fair on a shared machine."""
    runs = [(e, e.prepare(test, tokens)) for e in engines]
    warm, peaks = {}, {}
    for engine, run_sample in runs:
        warm[engine.name], peaks[engine.name] = _warm_up(engine, run_sample, settings, progress, test)
    start = take_snapshot(gpu or 0)
    timed: dict[str, list[Sample]] = {e.name: [] for e in engines}
    for i in range(settings.repeats):
        shift = i % len(runs)
        for engine, run_sample in runs[shift:] + runs[:shift]:
            timed[engine.name].append(run_sample())
            _tell(progress, f"{engine.name} {test.name} sample {i + 1}/{settings.repeats}")
    end = take_snapshot(gpu or 0)
    return [build_result(e.name, test, warm[e.name], timed[e.name], (start, end), peaks[e.name], e.params)
            for e in engines]


def _warm_up(engine: Engine, run_sample: Callable[[], Sample], settings: Settings, progress: Progress | None,
             test: Test) -> tuple[list[Sample], int | None]:
    engine.start_memory()
    warm = []
    for i in range(settings.warmups):
        warm.append(run_sample())
        _tell(progress, f"{engine.name} {test.name} warm-up {i + 1}/{settings.warmups}")
    return warm, engine.peak_memory() if warm else None  # nothing ran alone: no peak of its own to read


def _tell(progress: Progress | None, what: str) -> None:
    if progress is not None:
        progress(1, what)


def build_result(engine: str, test: Test, warm: Sequence[Sample], timed: Sequence[Sample],
                 snapshots: tuple[Snapshot, Snapshot], peak_memory: int | None,
                 params: dict | None = None) -> TestResult:
    """Measurements of the timed phase and of time to first token, raw samples kept."""
    common = {"engine": engine, "test": test.name, "kind": test.kind, "n": test.n, "depth": test.depth,
              **(params or {})}
    start, end = snapshots
    phase = MeasurementSpec(f"{engine} {test.name}", test.phase, test.n, "tok", common)
    first = None
    timed_first, warm_first = _first_tokens(timed), _first_tokens(warm)
    if timed_first is not None and warm_first is not None:
        spec = MeasurementSpec(f"{engine} {test.name} first token", "ttft", 1, "tok", common)
        first = Measurement(spec, timed_first, warm_first, start, end)
    timed_phase = Measurement(phase, tuple(s.timed for s in timed), tuple(s.timed for s in warm), start, end)
    return TestResult(engine, test, timed_phase, first, peak_memory, timed[0].tokens)


def _first_tokens(samples: Sequence[Sample]) -> tuple[float, ...] | None:
    """Each sample's seconds to its first token; None when one of them lacks it."""
    seconds = tuple(s.first_token for s in samples if s.first_token is not None)
    return seconds if len(seconds) == len(samples) else None


def prefill_sample(runner: Runner, tokens: Tokens) -> Sample:
    """Prefill N tokens after the cached prefix (trimmed back to it first)."""
    depth = len(tokens.prefix)
    runner.trim_cache(depth)
    start = runner.clock()
    logits = runner.prefill(tokens.prompt, depth)  # (1, V)
    prefilled = runner.clock()
    runner.greedy(logits)  # the host reads the first token
    return Sample(prefilled - start, host_clock() - start)


def decode_sample(runner: Runner, tokens: Tokens, count: int) -> Sample:
    """Prefill the prefix, then `count` decode steps through the runner's token loop."""
    runner.reset_cache(len(tokens.prefix) + count)
    start = runner.clock()
    logits = runner.prefill(tokens.prefix, 0)
    loop = runner.loop(logits, len(tokens.prefix), count + 1, runner.sampler(GREEDY, tokens.prefix))
    generated = [next(loop)]
    first = host_clock()  # a host int: the work that made it is done (module docstring)
    generated += list(loop)
    end = host_clock()
    runner.synchronize()  # nothing left queued for the next sample
    if len(generated) != count + 1:
        raise RuntimeError(f"token loop gave {len(generated)} tokens, expected {count + 1}")
    return Sample(end - first, first - start, tuple(generated))


def prompts_sample(runner: Runner, prompts: Sequence[Sequence[int]], count: int) -> Sample:
    """`decode_sample` of every prompt in turn: decode seconds and first-token seconds summed, tokens joined."""
    samples = [decode_sample(runner, Tokens(tuple(prompt), ()), count) for prompt in prompts]
    return Sample(sum(s.timed for s in samples), sum(s.first_token or 0.0 for s in samples),
                  tuple(t for s in samples for t in s.tokens))


class KerneltriageEngine:
    """The runner as the harness sees it: its prefill and its token loop (with whatever levers replaced)."""

    name = ENGINE

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.params = {"levers": list(runner.run_config.lever_names)}
        self.before = 0

    def supports(self, test: Test) -> str | None:
        return None

    def prepare(self, test: Test, tokens: Tokens) -> Callable[[], Sample]:
        runner = self.runner
        runner.reset_cache(test.context_needed)  # allocated now, so its bytes are held, not transient
        if test.kind == "tg":
            return lambda: decode_sample(runner, tokens, test.n)
        if tokens.prefix:
            runner.prefill(tokens.prefix, 0)  # the depth, untimed
        return lambda: prefill_sample(runner, tokens)

    def start_memory(self) -> None:
        self.runner.synchronize()
        self.runner.reset_peak_memory()
        self.before = self.runner.peak_memory()

    def peak_memory(self) -> int | None:
        """CUDA: weights + KV cache + the warm-ups' transient peak above what was in use before them (other
        engines in this process excluded); CPU: the process's peak resident set."""
        if self.runner.device_type != "cuda":
            return self.runner.peak_memory()
        return self.runner.held_bytes() + self.runner.peak_memory() - self.before

    def close(self) -> None:
        pass


def run_test(runner: Runner, test: Test, settings: Settings, progress: Progress | None = None) -> TestResult:
    """Warm-ups and `settings.repeats` timed samples of `test` on `runner` alone."""
    tokens = tokens_for(test, runner.config.vocab_size, settings.seed)
    return run_interleaved([KerneltriageEngine(runner)], test, tokens, settings, runner.gpu_index, progress)[0]


def run_tests(runner: Runner, tests: Sequence[Test], settings: Settings,
              progress: Progress | None = None) -> list[TestResult]:
    """Every test in order on one runner."""
    return [run_test(runner, test, settings, progress) for test in tests]
