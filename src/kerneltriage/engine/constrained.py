"""A constraint as a logits processor `(tokens, logits) → logits`: the tokens the grammar refuses get -inf.

Its state lives on the host (the grammar's matcher), so it needs each emitted token there. The token loops tell it
(`follow`) as soon as they read a token, right after queuing the next step: the mask for step i+1 is computed while
the device runs step i+1 (engine/decoding.py: `next_logits`). A path that does not tell it still gets the right
mask: the tokens it was not told about are read from the history (one sync) and looked ahead over, uncommitted —
which is also how speculative acceptance processes row i, after the history and the first i drafts.

Where the runner can compute the logits of a few rows only (`vocab_compact`), `rows` gives it the allowed ids when
there are at most that many: the step then skips the rest of the output projection (and the mask: the other rows are
-inf already).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from kerneltriage.engine.grammar import allowed_ids

if TYPE_CHECKING:
    from kerneltriage.engine.grammar import Grammar

Array = Any  # a backend's device array
# (logits (1, V), bitmask (⌈V/32⌉,) int32 on the host) → logits with the tokens whose bit is clear at -inf
Masking = Callable[[Array, np.ndarray], Array]


class ConstraintProcessor:
    """The processor of one generation: a fresh matcher of `grammar`, the backend's `masking` op; `offset` tokens of
    history (the prompt) come before the first token it follows."""

    def __init__(self, grammar: "Grammar", masking: Masking, offset: int) -> None:
        self.matcher, self.masking, self.offset = grammar.matcher(), masking, offset
        self.vocab = grammar.vocab
        self.cached: np.ndarray | None = None  # the mask of the current state, once computed
        self.compacted = False  # the current state's rows went to the step: its other logits are -inf already

    def follow(self, token: int) -> None:
        """A token this generation emitted, read on the host: commit it and compute the next mask now."""
        self.matcher.follow(token)
        self.cached, self.compacted = self.matcher.mask().copy(), False

    def mask(self) -> np.ndarray:
        if self.cached is None:
            self.cached = self.matcher.mask().copy()
        return self.cached

    def __call__(self, tokens: Array, logits: Array) -> Array:
        untold = len(tokens) - self.offset - self.matcher.followed
        if untold <= 0:
            return logits if self.compacted else self.masking(logits, self.mask())
        with self.matcher.ahead([int(t) for t in tokens[-untold:].tolist()]):  # one host sync
            return self.masking(logits, self.matcher.mask())

    def rows(self, limit: int) -> np.ndarray | None:
        """The ids allowed next when there are at most `limit` of them (else None: the full projection is cheaper).
        The step that gets them computes only those rows, so the mask is not applied to its logits again."""
        ids = allowed_ids(self.mask(), self.vocab) if limit > 0 else None
        self.compacted = ids is not None and len(ids) <= limit
        return ids if self.compacted else None
