"""The lever registry: named, composable changes applied from outside the model, each answering one question.

This file names them and says which question each answers; each backend implements them
(`backends/torch/accelerate.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kerneltriage.core.errors import InputError

QUESTIONS = ("delete", "fast-path", "dispatch", "kernel")


@dataclass(frozen=True)
class Lever:
    name: str
    question: str
    summary: str

    def __post_init__(self) -> None:
        if self.question not in QUESTIONS:
            raise ValueError(f"lever {self.name}: question {self.question!r} not in {QUESTIONS}")


LEVERS: dict[str, Lever] = {
    lever.name: lever
    for lever in (
        Lever("last_logits", "delete", "prefill computes the output projection for the last position only"),
    )
}


def parse_levers(text: str | None) -> tuple[str, ...]:
    """`a,b` → ('a', 'b'); empty → (); an unknown name is an InputError listing the known ones."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    for name in names:
        if name not in LEVERS:
            raise InputError(f"--levers: unknown lever {name!r}; expected some of {', '.join(LEVERS)}")
    if len(set(names)) != len(names):
        raise InputError(f"--levers {text!r}: a lever is named twice")
    return names
