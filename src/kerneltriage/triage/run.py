"""`triage`: the three questions, asked in order for one model and workload on this device.

0 setup → 1 where time goes → 2 Q1 delete work → 3 Q2 fast paths → 4 Q3 dispatch/sync →
5 custom-kernel outlook → 6 recommendations. Each stage measures, then hands plain data to the analyzers;
every finding goes to the ledger in one experiment (all of it, or nothing on an interruption).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kerneltriage.bench.workloads import Test
from kerneltriage.core.errors import InputError
from kerneltriage.engine.levers import LEVERS
from kerneltriage.triage import amdahl, q1_delete, q2_fastpath, q3_dispatch
from kerneltriage.triage.breakdown import from_profile
from kerneltriage.triage.context import ContextCost, measure_context
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.measure import LeverGain, measure_lever
from kerneltriage.triage.report import Report
from kerneltriage.triage.setup import Budget, Workload, budget_for, measure_setup

STAGES = ("setup", "where time goes", "Q1 delete work", "Q2 fast paths", "Q3 dispatch/sync",
          "custom-kernel outlook", "recommendations")
# Dispatch levers A/B'd in triage. compile=* are left out: their warm-up (about a minute) exceeds the budget.
DISPATCH_LEVERS = tuple(name for name, lever in LEVERS.items()
                        if lever.question == "dispatch" and not name.startswith("compile="))
NOT_MEASURED = {name: "compile warm-up (~1 min) is beyond triage's budget: measure it with `kerneltriage ab`"
                for name in LEVERS if name.startswith("compile=")}
Progress = Callable[[int, str], None]
FULL_ROOFLINE_PCT = 100.0
CONTEXT_DEPTH_MIN = 64  # shallower, decode's cost of context is within the noise of a short decode


@dataclass
class _State:
    """What the stages hand each other."""

    runner: Any
    workload: Workload
    budget: Budget
    spec: str | None
    gpu: bool
    setup: dict[str, Any] = field(default_factory=dict)
    measured: list = field(default_factory=list)  # the setup's harness results (ledger measurements)
    breakdown: dict = field(default_factory=dict)
    calls: dict[str, list] = field(default_factory=dict)  # recorded SDPA calls per phase
    passes: dict[str, int] = field(default_factory=dict)
    output_rows: tuple[int, ...] = ()
    census: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    gates: list = field(default_factory=list)
    sweep: list = field(default_factory=list)
    context: ContextCost | None = None
    gains: dict[str, LeverGain] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def stage_setup(state: _State) -> None:
    """0: ceilings, model costs, floors, measured prefill and decode."""
    state.setup, state.measured = measure_setup(state.runner, state.workload, state.budget)
    for phase in ("prefill", "decode"):
        pct = state.setup[phase]["roofline_pct"]
        if pct > FULL_ROOFLINE_PCT:  # faster than the device's limit: the limit is wrong, not the run
            state.notes.append(f"{phase} ran at {pct:.0f}% of roofline: the ceilings are too low (measured on a "
                               "busy machine?); re-measure with `kerneltriage ceilings --refresh`")


def stage_where(state: _State) -> None:
    """Profile one prefill and the decode loop (recording attention calls), count host issue time and ops."""
    from kerneltriage.backends.torch import census, profile

    runner, vocab, budget = state.runner, state.runner.config.vocab_size, state.budget
    prefix, prompt = state.workload.prefill_tokens(vocab)
    decode_prefix = state.workload.decode_prefix(vocab)
    prefill = profile.profile_prefill(runner, prefix, prompt, warmup=state.gpu)  # CPU: the setup just ran it
    decode = profile.profile_decode(runner, decode_prefix, budget.profile_steps)
    host = profile.host_issue_seconds(runner, decode_prefix, budget.profile_steps) if state.gpu else None
    state.calls = {"prefill": list(prefill.attention_calls), "decode": list(decode.attention_calls)}
    state.passes = {"prefill": prefill.passes, "decode": decode.passes}
    state.output_rows = prefill.output_rows
    state.breakdown = {"prefill": from_profile(prefill, state.setup["prefill"]["seconds_per_pass"], None),
                       "decode": from_profile(decode, state.setup["decode"]["seconds_per_pass"], host)}
    state.census = {"prefill": census.census_prefill(runner, prompt[: budget.census_prompt]).per(1),
                    "decode": census.census_decode(runner, decode_prefix, budget.census_tokens).per(budget.census_tokens)}


def _lever_gain(state: _State, lever: str, test: Any) -> LeverGain | None:
    """The lever's A/B, or a note saying why it was not measured."""
    try:
        gain = measure_lever(state.runner, lever, test, state.budget.lever_pairs, state.budget.warmups)
    except InputError as exc:
        state.notes.append(f"{lever}: not measured — {exc}")
        return None
    state.gains[lever] = gain
    return gain


