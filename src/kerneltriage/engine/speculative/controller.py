"""The depth controller: picks the draft depth k before each step (0 = a plain step) from measured costs and
acceptance, switches speculation off while it does not pay, and back on as soon as shadow acceptance (what a
lookup drafter would have drafted during the plain steps, engine/speculative/shadow.py) says it pays again."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median

from kerneltriage.engine.speculative.config import AUTO_MAX_DEPTH, AUTO_START_DEPTH, padded_rows
from kerneltriage.engine.speculative.suffix import LONG_MATCH

WARMUP_STEPS = 3  # verify steps between two judgements of the depth
CALIBRATION_STEPS = 2  # plain steps that measure the plain step's cost before auto depth first speculates
DECAY = 0.8  # weight kept by older steps in the acceptance estimates: they follow the text within ~5 steps
COST_WINDOW = 8  # costs are medians of the last steps: one slow step (a hiccup) decides nothing
SHRINK_MARGIN = 0.02  # padded: the deepest k whose estimate is within this of the best one is kept
COOLDOWN_STEPS = 32  # plain steps after speculation is switched off, doubled at each switch-off: a drafter
MAX_COOLDOWN = 512  # without shadows (a model) is re-probed after them; with shadows, they decide instead
SHADOW_MIN = 4  # shadow tokens scored since the switch-off before they may switch speculation back on
RESUME_SPEEDUP = 1.05  # estimated speed-up at which shadows switch it back on: above 1, so it does not flap
YIELD_WINDOW = 16  # resident: the recent verify steps whose tokens per second judge whether they pay
YIELD_MIN = 8  # resident: verify steps seen in a run before they are judged
MATCH_BUCKETS = (1, 2, 3, 4, LONG_MATCH)  # resident: match lengths from which verifies are judged apart
BUCKET_MIN = 3  # resident: verifies from a bucket's matches seen before it is judged
REPROBE_STEPS = 128  # resident: plain steps after which the least match a verify needs comes down a bucket (32
# instead, H200: copy_heavy 2.99× → 2.75–2.80× and summarize 1.35× → 1.41× on one machine, repetitive 3.26× →
# 3.33× and held-out 2.01× → 2.01× on two: a trade, not a win; spec-*-h200-suffix-resident-{reprobe128,reprobe32*}.json)
SHADOW_PRIOR = 0.5  # hits and misses added at each position when shadows judge (1, Laplace's, outweighed what the
# deep positions see — ~5 decayed counts at most — and kept a 6-plain-step verify off on text that would pay 2×)


def _rate(seen: "deque[tuple[int, float]]") -> float:
    """Tokens per second over (tokens, seconds) pairs."""
    tokens, seconds = (sum(column) for column in zip(*seen))
    return tokens / seconds if seconds > 0 else float("inf")


@dataclass(frozen=True)
class Decision:
    """A change of draft depth made by the controller, for the summary."""

    step: int  # decode steps taken when it was made
    depth: int  # 0 = speculation off
    reason: str


class DepthController:
    """Picks the draft depth k before each step (0 = a plain step) from what earlier steps accepted and cost.

    A step drafting j tokens emits E(j) = 1 + Σ_{i<j} Π_{m≤i} α_m tokens, α_m = P(draft m accepted | drafts
    before it accepted), and costs C(j) = plain + j·(draft per token + verify per extra row): a line through the
    measured plain step (M = 1) and the measured verify steps (costs are medians of recent steps); padded, the
    verify's part is what the shape a draft of j is padded to (config.padded_rows) measured, a line through the
    others until it has been seen. Speculating
    pays while E(j)·plain > C(j); k is set to the best j ≤ k + 1, and when even that loses, speculation is off
    until shadow drafts (scored for free during plain steps, `observe_shadow`) bring the estimate back to
    RESUME_SPEEDUP — with the measured costs kept from before; a drafter that cannot shadow waits out a cooldown of
    plain steps and re-measures — unless even a draft accepted every time would lose at the measured costs (a
    drafter slower per token than a plain step: the eager EAGLE head on the H200), which keeps it off for good.
    Padded (a verify costs its padded shape's price, so C(j) steps up only where j
    needs a larger shape), any j is an option and the deepest one within SHRINK_MARGIN of the best is kept. A fixed
    depth (`depth` given) is never changed.
    """

    def __init__(self, depth: int | None, max_depth: int = AUTO_MAX_DEPTH, padded: bool = False) -> None:
        self.adaptive = depth is None
        self.depth = depth or (max_depth if padded else AUTO_START_DEPTH)
        self.max_depth = max(self.depth, max_depth)
        # Padded: a verify has its padded shape's rows (graph capture), so its cost steps with k rather than grows:
        # auto depth starts at the deepest, which measures the largest shape too.
        self.padded = padded
        self.decisions: list[Decision] = []
        self.steps = self.plain_seen = self.cooldown = self.shadows = 0
        self.off = False  # speculation switched off by the cost model
        self.next_cooldown = COOLDOWN_STEPS
        self.plain_costs: deque[float] = deque(maxlen=COST_WINDOW)
        self.draft_costs: deque[float] = deque(maxlen=COST_WINDOW)  # seconds per drafted token
        self.row_costs: deque[float] = deque(maxlen=COST_WINDOW)  # verify seconds per row beyond the first
        self.shape_costs: dict[int, deque[float]] = {}  # padded: verify seconds beyond a plain step, by rows
        # resident steps (engine/speculative/resident.py): the device chooses each step and its shape from the text,
        # so the controller only judges whether its verifies pay — by what they emitted per second
        self.resident = False
        self.yields: deque[tuple[int, float]] = deque(maxlen=YIELD_WINDOW)  # (tokens emitted, seconds) per verify
        self.matches: dict[int, deque[tuple[int, float]]] = {  # the same, by match length
            start: deque(maxlen=YIELD_WINDOW) for start in MATCH_BUCKETS}
        self.least = 1  # the least match length a resident verify needs (the device's limit)
        self.plain_since = 0  # resident plain steps since `least` last changed
        self._reset_estimates()

    def carry_over(self, earlier: "DepthController") -> None:
        """Go on from an earlier run's controller on the same runner (same device, same verify rows): its measured
        costs, so there are no calibration steps before the first draft, and whether speculation was off — a run
        where drafts did not pay makes the next one start plain, to come back on through shadows (each run starting
        with three verifies to judge cost a float32 copy-heavy set 4% on the H200, where a verify costs ~6 plain
        steps). Acceptance and k start afresh: the text is new (an earlier text's misses at position 1 kept a k = 1
        from growing again). A fixed depth carries nothing: it never decides."""
        if not (self.adaptive and earlier.adaptive and earlier.max_depth == self.max_depth):
            return
        for mine, theirs in ((self.plain_costs, earlier.plain_costs), (self.draft_costs, earlier.draft_costs),
                             (self.row_costs, earlier.row_costs)):
            mine.extend(theirs)
        for rows, costs in earlier.shape_costs.items():
            self.shape_costs[rows] = deque(costs, maxlen=COST_WINDOW)
        self.plain_seen = min(earlier.plain_seen, CALIBRATION_STEPS)
        self.off, self.cooldown, self.next_cooldown = earlier.off, earlier.cooldown, earlier.next_cooldown
        for start, seen in earlier.matches.items():  # which match lengths paid: the same model and domain
            self.matches[start].extend(seen)
        self.least, self.plain_since = earlier.least, earlier.plain_since

    def _reset_estimates(self) -> None:
        """Acceptance starts afresh (the text may have changed); measured costs are kept."""
        self.reached = [0.0] * self.max_depth
        self.accepted = [0.0] * self.max_depth
        self.until_judged = WARMUP_STEPS
        self.shadows = self.reach = 0  # shadow tokens scored, and the positions they reached, since the reset

    @property
    def deepest(self) -> int:
        """The largest k this controller can ask for."""
        return self.max_depth if self.adaptive else self.depth

    def next_depth(self) -> int:
        if self.adaptive and (self.plain_seen < CALIBRATION_STEPS or self.off):
            return 0
        return self.depth

    def observe_match(self, matched: int, tokens: int, seconds: float) -> None:
        """Resident: a verify drafted from a match of `matched` tokens emitted `tokens` in `seconds`."""
        start = max(start for start in MATCH_BUCKETS if start <= max(matched, 1))
        self.matches[start].append((tokens, seconds))

    def observe_plain(self, seconds: float | None) -> None:
        """A plain step taken; `seconds` its cost, None where it was not measured."""
        self.steps += 1
        if self.resident and self.least > 1 and not self.off:  # shorter matches' verifies tried again now and then
            self.plain_since += 1
            if self.plain_since >= REPROBE_STEPS:
                lower = max(start for start in MATCH_BUCKETS if start < self.least)
                self.matches[lower].clear()
                self._limit(lower, f"{REPROBE_STEPS} plain steps: verifies from matches of {lower}+ tokens again")
        if seconds is not None:
            self.plain_seen += 1
            self.plain_costs.append(seconds)
        if self.off and self.cooldown:
            self.cooldown -= 1
            if not self.cooldown and self.shadows < SHADOW_MIN:  # no shadows to judge by: re-measure
                self.off = False
                self._decide(self.depth, f"speculation back on at k={self.depth}: re-measuring acceptance")

    def observe_shadow(self, position: int, hit: bool) -> None:
        """A shadow draft's token at `position` was (or was not) the one emitted: what a verify would have
        accepted. Position 0 opens a new draft, so the older ones decay then, as at a verify. While off, switches
        speculation back on as soon as the estimate pays."""
        if position == 0:
            self.reached = [DECAY * r for r in self.reached]
            self.accepted = [DECAY * a for a in self.accepted]
        if position < self.max_depth:
            self.reached[position] += 1
            self.accepted[position] += hit
            self.reach = max(self.reach, position + 1)
        self.shadows += 1
        if not (self.adaptive and self.off and self.shadows >= SHADOW_MIN and self.row_costs):
            return
        # Judged at the depth the shadows reached, each rate with SHADOW_PRIOR: the shadows see a few tokens per
        # position, and taken as they come (or the last one extrapolated to positions nobody saw) a lucky run of hits
        # promised up to 16 tokens per verify — speculation flapped on and off where it loses.
        speedup = self.speedup(self.reach, SHADOW_PRIOR)
        if speedup >= RESUME_SPEEDUP:
            # padded, a k costs its shape's price: the deepest within the margin; else no deeper than seen; resident,
            # the device picks each step's shape within k: the deepest (a shallower k would forbid its long verifies)
            best = self.max_depth if self.resident else self._options(self.max_depth)[1] if self.padded else self.reach
            self.off, self.cooldown = False, 0
            tokens = self.expected_tokens(self.reach, SHADOW_PRIOR)
            self._decide(best, f"shadow drafts: {tokens:.2f} tok/step over {self.reach} positions, est. speed-up "
                               f"{speedup:.2f}×: speculation back on at k={best}")

    def _learn(self, drafted: int, accepted: int) -> None:
        """Decayed counts of the positions a verify checked (0..min(accepted, drafted-1)) and accepted."""
        self.reached = [DECAY * r + (i <= min(accepted, drafted - 1)) for i, r in enumerate(self.reached)]
        self.accepted = [DECAY * a + (i < accepted) for i, a in enumerate(self.accepted)]

    def observe_verify(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rows: int) -> None:
        """A verify step of `drafted` tokens (`rows` computed, padding included) kept `accepted` of them."""
        self.steps += 1
        self._learn(drafted, accepted)
        if self.resident:
            self.yields.append((accepted + 1, verify_s))
        self.draft_costs.append(draft_s / drafted)
        if self.plain_costs:
            extra = max(verify_s - median(self.plain_costs), 0.0)
            self.row_costs.append(extra / max(rows - 1, 1))
            if self.padded:
                self.shape_costs.setdefault(rows, deque(maxlen=COST_WINDOW)).append(extra)
        self.until_judged -= 1
        if self.adaptive and self.row_costs and self.until_judged <= 0:
            self._judge()

    def expected_tokens(self, depth: int, prior: float = 0.0) -> float:
        """E(depth); a position never reached takes the rate of the last one that was. `prior`: that many hits and
        as many misses added at each position (a rate seen a few times is pulled towards ½)."""
        return self._expected(depth, prior)[-1]

    def _expected(self, depth: int, prior: float) -> list[float]:
        """[E(0), E(1), …, E(depth)], in one pass over the positions."""
        tokens, chain, rate = [1.0], 1.0, 0.0
        for reached, accepted in zip(self.reached[:depth], self.accepted[:depth]):
            rate = (accepted + prior) / (reached + 2 * prior) if reached > 1e-3 else rate
            chain *= rate
            tokens.append(tokens[-1] + chain)
        return tokens

    def speedup(self, depth: int, prior: float = 0.0) -> float:
        """Estimated E(depth)·plain / C(depth): above 1, speculating at this depth beats plain decode."""
        return self._speedups(depth, prior, only=depth)[depth]

    def _speedups(self, top: int, prior: float = 0.0, only: int | None = None,
                  tokens: list[float] | None = None) -> dict[int, float]:
        """The estimated speed-up of every k ≤ top (or of `only`), deepest first, at the estimated E(k) (or `tokens`,
        E(0)…E(top)); the costs' medians taken once (the controller judges on the host between a verify and the next
        draft, while the device waits)."""
        plain, draft = median(self.plain_costs), median(self.draft_costs)
        tokens, extra = tokens or self._expected(top, prior), {}
        speedups = {}
        for j in ([only] if only is not None else range(top, 0, -1)):
            rows = padded_rows(j, self.deepest) if self.padded else j + 1
            if rows not in extra:
                extra[rows] = self._verify_extra(rows)
            speedups[j] = tokens[j] * plain / (plain + j * draft + extra[rows])
        return speedups

    def _verify_extra(self, rows: int) -> float:
        """A verify of `rows` rows beyond a plain step: padded, its shape's measured cost where it was seen; else a
        line through every verify seen (seconds per row beyond the first)."""
        seen = self.shape_costs.get(rows) if self.padded else None
        return median(seen) if seen else (rows - 1) * median(self.row_costs)

    def _options(self, top: int) -> tuple[int, int, dict[int, float]]:
        """(the fastest k, the k to take, estimated speed-up per k ≤ top). Padded, the k that share a shape cost the
        verify the same: a shallower one saves drafting time only, and the positions it stops drafting are no longer
        observed (an early miss would pin k for good): the deepest option within SHRINK_MARGIN of the best is taken.
        Unpadded, a tie goes to the deeper one."""
        options = self._speedups(top)
        fastest = max(options, key=options.__getitem__)
        floor = max(options[fastest] * (1.0 - (SHRINK_MARGIN if self.padded else 0.0)), 1.0)
        best = next((j for j, speedup in options.items() if speedup >= floor), fastest)
        return fastest, best, options

    def _judge(self) -> None:
        self.until_judged = WARMUP_STEPS
        if self.resident:
            self._judge_yield()
            return
        fastest, best, options = self._options(self.max_depth if self.padded else min(self.depth + 1, self.max_depth))
        if options[fastest] < 1.0:
            self._switch_off(fastest, options[fastest])
            return
        if best != self.depth:
            kept = f", the deepest within {SHRINK_MARGIN:.0%} of k={fastest}'s {options[fastest]:.2f}×" \
                if best != fastest else ""
            self._decide(best, f"k {self.depth}→{best}: est. speed-up {options[best]:.2f}×{kept} "
                               f"(k={self.depth}: {options[self.depth]:.2f}×)")

    def _judge_yield(self) -> None:
        """Resident steps: the device chooses each step and its shape where a match is, so the controller judges
        what the verifies emitted per second against plain steps — by the match they were drafted from (a verify
        from a one-token match pays on some texts and not on others; acceptance by position, averaged over matches of
        every length, says nothing about the next one) — and no depth (the device picks each shape). A match length
        whose verifies lose raises the least match a verify needs above it; when the recent verifies lose as a whole,
        speculation is off."""
        plain, least = median(self.plain_costs), 1
        if plain <= 0.0:  # no plain step measured a cost (a clock too coarse): nothing to judge against
            return
        for start, above in zip(MATCH_BUCKETS, MATCH_BUCKETS[1:] + (self.max_depth + 2,)):
            seen = self.matches[start]
            if len(seen) >= BUCKET_MIN and _rate(seen) * plain < 1.0:
                least = above
        if least != self.least:
            self._limit(least, f"verifies from matches of {least}+ tokens (shorter ones emitted fewer tokens per "
                               f"second than plain steps)")
        if len(self.yields) < YIELD_MIN:
            return
        tokens, seconds = (sum(column) for column in zip(*self.yields))
        if tokens * plain >= seconds:
            return
        self.off = True
        self.cooldown, self.next_cooldown = self.next_cooldown, min(2 * self.next_cooldown, MAX_COOLDOWN)
        steps = len(self.yields)
        self._decide(0, f"resident verifies: {tokens / steps:.2f} tok/step at {seconds / steps * 1e3:.2f} ms against "
                        f"a plain step's {plain * 1e3:.2f} ms (est. {tokens * plain / seconds:.2f}×): speculation off "
                        f"for {self.cooldown} steps, or until shadow drafts pay")
        self._reset_estimates()
        self.yields.clear()

    def _limit(self, least: int, reason: str) -> None:
        self.least, self.plain_since = least, 0
        self.decisions.append(Decision(self.steps, self.depth, reason))

    def ceiling(self) -> float:
        """The best speed-up any k could reach were every draft accepted (E(k) = k + 1) at the measured costs."""
        top = self.max_depth if self.padded else min(self.depth + 1, self.max_depth)
        return max(self._speedups(top, tokens=[j + 1.0 for j in range(top + 1)]).values())

    def _switch_off(self, best: int, speedup: float) -> None:
        tokens, plain = self.expected_tokens(best), median(self.plain_costs) * 1e3
        self.off = True
        ceiling = self.ceiling()
        if ceiling < 1.0:  # no acceptance pays for this drafter's cost: re-measuring it would only cost steps
            self.cooldown = 0
            self._decide(0, f"drafting {median(self.draft_costs) * 1e3:.2f} ms per token against a plain step's "
                            f"{plain:.2f} ms: even every draft accepted, est. {ceiling:.2f}× at best — speculation "
                            "off for good on this runner")
        else:
            self.cooldown, self.next_cooldown = self.next_cooldown, min(2 * self.next_cooldown, MAX_COOLDOWN)
            self._decide(0, f"{tokens:.2f} tok/step × plain {plain:.2f} ms = {tokens * plain:.2f} ms < "
                            f"{tokens * plain / speedup:.2f} ms per step at k={best}: speculation off for "
                            f"{self.cooldown} steps, or until shadow drafts pay")
        self.depth = self.max_depth if self.padded else best
        self._reset_estimates()

    def _decide(self, depth: int, reason: str) -> None:
        self.decisions.append(Decision(self.steps, depth, reason))
        if depth:
            self.depth = depth

