"""What speculative runs did, per draft source: acceptance per draft position, tokens per verify step, the
time split, and the shadow acceptance scored during plain steps (engine/speculative/shadow.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


def _count(reached: list[int], accepted: list[int], drafted: int, kept: int) -> None:
    """A draft of `drafted` tokens checked positions 0..min(kept, drafted - 1) and kept the first `kept`."""
    checked = min(kept + 1, drafted)
    grow = max(checked - len(reached), 0)
    reached += [0] * grow
    accepted += [0] * grow
    for i in range(checked):
        reached[i] += 1
        accepted[i] += i < kept


def _rates(reached: list[int], accepted: list[int]) -> list[float]:
    return [a / r for a, r in zip(accepted, reached)]


@dataclass
class SpecStats:
    """What speculative runs of one draft source did (`source` as `--spec` writes it: `suffix:31`)."""

    source: str = ""
    reached: list[int] = field(default_factory=list)  # verify steps that checked draft position i
    accepted: list[int] = field(default_factory=list)  # ... and accepted it
    drafted_tokens: int = 0
    verify_tokens: int = 0  # tokens emitted by verify steps: accepted drafts + 1 each
    draft_seconds: list[float] = field(default_factory=list)  # per verify step
    verify_seconds: list[float] = field(default_factory=list)
    plain_seconds: list[float] = field(default_factory=list)  # steps without a draft (M = 1)
    shadow_reached: list[int] = field(default_factory=list)  # shadow drafts (plain steps) that reached position i
    shadow_accepted: list[int] = field(default_factory=list)  # ... and whose token there was the one emitted

    def record_verify(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """A verify step checked positions 0..min(accepted, drafted - 1) and kept the first `accepted`."""
        _count(self.reached, self.accepted, drafted, accepted)
        self.drafted_tokens += drafted
        self.verify_tokens += accepted + 1
        self.draft_seconds.append(draft_s)
        self.verify_seconds.append(verify_s)

    def record_plain(self, seconds: float) -> None:
        self.plain_seconds.append(seconds)

    def record_shadow(self, position: int, hit: bool) -> None:
        """A shadow draft's token at `position` was (or was not) the one emitted."""
        grow = max(position + 1 - len(self.shadow_reached), 0)
        self.shadow_reached += [0] * grow
        self.shadow_accepted += [0] * grow
        self.shadow_reached[position] += 1
        self.shadow_accepted[position] += hit

    def merge(self, other: "SpecStats") -> None:
        """Add another run's counts and times (the same source) to these."""
        for mine, theirs in ((self.reached, other.reached), (self.accepted, other.accepted),
                             (self.shadow_reached, other.shadow_reached),
                             (self.shadow_accepted, other.shadow_accepted)):
            mine += [0] * max(len(theirs) - len(mine), 0)
            for i, n in enumerate(theirs):
                mine[i] += n
        self.drafted_tokens += other.drafted_tokens
        self.verify_tokens += other.verify_tokens
        self.draft_seconds += other.draft_seconds
        self.verify_seconds += other.verify_seconds
        self.plain_seconds += other.plain_seconds

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
        return _rates(self.reached, self.accepted)

    def shadow_by_position(self) -> list[float]:
        """The same for the shadow drafts: what verifying them would have accepted."""
        return _rates(self.shadow_reached, self.shadow_accepted)

    def brief(self) -> dict[str, object]:
        """The derived figures, without the per-step times."""
        return {"source": self.source, "acceptance": self.acceptance,
                "acceptance_by_position": self.acceptance_by_position(),
                "tokens_per_verify_step": self.tokens_per_step, "verify_steps": self.verify_steps,
                "plain_steps": len(self.plain_seconds), "drafted_tokens": self.drafted_tokens,
                "shadow_drafts": self.shadow_reached[0] if self.shadow_reached else 0,
                "shadow_acceptance_by_position": self.shadow_by_position()}

    def to_dict(self) -> dict[str, object]:
        """For the ledger: the derived figures and the raw per-step times."""
        return self.brief() | {"draft_seconds": self.draft_seconds, "verify_seconds": self.verify_seconds,
                               "plain_seconds": self.plain_seconds}

    def summary(self) -> str:
        """One line for the end of a run."""
        ms = lambda seconds: 1e3 * sum(seconds) / max(len(seconds), 1)  # noqa: E731 - mean per step
        percent = lambda rates: " ".join(f"{rate:.0%}" for rate in rates) or "-"  # noqa: E731
        plain = f" | plain step {ms(self.plain_seconds):.2f} ms" if self.plain_seconds else ""
        shadow = (f" | shadow drafts {self.shadow_reached[0]} (by position {percent(self.shadow_by_position())})"
                  if self.shadow_reached else "")
        return (f"{self.source + ': ' if self.source else ''}{self.verify_steps} verify + {len(self.plain_seconds)} "
                f"plain steps | {self.tokens_per_step:.2f} tok/verify step | acceptance {self.acceptance:.0%} "
                f"(by position {percent(self.acceptance_by_position())}) | draft {ms(self.draft_seconds):.2f} ms + "
                f"verify {ms(self.verify_seconds):.2f} ms per verify step{plain}{shadow}")
