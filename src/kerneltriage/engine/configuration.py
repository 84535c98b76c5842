"""One typed configuration of the engine: levers (kernels included) and speculative decoding.

Parsed once — from `--levers/--spec/--spec-depth`, or from one side of an `ab` (`levers=a,b;spec=ngram;depth=4`)
— and printed back the same way (`text` parses to an equal RunConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from kerneltriage.core.errors import InputError
from kerneltriage.engine.levers import LeverSetting, changes_numerics, ordered, parse_levers
from kerneltriage.engine.speculative.config import Speculation, parse_speculation

KEYS = ("levers", "spec", "depth")


@dataclass(frozen=True)
class RunConfig:
    """The levers switched on (in composition order) and the speculation, if any."""

    levers: tuple[LeverSetting, ...] = ()
    speculation: Speculation | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "levers", ordered(self.levers))

    @property
    def lever_names(self) -> tuple[str, ...]:
        """Each lever as written: `graphs`, `compile=default`."""
        return tuple(s.text for s in self.levers)

    @property
    def text(self) -> str:
        """`levers=a,b` plus `;spec=…;depth=…` when speculating: what `parse` reads back."""
        text = f"levers={','.join(self.lever_names)}"
        if self.speculation is not None:
            text += f";spec={self.speculation.source_text};depth={self.speculation.depth or 'auto'}"
        return text

    @property
    def label(self) -> str:
        """For tables: `levers=(stock)` when there are none, and the speculation's label."""
        levers = f"levers={','.join(self.lever_names) or '(stock)'}"
        return levers + (f" + spec {self.speculation.label}" if self.speculation else "")

    @property
    def changes_numerics(self) -> bool:
        """Another arithmetic than stock: a lever that reorders, or speculation's verify of k+1 rows."""
        return changes_numerics(self.levers) or self.speculation is not None

    @property
    def stock_values(self) -> bool:
        """Its weights hold the stock copy's values (no lever keeps values of its own, as quantized's blocks do)."""
        return not any(s.lever.own_values for s in self.levers)

    @property
    def numeric_seams(self) -> tuple[str, ...]:
        """The seams whose op a lever of this configuration computes with another arithmetic than stock (what a
        backend's per-seam error check measures), each once, in composition order."""
        return tuple(dict.fromkeys(seam for s in self.levers if s.lever.numerics != "exact" for seam in s.lever.seams))

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.levers)

    def plus(self, setting: LeverSetting) -> "RunConfig":
        """This configuration with one more lever (an InputError if it is already on)."""
        if setting.text in self.lever_names:
            raise InputError(f"lever {setting.text} is already on")
        return RunConfig(self.levers + (setting,), self.speculation)

    def without(self, name: str) -> "RunConfig":
        """This configuration with lever `name` off, and every lever that requires it."""
        return RunConfig(tuple(s for s in self.levers if s.name != name and name not in s.lever.requires),
                         self.speculation)

    @classmethod
    def from_flags(cls, levers: str | None, spec: str | None = None, depth: str | None = None) -> "RunConfig":
        """From `--levers`, `--spec` and `--spec-depth`."""
        return cls(parse_levers(levers), parse_speculation(spec, depth))

    @classmethod
    def parse(cls, text: str, flag: str) -> "RunConfig":
        """`levers=a,b;spec=ngram;depth=4` (key=value pairs separated by ';'); errors name `flag`."""
        fields: dict[str, str] = {}
        for part in (p.strip() for p in text.split(";")):
            key, sep, value = part.partition("=")
            if not part:
                continue
            if not sep or key.strip() not in KEYS:
                raise InputError(f"{flag} {text!r}: expected key=value pairs separated by ';' with keys "
                                 f"{', '.join(KEYS)}, got {part!r}")
            if key.strip() in fields:
                raise InputError(f"{flag} {text!r}: {key.strip()} is given twice")
            fields[key.strip()] = value.strip()
        try:
            return cls.from_flags(fields.get("levers"), fields.get("spec") or None, fields.get("depth") or None)
        except InputError as exc:
            raise InputError(f"{flag} {text!r}: {exc}") from None
