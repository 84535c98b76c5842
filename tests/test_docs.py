"""docs/levers.md is generated from the lever table: it must be the generator's output for the table as it stands,
and the generator must follow the Lever record's fields (a field added to the record shows up without a change)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kerneltriage.cli import docs
from kerneltriage.engine import levers

LEVERS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "levers.md"


def test_levers_page_is_current() -> None:
    assert LEVERS_PAGE.read_text() == docs.render_levers(), \
        "docs/levers.md is stale: python -m kerneltriage.cli.docs levers > docs/levers.md"


def test_every_row_and_every_set_field_is_on_the_page() -> None:
    page = docs.render_levers()
    for lever in levers.TABLE:
        assert f"### {lever.name}\n" in page and lever.summary in page
        for field in dataclasses.fields(lever):
            if field.name not in docs.HIDDEN_FIELDS and getattr(lever, field.name) not in (None, ()):
                assert f"**{field.name}**" in page


def test_a_new_field_appears_without_a_change_to_the_generator(monkeypatch) -> None:
    Wider = dataclasses.make_dataclass("Wider", [("cost_note", str, dataclasses.field(default=""))],
                                       bases=(levers.Lever,), frozen=True)
    row = Wider("graphs", "dispatch", "step", "replayed", cost_note="captured once per window")
    monkeypatch.setattr(levers, "TABLE", (row,))
    page = docs.render_levers()
    assert "- **cost_note**: captured once per window" in page and "[`graphs`](#graphs)" in page
