"""Typed reads of a model's settings (GGUF metadata or config.json), each bad value named by its key.

A flipped byte can turn a size into 0 (a division by zero three lines later), a float into NaN (an `<= 0`
check lets it through), a count into a list, or `"vocab_size"` into null: every read here says which key
held what and what was expected, as one line, before any of it is used.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from kerneltriage.core.errors import InputError

_REQUIRED = object()
_SHOWN_CHARS = 40  # a rewritten key can hold a 49k-entry list: show only its start


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON's true is not a size)."""
    return isinstance(value, int) and not isinstance(value, bool)


class SettingsReader:
    """Reads `data[prefix + key]` for one source (`what`: "GGUF metadata", "config.json")."""

    def __init__(self, data: Mapping[str, Any], what: str, prefix: str = "") -> None:
        self.data, self.what, self.prefix = data, what, prefix

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(self.prefix + key)
        if value is None:
            if default is _REQUIRED:
                raise InputError(f"{self.what}: missing {self.prefix + key}")
            return default
        return value

    def _bad(self, key: str, value: Any, expected: str) -> InputError:
        return InputError(f"{self.what} {self.prefix + key}={_short(value)}: expected {expected}")

    def size(self, key: str, default: Any = _REQUIRED) -> Any:
        """A positive integer (or `default` when absent or null)."""
        value = self._get(key, default)
        if value is None:  # absent, and the default is None
            return None
        if not is_int(value) or value <= 0:
            raise self._bad(key, value, "a positive integer")
        return value

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        """A finite positive number (NaN and inf pass an `<= 0` check and then poison every activation)."""
        value = self._get(key, default)
        if not (is_int(value) or isinstance(value, float)) or not math.isfinite(value) or value <= 0:
            raise self._bad(key, value, "a finite positive number")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        """A finite positive number, or None when absent or null."""
        return None if self._get(key, None) is None else self.number(key)

    def token(self, key: str) -> int | None:
        """A token id (a non-negative integer), or None when absent."""
        value = self._get(key, None)
        if value is not None and (not is_int(value) or value < 0):
            raise self._bad(key, value, "a token id (a non-negative integer)")
        return value

    def tokens(self, key: str) -> tuple[int, ...]:
        """One token id or a list of them (config.json's eos_token_id may be either)."""
        value = self._get(key, None)
        values = value if isinstance(value, list) else [] if value is None else [value]
        if not all(is_int(v) and v >= 0 for v in values):
            raise self._bad(key, value, "a token id or a list of token ids")
        return tuple(values)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def mapping(self, key: str) -> Mapping[str, Any] | None:
        value = self._get(key, None)
        if value is not None and not isinstance(value, Mapping):
            raise self._bad(key, value, "an object")
        return value
