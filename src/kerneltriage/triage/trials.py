"""The climb's bench over the backend protocol: each configuration measured once as a base (its A/A noise per
phase, its profile, its rates), and each candidate judged against it by `ab` itself.

Every runner is a stock copy of the user's runner's weights (made on the device, no reload), configured anew; the
user's own runner is the first base. A base's A/A block (A against a twin copy) is measured once and reused by every
A/B against that A in its round: the band does not change between candidates, and the twin is freed at once. The
A/B blocks are sequential (`core/sequential.py`): a clear win or a hopeless candidate stops early. Outputs are
checked for the candidates whose timing wins (`ab`'s winners-only check), not for every candidate.

How many pairs a base gets follows its own speed: NOISE_SECONDS of A/A pairs, between the device's least and most
(an eager decode on the H200 takes 0.35 s a sample, a graphed one 10 ms: 5 pairs of the first, 20 of the second).
Where even the fewest pairs would take longer than SHRINK_SECONDS, the samples shrink to fit NOISE_SECONDS instead
(fewer prompt and decode tokens, down to SMALLEST): MLX's CPU prefill runs ~9 tok/s, so a 128-token sample alone took
15 s and one A/B of the climb 274 s. (An eager base on the H200, ~4 s for its fewest pairs, keeps its sizes.)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kerneltriage.bench import ab
from kerneltriage.bench.outputs import Outputs
from kerneltriage.bench.table import Traffic, floor_of
from kerneltriage.bench.workloads import tokens_for
from kerneltriage.core import roofline
from kerneltriage.core.errors import InputError
from kerneltriage.core.verdict import MIN_PAIRS
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage.breakdown import Breakdown, from_profile
from kerneltriage.triage.candidates import Candidate
from kerneltriage.triage.ladder import Standing
from kerneltriage.triage.measure import LeverResult
from kerneltriage.triage.setup import Budget, Workload

NOISE_SECONDS = {"cuda": 1.0, "cpu": 10.0}  # wall seconds of A/A pairs a base gets, both phases together
SMALLEST = (16, 4)  # the prompt and decode tokens a lever sample shrinks to at most (`_sized`)
SHRINK_SECONDS = 30.0  # the fewest pairs taking longer than this: the samples shrink (`_sized`)


@dataclass
class TrialBase:
    """One configuration, measured: its runner (A of every A/B in its round), A/A noise per phase, profile, and
    the settings its A/Bs use (pairs sized by its speed)."""

    config: RunConfig
    runner: Runner
    settings: ab.Settings
    noise: dict[str, ab.Noise]
    breakdowns: dict[str, Breakdown]
    workload: Workload
    floors: dict[str, float]  # phase → seconds of one sample at the roofline
    owned: bool = True  # a copy the climb made (released with the base); False: the user's runner

    @property
    def bands(self) -> dict[str, float]:
        return {phase: noise.band for phase, noise in self.noise.items()}

    def rate(self, phase: str) -> float:
        """tok/s of this configuration at the climb's test size: tokens / median of its A/A block's first side."""
        first = self.noise[phase].aa[0]
        return first.spec.units_per_sample / first.median

    @property
    def weights(self) -> dict[str, float]:
        """Seconds the user's workload (pp `prompt`, tg `gen`) spends in each phase at this configuration's rates."""
        tokens = {"prefill": self.workload.prompt, "decode": self.workload.gen}
        return {phase: tokens[phase] / self.rate(phase) for phase in self.noise}

    def standing(self) -> Standing:
        tests = {phase: noise.aa[0].spec.params["test"] for phase, noise in self.noise.items()}
        pct = {phase: 100.0 * self.floors[phase] / self.noise[phase].aa[0].median for phase in self.noise}
        kernels = self.breakdowns["decode"].kernels_per_token if "decode" in self.breakdowns else 0.0
        return Standing(self.config, tests, {p: self.rate(p) for p in self.noise}, pct, kernels or None)


@dataclass
class Trials:
    """The climb's `Bench`: bases and judgements on stock copies of `root`'s weights."""

    backend: Backend
    root: Runner
    workload: Workload
    budget: Budget
    ceilings: roofline.Ceilings
    evidence: Mapping[str, str | None] = field(default_factory=dict)
    tell: Callable[[str], None] = lambda what: None
    prompt_set: Any = None  # the user's prompts: every decode sample runs over them
    known: dict[str, dict[str, Breakdown]] = field(default_factory=dict)  # config text → a profile already made
    began: float = field(default_factory=time.perf_counter)
    start_noise: dict[str, ab.Noise] | None = None  # the user's configuration's A/A, kept for the final confirmation
    kept: Outputs = field(default_factory=Outputs)  # outputs checks computed, reused by later checks

    @property
    def template(self) -> ab.Settings:
        w, b = self.workload, self.budget
        return ab.Settings(prompt=min(w.prompt, b.lever_prompt), gen=min(b.lever_tokens, w.gen), pairs=b.lever_pairs,
                           warmups=b.warmups, prompt_set=self.prompt_set, sequential=True, winners_only=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def base(self, config: RunConfig) -> TrialBase:
        """Build (or take the user's runner), size the pairs by a warm-up sample, measure the A/A noise of each
        phase against a twin, then profile decode (its kernels per token); `profiled` adds prefill where a round
        needs both."""
        own = config != self.root.run_config
        runner = self.backend.copy(self.root, config) if own else self.root
        twin = self.backend.copy(self.root, config)
        try:
            settings = self._sized(runner, twin)
            noise = {t.phase: ab.measure_noise({"A": runner, "A'": twin}, t, settings, self.tell)
                     for t in settings.tests}
        finally:
            self.backend.release(twin)
        base = TrialBase(config, runner, settings, noise, dict(self.known.get(config.text, {})), self.workload,
                         self._floors(settings), own)
        self._profile(base, ("decode",))
        if not own and self.start_noise is None:
            self.start_noise = noise
        return base

    def profiled(self, base: TrialBase) -> TrialBase:
        """The base with both phases profiled (what a round's ceilings need)."""
        self._profile(base, ("prefill", "decode"))
        return base

    def _sized(self, runner: Runner, twin: Runner) -> ab.Settings:
        """The template with pairs for NOISE_SECONDS of A/A (MIN_PAIRS at least), sized by each side's last warm-up
        sample in each phase (the warm-ups are done here: the blocks need none). Where MIN_PAIRS would take longer
        than SHRINK_SECONDS, the samples shrink to fit NOISE_SECONDS (not below SMALLEST), warmed and timed again."""
        settings = self.template
        limit = NOISE_SECONDS["cuda" if runner.device_type == "cuda" else "cpu"]
        pair = _warm_pair(runner, twin, settings)
        if MIN_PAIRS * pair > SHRINK_SECONDS:
            scale = limit / (MIN_PAIRS * pair)
            prompt, gen = (max(min(size, smallest), int(size * scale))
                           for size, smallest in zip((settings.prompt, settings.gen), SMALLEST))
            if (prompt, gen) != (settings.prompt, settings.gen):
                settings = dataclasses.replace(settings, prompt=prompt, gen=gen)
                self.tell(f"samples shrunk to pp{prompt}/tg{gen}: {pair:.1f} s a pair at full size")
                pair = _warm_pair(runner, twin, settings)
        pairs = int(min(max(limit / max(pair, 1e-6), MIN_PAIRS), self.budget.lever_pairs))
        return dataclasses.replace(settings, pairs=pairs, warmups=0)

    def _floors(self, settings: ab.Settings) -> dict[str, float]:
        config = self.root.config
        traffic = Traffic(roofline.engine_weight_bytes(config, self.root.dtype_bytes), self.root.dtype_bytes)
        return {t.phase: floor_of(t, config, traffic, self.ceilings).seconds * settings.tokens_per_sample(t) / t.n
                for t in settings.tests}

    def _profile(self, base: TrialBase, phases: tuple[str, ...]) -> None:
        """Profile the phases not profiled yet; step seconds from the A/A block's first side (unprofiled)."""
        runner, settings = base.runner, base.settings
        for test in (t for t in settings.tests if t.phase in phases and t.phase not in base.breakdowns):
            tokens = tokens_for(test, runner.config.vocab_size)
            what = tokens.prompt if test.kind == "pp" else min(test.n, self.budget.profile_steps)
            profile = self.backend.profile(runner, test.phase, tokens.prefix, what)
            passes = 1 if test.kind == "pp" else settings.tokens_per_sample(test)
            base.breakdowns[test.phase] = from_profile(profile, base.noise[test.phase].aa[0].median / passes, None)

    def judge(self, base: TrialBase, candidate: Candidate) -> tuple[LeverResult | None, str, float]:
        """`ab` of base + candidate (B) against the base (A), the base's noise reused."""
        began = time.perf_counter()
        try:
            runner = self.backend.copy(self.root, candidate.config)
        except InputError as exc:
            return None, f"refused when built: {exc}", 0.0
        built = time.perf_counter() - began
        try:
            settings = dataclasses.replace(base.settings, warmups=max(1, self.budget.warmups))
            report = ab.run_ab(self.backend, {"A": base.runner, "B": runner}, settings,
                               lambda what: self.tell(f"{candidate.text}: {what}"), candidate.shares, self.evidence,
                               base.noise, self.kept)
        except InputError as exc:
            return None, f"refused when run: {exc}", built
        finally:
            self.backend.release(runner)
        warm = sum(sum(m.warmups) for m in report.measurements if m.spec.params.get("config") == "B")
        return LeverResult.from_report(candidate.text, report), "", built + warm

    def release(self, base: TrialBase) -> None:
        if base.owned:
            self.backend.release(base.runner)
        else:
            base.runner.drop_cache()


def _warm_pair(runner: Runner, twin: Runner, settings: ab.Settings) -> float:
    """Seconds of one pair (each side's last warm-up sample of each phase, after `settings.warmups` of them)."""
    pair = 0.0
    for r in (runner, twin):
        r.drop_cache()
        r.reset_cache(settings.context_needed)
        for test in settings.tests:
            sample = ab.sampler_of(r, test, settings.prompt_set)
            for _ in range(max(1, settings.warmups)):
                began = time.perf_counter()
                sample()
            pair += time.perf_counter() - began
    return pair
