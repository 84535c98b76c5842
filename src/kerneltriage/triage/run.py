"""`triage`: the three questions, asked in order for one model and workload on this device, then asked again after
every lever adopted — the climb — until nothing wins.

0 setup → 1 where time goes → 2 Q1 delete work → 3 Q2 fast paths → 4 Q3 dispatch/sync (the detectors, on the
configuration given) → 5 the climb (triage/climb.py: every applicable lever, winning kernel and speculation source
judged by `ab` against the configuration reached so far; the ladder) → 6 custom-kernel outlook (on the final
configuration's profile) → 7 recommendations (the ladder's rungs, the line to paste). Each stage measures through the
backend protocol, then hands plain data to the analyzers. Every finding goes to the ledger in one experiment (all of
it, or nothing on an interruption).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kerneltriage.core import roofline
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.memory import stored_blocks
from kerneltriage.engine.paths import shown
from kerneltriage.engine.probes import at_keys, distinct_calls
from kerneltriage.engine.speculative.config import Speculation
from kerneltriage.triage import amdahl, climbing, graphed, q1_delete, q2_fastpath, q3_dispatch
from kerneltriage.triage.breakdown import Breakdown, from_profile
from kerneltriage.triage.candidates import BUDGETS
from kerneltriage.triage.climb import FAVORS
from kerneltriage.triage.context import ContextCost, measure_context
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.ladder import Ladder
from kerneltriage.triage.report import Report
from kerneltriage.triage.setup import Budget, Workload, budget_for, measure_setup, phase_numbers
from kerneltriage.triage.shares import baseline_evidence

STAGES = ("setup", "where time goes", "Q1 delete work", "Q2 fast paths", "Q3 dispatch/sync", "climb",
          "custom-kernel outlook", "recommendations")
Progress = Callable[[int, str], None]
FULL_ROOFLINE_PCT = 100.0
CONTEXT_DEPTH_MIN = 64  # shallower, decode's cost of context is within the noise of a short decode
CPU_SDPA_NOTES = {"torch": "SDPA on the CPU: torch's CPU kernels, reported without timing claims",
                  "mlx": "SDPA on the CPU: MLX has no fused attention there (its composed ops run every call); the "
                         "gate table says what Metal and CUDA would run, by MLX's source"}


@dataclass
class _State:
    """What the stages hand each other."""

    backend: Backend
    runner: Runner
    workload: Workload
    budget: Budget
    gpu: bool
    options: "Options" = field(default_factory=lambda: Options())
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
    ladder: Ladder | None = None
    final: dict[str, Breakdown] = field(default_factory=dict)  # the final configuration's profile
    notes: list[str] = field(default_factory=list)
    deletable: dict[str, float] = field(default_factory=dict)  # Q1: lever → the fraction of its seams' share it deletes


@dataclass(frozen=True)
class Options:
    """What triage is asked beyond the workload: the climb's budget and favour, the user's prompts (speculation
    becomes a candidate, every decode sample runs over them), the --spec whose verify shapes the M-sweep covers, the
    kernel ledger's winners and a peer to stand the final configuration beside."""

    budget: str = "quick"
    favor: str = "balanced"
    prompt_set: Any = None
    speculation: Speculation | None = None
    kernels: tuple[str, ...] = ()
    peer: Callable[[RunConfig], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS or self.favor not in FAVORS:
            raise ValueError(f"triage options: budget {self.budget!r} in {BUDGETS}, favor {self.favor!r} in {FAVORS}")


def stage_setup(state: _State) -> None:
    """0: ceilings, model costs, floors, measured prefill and decode. A rate above the roofline is impossible: the
    cached ceilings are stale or were measured on a busy machine, so they are measured again and the phases
    re-judged against them."""
    state.setup, state.measured = measure_setup(state.backend, state.runner, state.workload, state.budget)
    over = [phase for phase in ("prefill", "decode") if state.setup[phase]["roofline_pct"] > FULL_ROOFLINE_PCT]
    if not over:
        return
    runner = state.runner
    ceilings = state.backend.ceilings(str(runner.device), runner.dtype, refresh=True)
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


def stage_delete(state: _State) -> None:
    """Q1: attention sparsity (real weights only), then the delete-work detectors (the levers are the climb's)."""
    runner, w = state.runner, state.workload
    sparsity = None
    if runner.config.random_weights:
        state.notes.append("sparse-V: not measured — random weights attend uniformly; needs a real model (the climb "
                           "takes sparse_v's ceiling as 1.000×)")
    else:
        sparsity = state.backend.attention_sparsity(runner)
    pad_id = getattr(runner.checkpoint.tokenizer, "pad_token_id", None)
    if pad_id is None:
        state.notes.append("padding: the tokenizer names no pad token; nothing to look for")
    _, prompt = w.prefill_tokens(runner.config.vocab_size)
    b = state.breakdown
    attention = b["decode"].shares.get(q1_delete.ATTENTION_CLASS, 0.0)
    state.deletable = q1_delete.deletable(sparsity)
    if sparsity is not None:
        state.notes.append(q1_delete.sparse_v_note(sparsity, attention))
    state.findings += q1_delete.analyze(b["prefill"].shares, b["decode"].shares, state.output_rows,
                                        state.calls["prefill"], prompt, pad_id, sparsity, None,
                                        runner.place.constrained)
    if runner.backend == "torch" and runner.device_type == "cpu" and runner.dtype != "bfloat16" \
            and not runner.run_config.has("quantized"):
        blocks, values = stored_blocks(runner.checkpoint, runner.dtype_bytes)
        read = roofline.engine_weight_bytes(runner.config, runner.dtype_bytes)
        found = q1_delete.blocks_read_as_values(blocks, values, read)
        state.findings += [] if found is None else [found]


def stage_fastpath(state: _State) -> None:
    """Q2: every recorded attention call's gates, the M-sweep, decode's cost of context, the fast-path findings."""
    backend, runner, w = state.backend, state.runner, state.workload
    # The profiled decode steps sit at the start of the generation: probe decode at its mean context instead.
    depth = w.decode_test.prefix_length + w.gen // 2
    state.gates = [backend.attention_gates(phase, at_keys(call, depth) if phase == "decode" else call, per_pass,
                                           str(runner.device))
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
    """Q3: the dispatch gap and the syncs per token with their call sites (the levers are the climb's)."""
    state.findings += q3_dispatch.analyze(state.breakdown["decode"], state.census["decode"], state.gpu)


def stage_climb(state: _State) -> None:
    """The climb from the configuration given; its trials and rungs become the measured findings, and the final
    configuration's profile feeds the outlook and Q3's look at its step."""
    routed = frozenset(f.lever for f in state.findings if f.lever and f.question == "fast-path")
    state.ladder, state.final = climbing.climb(state.backend, state.runner, state.workload, state.budget,
                                               state.setup, baseline_evidence(state.gates), state.options,
                                               state.tell, routed,
                                               {state.runner.run_config.text: dict(state.breakdown)},
                                               state.deletable)
    state.findings += climbing.findings(state.ladder)
    step = graphed.final_step(state.final.get("decode"), state.ladder.final)
    found = q3_dispatch.graphed_step(step, state.breakdown["decode"].class_kernels,
                                     graphed.structure(state.runner, state.ladder.final.lever_names), state.gpu)
    if found is not None:
        state.findings.append(found)


def stage_outlook(state: _State) -> None:
    """One 'kernel' finding per phase: the largest op class's ceilings beside the hand-kernel prior, on the final
    configuration's profile (what a kernel would race once the levers are on)."""
    for phase, b in (state.final or state.breakdown).items():
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


STAGE_FUNCTIONS = (stage_setup, stage_where, stage_delete, stage_fastpath, stage_dispatch, stage_climb, stage_outlook)


def triage(backend: Backend, runner: Runner, workload: Workload, progress: Progress | None = None,
           ledger: Any = None, label: str = "", options: Options | None = None) -> Report:
    """Ask the three questions for `runner` on `workload`, then climb; findings to `ledger` (one experiment)."""
    from kerneltriage.core.environment import capture_environment

    options = options or Options()
    state = _State(backend, runner, workload, budget_for(runner.device_type), runner.device_type == "cuda", options)
    config = {"model": runner.config.name or runner.checkpoint.source, "source": shown(runner.checkpoint.source),
              "random_weights": runner.config.random_weights, "backend": runner.backend,
              "device": str(runner.device), "dtype": runner.dtype, "levers": list(runner.run_config.lever_names),
              "run_config": runner.run_config.text,
              "workload": asdict(workload), "budget": asdict(state.budget), "climb_budget": options.budget,
              "favor": options.favor, "prompts": options.prompt_set.name if options.prompt_set else None,
              "spec": options.speculation.label if options.speculation else None}
    environment = capture_environment()
    opened = ledger.experiment("triage", config, environment, label) if ledger else nullcontext()
    with opened as exp:
        seconds = _run_stages(state, progress)
        report = Report(config, state.setup, state.breakdown, state.findings,
                        [g.to_dict() for g in state.gates],
                        [c.to_dict() | {"holes": q2_fastpath.sweep_holes(c)} for c in state.sweep], state.census,
                        {}, state.notes, seconds, state.context.to_dict() if state.context else {},
                        ladder=state.ladder, final_breakdown=state.final, environment=environment)
        if exp is not None:
            _record(exp, report, state.measured)
    report.experiment_id = None if exp is None else exp.id
    return report


def _stage_tell(progress: Progress, index: int, name: str) -> Callable[[str], None]:
    """What a stage says as it goes, shown under its own name and number."""
    return lambda what: progress(index, f"{name} — {what}")


def _run_stages(state: _State, progress: Progress | None) -> dict[str, float]:
    seconds = {}
    for index, (name, stage) in enumerate(zip(STAGES, STAGE_FUNCTIONS)):
        if progress is not None:
            progress(index, name)
            state.tell = _stage_tell(progress, index, name)
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
                                     "recommendations": [f.code for f in report.recommendations()],
                                     "ladder": report.ladder.to_dict() if report.ladder else None}))
