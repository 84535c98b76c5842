"""`--html FILE`: the triage report as one self-contained HTML page, plots embedded as base64 PNG
(time breakdown, roofline position of prefill and decode, the M-sweep curves, SDPA backend times), written
atomically (a temporary file in the same folder, then renamed over the target).
"""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from pathlib import Path
from typing import Any

from kerneltriage.triage.report import QUESTION_TITLES, Report, gain_text

FIGURE_SIZE = (8.0, 4.0)  # inches
DPI = 100
BREAKDOWN_CLASSES = 10  # op classes drawn per phase; the rest are summed into "rest"
STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
         "h2{border-bottom:2px solid #888}code{background:#f4f4f4}")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory only
    import matplotlib.pyplot as plt

    return plt


def _img(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def breakdown_plot(report: Report) -> str:
    """Stacked horizontal bars: each phase's step split by op class (and the host/dispatch gap), one colour
    per class in both bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    names = list(dict.fromkeys(n for b in report.breakdown.values() for n in list(b.shares)[:BREAKDOWN_CLASSES]))
    colours = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names + ["rest"])}
    for y, b in enumerate(report.breakdown.values()):
        left = 0.0
        for name, share in b.shares.items():
            key = name if name in colours else "rest"
            ax.barh(y, share * 100, left=left, color=colours[key], label=key)
            left += share * 100
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_yticks(range(len(report.breakdown)), list(report.breakdown))
    ax.set_xlabel("% of the measured step")
    ax.set_title("where time goes")
    return _img(fig)


def roofline_plot(report: Report) -> str:
    """The roofline (min(peak, bandwidth × intensity)) with prefill and decode at their measured FLOP/s."""
    plt = _pyplot()
    ceilings, model = report.setup["ceilings"], report.setup["model"]
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    points = {}
    for phase in ("prefill", "decode"):
        numbers, cost = report.setup[phase], model[phase]
        passes = 1 if phase == "prefill" else report.config["workload"]["gen"]
        points[phase] = (cost["flops"] / cost["bytes"], cost["flops"] / (numbers["seconds_per_pass"] * passes))
    low = min(x for x, _ in points.values()) / 10
    high = max(max(x for x, _ in points.values()) * 10, ceilings["matmul_flops"] / ceilings["bandwidth"] * 10)
    xs = [low * (high / low) ** (i / 99) for i in range(100)]
    ax.loglog(xs, [min(ceilings["matmul_flops"], ceilings["bandwidth"] * x) for x in xs], "k-", label="roofline")
    for phase, (x, y) in points.items():
        ax.loglog([x], [y], "o", label=f"{phase}: {report.setup[phase]['roofline_pct']:.3g}% of roofline")
    ax.set_xlabel("FLOPs per byte moved")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"roofline ({ceilings['source']} ceilings)")
    ax.legend()
    return _img(fig)


def sweep_plot(report: Report) -> str:
    """Per-call time of every projection shape against M, holes marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    for curve in report.sweep:
        ax.plot(curve["rows"], [s * 1e6 for s in curve["seconds"]], "o-",
                label=f"{curve['name']} {curve['k']}→{curve['n']}")
        for hole in curve["holes"]:
            ax.plot([hole["rows"]], [curve["seconds"][curve["rows"].index(hole["rows"])] * 1e6], "rx", markersize=12)
    ax.set_xlabel("M (rows per call)")
    ax.set_ylabel("µs per call")
    ax.set_yscale("log")
    ax.set_title("M-sweep of the projections (x: a hole in the tuning grid)")
    if report.sweep:  # an empty sweep (no projection measured) has no curves to name
        ax.legend(fontsize=7)
    return _img(fig)


def sdpa_plot(report: Report) -> str:
    """Per-call time of each SDPA backend for every timed attention call ('' when nothing was timed)."""
    timed = [row for row in report.gates if row["seconds"]]
    if not timed:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    names = sorted({name for row in timed for name in row["seconds"]})
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([j + i * width for j in range(len(timed))], [row["seconds"].get(name, 0) * 1e6 for row in timed],
               width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(timed))],
                  [f"{row['phase']} q{row['call']['q'][2]} k{row['call']['k'][2]} d{row['call']['q'][3]}"
                   for row in timed])
    ax.set_ylabel("µs per call")
    ax.set_title("SDPA backends at the model's shapes")
    ax.legend(fontsize=7)
    return _img(fig)


