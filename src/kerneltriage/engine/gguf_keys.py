"""Metadata keys a flipped byte renamed: a key no GGUF writer uses, one character from a GGUF key the file lacks.

Read as missing, each took a default without a word: a renamed `tokenizer.ggml.eos_token_id` left generation with no
end, a renamed `{arch}.vocab_size`, `tokenizer.ggml.bos_token_id`, `add_bos_token` or `pre` a guessed value (a fuzz
run of 3,000 mutated files found all five). llama.cpp reads such a file as one without the key; here it is refused
as corrupt, naming both keys. The GGUF keys are those of llama.cpp's own `gguf` package.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterator, Mapping

from gguf.constants import Keys

from kerneltriage.core.errors import InputError


def _key_templates(group: type) -> Iterator[str]:
    """Every key `gguf.constants.Keys` spells, `{arch}` unfilled (Keys nests one class per group)."""
    for value in vars(group).values():
        if isinstance(value, str) and "." in value:
            yield value
        elif isinstance(value, type):
            yield from _key_templates(value)


@functools.lru_cache(maxsize=8)
def known_keys(arch: str) -> frozenset[str]:
    """The GGUF keys of a file of architecture `arch` (templates naming anything else, e.g. `{name}`, left out)."""
    return frozenset(key.format(arch=arch) for key in _key_templates(Keys) if "{" not in key.replace("{arch}", ""))


def check_key_names(path: Path, meta: Mapping[str, Any], arch: str) -> None:
    """No key of `meta` is one character from a GGUF key it lacks (`arch`: its checked general.architecture)."""
    known = known_keys(arch)
    missing = [key for key in known if key not in meta]
    for key in meta:
        if key in known:
            continue
        twin = next((want for want in missing if _one_apart(key, want)), None)
        if twin is not None:
            raise InputError(f"GGUF {path}: metadata key {key!r} is no GGUF key but one character from {twin!r}, "
                             "which the file lacks: a corrupt file (a flipped byte renames a key)")


def _one_apart(a: str, b: str) -> bool:
    """Same length, exactly one character different (what a flipped bit does to a key that stays UTF-8)."""
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
