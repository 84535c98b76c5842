"""The triage report as terminal sections (rich renderables), in stage order, ending with the headlines."""

from __future__ import annotations

from typing import Any, Iterable

from rich.console import RenderableType
from rich.rule import Rule
from rich.table import Table

from kerneltriage.core.units import format_bandwidth, format_bytes, format_duration, format_flops, format_sig
from kerneltriage.triage.report import QUESTION_TITLES, Report, gain_text

OUTLOOK_ROWS = 6  # op classes shown per phase in the outlook
REASON_CHARS = 90  # a refused backend's first reason, cut to this length


def _pct(share: float) -> str:
    return f"{share:.1%}"


def _phase_line(name: str, numbers: dict[str, Any], unit: str) -> str:
    return (f"{name} {numbers['test']}: {format_sig(numbers['rate'])} tok/s, "
            f"{format_duration(numbers['seconds_per_pass'])}{unit} measured vs floor "
            f"{format_duration(numbers['floor_seconds_per_pass'])}{unit} ({numbers['bound']}-bound) → "
            f"{format_sig(numbers['roofline_pct'])}% of roofline")


def _setup(report: Report) -> Iterable[RenderableType]:
    s, c = report.setup, report.setup["ceilings"]
    yield Rule("0 setup")
    yield (f"{report.config['model']} ({report.config['source']}) on {s['device']}, {s['dtype']}, "
           f"levers: {', '.join(report.config['levers']) or 'none'}")
    yield (f"ceilings ({c['source']}): copy {format_bandwidth(c['bandwidth'])}, "
           f"matmul {format_flops(c['matmul_flops'])}; "
           f"model {format_sig(s['model']['params'] / 1e6)} M params, "
           f"{format_bytes(s['model']['weight_bytes_per_token'])} of weights read per token")
    yield _phase_line("prefill", s["prefill"], "")
    yield _phase_line("decode", s["decode"], "/token")


def _where(report: Report) -> Iterable[RenderableType]:
    yield Rule("1 where time goes (share of the measured step; device time from the profiler)")
    pre, dec = report.breakdown["prefill"], report.breakdown["decode"]
    table = Table("op class", "prefill", "decode", "decode per token")
    for name in dict.fromkeys([*dec.shares, *pre.shares]):
        seconds = dec.class_seconds.get(name)
        table.add_row(name, _pct(pre.shares.get(name, 0.0)), _pct(dec.shares.get(name, 0.0)),
                      "—" if seconds is None else format_duration(seconds))
    yield table
    step = f"decode step: {format_duration(dec.step_seconds)} measured, "
    if report.config["device"].startswith("cpu"):  # no kernels, launches or runtime syncs to count on the CPU
        yield step + (f"op time {format_duration(dec.device_seconds)} "
                      f"(the rest {_pct(dec.gap_share)}: Python, framework)")
        return
    host = "—" if dec.host_seconds is None else format_duration(dec.host_seconds)
    yield (step + f"device busy {format_duration(dec.device_seconds)} (idle {_pct(dec.gap_share)}), host issue {host}; "
           f"per token {dec.kernels_per_token:.0f} kernels, {dec.launches_per_token:.0f} launches, "
           f"{dec.sync_calls_per_token:.1f} runtime syncs")


def _findings(report: Report, question: str) -> Iterable[RenderableType]:
    found = report.by_question(question)
    for f in found:
        measured = "" if f.measured_gain is None else f", estimated {format_sig(f.estimated_gain)}×"
        yield f"• {f.title} — {gain_text(f)}{measured}\n    fix: {f.fix}"
    if not found:
        yield "• silent: no detector fired"


def _gates_table(report: Report) -> Table:
    columns = report.gate_columns()
    table = Table("phase", "call", "default", *columns, "per call")
    for row in report.gates:
        call = row["call"]
        cells = [("yes" if row["usable"].get(b) else ((row["reasons"].get(b) or ["no"])[0][:REASON_CHARS]))
                 if row["usable"] else "—" for b in columns]
        times = ", ".join(f"{name} {format_duration(s)}" for name, s in row["seconds"].items()) or "not timed (cpu)"
        table.add_row(row["phase"], f"q{list(call['q'])} k{list(call['k'])} ×{row['calls_per_pass']:g}",
                      row["default"], *cells, times)
    return table


