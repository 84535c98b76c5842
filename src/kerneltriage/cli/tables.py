"""Terminal tables that stay readable at 80 columns and never cut an identifier.

rich's default overflow ends a long cell in "…", which cut the very path a user copies into --model. Here
every cell wraps at spaces or folds onto further lines instead; a short identifier (an id, a preset name) is
kept whole on its line.
"""

from __future__ import annotations

from typing import Sequence

from rich.table import Table
from rich.text import Text


def folded_table(title: str | None, columns: Sequence[str], whole: Sequence[int] = ()) -> Table:
    """A table whose cells wrap or fold, never truncate; the columns in `whole` never break (short ids)."""
    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, overflow="fold", no_wrap=index in whole)
    return table


def add_row(table: Table, *cells: object) -> None:
    # Text() keeps labels such as "[graphs]" literal instead of parsing them as rich markup.
    table.add_row(*(Text("—" if c is None else str(c)) for c in cells))