def stage_delete(state: _State) -> None:
    """Q1: the last_logits A/B, attention sparsity (real weights only), then the delete-work detectors."""
    from kerneltriage.backends.torch.sparsity import attention_sparsity, passage_tokens

    runner, w = state.runner, state.workload
    test = Test("pp", min(w.prompt, state.budget.lever_prompt), w.depth)
    last = _lever_gain(state, "last_logits", test) if "last_logits" in LEVERS else None
    sparsity = None
    if runner.config.random_weights:
        state.notes.append("sparse-V: not measured — random weights attend uniformly; needs a real model")
    else:
        sparsity = attention_sparsity(runner, passage_tokens(runner))
    pad_id = getattr(runner.checkpoint.tokenizer, "pad_token_id", None)
    if pad_id is None:
        state.notes.append("padding: the tokenizer names no pad token; nothing to look for")
    _, prompt = w.prefill_tokens(runner.config.vocab_size)
    b = state.breakdown
    state.findings += q1_delete.analyze(b["prefill"].shares, b["decode"].shares, state.output_rows,
                                        state.calls["prefill"], prompt, pad_id, sparsity, last)


def stage_fastpath(state: _State) -> None:
    """Q2: every recorded attention call's gates, the M-sweep, then the fast-path findings."""
    from kerneltriage.backends.torch import gates, msweep

    device, w = state.runner.device, state.workload
    # The profiled decode steps sit at the start of the generation: probe decode at its mean context instead.
    depth = w.decode_test.prefix_length + w.gen // 2
    state.gates = [gates.gate_row(phase, gates.at_keys(call, depth) if phase == "decode" else call, per_pass, device)
                   for phase, calls in state.calls.items()
                   for call, per_pass in gates.distinct_calls(calls, state.passes[phase])]
    if not state.gpu:
        state.notes.append("SDPA on the CPU: torch's CPU kernels, reported without timing claims")
    state.sweep = msweep.m_sweep(state.runner.model, device, sweep_rows(state.spec))
    budget = state.budget
    deepest = min(budget.context_depth, state.runner.config.max_context - budget.lever_tokens)
    if deepest >= CONTEXT_DEPTH_MIN:
        state.context = measure_context(state.runner, deepest, budget.lever_tokens, budget.repeats, budget.warmups)
    else:
        state.notes.append(f"decode's cost of context: not measured — a context of "
                           f"{state.runner.config.max_context} leaves no depth of {CONTEXT_DEPTH_MIN} to time")
    b = state.breakdown
    state.findings += q2_fastpath.analyze(state.gates, state.sweep, state.census,
                                          {p: b[p].shares for p in b}, {p: b[p].step_seconds for p in b}, state.gpu,
                                          state.setup["ceilings"]["bandwidth"], state.context, depth,
                                          state.runner.levers)


def sweep_rows(spec: str | None) -> tuple[int, ...] | None:
    """The M values to sweep: None (the default 1…16) without --spec, else 1 and the verify rows k + 1."""
    if not spec:
        return None
    from kerneltriage.engine.speculative import AUTO_MAX_DEPTH, parse_spec

    depth = parse_spec(spec).depth
    return (1,) + tuple(k + 1 for k in ([depth] if depth else range(1, AUTO_MAX_DEPTH + 1)))


