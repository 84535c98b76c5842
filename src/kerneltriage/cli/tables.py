"""Terminal tables that stay readable at 80 columns and never cut an identifier.

rich's default overflow ends a long cell in "…", which cut the very path a user copies into --model. Here
every cell folds onto further lines instead, and the identifier column keeps a minimum width.
"""

from __future__ import annotations

from typing import Sequence

from rich.table import Table
from rich.text import Text

IDENTIFIER_MIN_WIDTH = 12


def folded_table(title: str | None, columns: Sequence[str], fold: int = 0) -> Table:
    """A table whose cells wrap or fold, never truncate; column `fold` holds the identifier."""
    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, overflow="fold", min_width=IDENTIFIER_MIN_WIDTH if index == fold else None)
    return table


def add_row(table: Table, *cells: object) -> None:
    # Text() keeps labels such as "[graphs]" literal instead of parsing them as rich markup.
    table.add_row(*(Text("—" if c is None else str(c)) for c in cells))
