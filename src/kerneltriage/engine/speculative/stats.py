"""What one speculative run did: acceptance per draft position, tokens per verify step, time split."""

from __future__ import annotations

from dataclasses import dataclass, field


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

