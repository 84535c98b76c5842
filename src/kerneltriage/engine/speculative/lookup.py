"""The lookup drafters by name (prompt lookup, suffix match): framework-free, so every backend builds them alike."""

from __future__ import annotations

from kerneltriage.engine.speculative.config import Speculation
from kerneltriage.engine.speculative.draft import Drafter
from kerneltriage.engine.speculative.ngram import NgramDrafter
from kerneltriage.engine.speculative.suffix import SuffixDrafter


def lookup_drafter(speculation: Speculation) -> Drafter | None:
    """The drafter of a lookup source (`ngram`, `suffix`); None for a source that needs a model."""
    if speculation.source == "ngram":
        return NgramDrafter(speculation.ngram_max)
    if speculation.source == "suffix":
        return SuffixDrafter(speculation.suffix_max, speculation.tree_nodes)
    return None
