"""Ledger exports: JSON (everything, raw samples included), CSV (one row per measurement), Markdown."""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kerneltriage.core.measurement import Measurement
from kerneltriage.core.units import format_duration, format_rate, format_sig

if TYPE_CHECKING:
    from kerneltriage.core.ledger import ExperimentRecord

FORMATS = ("md", "csv", "json")
EXPERIMENT_COLUMNS = ("experiment_id", "created", "kind", "experiment_label", "verdict")
MEASUREMENT_COLUMNS = ("measurement", "phase", "unit", "units_per_sample")
DERIVED_COLUMNS = ("n", "median_s", "iqr_s", "mad_s", "rate_per_s", "ms_per_unit", "warnings")
CSV_COLUMNS = EXPERIMENT_COLUMNS + MEASUREMENT_COLUMNS + DERIVED_COLUMNS + ("samples_json", "warmups_json")
MD_COLUMNS = ("measurement", "phase", "n", "median", "IQR", "rate", "ms/unit", "warnings")


def derived(m: Measurement) -> dict[str, Any]:
    """The statistics a reader wants next to the raw samples (re-derivable from them)."""
    return {
        "n": m.n,
        "median_s": m.median,
        "iqr_s": m.iqr,
        "mad_s": m.mad,
        "rate_per_s": m.rate,
        "ms_per_unit": m.ms_per_unit,
        "warnings": [c.code for c in m.warnings()],
    }


def to_json(records: Sequence[ExperimentRecord]) -> str:
    """All experiments as one JSON document; each measurement carries its raw samples and derived stats."""
    experiments = []
    for record in records:
        data = record.to_dict()
        data["measurements"] = [m.to_dict() | {"derived": derived(m)} for m in record.measurements]
        experiments.append(data)
    return json.dumps({"experiments": experiments}, indent=2, sort_keys=True) + "\n"


def _csv_row(record: ExperimentRecord, m: Measurement | None) -> list[Any]:
    row = [record.id, record.created, record.kind, record.label, record.verdict or ""]
    if m is None:
        return row + [""] * (len(CSV_COLUMNS) - len(row))
    stats = derived(m)
    stats["warnings"] = ";".join(stats["warnings"])
    row += [m.spec.label, m.spec.phase, m.spec.unit, m.spec.units_per_sample]
    row += [stats[column] for column in DERIVED_COLUMNS]
    return row + [json.dumps(list(m.samples)), json.dumps(list(m.warmups))]


def to_csv(records: Sequence[ExperimentRecord]) -> str:
    """One row per measurement (an experiment without measurements gets one row of its own)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record in records:
        for m in record.measurements or (None,):
            writer.writerow(_csv_row(record, m))
    return out.getvalue()


def _md_row(cells: Sequence[object]) -> str:
    escaped = (str(c).replace("|", "\\|").replace("\n", " ") for c in cells)
    return "| " + " | ".join(escaped) + " |"


def _md_experiment(record: ExperimentRecord) -> list[str]:
    title = f"## #{record.id} {record.kind}" + (f" — {record.label}" if record.label else "")
    lines = [title, "", f"- created: {record.created}", f"- verdict: {record.verdict or '—'}"]
    lines.append(f"- config: `{json.dumps(record.config, sort_keys=True)}`")
    if record.summary:
        lines.append(f"- summary: `{json.dumps(record.summary, sort_keys=True)}`")
    if record.measurements:
        lines += ["", _md_row(MD_COLUMNS), "|---" * len(MD_COLUMNS) + "|"]
        lines += [_md_row(measurement_cells(m)) for m in record.measurements]
    if record.findings:
        lines += [""] + [f"- **[{f.question}] {f.code}** — {f.title}" for f in record.findings]
    return lines + [""]


def measurement_cells(m: Measurement) -> tuple[str, ...]:
    """One measurement as human-readable cells, in the order of MD_COLUMNS."""
    warnings = ", ".join(c.code for c in m.warnings()) or "—"
    median, iqr = format_duration(m.median), format_duration(m.iqr)
    rate, per_unit = format_rate(m.rate, m.spec.unit), format_sig(m.ms_per_unit)
    return (m.spec.label, m.spec.phase, str(m.n), median, iqr, rate, per_unit, warnings)


KERNEL_COLUMNS = ("#", "kernel", "seam", "correctness", "isolation chained", "isolation queued", "prefill e2e",
                  "decode e2e", "verdict")


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}×"


def kernel_ledger(records: Sequence[ExperimentRecord]) -> list[str]:
    """The kernel ledger: one row per `kernel` experiment — wins, losses, neutral, no-lever and invalid alike."""
    kernels = [r for r in records if r.kind == "kernel" and r.summary]
    if not kernels:
        return []
    lines = ["## Kernel ledger", "", _md_row(KERNEL_COLUMNS), "|---" * len(KERNEL_COLUMNS) + "|"]
    for r in kernels:
        s, lanes = r.summary, r.summary.get("isolation", {})
        lines.append(_md_row((r.id, f"`{s['kernel']}`", s["seam"], s["correctness"], _ratio(lanes.get("chained")),
                              _ratio(lanes.get("queued")), _ratio(s.get("prefill")), _ratio(s.get("decode")),
                              r.verdict or "checked only")))
    return lines + [""]


def to_markdown(records: Sequence[ExperimentRecord]) -> str:
    """A human-readable report: the kernel ledger first, then one section per experiment, a table of its
    measurements, its findings."""
    lines = ["# kerneltriage ledger", ""] + kernel_ledger(records)
    if not records:
        lines += ["No experiments recorded.", ""]
    for record in records:
        lines += _md_experiment(record)
    return "\n".join(lines)


_EXPORTERS: dict[str, Callable[[Sequence["ExperimentRecord"]], str]] = {
    "md": to_markdown,
    "csv": to_csv,
    "json": to_json,
}


def export(records: Sequence[ExperimentRecord], fmt: str) -> str:
    """`records` rendered in one of FORMATS."""
    if fmt not in _EXPORTERS:
        raise ValueError(f"ledger export: format must be one of {FORMATS}, got {fmt!r}")
    return _EXPORTERS[fmt](records)
