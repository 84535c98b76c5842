"""An A/B of two engine configurations that cannot be fooled: correctness first, proof that the candidate
ran, an A/A noise band, then paired interleaved timing of prefill and decode apart, and a verdict.

Three runners are built from the SAME checkpoint: A, a second A (A') and B — three copies of the weights
in memory (48 GB for an 8B model in bf16). A' sizes the noise band with everything B/A also contains
(a separate model instance, its own cache). Pairs alternate which side runs first (A B, B A, …) so an
order effect cancels. Ratios are B/A throughput = median A time / median B time (> 1: B is faster), with a
paired-bootstrap CI. Tok/s shown is tokens / median time; ± is the IQR of the per-sample rates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from kerneltriage.backends.torch.accelerate import apply_levers
from kerneltriage.backends.torch.runner import Runner, build_runner
from kerneltriage.backends.torch.speculative import SPEC_COUNTER, decoder_of, install_speculation
from kerneltriage.bench.equivalence import (DIGEST_PROMPT_TOKENS, DIGEST_PROMPTS, DIGEST_TOKENS, Correctness,
                                            check_outputs)
from kerneltriage.bench.harness import Sample, _decode_sample, _prefill_sample
from kerneltriage.bench.workloads import WORKLOAD_SEED, Test, check_fits, expand, tokens_for
from kerneltriage.core import stats, verdict
from kerneltriage.core.environment import take_snapshot
from kerneltriage.core.errors import InputError
from kerneltriage.core.measurement import Measurement, MeasurementSpec
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine import speculative
from kerneltriage.engine.levers import LEVERS, parse_levers

SPEC_KEYS = ("levers", "spec", "depth")
SUSTAIN_WINDOW_FRACTION = 0.25  # first and last quarter of the sustained samples are compared
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Spec:
    """One configuration under test: the levers switched on, and speculative decoding (`--spec` text)."""

    levers: tuple[str, ...] = ()
    spec: str = ""
    depth: str = ""

    @property
    def text(self) -> str:
        extra = f";spec={self.spec}" if self.spec else ""
        return f"levers={','.join(self.levers)}{extra}" + (f";depth={self.depth}" if self.depth else "")


def parse_spec(text: str, flag: str) -> Spec:
    """`levers=a,b;spec=ngram;depth=4` (key=value pairs separated by ';') → Spec; bad values are InputErrors."""
    fields: dict[str, str] = {}
    for part in (p.strip() for p in text.split(";")):
        key, sep, value = part.partition("=")
        if not part:
            continue
        if not sep or key.strip() not in SPEC_KEYS:
            raise InputError(f"{flag} {text!r}: expected key=value pairs separated by ';' with keys "
                             f"{', '.join(SPEC_KEYS)}, got {part!r}")
        if key.strip() in fields:
            raise InputError(f"{flag} {text!r}: {key.strip()} is given twice")
        fields[key.strip()] = value.strip()
    try:
        speculative.parse_spec(fields.get("spec"), fields.get("depth") or None)
        return Spec(parse_levers(fields.get("levers", "")), fields.get("spec", ""), fields.get("depth", ""))
    except InputError as exc:
        raise InputError(f"{flag} {text!r}: {exc}") from None


@dataclass(frozen=True)
class Settings:
    """Workload and effort: prefill and decode sizes, pairs per block, warm-ups, sustained seconds."""

    prompt: int = 512
    gen: int = 128
    pairs: int = 10
    warmups: int = 1
    sustain: float = 0.0

    def __post_init__(self) -> None:
        if self.pairs < 2 or self.warmups < 0 or self.sustain < 0:
            raise ValueError(f"ab settings: pairs ≥ 2, warm-ups ≥ 0, sustain ≥ 0, got {self}")

    @property
    def tests(self) -> list[Test]:
        return expand([self.prompt], [self.gen], [0])


@dataclass(frozen=True)
class Phase:
    """One phase's two blocks — A/A (A, A') then A/B (A, B) — their ratios, noise band and verdict."""

    test: Test
    aa: tuple[Measurement, Measurement]
    ab: tuple[Measurement, Measurement]
    aa_ratio: stats.Interval
    ratio: stats.Interval
    band: float
    verdict: verdict.Verdict

    def to_dict(self) -> dict[str, Any]:
        (a, b), (aa_a, aa_b) = self.ab, self.aa
        return {"phase": self.test.phase, "test": self.test.name, "a": _rates(a), "b": _rates(b),
                "ratio": _interval(self.ratio), "aa_ratio": _interval(self.aa_ratio), "band": self.band,
                "verdict": self.verdict.verdict, "reason": self.verdict.reason,
                "warnings": sorted({c.code for m in (aa_a, aa_b, a, b) for c in m.warnings()})}


def _rates(m: Measurement) -> dict[str, float]:
    """Tokens / median time and the IQR of per-sample rates."""
    rates = [m.spec.units_per_sample / t for t in m.samples]
    return {"tok_s": m.spec.units_per_sample / m.median, "iqr": stats.iqr(rates)}


def _interval(i: stats.Interval) -> dict[str, float]:
    return {"estimate": i.estimate, "low": i.low, "high": i.high, "confidence": i.confidence}


def _sampler(runner: Runner, test: Test) -> Callable[[], Sample]:
    tokens = tokens_for(test, runner.config.vocab_size)
    if test.kind == "pp":
        return lambda: _prefill_sample(runner, tokens)
    return lambda: _decode_sample(runner, tokens, test.n)


def _paired(first: Callable[[], Sample], second: Callable[[], Sample], pairs: int,
            tell: Callable[[int], None]) -> tuple[list[float], list[float]]:
    """`pairs` interleaved samples of two samplers; odd pairs run the second one first."""
    xs, ys = [], []
    for i in range(pairs):
        if i % 2:
            y, x = second(), first()
        else:
            x, y = first(), second()
        xs.append(x.timed)
        ys.append(y.timed)
        tell(i + 1)
    return xs, ys


def _block(names: tuple[str, str], samplers: Mapping[str, Callable[[], Sample]], test: Test, block: str,
           settings: Settings, warm: dict[str, list[float]], progress: Progress, gpu: int) -> tuple[Measurement, ...]:
    """One block of interleaved pairs, as two measurements with the block's start/end snapshots; a runner's
    warm-ups (popped from `warm`) go with its first measurement."""
    start = take_snapshot(gpu)
    tell = lambda i: progress(f"{test.name} {block} pair {i}/{settings.pairs}")  # noqa: E731
    times = _paired(samplers[names[0]], samplers[names[1]], settings.pairs, tell)
    end = take_snapshot(gpu)
    return tuple(
        Measurement(MeasurementSpec(f"{name} {test.name} ({block})", test.phase, test.n, "tok",
                                    {"config": name, "block": block, "test": test.name}),
                    samples, warm.pop(name, []), start, end)
        for name, samples in zip(names, times))


def measure_phase(runners: Mapping[str, Runner], test: Test, settings: Settings, progress: Progress,
                  share: float | None = None) -> Phase:
    """Warm-ups of every runner, the A/A block, then the A/B block; ratios, band and verdict."""
    samplers = {name: _sampler(runner, test) for name, runner in runners.items()}
    warm = {name: [sampler().timed for _ in range(settings.warmups)] for name, sampler in samplers.items()}
    progress(f"{test.name} warmed up")
    gpu = _gpu_index(runners)
    aa = _block(("A", "A'"), samplers, test, "A/A", settings, warm, progress, gpu)
    ab = _block(("A", "B"), samplers, test, "A/B", settings, warm, progress, gpu)
    aa_ratio = stats.bootstrap_ratio_ci(aa[0].samples, aa[1].samples)
    ratio = stats.bootstrap_ratio_ci(ab[0].samples, ab[1].samples)
    band = verdict.noise_band(aa_ratio)
    return Phase(test, aa, ab, aa_ratio, ratio, band, verdict.phase_verdict(ratio, band, share))


def sustain(runners: Mapping[str, Runner], tests: Sequence[Test], seconds: float,
            progress: Progress) -> tuple[list[Measurement], dict[str, tuple[float, float]]]:
    """Alternate A and B (every test each) for `seconds`; first vs last window rate per config and phase."""
    samplers = {(name, test): _sampler(runners[name], test) for name in ("A", "B") for test in tests}
    times: dict[tuple[str, Test], list[float]] = {key: [] for key in samplers}
    start, began, rounds = take_snapshot(_gpu_index(runners)), time.perf_counter(), 0
    while time.perf_counter() - began < seconds or rounds < 2:
        for key in sorted(samplers, key=lambda k: k[0], reverse=rounds % 2 == 1):
            times[key].append(samplers[key]().timed)
        rounds += 1
        progress(f"sustained {time.perf_counter() - began:.0f}/{seconds:.0f} s")
    end = take_snapshot(_gpu_index(runners))
    measurements = [Measurement(MeasurementSpec(f"{name} {test.name} (sustained)", test.phase, test.n, "tok",
                                                {"config": name, "block": "sustained", "test": test.name}),
                                samples, (), start, end) for (name, test), samples in times.items()]
    return measurements, {m.spec.label.removesuffix(" (sustained)"): _windows(m) for m in measurements}


def _gpu_index(runners: Mapping[str, Runner]) -> int:
    """The GPU whose clocks and temperature the snapshots read (0 on CPU: NVML then has nothing to say)."""
    return runners["A"].device.index or 0


def _windows(m: Measurement) -> tuple[float, float]:
    """Rates (total tokens / total time) over the first and the last SUSTAIN_WINDOW_FRACTION of samples."""
    k = max(1, int(m.n * SUSTAIN_WINDOW_FRACTION))
    first, last = m.samples[:k], m.samples[-k:]
    return m.spec.units_per_sample * k / sum(first), m.spec.units_per_sample * k / sum(last)


@dataclass
class Report:
    """Everything an A/B found: config, correctness, counters, phases, sustained window, checklist, verdict."""

    config: dict[str, Any]
    correctness: Correctness
    counters: dict[str, dict[str, int]]
    silent: list[str]
    phases: list[Phase]
    sustained: list[Measurement] = field(default_factory=list)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    checklist: tuple[verdict.ChecklistItem, ...] = ()
    verdict: verdict.Verdict | None = None

    @property
    def measurements(self) -> list[Measurement]:
        return [m for p in self.phases for m in (*p.aa, *p.ab)] + self.sustained

    def summary(self) -> dict[str, Any]:
        """The JSON-ready result (raw samples are in `measurements`)."""
        return {"verdict": self.verdict.verdict, "reason": self.verdict.reason,
                "phases": [p.to_dict() for p in self.phases],
                "correctness": {"passed": self.correctness.passed, "detail": self.correctness.detail,
                                "digest_a": self.correctness.digest_a, "digest_b": self.correctness.digest_b,
                                "max_logit_diff": self.correctness.max_logit_diff,
                                "reference": self.correctness.reference, "error_a": self.correctness.error_a,
                                "tolerance": self.correctness.tolerance},
                "counters": self.counters, "silent_levers": self.silent,
                "sustained": {label: {"first_tok_s": f, "last_tok_s": la} for label, (f, la) in self.windows.items()},
                "checklist": [item.to_dict() for item in self.checklist]}


def build_runners(checkpoint: Checkpoint, a: Spec, b: Spec, device: torch.device,
                  dtype: torch.dtype) -> dict[str, Runner]:
    """A, A' and B, each with its own copy of the weights from the one checkpoint."""
    return {name: _build(checkpoint, spec, device, dtype) for name, spec in {"A": a, "A'": a, "B": b}.items()}


