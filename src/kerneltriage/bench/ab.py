"""An A/B of two engine configurations that cannot be fooled: correctness first, proof that the candidate
ran, an A/A noise band, then paired interleaved timing of prefill and decode apart, and the one verdict rule.

Three runners are built from the SAME checkpoint: A, a second A (A') and B — three copies of the weights
in memory (48 GB for an 8B model in bf16). A' sizes the noise band with everything B/A also contains
(a separate model instance, its own cache). Pairs alternate which side runs first (A B, B A, …) so an
order effect cancels. A ratio is B/A throughput: the median of the per-pair ratios A time / B time (> 1: B is
faster), with an order-statistic CI whose level is the one it really has at this many pairs. Tok/s shown is
tokens / median time; ± is the IQR of the per-sample rates. Triage's lever measurements run through here too.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kerneltriage.bench.ab_report import Report, checklist, describe
from kerneltriage.bench.equivalence import Correctness, check_outputs, check_timed
from kerneltriage.bench.outputs import Outputs
from kerneltriage.bench.harness import Sample
from kerneltriage.bench.pairs import paired, sampler_of, sequential_pairs
from kerneltriage.bench.workloads import PromptSet, Test, check_fits, expand, tokens_for
from kerneltriage.core import sequential, stats, verdict
from kerneltriage.core.contention import contention
from kerneltriage.core.environment import take_snapshot
from kerneltriage.core.errors import InputError
from kerneltriage.core.measurement import Measurement, MeasurementSpec
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.speculative.decoder import SPEC_COUNTER

SUSTAIN_WINDOW_FRACTION = 0.25  # first and last quarter of the sustained samples are compared
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Settings:
    """Workload and effort: prefill and decode sizes, pairs per block, warm-ups, sustained seconds; with a prompt
    set, every decode sample decodes `gen` tokens after each of its prompts (random tokens otherwise)."""

    prompt: int = 512
    gen: int = 128
    pairs: int = 10
    warmups: int = 1
    sustain: float = 0.0
    prompt_set: PromptSet | None = None
    sequential: bool = False  # the A/B block stops once it clears the band or cannot (core/sequential.py)
    winners_only: bool = False  # outputs checked after the timing, and only where it shows a win (triage's climb)
    depth: int = 0  # tokens already in the cache before each timed test (llama-bench's -d)

    def __post_init__(self) -> None:
        if self.pairs < 2 or self.warmups < 0 or self.sustain < 0 or self.depth < 0:
            raise ValueError(f"ab settings: pairs ≥ 2, warm-ups ≥ 0, sustain ≥ 0, depth ≥ 0, got {self}")
        if self.sequential and self.pairs < sequential.LOOKS[0]:
            raise ValueError(f"ab settings: sequential pairs need at least {sequential.LOOKS[0]}, got {self.pairs}")

    @property
    def tests(self) -> list[Test]:
        return expand([self.prompt], [self.gen], [self.depth])

    @property
    def context_needed(self) -> int:
        """Cache positions the longest sample fills."""
        longest = self.prompt_set.longest if self.prompt_set and self.gen else 0
        return max([t.context_needed for t in self.tests] + [longest + self.gen + 1])

    def tokens_per_sample(self, test: Test) -> int:
        """Tokens one sample of `test` prefills or emits: a decode sample over a prompt set emits `n` after each."""
        prompts = len(self.prompt_set.prompts) if test.kind == "tg" and self.prompt_set is not None else 1
        return test.n * prompts

    def name(self, test: Test) -> str:
        """The test's name, with the prompt set its decode samples run over."""
        if test.kind == "tg" and self.prompt_set is not None:
            return f"{test.name} × {len(self.prompt_set.prompts)} prompts ({self.prompt_set.name})"
        return test.name


