"""An attribute set for one block and put back after: how a probe wraps a model's functions for one measured run."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Set `obj.name` for the block; restore the instance attribute after, or its absence (the class's shows again)."""
    had, old = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)