def stage_dispatch(state: _State) -> None:
    """Q3: an A/B of every dispatch lever on a short decode, then the dispatch findings."""

    test = Test("tg", min(state.budget.lever_tokens, state.workload.gen), state.workload.depth)
    for lever in DISPATCH_LEVERS:
        _lever_gain(state, lever, test)
    state.notes += [f"{name}: not measured — {why}" for name, why in NOT_MEASURED.items()]
    dispatch = {name: gain for name, gain in state.gains.items() if name in DISPATCH_LEVERS}
    state.findings += q3_dispatch.analyze(state.breakdown["decode"], state.census["decode"], dispatch, state.gpu)


def stage_outlook(state: _State) -> None:
    """One 'kernel' finding per phase: the largest op class's ceilings beside the hand-kernel prior."""
    for phase, b in state.breakdown.items():
        rows = amdahl.outlook(b.op_shares)
        if not rows:
            continue
        top = rows[0]
        state.findings.append(Finding(
            "kernel", f"kernel-outlook-{phase}",
            f"{top.op} is {top.share:.0%} of {phase}: free → {top.if_free:.2f}×, 2× faster → {top.if_2x:.2f}×; "
            f"a hand kernel at {amdahl.HAND_KERNEL_PRIOR[0]}–{amdahl.HAND_KERNEL_PRIOR[1]}× of stock → "
            f"{top.prior_low:.2f}–{top.prior_high:.2f}×",
            {"outlook": [row.to_dict() for row in rows]}, top.if_2x, None, "ceiling",
            "answer the three questions first; a custom kernel only where no stock fast path exists", phase))


STAGE_FUNCTIONS = (stage_setup, stage_where, stage_delete, stage_fastpath, stage_dispatch, stage_outlook)


def triage(runner: Any, workload: Workload, spec: str | None = None, progress: Progress | None = None,
           ledger: Any = None, label: str = "") -> Report:
    """Ask the three questions for `runner` on `workload`; findings to `ledger` (one experiment) when given."""
    from kerneltriage.core.environment import capture_environment

    state = _State(runner, workload, budget_for(runner.device), spec, runner.device.type == "cuda")
    config = {"model": runner.config.name or runner.checkpoint.source, "source": runner.checkpoint.source,
              "random_weights": runner.config.random_weights, "device": str(runner.device),
              "dtype": str(runner.dtype).removeprefix("torch."), "levers": list(runner.levers),
              "workload": asdict(workload), "spec": spec, "budget": asdict(state.budget)}
    opened = ledger.experiment("triage", config, capture_environment(), label) if ledger else nullcontext()
    with opened as exp:
        seconds = _run_stages(state, progress)
        report = Report(config, state.setup, state.breakdown, state.findings,
                        [g.to_dict() for g in state.gates],
                        [c.to_dict() | {"holes": q2_fastpath.sweep_holes(c)} for c in state.sweep], state.census,
                        {name: gain.to_dict() for name, gain in state.gains.items()}, state.notes, seconds,
                        state.context.to_dict() if state.context else {})
        if exp is not None:
            _record(exp, report, state.measured)
    report.experiment_id = None if exp is None else exp.id
    return report


def _run_stages(state: _State, progress: Progress | None) -> dict[str, float]:
    seconds = {}
    for index, (name, stage) in enumerate(zip(STAGES, STAGE_FUNCTIONS)):
        if progress is not None:
            progress(index, name)
        started = time.perf_counter()
        stage(state)
        seconds[name] = time.perf_counter() - started
    if progress is not None:
        progress(len(STAGE_FUNCTIONS), STAGES[-1])
    return seconds


def _record(exp: Any, report: Report, results: list) -> None:
    from kerneltriage.triage.report import jsonable

    for result in results:
        for measurement in result.measurements:
            exp.add_measurement(measurement)
    for finding in report.findings:
        exp.add_finding(finding.question, finding.code, finding.title, jsonable(finding.to_dict()))
    exp.set_verdict(None, jsonable({"headlines": report.headlines(), "answers": report.answers(),
                                     "recommendations": [f.code for f in report.recommendations()]}))