@dataclass(frozen=True)
class Phase:
    """One phase's two blocks — A/A (A, A') then A/B (A, B) — their ratios, noise band and verdict, and the
    tokens of the first A/B pair (decode: what the timed runs emitted)."""

    test: Test
    name: str
    aa: tuple[Measurement, Measurement]
    ab: tuple[Measurement, Measurement]
    aa_ratio: stats.Interval
    ratio: stats.Interval
    band: float
    verdict: verdict.Verdict
    tokens: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    @property
    def slower(self) -> bool:
        return verdict.slower(self.ratio, self.band)

    def to_dict(self) -> dict[str, Any]:
        (a, b), (aa_a, aa_b) = self.ab, self.aa
        return {"phase": self.test.phase, "test": self.name, "a": _rates(a), "b": _rates(b),
                "ratio": _interval(self.ratio), "aa_ratio": _interval(self.aa_ratio), "band": self.band,
                "slower": self.slower, "verdict": self.verdict.verdict, "reason": self.verdict.reason,
                "warnings": sorted({c.code for m in (aa_a, aa_b, a, b) for c in m.warnings()})}


def _rates(m: Measurement) -> dict[str, float]:
    """Tokens / median time and the IQR of per-sample rates."""
    rates = [m.spec.units_per_sample / t for t in m.samples]
    return {"tok_s": m.spec.units_per_sample / m.median, "iqr": stats.iqr(rates)}


def _interval(i: stats.Interval) -> dict[str, float]:
    return {"estimate": i.estimate, "low": i.low, "high": i.high, "confidence": i.confidence}


def _block(names: tuple[str, str], samplers: Mapping[str, Callable[[], Sample]], test: Test, block: str,
           settings: Settings, warm: dict[str, list[float]], progress: Progress, gpu: int, band: float | None = None
           ) -> tuple[tuple[Measurement, Measurement], tuple[tuple[int, ...], tuple[int, ...]], stats.Interval]:
    """One block of interleaved pairs, as two measurements with the block's start/end snapshots (a runner's
    warm-ups, popped from `warm`, go with its first measurement), each side's first tokens and the ratio's interval.
    With `band` and sequential settings the block stops at the first look that settles it."""
    start = take_snapshot(gpu)
    tell = lambda i: progress(f"{test.name} {block} pair {i}/{settings.pairs}")  # noqa: E731
    first, second = samplers[names[0]], samplers[names[1]]
    if band is not None and settings.sequential:
        samples, ratio = sequential_pairs(first, second, settings.pairs, band, tell)
    else:
        samples = paired(first, second, settings.pairs, tell)
        ratio = stats.paired_ratio_ci([s.timed for s in samples[0]], [s.timed for s in samples[1]])
    end = take_snapshot(gpu)
    first_side, second_side = (
        Measurement(MeasurementSpec(f"{name} {test.name} ({block})", test.phase, settings.tokens_per_sample(test),
                                    "tok",
                                    {"config": name, "block": block, "test": test.name}),
                    tuple(s.timed for s in side), tuple(warm.pop(name, [])), start, end)
        for name, side in zip(names, samples))
    return (first_side, second_side), (samples[0][0].tokens, samples[1][0].tokens), ratio


@dataclass(frozen=True)
class Noise:
    """One phase's A/A block (A against its twin A'), measured once and reused by the A/Bs against the same A."""

    aa: tuple[Measurement, Measurement]
    ratio: stats.Interval

    @property
    def band(self) -> float:
        return verdict.noise_band(self.ratio)


def measure_noise(runners: Mapping[str, Runner], test: Test, settings: Settings, progress: Progress) -> Noise:
    """Warm-ups of A and A', then the A/A block of `test`."""
    samplers = {name: sampler_of(runners[name], test, settings.prompt_set) for name in ("A", "A'")}
    warm = {name: [sampler().timed for _ in range(settings.warmups)] for name, sampler in samplers.items()}
    aa, _, ratio = _block(("A", "A'"), samplers, test, "A/A", settings, warm, progress, runners["A"].gpu_index or 0)
    return Noise(aa, ratio)


def measure_phase(runners: Mapping[str, Runner], test: Test, settings: Settings, progress: Progress,
                  share: float | None = None, noise: Noise | None = None) -> Phase:
    """Warm-ups of every runner, the A/A block (or `noise`, measured before against the same A), then the A/B
    block; ratios, band and verdict."""
    samplers = {name: sampler_of(runner, test, settings.prompt_set) for name, runner in runners.items()
                if noise is None or name != "A'"}
    warm = {name: [sampler().timed for _ in range(settings.warmups)] for name, sampler in samplers.items()}
    progress(f"{test.name} warmed up")
    gpu = runners["A"].gpu_index or 0
    if noise is None:
        aa, _, aa_ratio = _block(("A", "A'"), samplers, test, "A/A", settings, warm, progress, gpu)
        noise = Noise(aa, aa_ratio)
    ab, tokens, ratio = _block(("A", "B"), samplers, test, "A/B", settings, warm, progress, gpu, noise.band)
    band = noise.band
    return Phase(test, settings.name(test), noise.aa, ab, noise.ratio, ratio, band,
                 verdict.phase_verdict(ratio, band, share), tokens)