def _families(curve: dict) -> str:
    """'cpu qmm_t; metal qmv→qmm_splitk@13': each device's kernel family over the swept M, where it changes."""
    parts = []
    for device, names in curve.get("kernels", {}).items():
        steps = [names[0]] + [f"{name}@{m}" for m, name, before in zip(curve["rows"][1:], names[1:], names)
                              if name != before]
        parts.append(f"{device} {'→'.join(steps)}")
    return "; ".join(parts)


def _sweep_table(report: Report) -> Table:
    kernels = any(curve.get("kernels") for curve in report.sweep)
    table = Table("projection", "K→N", "weights", "M", "per call (min–max)", "M=1 reads", "holes",
                  *(("kernel family by M",) if kernels else ()))
    copy = report.setup["ceilings"]["bandwidth"]
    for curve in report.sweep:
        rate = curve["weight_bytes"] / curve["seconds"][0]
        reads = f"{rate / 1e9:,.0f} GB/s ({rate / copy:.0%} of copy)" if curve["timer"] == "cuda graph replay" \
            else "— (one weight, cache-resident)"
        table.add_row(curve["name"], f"{curve['k']}→{curve['n']}", str(curve["weights"]),
                      f"{curve['rows'][0]}…{curve['rows'][-1]}",
                      f"{format_duration(min(curve['seconds']))}–{format_duration(max(curve['seconds']))}",
                      reads,
                      ", ".join(f"{h['kind']} @ M={h['rows']} ({h['ratio']:.2f}×)" for h in curve["holes"]) or "none",
                      *((_families(curve),) if kernels else ()))
    return table


def _fastpath(report: Report) -> Iterable[RenderableType]:
    yield Rule(f"3 {QUESTION_TITLES['fast-path']}")
    yield _gates_table(report)
    yield _sweep_table(report)
    for phase, census in report.census.items():
        yield (f"{phase} op census per {'token' if phase == 'decode' else 'prefill'}: {census['casts']:.1f} casts, "
               f"{census['strided_copies']:.1f} non-contiguous copies, {census['cpu_ops']:.1f} CPU ops")
    yield from _findings(report, "fast-path")


def _ratio_cell(ratio: dict | None) -> str:
    """'1.062 [1.031, 1.090]' (an interval record), or '-'."""
    if ratio is None:
        return "-"
    return f"{ratio['estimate']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def _dispatch(report: Report) -> Iterable[RenderableType]:
    yield Rule(f"4 {QUESTION_TITLES['dispatch']}")
    sites = report.census.get("decode", {}).get("readback_sites", {})
    yield "readbacks per token: " + (", ".join(f"{site} ×{n:g}" for site, n in sites.items()) or "none")
    yield from _findings(report, "dispatch")


def _grouped(refused: Iterable[Any]) -> dict[str, list[str]]:
    """Refusals by reason, each lever named once (a lever's values share its reason: `sdpa_backend`, not each)."""
    grouped: dict[str, list[str]] = {}
    for r in refused:
        names = grouped.setdefault(r.why, [])
        name = r.text.split("=")[0]
        if name not in names:
            names.append(name)
    return grouped