def _build(checkpoint: Checkpoint, spec: Spec, device: torch.device, dtype: torch.dtype) -> Runner:
    runner = apply_levers(build_runner(checkpoint, device, dtype), spec.levers)
    config = speculative.parse_spec(spec.spec, spec.depth or None)
    if config is not None:  # after the levers: speculation wraps whatever prefill they installed
        install_speculation(runner, config)
    return runner


def _speculation(runner: Runner) -> str | None:
    decoder = decoder_of(runner)
    return decoder.spec.label if decoder else None


def _executions(runners: Mapping[str, Runner]) -> dict[str, dict[str, int]]:
    return {name: {lever: r.counters[lever] for lever in r.levers + ((SPEC_COUNTER,) if _speculation(r) else ())}
            for name, r in runners.items()}


@torch.inference_mode()
def run_ab(runners: Mapping[str, Runner], settings: Settings, progress: Progress,
           shares: Mapping[str, float] | None = None,
           baseline_evidence: Mapping[str, str | None] | None = None) -> Report:
    """Correctness, then every phase (A/A and A/B blocks), then the sustained window; checklist and verdict.

    `shares`: phase → the changed op's measured share of that phase (for no-lever); `baseline_evidence`:
    check → problem found in the baseline, or None when it passed (answers checklist point 3)."""
    a, b = runners["A"], runners["B"]
    check_fits(settings.tests, a.config.max_context)
    progress("checking outputs")
    correctness = check_outputs(a, b)
    for runner in runners.values():  # one cache big enough for every test: reused, never reallocated
        runner.reset_cache(max(t.context_needed for t in settings.tests))
    before = _executions(runners)
    phases = [measure_phase(runners, t, settings, progress, (shares or {}).get(t.phase)) for t in settings.tests]
    counters = {name: {lever: n - before[name][lever] for lever, n in c.items()}
                for name, c in _executions(runners).items()}
    sustained, windows = sustain(runners, settings.tests, settings.sustain, progress) if settings.sustain else ([], {})
    report = Report(_config(runners, settings), correctness, counters,
                    sorted({lever for c in counters.values() for lever, n in c.items() if n == 0}),
                    phases, sustained, windows)
    report.checklist = _checklist(report, baseline_evidence)
    report.verdict = verdict.overall_verdict({p.test.phase: p.verdict for p in phases}, correctness.passed,
                                             report.silent, correctness.detail)
    return report