def sustain(runners: Mapping[str, Runner], settings: Settings, progress: Progress
            ) -> tuple[list[Measurement], dict[str, tuple[float, float]]]:
    """Alternate A and B (every test each) for `settings.sustain` seconds; first vs last window rate per config
    and phase."""
    seconds, tests = settings.sustain, settings.tests
    samplers = {(name, test): sampler_of(runners[name], test, settings.prompt_set) for name in ("A", "B")
                for test in tests}
    times: dict[tuple[str, Test], list[float]] = {key: [] for key in samplers}
    gpu = runners["A"].gpu_index or 0
    start, began, rounds = take_snapshot(gpu), time.perf_counter(), 0
    while time.perf_counter() - began < seconds or rounds < 2:
        for key in sorted(samplers, key=lambda k: k[0], reverse=rounds % 2 == 1):
            times[key].append(samplers[key]().timed)
        rounds += 1
        progress(f"sustained {time.perf_counter() - began:.0f}/{seconds:.0f} s")
    end = take_snapshot(gpu)
    measurements = [Measurement(MeasurementSpec(f"{name} {test.name} (sustained)", test.phase,
                                                settings.tokens_per_sample(test), "tok",
                                                {"config": name, "block": "sustained", "test": test.name}),
                                tuple(samples), (), start, end) for (name, test), samples in times.items()]
    return measurements, {m.spec.label.removesuffix(" (sustained)"): _windows(m) for m in measurements}


def _windows(m: Measurement) -> tuple[float, float]:
    """Rates (total tokens / total time) over the first and the last SUSTAIN_WINDOW_FRACTION of samples."""
    k = max(1, int(m.n * SUSTAIN_WINDOW_FRACTION))
    first, last = m.samples[:k], m.samples[-k:]
    return m.spec.units_per_sample * k / sum(first), m.spec.units_per_sample * k / sum(last)


def build_runners(backend: Backend, checkpoint: Checkpoint, a: RunConfig, b: RunConfig, device: str,
                  dtype: str) -> dict[str, Runner]:
    """A, A' and B, each with its own copy of the weights from the one checkpoint."""
    sides = {"A": a, "A'": a, "B": b}
    return {name: backend.build(checkpoint, config, device, dtype) for name, config in sides.items()}


def _counted(runner: Runner) -> tuple[str, ...]:
    """The counters that prove the runner's levers (and speculation) ran."""
    return runner.run_config.lever_names + ((SPEC_COUNTER,) if runner.speculation else ())


def _executions(runners: Mapping[str, Runner]) -> dict[str, dict[str, int]]:
    return {name: {key: r.counters[key] for key in _counted(r)} for name, r in runners.items()}


