"""`triage`: the three questions, asked in order for one model and workload on this device.

0 setup → 1 where time goes → 2 Q1 delete work → 3 Q2 fast paths → 4 Q3 dispatch/sync →
5 custom-kernel outlook → 6 recommendations. Each stage measures through the backend protocol, then hands plain
data to the analyzers; every lever is judged by `ab` (triage/measure.py). Every finding goes to the ledger in
one experiment (all of it, or nothing on an interruption).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kerneltriage.bench.ab import Settings
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.levers import LEVERS, TABLE, LeverSetting
from kerneltriage.engine.probes import at_keys, distinct_calls
from kerneltriage.engine.speculative.config import Speculation
from kerneltriage.triage import amdahl, graphed, q1_delete, q2_fastpath, q3_dispatch
from kerneltriage.triage.breakdown import from_profile
from kerneltriage.triage.context import ContextCost, measure_context
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.measure import LeverResult, try_lever
from kerneltriage.triage.report import Report
from kerneltriage.triage.setup import Budget, Workload, budget_for, measure_setup, phase_numbers
from kerneltriage.triage.shares import baseline_evidence, lever_shares

STAGES = ("setup", "where time goes", "Q1 delete work", "Q2 fast paths", "Q3 dispatch/sync",
          "custom-kernel outlook", "recommendations")
# Dispatch levers A/B'd in triage: the table's, but the compiles (a warm-up of about a minute is beyond the budget)
# and pdl (it acts on fused_layer's kernels only).
NOT_MEASURED = {name: "compile warm-up (~1 min) is beyond triage's budget: measure it with `kerneltriage ab`"
                for name in ("compile", "compile_prefill")}
NOT_MEASURED["pdl"] = "acts on fused_layer's kernels only: measure `fused_layer,pdl` against `fused_layer` with ab"
DISPATCH_LEVERS = tuple(LeverSetting(lever) for lever in TABLE
                        if lever.question == "dispatch" and not lever.takes_value and lever.name not in NOT_MEASURED)
Progress = Callable[[int, str], None]
FULL_ROOFLINE_PCT = 100.0
CONTEXT_DEPTH_MIN = 64  # shallower, decode's cost of context is within the noise of a short decode
CPU_SDPA_NOTES = {"torch": "SDPA on the CPU: torch's CPU kernels, reported without timing claims",
                  "mlx": "SDPA on the CPU: MLX has no fused attention there (its composed ops run every call); the gate "
                         "table says what Metal and CUDA would run, by MLX's source"}


@dataclass
class _State:
    """What the stages hand each other."""

    backend: Backend
    runner: Runner
    workload: Workload
    budget: Budget
    gpu: bool
    speculation: Speculation | None = None  # what --spec asked for: the verify shapes the M-sweep covers
    tell: Callable[[str], None] = lambda what: None
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
    gains: dict[str, LeverResult] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def stage_setup(state: _State) -> None:
    """0: ceilings, model costs, floors, measured prefill and decode. A rate above the roofline is impossible: the
    cached ceilings are stale or were measured on a busy machine, so they are measured again and the phases
    re-judged against them."""
    state.setup, state.measured = measure_setup(state.backend, state.runner, state.workload, state.budget)
    over = [phase for phase in ("prefill", "decode") if state.setup[phase]["roofline_pct"] > FULL_ROOFLINE_PCT]
    if not over:
        return
    runner = state.runner
    ceilings = state.backend.ceilings(runner.device, runner.dtype, refresh=True)
    state.setup["ceilings"] = asdict(ceilings)
    for result in state.measured:
        state.setup[result.test.phase] = phase_numbers(result, runner.config, runner.dtype_bytes, ceilings)
    state.notes.append(f"{', '.join(over)} ran above 100% of the cached ceilings' roofline: they were measured "
                       "again (stale, or taken on a busy machine)")


def stage_where(state: _State) -> None:
    """Profile one prefill and the decode loop (recording attention calls), count host issue time and ops."""
    backend, runner, budget = state.backend, state.runner, state.budget
    prefix, prompt = state.workload.prefill_tokens(runner.config.vocab_size)
    decode_prefix = state.workload.decode_prefix(runner.config.vocab_size)
    prefill = backend.profile(runner, "prefill", prefix, prompt)
    decode = backend.profile(runner, "decode", decode_prefix, budget.profile_steps)
    host = backend.host_issue_seconds(runner, decode_prefix, budget.profile_steps)
    state.calls = {"prefill": list(prefill.attention_calls), "decode": list(decode.attention_calls)}
    state.passes = {"prefill": prefill.passes, "decode": decode.passes}
    state.output_rows = prefill.output_rows
    state.breakdown = {"prefill": from_profile(prefill, state.setup["prefill"]["seconds_per_pass"], None),
                       "decode": from_profile(decode, state.setup["decode"]["seconds_per_pass"], host)}
    state.census = {"prefill": backend.census(runner, "prefill", (), prompt[: budget.census_prompt]),
                    "decode": backend.census(runner, "decode", decode_prefix, budget.census_tokens)}


def _lever(state: _State, setting: LeverSetting) -> LeverResult | None:
    """The lever's `ab` on both phases at triage's sizes, or a note saying why it was not measured."""
    budget, w = state.budget, state.workload
    settings = Settings(prompt=min(w.prompt, budget.lever_prompt), gen=min(budget.lever_tokens, w.gen),
                        pairs=budget.lever_pairs, warmups=budget.warmups)
    shares = lever_shares(setting, state.breakdown)
    result = try_lever(state.backend, state.runner, setting, settings, shares, baseline_evidence(state.gates),
                       state.notes, lambda what: state.tell(f"{setting.text}: {what}"))
    if result is not None:
        state.gains[setting.text] = result
    return result


def stage_delete(state: _State) -> None:
    """Q1: the last_logits A/B, attention sparsity (real weights only), then the delete-work detectors."""
    runner, w = state.runner, state.workload
    last = None
    if runner.run_config.has("last_logits"):
        state.notes.append("last_logits: not measured — already on")
    else:
        last = _lever(state, LeverSetting(LEVERS["last_logits"]))
    sparsity = None
    if runner.config.random_weights:
        state.notes.append("sparse-V: not measured — random weights attend uniformly; needs a real model")
    else:
        sparsity = state.backend.attention_sparsity(runner)
    pad_id = getattr(runner.checkpoint.tokenizer, "pad_token_id", None)
    if pad_id is None:
        state.notes.append("padding: the tokenizer names no pad token; nothing to look for")
    _, prompt = w.prefill_tokens(runner.config.vocab_size)
    b = state.breakdown
    state.findings += q1_delete.analyze(b["prefill"].shares, b["decode"].shares, state.output_rows,
                                        state.calls["prefill"], prompt, pad_id, sparsity, last)


def stage_fastpath(state: _State) -> None:
    """Q2: every recorded attention call's gates, the M-sweep, decode's cost of context, the fast-path findings."""
    backend, runner, w = state.backend, state.runner, state.workload
    # The profiled decode steps sit at the start of the generation: probe decode at its mean context instead.
    depth = w.decode_test.prefix_length + w.gen // 2
    state.gates = [backend.attention_gates(phase, at_keys(call, depth) if phase == "decode" else call, per_pass,
                                           runner.device)
                   for phase, calls in state.calls.items()
                   for call, per_pass in distinct_calls(calls, state.passes[phase])]
    if not state.gpu:
        state.notes.append(CPU_SDPA_NOTES.get(runner.backend, CPU_SDPA_NOTES["torch"]))
    state.sweep = backend.sweep_projections(runner, sweep_rows(runner))
    budget = state.budget
    deepest = min(budget.context_depth, runner.config.max_context - budget.lever_tokens)
    if deepest >= CONTEXT_DEPTH_MIN:
        state.context = measure_context(runner, deepest, budget.lever_tokens, budget.repeats, budget.warmups)
    else:
        state.notes.append(f"decode's cost of context: not measured — a context of {runner.config.max_context} "
                           f"leaves no depth of {CONTEXT_DEPTH_MIN} to time")
    b = state.breakdown
    state.findings += q2_fastpath.analyze(state.gates, state.sweep, state.census,
                                          {p: b[p].shares for p in b}, {p: b[p].step_seconds for p in b}, state.gpu,
                                          state.setup["ceilings"]["bandwidth"], state.context, depth,
                                          runner.run_config.lever_names)


def sweep_rows(runner: Runner) -> tuple[int, ...] | None:
    """The M values to sweep: None (the default 1…16) without speculation, else 1 and the rows its verifies take —
    each padded shape where they are padded, each k + 1 the depth may pick otherwise."""
    decoder = runner.speculation
    if decoder is None:
        return None
    if decoder.shapes(runner):
        return (1, *decoder.shapes(runner))
    deepest = decoder.deepest(runner)
    return (1,) + tuple(k + 1 for k in ([deepest] if decoder.speculation.depth else range(1, deepest + 1)))


def stage_dispatch(state: _State) -> None:
    """Q3: every dispatch lever not already on, through `ab`, then the dispatch findings."""
    for setting in DISPATCH_LEVERS:
        if state.runner.run_config.has(setting.name):
            state.notes.append(f"{setting.text}: not measured — already on")
        else:
            _lever(state, setting)
    state.notes += [f"{name}: not measured — {why}" for name, why in NOT_MEASURED.items()
                    if not state.runner.run_config.has(name)]
    dispatch = {name: result for name, result in state.gains.items() if LEVERS[name.split("=")[0]].question == "dispatch"}
    state.findings += q3_dispatch.analyze(state.breakdown["decode"], state.census["decode"], dispatch, state.gpu)
    if state.gpu:  # no kernels to count on the CPU
        _graphed_step(state)


def _graphed_step(state: _State) -> None:
    """Q3 after graphs: the graphed step's kernels per token and the fusion candidates, when it is device-bound with
    many small kernels. Kernel counts per op class come from the baseline's profile (where it attributes them)."""
    step, note = graphed.graphed_decode(state.backend, state.runner, state.workload, state.budget,
                                        state.breakdown["decode"], state.gains)
    if note:
        state.notes.append(note)
    found = q3_dispatch.graphed_step(step, state.breakdown["decode"].class_kernels,
                                     graphed.structure(state.runner, graphed=True), state.gpu)
    if found is not None:
        state.findings.append(found)


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


