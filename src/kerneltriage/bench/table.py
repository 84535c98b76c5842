"""Bench rows: one per engine and test, with the roofline and the ratio to kerneltriage; rendered as a
terminal table, Markdown, CSV or JSON.

Rate = total tokens / total time (Measurement.rate). The ± is the IQR of the per-sample rates: a spread,
never an average. "vs kerneltriage" = this engine's rate / kerneltriage's on the same test (> 1: faster).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

from kerneltriage.bench.harness import ENGINE, TestResult
from kerneltriage.bench.workloads import Test
from kerneltriage.core import roofline, stats
from kerneltriage.core.units import format_bytes, format_duration, format_sig

COLUMNS = ("model", "engine", "test", "tok/s", "± IQR", "ms/tok", "first token", "% roofline", "peak memory",
           "vs kerneltriage")
KV_BYTES_LLAMA_CPP = 2  # llama.cpp's default KV cache type is f16


@dataclass(frozen=True)
class Traffic:
    """What one engine moves per forward pass: weight bytes as it holds them, bytes per KV element."""

    weight_bytes: float
    kv_dtype_bytes: int


@dataclass(frozen=True)
class Row:
    """One line of the bench table; numbers are None where there is no measurement (see `status`)."""

    model: str
    engine: str
    test: str
    status: str  # "ok", or why there is no number ("not installed", …)
    rate: float | None = None
    rate_iqr: float | None = None
    ms_per_token: float | None = None
    first_token_s: float | None = None
    roofline_pct: float | None = None
    bound: str | None = None
    peak_memory: int | None = None
    ratio: float | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"warnings": list(self.warnings)}


def floor_of(test: Test, config: roofline.ModelShape, traffic: Traffic, ceilings: roofline.Ceilings) -> roofline.Floor:
    """The roofline time of one sample of `test`."""
    cost_fn = roofline.prefill_cost if test.kind == "pp" else roofline.decode_cost
    depth = test.depth if test.kind == "pp" else test.prefix_length
    return roofline.floor(cost_fn(config, test.n, depth, traffic.weight_bytes, traffic.kv_dtype_bytes), ceilings)


def result_row(model: str, result: TestResult, floor: roofline.Floor | None, baseline: float | None) -> Row:
    """The row of one measured result; `baseline` is kerneltriage's rate on the same test."""
    m = result.timed
    rates = [m.spec.units_per_sample / t for t in m.samples]
    pct = None if floor is None else roofline.percent_of_roofline(m.total_time / m.n, floor.seconds)
    return Row(
        model, result.engine, result.test.name, "ok", m.rate, stats.iqr(rates), m.ms_per_unit,
        None if result.first_token is None else result.first_token.median,
        pct, None if floor is None else floor.bound, result.peak_memory,
        None if baseline is None else m.rate / baseline,
        tuple(c.code for c in m.warnings()),
    )


def build_rows(model: str, results: Sequence[TestResult], floors: Mapping[tuple[str, Test], roofline.Floor | None],
               missing: Iterable[tuple[str, str, str]] = ()) -> list[Row]:
    """Rows for every result (kerneltriage's first) plus (engine, test name, why) lines for gaps."""
    ours = {r.test: r.timed.rate for r in results if r.engine == ENGINE}
    rows = [result_row(model, r, floors.get((r.engine, r.test)), ours.get(r.test)) for r in results]
    rows += [Row(model, engine, test, why) for engine, test, why in missing]
    return rows


def _cells(row: Row) -> tuple[str, ...]:
    def maybe(value: float | None, fmt: Any) -> str:
        return "—" if value is None else fmt(value)

    if row.status != "ok":
        return (row.model, row.engine, row.test, row.status, *("—",) * (len(COLUMNS) - 4))
    return (
        row.model, row.engine, row.test, maybe(row.rate, format_sig), maybe(row.rate_iqr, format_sig),
        maybe(row.ms_per_token, format_sig), maybe(row.first_token_s, format_duration),
        maybe(row.roofline_pct, lambda p: f"{format_sig(p)}% ({row.bound})"),
        maybe(row.peak_memory, format_bytes), maybe(row.ratio, lambda r: f"{format_sig(r)}×"),
    )


def to_markdown(rows: Sequence[Row]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(COLUMNS), "|---" * len(COLUMNS) + "|", *(line(_cells(r)) for r in rows)]) + "\n"


def to_csv(rows: Sequence[Row]) -> str:
    out = io.StringIO()
    fields = list(Row.__dataclass_fields__)
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.to_dict() | {"warnings": ";".join(row.warnings)})
    return out.getvalue()


def to_json(rows: Sequence[Row], document: Mapping[str, Any]) -> str:
    """The rows inside `document` (config, ceilings, raw measurements, environment, …)."""
    return json.dumps({**document, "rows": [r.to_dict() for r in rows]}, indent=2, sort_keys=True) + "\n"


def to_rich(rows: Sequence[Row]) -> Any:
    """A rich Table (imported here: rich is for the terminal only)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title_justify="left")
    for i, column in enumerate(COLUMNS):
        table.add_column(column, justify="left" if i < 3 else "right")
    for row in rows:
        table.add_row(*(Text(c) for c in _cells(row)))
    return table
