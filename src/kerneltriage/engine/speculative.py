"""Speculative decoding, framework-free: the `--spec` configuration, prompt-lookup drafting on token lists,
the record a run keeps, and the controller that shrinks the draft depth or switches speculation off.

The backends run the drafters and the verify forward; everything here is plain Python on token ids and seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Iterable

from kerneltriage.core.errors import InputError

if TYPE_CHECKING:
    from kerneltriage.engine.checkpoint import Checkpoint

SOURCES = ("ngram", "selfdraft", "draft")
MAX_DEPTH = 16  # deepest --spec-depth accepted
AUTO_START_DEPTH = 4  # where --spec-depth auto begins
AUTO_MAX_DEPTH = 8  # auto grows k no further
DEFAULT_NGRAM = 3  # ngram: longest context suffix matched
SPEC_HELP = "ngram[:N] | selfdraft[:L] | draft:MODEL"
VOCAB_PROBE = "The quick brown fox → 42 façades, 東京 and `def f(x): return x**2` {\"a\": [1, 2]}"


@dataclass(frozen=True)
class SpecConfig:
    """What `--spec` and `--spec-depth` asked for; `depth` None means auto (adaptive)."""

    source: str
    layers: int | None = None  # selfdraft: the target's first L layers draft (None: half of them)
    draft_model: str | None = None  # draft: the --model spec of the draft model
    depth: int | None = None
    ngram_max: int = DEFAULT_NGRAM

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"spec source {self.source!r}: expected one of {', '.join(SOURCES)}")
        if self.layers is not None and (self.source != "selfdraft" or self.layers < 1):
            raise ValueError(f"layers={self.layers}: expected a positive count, for selfdraft only")
        if (self.source == "draft") != bool(self.draft_model):
            raise ValueError(f"draft_model={self.draft_model!r}: expected a model for source 'draft' only")
        if self.depth is not None and not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"depth={self.depth}: expected 1..{MAX_DEPTH} or None (auto)")
        if self.ngram_max < 1:
            raise ValueError(f"ngram_max={self.ngram_max}: expected >= 1")

    @property
    def label(self) -> str:
        """`--spec` as the user would write it, with the depth."""
        arg = {"ngram": str(self.ngram_max), "selfdraft": str(self.layers or "half"), "draft": self.draft_model}
        return f"{self.source}:{arg[self.source]} k={self.depth or 'auto'}"


def parse_spec(spec: str | None, depth: str | None = None) -> SpecConfig | None:
    """`--spec` and `--spec-depth` → a SpecConfig (None when --spec is absent); bad values are InputErrors."""
    if not spec:
        if depth not in (None, "auto"):
            raise InputError(f"--spec-depth {depth}: needs --spec ({SPEC_HELP})")
        return None
    source, colon, arg = spec.partition(":")
    bad = InputError(f"--spec {spec!r}: expected {SPEC_HELP}")
    if source == "draft":
        if not arg:
            raise bad
        return SpecConfig("draft", draft_model=arg, depth=_parse_depth(depth))
    if source not in ("ngram", "selfdraft") or (colon and not (arg.isdigit() and int(arg) > 0)):
        raise bad
    count = int(arg) if arg else None
    if source == "ngram":
        return SpecConfig("ngram", depth=_parse_depth(depth), ngram_max=count or DEFAULT_NGRAM)
    return SpecConfig("selfdraft", layers=count, depth=_parse_depth(depth))


def _parse_depth(depth: str | None) -> int | None:
    if depth in (None, "auto"):
        return None
    if not (depth.isdigit() and 1 <= int(depth) <= MAX_DEPTH):
        raise InputError(f"--spec-depth {depth!r}: expected a whole number 1..{MAX_DEPTH} or auto")
    return int(depth)


def check_same_vocabulary(target: "Checkpoint", draft: "Checkpoint") -> None:
    """A draft model must score the target's token ids: same logit width and the same tokenizer."""
    sizes = (target.config.vocab_size, draft.config.vocab_size)
    same = sizes[0] == sizes[1] and target.tokenizer.vocab_size == draft.tokenizer.vocab_size
    if not same or target.tokenizer.encode(VOCAB_PROBE) != draft.tokenizer.encode(VOCAB_PROBE):
        raise InputError(
            f"--spec draft:{draft.source}: its vocabulary ({sizes[1]} logits, {draft.tokenizer.vocab_size} tokens) "
            f"differs from the target's ({sizes[0]} logits, {target.tokenizer.vocab_size} tokens); "
            "a draft model must share the target's tokenizer")