def triage(backend: Backend, runner: Runner, workload: Workload, progress: Progress | None = None,
           ledger: Any = None, label: str = "", speculation: Speculation | None = None) -> Report:
    """Ask the three questions for `runner` on `workload`; findings to `ledger` (one experiment) when given.
    `speculation`: the --spec asked for (the M-sweep then covers its verify shapes)."""
    from kerneltriage.core.environment import capture_environment

    state = _State(backend, runner, workload, budget_for(runner.device_type), runner.device_type == "cuda",
                   speculation)
    config = {"model": runner.config.name or runner.checkpoint.source, "source": runner.checkpoint.source,
              "random_weights": runner.config.random_weights, "backend": runner.backend, "device": str(runner.device),
              "dtype": runner.dtype, "levers": list(runner.run_config.lever_names), "run_config": runner.run_config.text,
              "workload": asdict(workload), "budget": asdict(state.budget),
              "spec": speculation.label if speculation else None}
    opened = ledger.experiment("triage", config, capture_environment(), label) if ledger else nullcontext()
    with opened as exp:
        seconds = _run_stages(state, progress)
        report = Report(config, state.setup, state.breakdown, state.findings,
                        [g.to_dict() for g in state.gates],
                        [c.to_dict() | {"holes": q2_fastpath.sweep_holes(c)} for c in state.sweep], state.census,
                        {name: result.to_dict() for name, result in state.gains.items()}, state.notes, seconds,
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
            state.tell = lambda what, index=index, name=name: progress(index, f"{name} — {what}")
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