def _checklist(report: Report, evidence: Mapping[str, str | None] | None) -> tuple[verdict.ChecklistItem, ...]:
    a_levers, b_levers = report.config["a"]["levers"], report.config["b"]["levers"]
    a_spec, b_spec = report.config["a"]["spec"], report.config["b"]["spec"]
    snapshots = [s for m in report.measurements for s in (m.start, m.end) if s is not None]
    by_time = sorted(snapshots, key=lambda s: s.time)
    first, last = (by_time[0], by_time[-1]) if by_time else (None, None)
    return (verdict.synthetic_item(True, report.config["random_weights"]),
            verdict.question_item({**{lv: LEVERS[lv].question for lv in b_levers if lv not in a_levers},
                                   **({f"spec {b_spec}": "dispatch"} if b_spec and b_spec != a_spec else {})}),
            verdict.baseline_item(a_levers + ([f"spec {a_spec}"] if a_spec else []), evidence),
            verdict.phases_item([p.test.phase for p in report.phases]),
            verdict.thermals_item(first, last, report.windows))


def _config(runners: Mapping[str, Runner], settings: Settings) -> dict[str, Any]:
    a, b = runners["A"], runners["B"]
    return {"source": a.checkpoint.source, "model": a.config.name, "random_weights": a.config.random_weights,
            "device": str(a.device), "dtype": str(a.dtype).removeprefix("torch."),
            "a": {"levers": list(a.levers), "spec": _speculation(a)},
            "b": {"levers": list(b.levers), "spec": _speculation(b)},
            "tests": [t.name for t in settings.tests], "pairs": settings.pairs, "warmups": settings.warmups,
            "sustain_s": settings.sustain, "seed": WORKLOAD_SEED,
            "digest": {"prompts": DIGEST_PROMPTS, "prompt_tokens": DIGEST_PROMPT_TOKENS, "tokens": DIGEST_TOKENS},
            "noise_band_rule": f"A/A CI bound farthest from 1, at least {verdict.MIN_NOISE_BAND}",
            "pair_order": "alternating (A B, B A, …)"}


def side_label(side: Mapping[str, Any]) -> str:
    """One side of a report's config as text: `levers=a,b` (`levers=(stock)` for none) and its speculation."""
    return f"levers={','.join(side['levers']) or '(stock)'}" + (f" + spec {side['spec']}" if side["spec"] else "")


def record(report: Report, ledger: Any, environment: Mapping[str, Any]) -> int:
    """Store the whole A/B as one ledger experiment (all samples, config, verdict, checklist as findings)."""
    a, b = (side_label(report.config[side]) for side in ("a", "b"))
    label = f"{report.config['model'] or report.config['source']}: A {a} vs B {b}"
    with ledger.experiment("ab", report.config, environment, label=label) as exp:
        for m in report.measurements:
            exp.add_measurement(m)
        for item in report.checklist:
            exp.add_finding("checklist", item.point, item.answer, {"status": item.status})
        exp.set_verdict(report.verdict.verdict, report.summary())
    return exp.id