def run_ab(backend: Backend, runners: Mapping[str, Runner], settings: Settings, progress: Progress,
           shares: Mapping[str, float] | None = None,
           baseline_evidence: Mapping[str, str | None] | None = None,
           noise: Mapping[str, Noise] | None = None, kept: Outputs | None = None) -> Report:
    """Correctness, then every phase (A/A and A/B blocks), then the sustained window; checklist and verdict.

    `shares`: phase → the changed op's measured share of that phase (for no-lever); `baseline_evidence`:
    check → problem found in the baseline, or None when it passed (answers checklist point 3); `noise`: phase → an
    A/A block measured before against this very A (then no A' is needed); `kept`: outputs earlier checks computed
    (A's digest and rows, reused when the same A is checked again). With `settings.winners_only` the outputs are
    checked after the timing, where it shows a win."""
    a, b = runners["A"], runners["B"]
    check_fits(settings.tests, a.config.max_context)
    if settings.prompt_set is not None and settings.context_needed > a.config.max_context:
        raise InputError(f"--prompts {settings.prompt_set.name}: the longest prompt ({settings.prompt_set.longest} "
                         f"tokens) and {settings.gen} new ones exceed the model's context of {a.config.max_context}")
    correctness = None if settings.winners_only else _checked(backend, a, b, progress, kept)
    for runner in runners.values():  # one cache for every test, the same size on all three: reused, never reallocated
        runner.drop_cache()  # the correctness check left bigger caches on A and B than on A'
        runner.reset_cache(settings.context_needed)
    before = _executions(runners)
    for runner in runners.values():
        if runner.speculation is not None:
            runner.speculation.reset_total()  # what the phases' runs do, warm-ups included
    phases = [measure_phase(runners, t, settings, progress, (shares or {}).get(t.phase), (noise or {}).get(t.phase))
              for t in settings.tests]
    counters = {name: {key: n - before[name][key] for key, n in c.items()} for name, c in _executions(runners).items()}
    speculation = {name: r.speculation.total.brief() for name, r in runners.items() if r.speculation is not None}
    if correctness is None:
        timing = verdict.timing_verdict({p.test.phase: p.verdict for p in phases}, [p.test.phase for p in phases
                                                                                   if p.slower])
        correctness = (_checked(backend, a, b, progress, kept) if timing.verdict in ("win", "traded")
                       else Correctness.unchecked())
    if correctness.checked:
        began = time.perf_counter()
        correctness = _with_timed(backend, a, b, correctness, phases, settings, kept)
        correctness = dataclasses.replace(correctness, parts=correctness.parts | {
            "timed": time.perf_counter() - began})
    sustained, windows = sustain(runners, settings, progress) if settings.sustain else ([], {})
    report = Report(describe(runners, settings), correctness, counters,
                    sorted({key for c in counters.values() for key, n in c.items() if n == 0}),
                    phases, sustained, windows, speculation=speculation)
    cleared = [p.test.phase for p in phases if p.verdict.verdict in ("win", "loss")]
    report.contention = (verdict.band_contention({p.test.phase: p.band for p in phases}, cleared)
                         or _load_contention(report))
    report.checklist = checklist(report, a.run_config, b.run_config, baseline_evidence)
    report.verdict = verdict.overall_verdict(
        {p.test.phase: p.verdict for p in phases}, correctness.passed, report.silent, correctness.detail,
        slower_phases=[p.test.phase for p in phases if p.slower], pairs=settings.pairs, contention=report.contention)
    return report


def _checked(backend: Backend, a: Runner, b: Runner, progress: Progress, kept: Outputs | None = None
             ) -> Correctness:
    progress("checking outputs")
    began = time.perf_counter()
    checked = check_outputs(backend, a, b, kept)
    return dataclasses.replace(checked, seconds=time.perf_counter() - began)


def _load_contention(report: Report) -> str | None:
    """Why the machine was shared while the phases were timed (other processes' CPU, the GPU held), or None."""
    snapshots = sorted((s for p in report.phases for m in (*p.aa, *p.ab) for s in (m.start, m.end) if s is not None),
                       key=lambda s: s.time)
    return contention(snapshots[0], snapshots[-1]) if snapshots else None


def _with_timed(backend: Backend, a: Runner, b: Runner, correctness: Correctness, phases: list[Phase],
                settings: Settings, kept: Outputs | None = None) -> Correctness:
    """The correctness record with what the timed decode runs' own tokens showed (per prompt of a prompt set)."""
    decode = next((p for p in phases if p.test.kind == "tg"), None)
    if decode is None:
        return correctness
    size = decode.test.n + 1  # tokens each prompt's run emits
    prefixes = (settings.prompt_set.prompts if settings.prompt_set
                else [tokens_for(decode.test, a.config.vocab_size).prefix])
    for i, prefix in enumerate(prefixes):
        run_a, run_b = (tokens[i * size:(i + 1) * size] for tokens in decode.tokens)
        timed = check_timed(backend, a, b, prefix, run_a, run_b, correctness.semantic_error is None, kept)
        if timed is not None:
            return dataclasses.replace(correctness, timed=f"prompt {i}: {timed}" if settings.prompt_set else timed)
    return correctness