def _climb(report: Report) -> Iterable[RenderableType]:
    """The ladder: one row per rung, then what was tried, refused, why it stopped, the confirmation and the peer."""
    ladder = report.ladder
    if ladder is None:
        return
    yield Rule("5 the climb: each rung judged by ab against the one below")
    table = Table("rung", "added", "question", "prefill B/A [CI]", "decode B/A [CI]", "prefill tok/s", "decode tok/s",
                  "% roofline p/d", "kernels/token", "warm-up")
    for i, rung in enumerate(ladder.rungs):
        d = rung.to_dict()
        table.add_row(str(i), d["added"] or "(start)", d["question"] or "-", _ratio_cell(d["ratios"]["prefill"]),
                      _ratio_cell(d["ratios"]["decode"]),
                      *(f"{format_sig(d['rates'][p])} ({d['tests'][p]})" for p in ("prefill", "decode")),
                      " / ".join(format_sig(d["roofline_pct"][p]) for p in ("prefill", "decode")),
                      "-" if d["kernels_per_token"] is None else f"{d['kernels_per_token']:.0f}",
                      f"{d['warmup_s']:.1f} s")
    yield table
    tried = Table("round", "candidate", "against", "verdict", "prefill B/A", "decode B/A", "s",
                  title="every candidate tried, in the order tried")
    for trial in ladder.trials:
        t = trial.to_dict()
        tried.add_row(str(t["round"]), t["candidate"]["text"], t["base"], t["verdict"] or "not timed",
                      *("-" if t["ratios"][p] is None else f"{t['ratios'][p]:.3f}" for p in ("prefill", "decode")),
                      f"{t['seconds']:.1f}")
    yield tried
    untimed = {(t.candidate.text, t.note): None for t in ladder.trials if t.result is None}
    yield from (f"not timed: {text} — {note}" for text, note in untimed)
    yield from (f"not a candidate ({why}): {', '.join(names)}" for why, names in _grouped(ladder.refused).items())
    yield f"stopped: {ladder.stop} ({ladder.rounds} round(s), {ladder.seconds:.0f} s)"
    if ladder.confirmation is not None:
        c = ladder.confirmation
        ratios = ", ".join(f"{p['phase']} {p['ratio']['estimate']:.2f}× [{p['ratio']['low']:.2f}, "
                           f"{p['ratio']['high']:.2f}]" for p in c.get("phases", []))
        yield f"confirmed: start → final {ratios}: {c['verdict']} — {c['reason']}"
    if ladder.peer is not None:
        yield f"beside {ladder.peer.get('peer', 'the peer')}: " + ", ".join(
            f"{row['test']} {format_sig(row['ours'])} vs {format_sig(row['theirs'])} tok/s ({row['ratio']:.2f}×)"
            for row in ladder.peer.get("rows", []))
    yield f"paste: {ladder.command_line() or '(nothing: the configuration given is the best found)'}"


def _fusion(report: Report) -> Iterable[RenderableType]:
    """The graphed step's fusion candidates, each ceiling that candidate alone (nothing where Q3 found none)."""
    rows = report.fusion_candidates()
    if not rows:
        return
    table = Table("fusion candidate (graphed step)", "seam", "kernels removed / token", "counted from", "share",
                  "ceiling", title="each ceiling alone: the candidates overlap")
    for row in rows:
        table.add_row(row["candidate"], row["seam"], f"{row['kernels_removed']:.0f}", row["source"],
                      _pct(row["share"]), f"{row['ceiling']:.3f}×")
    yield table


def _outlook(report: Report) -> Iterable[RenderableType]:
    yield Rule("6 custom-kernel outlook on the final configuration (Amdahl; hand kernels come back at 0.5–0.8× of "
               "stock)")
    table = Table("phase", "op class", "share", "if free", "if 2× faster", "at the prior")
    for phase, rows in report.outlook().items():
        for row in rows[:OUTLOOK_ROWS]:
            table.add_row(phase, row.op, _pct(row.share), f"{row.if_free:.3f}×", f"{row.if_2x:.3f}×",
                          f"{row.prior_low:.3f}–{row.prior_high:.3f}×")
    yield table


def _recommendations(report: Report, shared: str | None = None) -> Iterable[RenderableType]:
    yield Rule("7 recommendations: the ladder's rungs, in order")
    ranked = report.recommendations()
    for i, f in enumerate(ranked, start=1):
        yield f"{i}. {f.fix} — {gain_text(f)}: {f.title}"
    if not ranked:
        yield "no change gains more than the noise here"
    yield from (f"note: {note}" for note in report.notes)
    yield Rule("headlines")
    if shared:
        yield (f"WARNING: the machine was shared during triage ({shared}): the rates below were measured beside "
               "another load and may be far from a quiet machine's; run it again alone")
    yield from report.headlines()


def sections(report: Report, shared: str | None = None) -> list[RenderableType]:
    """Every section in stage order (`shared`: why the machine was shared, warned beside the headlines)."""
    return [*_setup(report), *_where(report), Rule(f"2 {QUESTION_TITLES['delete']}"), *_findings(report, "delete"),
            *_fastpath(report), *_dispatch(report), *_climb(report), *_fusion(report), *_outlook(report),
            *_recommendations(report, shared)]