class NgramIndex:
    """Prompt-lookup drafting: for every n-gram (n ≤ max_n) of the context, where it last occurred with a
    token after it. Updated incrementally, so a lookup costs O(max_n) whatever the context length."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram → index of the token that followed it

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # `token` lands here: every n-gram ending just before it gains a continuation
            for n in range(1, min(self.max_n, end) + 1):
                self.follows[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix (n = max…1).

        A copy that runs into the end of the context continues from its own start (LZ77-style overlap),
        so a period shorter than k still yields k tokens."""
        for n in range(min(self.max_n, len(self.tokens)), 0, -1):
            start = self.follows.get(tuple(self.tokens[-n:]))
            if start is not None:
                size = len(self.tokens)
                out: list[int] = []
                for i in range(start, start + k):
                    out.append(self.tokens[i] if i < size else out[i - size])
                return out
        return []


@dataclass
class SpecStats:
    """What one speculative run did: acceptance per draft position, tokens per verify step, time split."""

    reached: list[int] = field(default_factory=list)  # verify steps that checked draft position i
    accepted: list[int] = field(default_factory=list)  # ... and accepted it
    drafted_tokens: int = 0
    verify_tokens: int = 0  # tokens emitted by verify steps: accepted drafts + 1 each
    draft_seconds: list[float] = field(default_factory=list)  # per verify step
    verify_seconds: list[float] = field(default_factory=list)
    plain_seconds: list[float] = field(default_factory=list)  # steps without a draft (M = 1)

    def record_verify(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """A verify step checked positions 0..min(accepted, drafted - 1) and kept the first `accepted`."""
        checked = min(accepted + 1, drafted)
        grow = checked - len(self.reached)
        self.reached += [0] * max(grow, 0)
        self.accepted += [0] * max(grow, 0)
        for i in range(checked):
            self.reached[i] += 1
            self.accepted[i] += i < accepted
        self.drafted_tokens += drafted
        self.verify_tokens += accepted + 1
        self.draft_seconds.append(draft_s)
        self.verify_seconds.append(verify_s)

    def record_plain(self, seconds: float) -> None:
        self.plain_seconds.append(seconds)

    @property
    def verify_steps(self) -> int:
        return len(self.verify_seconds)

    @property
    def acceptance(self) -> float:
        """Accepted drafted tokens / drafted tokens."""
        return sum(self.accepted) / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.verify_tokens / self.verify_steps if self.verify_steps else 0.0

    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | drafts before it accepted)."""
        return [a / r for a, r in zip(self.accepted, self.reached)]

    def to_dict(self) -> dict[str, object]:
        """For the ledger: the derived figures and the raw per-step times."""
        return {"acceptance": self.acceptance, "acceptance_by_position": self.acceptance_by_position(),
                "tokens_per_verify_step": self.tokens_per_step, "verify_steps": self.verify_steps,
                "plain_steps": len(self.plain_seconds), "drafted_tokens": self.drafted_tokens,
                "draft_seconds": self.draft_seconds, "verify_seconds": self.verify_seconds,
                "plain_seconds": self.plain_seconds}

    def summary(self) -> str:
        """One line for the end of a run."""
        ms = lambda seconds: 1e3 * sum(seconds) / max(len(seconds), 1)  # noqa: E731 - mean per step
        by_position = " ".join(f"{rate:.0%}" for rate in self.acceptance_by_position()) or "-"
        plain = f" | plain step {ms(self.plain_seconds):.2f} ms" if self.plain_seconds else ""
        return (f"{self.verify_steps} verify + {len(self.plain_seconds)} plain steps | "
                f"{self.tokens_per_step:.2f} tok/verify step | acceptance {self.acceptance:.0%} "
                f"(by position {by_position}) | draft {ms(self.draft_seconds):.2f} ms + verify "
                f"{ms(self.verify_seconds):.2f} ms per verify step{plain}")


WARMUP_STEPS = 3  # verify steps between two judgements of the depth
CALIBRATION_STEPS = 2  # plain steps that measure the plain step's cost before auto depth speculates
DECAY = 0.8  # weight kept by older steps in the acceptance estimates: they follow the text within ~5 steps
COST_WINDOW = 8  # costs are medians of the last steps: one slow step (a hiccup) decides nothing
SHRINK_MARGIN = 0.02  # padded: the deepest k whose estimate is within this of the best one is kept
COOLDOWN_STEPS = 32  # plain steps after speculation is switched off, doubled at each switch-off
MAX_COOLDOWN = 512


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
    measured plain step (M = 1) and the measured verify steps (costs are medians of recent steps). Speculating
    pays while E(j)·plain > C(j); k is set to the best j ≤ k + 1, and when even that loses, speculation is off
    for a cooldown of plain steps. Padded (every verify has the deepest k's rows, so C(j) grows with drafting only),
    any j is an option and the deepest one within SHRINK_MARGIN of the best is kept. A fixed depth (`depth` given)
    is never changed.
    """

    def __init__(self, depth: int | None, max_depth: int = AUTO_MAX_DEPTH, padded: bool = False) -> None:
        self.adaptive = depth is None
        self.depth = depth or (max_depth if padded else AUTO_START_DEPTH)
        self.max_depth = max(self.depth, max_depth)
        # Padded: every verify has the deepest step's rows (graph capture), so its cost does not shrink with k:
        # auto depth starts at the deepest and only the drafting cost grows with k.
        self.padded = padded
        self.decisions: list[Decision] = []
        self.steps = self.plain_seen = self.cooldown = 0
        self.next_cooldown = COOLDOWN_STEPS
        self.plain_costs: deque[float] = deque(maxlen=COST_WINDOW)
        self._reset_estimates()

    def _reset_estimates(self) -> None:
        self.reached = [0.0] * self.max_depth
        self.accepted = [0.0] * self.max_depth
        self.draft_costs: deque[float] = deque(maxlen=COST_WINDOW)  # seconds per drafted token
        self.row_costs: deque[float] = deque(maxlen=COST_WINDOW)  # verify seconds per row beyond the first
        self.until_judged = WARMUP_STEPS

    @property
    def deepest(self) -> int:
        """The largest k this controller can ask for."""
        return self.max_depth if self.adaptive else self.depth

    def next_depth(self) -> int:
        if self.adaptive and (self.plain_seen < CALIBRATION_STEPS or self.cooldown > 0):
            return 0
        return self.depth

    def observe_plain(self, seconds: float) -> None:
        self.steps += 1
        self.plain_seen += 1
        self.plain_costs.append(seconds)
        if self.cooldown:
            self.cooldown -= 1
            if not self.cooldown:
                self._decide(self.depth, f"speculation back on at k={self.depth}: re-measuring acceptance")

    def observe_verify(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.steps += 1
        self.reached = [DECAY * r + (i <= min(accepted, drafted - 1)) for i, r in enumerate(self.reached)]
        self.accepted = [DECAY * a + (i < accepted) for i, a in enumerate(self.accepted)]
        self.draft_costs.append(draft_s / drafted)
        if self.plain_costs:
            rows = self.deepest if self.padded else drafted  # rows beyond the first that the verify computed
            self.row_costs.append(max(verify_s - median(self.plain_costs), 0.0) / rows)
        self.until_judged -= 1
        if self.adaptive and self.row_costs and self.until_judged <= 0:
            self._judge()

    def expected_tokens(self, depth: int) -> float:
        """E(depth); a position never reached takes the rate of the last one that was."""
        tokens, chain, rate = 1.0, 1.0, 0.0
        for reached, accepted in zip(self.reached[:depth], self.accepted[:depth]):
            rate = accepted / reached if reached > 1e-3 else rate
            chain *= rate
            tokens += chain
        return tokens

    def speedup(self, depth: int) -> float:
        """Estimated E(depth)·plain / C(depth): above 1, speculating at this depth beats plain decode."""
        plain = median(self.plain_costs)
        rows = self.deepest if self.padded else depth
        cost = plain + depth * median(self.draft_costs) + rows * median(self.row_costs)
        return self.expected_tokens(depth) * plain / cost

    def _judge(self) -> None:
        self.until_judged = WARMUP_STEPS
        # Padded, any k costs the verify the same: every k is an option. A shallower one then saves drafting time
        # only, and the positions it stops drafting are no longer observed (an early miss would pin k for good):
        # the deepest option within SHRINK_MARGIN of the best is kept. Unpadded, a tie goes to the deeper one.
        top = self.max_depth if self.padded else min(self.depth + 1, self.max_depth)
        options = {j: self.speedup(j) for j in range(top, 0, -1)}  # deepest first
        fastest = max(options, key=options.__getitem__)
        if options[fastest] < 1.0:
            self._switch_off(fastest, options[fastest])
            return
        floor = max(options[fastest] * (1.0 - (SHRINK_MARGIN if self.padded else 0.0)), 1.0)
        best = next(j for j, speedup in options.items() if speedup >= floor)
        if best != self.depth:
            kept = f", the deepest within {SHRINK_MARGIN:.0%} of k={fastest}'s {options[fastest]:.2f}×" \
                if best != fastest else ""
            self._decide(best, f"k {self.depth}→{best}: est. speed-up {options[best]:.2f}×{kept} "
                               f"(k={self.depth}: {options[self.depth]:.2f}×)")

    def _switch_off(self, best: int, speedup: float) -> None:
        tokens, plain = self.expected_tokens(best), median(self.plain_costs) * 1e3
        self.cooldown, self.next_cooldown = self.next_cooldown, min(2 * self.next_cooldown, MAX_COOLDOWN)
        self._decide(0, f"{tokens:.2f} tok/step × plain {plain:.2f} ms = {tokens * plain:.2f} ms < "
                        f"{tokens * plain / speedup:.2f} ms per step at k={best}: speculation off for "
                        f"{self.cooldown} steps")
        self.depth = self.max_depth if self.padded else best
        self._reset_estimates()

    def _decide(self, depth: int, reason: str) -> None:
        self.decisions.append(Decision(self.steps, depth, reason))
        if depth:
            self.depth = depth
