"""Triage's climb stage: the climb run over the backend (triage/trials.py), its final confirmation against the
start, the peer beside the final configuration, and the ladder turned into measured findings per question."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from kerneltriage.bench import ab
from kerneltriage.core.errors import InputError
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.candidates import candidates
from kerneltriage.triage.climb import Climb
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.ladder import Ladder, Rung
from kerneltriage.triage.measure import LeverResult
from kerneltriage.triage.setup import Budget, Workload
from kerneltriage.triage.trials import TrialBase, Trials

CONFIRM_PAIRS = 8  # the final confirmation of the start against the final configuration: a fixed block, never fewer


def climb(backend: Backend, runner: Runner, workload: Workload, budget: Budget, setup: Mapping[str, Any],
          evidence: Mapping[str, str | None], options: Any, tell: Callable[[str], None],
          routed: frozenset[str] = frozenset(), known: Mapping[str, dict[str, Breakdown]] | None = None,
          deletable: Mapping[str, float] | None = None) -> tuple[Ladder, dict[str, Breakdown]]:
    """The ladder from the runner's configuration, confirmed against it, and the final configuration's profile.
    `routed`: the attention levers the gate audit named (the only gated levers tried); `known`: profiles already made
    (configuration text → phase → breakdown: the start's, from triage's own profile); `deletable`: Q1's measured
    fraction of a delete lever's seams it can delete (candidates.candidates)."""
    trials = Trials(backend, runner, workload, budget, Ceilings(**setup["ceilings"]), evidence, tell,
                    options.prompt_set, known=dict(known or {}))
    place = runner.place

    def propose(config: RunConfig, breakdowns: Mapping[str, Breakdown], start: Mapping[str, Breakdown]
                ) -> tuple[list, list]:
        return candidates(config, place, breakdowns, options.budget, options.kernels,
                          speculate=options.prompt_set is not None, routed=routed, reference=start,
                          deletable=deletable)

    seconds = budget.climb_limit(options.budget, setup["model"]["weight_bytes_per_token"])
    ladder, final = Climb(trials, propose, options.favor, seconds, tell).run(runner.run_config)
    assert isinstance(final, TrialBase), "the climb hands back a base its bench made"
    profile = dict(trials.profiled(final).breakdowns)
    try:
        if ladder.final != ladder.start:
            tell("confirming the final configuration against the start")
            ladder.confirmation = confirm(backend, runner, final, trials)
        if options.peer is not None:
            tell("the final configuration beside the peer")
            ladder.peer = options.peer(ladder.final)
    finally:
        trials.release(final)
    return ladder, profile


def confirm(backend: Backend, root: Runner, final: Any, trials: Trials) -> dict[str, Any]:
    """`ab` of the start (the user's runner, A) against the final configuration (B): a fixed block of at least
    CONFIRM_PAIRS pairs, outputs checked, the start's own A/A reused."""
    settings = dataclasses.replace(final.settings, pairs=max(CONFIRM_PAIRS, final.settings.pairs), sequential=False,
                                   winners_only=False, warmups=1)
    candidate = backend.copy(root, final.config)
    try:
        report = ab.run_ab(backend, {"A": root, "B": candidate}, settings, lambda what: None,
                           noise=trials.start_noise, kept=trials.kept)
    except InputError as exc:
        return {"verdict": "invalid", "reason": str(exc)}
    finally:
        backend.release(candidate)
        root.drop_cache()
    return report.summary()


def findings(ladder: Ladder) -> list[Finding]:
    """One measured finding per rung (its adopting A/B, the phase it gained most), and one per candidate tried
    and not adopted whose A/B was valid (its measured ratio, with ab's verdict)."""
    found = [_rung_finding(rung) for rung in ladder.rungs[1:]]
    adopted = {rung.added for rung in ladder.rungs}
    seen = set()
    for trial in reversed(ladder.trials):  # the latest judgement of each candidate
        text = trial.candidate.text
        if text in adopted or text in seen or trial.result is None or not trial.result.valid:
            continue
        seen.add(text)
        found.append(_finding(trial.result, trial.candidate.question, f"tried in round {trial.round}, not adopted"))
    return [f for f in found if f is not None]


def _best_phase(result: LeverResult) -> str:
    ratios = {p: result.ratio(p) or 0.0 for p in ("prefill", "decode") if p in result.phases}
    return max(ratios, key=lambda phase: ratios[phase]) if ratios else "decode"


def _rung_finding(rung: Rung) -> Finding | None:
    trial = rung.trial
    if trial is None or trial.result is None:
        return None
    return _finding(trial.result, rung.question, f"adopted in round {trial.round}")


def _finding(result: LeverResult, question: str, when: str) -> Finding | None:
    phase = _best_phase(result)
    ratio = result.ratio(phase)
    if ratio is None or ratio <= 0:
        return None
    text = result.lever
    spec = text.startswith("spec=")
    left_out = text.startswith("-")  # the stack's member whose removal won (a ",-" list: several together)
    fix = (f"--spec {text.removeprefix('spec=')}" if spec else
           f"leave {text.replace(',-', ', ').removeprefix('-')} out of --levers" if left_out else
           f"--levers {text.replace('+', ',')}")
    lever = None if spec or left_out or "+" in text else text.split("=")[0]
    return Finding(question, f"lever-{text}", f"{text}: {phase} {ratio:.2f}× ({result.verdict}; {when})",
                   {"ab": result.to_dict()}, ratio, ratio, "measured", fix, phase, lever)