def ladder_plot(report: Report) -> str:
    """Each rung's prefill and decode tok/s (log scale), the rung's added lever under it ('' without a ladder)."""
    if report.ladder is None:
        return ""
    plt = _pyplot()
    rungs = [rung.to_dict() for rung in report.ladder.rungs]
    fig, axes = plt.subplots(1, 2, figsize=(FIGURE_SIZE[0] * 1.5, FIGURE_SIZE[1]))
    for ax, phase in zip(axes, ("prefill", "decode")):
        ax.plot(range(len(rungs)), [r["rates"][phase] for r in rungs], "o-")
        ax.set_xticks(range(len(rungs)), [r["added"] or "start" for r in rungs], rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel(f"tok/s ({rungs[0]['tests'][phase]})")
        ax.set_title(f"{phase}: the ladder")
    return _img(fig)


def _ladder_html(report: Report) -> str:
    """The rungs and every candidate tried ('' without a ladder)."""
    ladder = report.ladder
    if ladder is None:
        return ""
    cell = lambda r: "-" if r is None else f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"  # noqa: E731
    rungs = [[i, d["added"] or "(start)", d["question"] or "-", cell(d["ratios"]["prefill"]),
              cell(d["ratios"]["decode"]), f"{d['rates']['prefill']:.4g}", f"{d['rates']['decode']:.4g}",
              "-" if d["kernels_per_token"] is None else f"{d['kernels_per_token']:.0f}"]
             for i, d in enumerate(r.to_dict() for r in ladder.rungs)]
    trials = [[t.round, t.candidate.text, t.result.verdict if t.result else "not timed",
               t.result.reason if t.result else t.note] for t in ladder.trials]
    return ("<h2>the climb</h2>" + ladder_plot(report)
            + _table(["rung", "added", "question", "prefill B/A", "decode B/A", "prefill tok/s", "decode tok/s",
                      "kernels/token"], rungs)
            + f"<p>stopped: {html.escape(ladder.stop)}; paste: <code>{html.escape(ladder.command_line())}</code></p>"
            + _table(["round", "candidate", "verdict", "why"], trials))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _gates_table(report: Report) -> str:
    columns = report.gate_columns()
    rows = [[g["phase"], f"q{g['call']['q']} k{g['call']['k']}", g["default"],
             *[("usable" if g["usable"].get(b) else "; ".join(g["reasons"].get(b, ["—"]))) for b in columns],
             ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in g["seconds"].items()) or "not timed"] for g in report.gates]
    return _table(["phase", "call", "default", *columns, "per call"], rows)


def _findings_html(report: Report) -> str:
    rows = [[f.question, f.title, gain_text(f), f.fix] for f in report.findings]
    return _table(["question", "finding", "gain", "fix"], rows)


def _fusion_html(report: Report) -> str:
    """The graphed step's fusion candidates ('' where Q3 after graphs found nothing)."""
    rows = [[r["candidate"], r["seam"], r["summary"], f"{r['kernels_removed']:.0f}", r["source"], f"{r['share']:.1%}",
             f"{r['ceiling']:.3f}×"] for r in report.fusion_candidates()]
    if not rows:
        return ""
    header = ["candidate", "seam", "what", "kernels removed / token", "counted from", "share", "ceiling"]
    return "<h2>fusion candidates of the graphed step (each ceiling alone)</h2>" + _table(header, rows)


def render_html(report: Report) -> str:
    """The whole page."""
    e = html.escape
    headlines = "".join(f"<li>{e(line)}</li>" for line in report.headlines())
    ranked = "".join(f"<li>{e(f.fix)} — {e(gain_text(f))}: {e(f.title)}</li>" for f in report.recommendations())
    notes = "".join(f"<li>{e(n)}</li>" for n in report.notes)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>kerneltriage: {e(report.config['model'])}"
            f"</title><style>{STYLE}</style></head><body><h1>kerneltriage triage — {e(report.config['model'])}</h1>"
            f"<ul>{headlines}</ul><h2>where time goes</h2>{breakdown_plot(report)}"
            f"<h2>roofline</h2>{roofline_plot(report)}<h2>{e(QUESTION_TITLES['fast-path'])}</h2>"
            f"{_gates_table(report)}{sdpa_plot(report)}{sweep_plot(report)}"
            f"{_ladder_html(report)}<h2>findings</h2>{_findings_html(report)}{_fusion_html(report)}<h2>recommendations</h2><ol>{ranked}</ol>"
            f"<h2>notes</h2><ul>{notes}</ul></body></html>\n")


def write_html(report: Report, path: Path) -> None:
    """Write the page atomically: readers see the old file or the whole new one."""
    text = render_html(report)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        # mkstemp makes the file 0600; a report is for sharing: the mode open() would give (0644 under umask 022)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
