"""Speculation's drafting, the step's choice and greedy acceptance on the device: steps that need no host between them.

The text (prompt + emitted tokens) lives in a device buffer `history` with its length in a device scalar. Around
each graphed step (backends/torch/resident.py):

- `draft` (before it): the longest suffix of the text, up to LOOKBACK tokens, that occurred earlier, at its
  latest occurrence (ties go to the later end) — prompt lookup and longest-match lookup, as the host's `ngram`
  and `suffix` drafters find it (their index over the whole text, ours a scan of it: O(length · LOOKBACK) loads;
  8.2 µs on the H200 for a ~300-token text, spec-profile-repetitive-h200-resident.json). The step's tokens are
  the text's last token and the ROWS - 1 tokens that followed that occurrence; a source that runs into the end of
  the text repeats with period last - end (the LZ77 copy of `suffix.copy_from`). Where nothing recurs the draft is
  the last token repeated. Writes the step's position (last) for the forward to read, and the step's `choice`:
  the suffix drafter's rule (`suffix.draft_length` with padded shapes) — 2, the widest verify, from a match of
  LONG_MATCH tokens; 1, the narrower one, from a match of 2 or more, or of one token whose every earlier
  occurrence went on with the same token; else 0, a plain step — and, from the host's `limits`, a plain step
  below a match of `least` tokens and no verify wider than the `widest`-th (the depth controller's: which match
  lengths have paid, and its k). Once the text has the run's `end` tokens the choice is DONE, past every body: the
  step runs none (a SWITCH node past its last body runs nothing) and its result reads [0 emitted, matched, 0 rows]
  — the step the host queued ahead of the last one costs ~5 µs, not a forward whose tokens nobody reads.
- `accept` (after the chosen forward, on its rows' argmaxes): greedy acceptance — the drafts kept while each
  equals the argmax of the row before it, then that argmax: exactly plain greedy decoding's tokens
  (`acceptance.greedy_accept`); one row is a plain step (its argmax). Appends every row's argmax to the text
  (those past the accepted ones lie beyond the new length: never read) and moves the length on; `out` = [tokens
  emitted, matched length, rows, the ROWS argmaxes] for the host to read later.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltriage.engine.speculative.resident import DONE
from kerneltriage.engine.speculative.suffix import LONG_MATCH

BLOCK = 1024  # candidate match ends scanned per round
MATCH_SHIFT = tl.constexpr(32)  # a candidate's score: (matched length << 32) + its end; its max is the longest, latest
NONE = tl.constexpr(1 << 40)  # above any token id: no one-token match seen yet


@triton.jit
def _draft(history, length_ptr, tokens, position_ptr, matched_ptr, choice_ptr, limits_ptr, out, ROWS: tl.constexpr,
           ROWS_P2: tl.constexpr, LOOKBACK: tl.constexpr, BLOCK: tl.constexpr, LONG: tl.constexpr,
           DONE: tl.constexpr):
    last = (tl.load(length_ptr) - 1).to(tl.int32)  # the text's last token: its suffix is matched
    lanes = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), -1, tl.int64)
    low = tl.full((BLOCK,), NONE, tl.int64)  # the least and greatest token after an earlier occurrence of the
    high = tl.full((BLOCK,), -1, tl.int64)  # last token (equal: every one went on the same way)
    start = 0
    while start < last:  # (a while: the text's length is read on the device)
        end = start + lanes  # candidate: an earlier occurrence of the suffix ending here (end < last)
        run = end < last
        matched = tl.zeros((BLOCK,), tl.int64)
        for i in tl.static_range(LOOKBACK):  # run: the last i tokens before `end` equal the suffix's
            # (loads independent of `run`: all LOOKBACK of them in flight at once, not one after another)
            here = tl.load(history + end - i, mask=(end >= i) & (end < last), other=-1)
            run = run & (end >= i) & (here == tl.load(history + tl.maximum(last - i, 0)))
            matched += run.to(tl.int64)
            if i == 0:
                after = tl.load(history + end + 1, mask=run, other=0)
                low = tl.minimum(low, tl.where(run, after, NONE))
                high = tl.maximum(high, tl.where(run, after, -1))
        score = tl.where(end < last, (matched << MATCH_SHIFT) + end, -1)
        best = tl.maximum(best, score)
        start += BLOCK
    top = tl.max(best, axis=0)
    source = tl.where(top >= 0, top & 0xFFFFFFFF, last - 1).to(tl.int32)  # (nothing before: the last token)
    period = tl.maximum(last - source, 1)
    rows = tl.arange(0, ROWS_P2)
    index = tl.where(rows == 0, last, source + 1 + (rows - 1) % period)
    tl.store(tokens + rows, tl.load(history + index, mask=rows < ROWS), mask=rows < ROWS)
    tl.store(position_ptr, last.to(tl.int64))
    length = tl.maximum(top, 0) >> MATCH_SHIFT
    tl.store(matched_ptr, length)
    agreed = tl.max(high, axis=0) == tl.min(low, axis=0)
    choice = tl.where(length >= LONG, 2, tl.where((length >= 2) | ((length == 1) & agreed), 1, 0))
    choice = tl.minimum(tl.where(length >= tl.load(limits_ptr + 1), choice, 0), tl.load(limits_ptr))
    done = last + 1 >= tl.load(limits_ptr + 2)  # the text has reached the run's end: no body runs
    tl.store(choice_ptr, tl.where(done, DONE, choice).to(tl.int32))
    head = tl.arange(0, 4)  # and the step's result says so: nothing emitted, no rows
    tl.store(out + head, tl.where(head == 1, length, 0), mask=done & (head < 3))


@triton.jit
def _accept(history, length_ptr, best_ptr, tokens, matched_ptr, out, ROWS: tl.constexpr, ROWS_P2: tl.constexpr):
    rows = tl.arange(0, ROWS_P2)
    best = tl.load(best_ptr + rows, mask=rows < ROWS, other=-1)
    drafted = tl.load(tokens + rows + 1, mask=rows + 1 < ROWS, other=-1)  # the draft row r's argmax is checked against
    miss = (rows + 1 >= ROWS) | (best != drafted)
    emitted = tl.min(tl.where(miss, rows, ROWS_P2), axis=0) + 1  # rows up to the first miss, its argmax included
    length = tl.load(length_ptr)
    tl.store(history + length + rows, best, mask=rows < ROWS)
    tl.store(out + 3 + rows, best, mask=rows < ROWS)
    tl.store(out, emitted.to(tl.int64))
    tl.store(out + 1, tl.load(matched_ptr))
    tl.store(out + 2, tl.full((), ROWS, tl.int64))
    tl.debug_barrier()  # every lane has read the length before it moves on
    tl.store(length_ptr, length + emitted)


def draft(history: torch.Tensor, length: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor,
          matched: torch.Tensor, choice: torch.Tensor, limits: torch.Tensor, out: torch.Tensor, lookback: int) -> None:
    """The step's tokens (1, ROWS) from the text: its last token, then what followed the longest earlier match
    of its suffix (≤ `lookback` tokens); `position` ← where the last token goes, `matched` ← the match's length,
    `choice` ← the step it calls for (0 plain, 1 and 2 the verify shapes) within `limits` = [widest, least, end],
    or DONE once the text has `end` tokens, `out`'s head then [0, matched, 0] (`accept` writes it otherwise).
    history (S,) long with room for ROWS more; length, position, matched () long; choice () and limits (3,) int32."""
    rows = tokens.shape[-1]
    _draft[(1,)](history, length, tokens, position, matched, choice, limits, out, ROWS=rows,
                 ROWS_P2=triton.next_power_of_2(rows), LOOKBACK=lookback, BLOCK=BLOCK, LONG=LONG_MATCH, DONE=DONE,
                 num_warps=4)


def accept(history: torch.Tensor, length: torch.Tensor, best: torch.Tensor, tokens: torch.Tensor,
           matched: torch.Tensor, out: torch.Tensor) -> None:
    """Greedy acceptance of the step of `tokens` (1, ROWS) whose rows' argmaxes are `best` (ROWS,) — one row: a
    plain step: the emitted tokens appended to the text; out (ROWS + 3,) ← [emitted, matched, ROWS, best…]."""
    rows = tokens.shape[-1]
    _accept[(1,)](history, length, best, tokens, matched, out, ROWS=rows,
                  ROWS_P2=max(2, triton.next_power_of_2(rows)), num_warps=1)
