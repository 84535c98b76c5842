"""A model's chat template rendered as transformers' `apply_chat_template` renders it: jinja2's immutable sandbox,
trim_blocks/lstrip_blocks, loop controls and the same helpers (`raise_exception`, `strftime_now`, a `tojson` that
does not escape HTML)."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from kerneltriage.core.errors import InputError


def render_chat(template: str, source: str, messages: list[dict], **variables: Any) -> str:
    """`messages` through `template` (of the model `source`, for errors) with `variables` (add_generation_prompt,
    bos_token, eos_token); a template that fails is one InputError line."""
    import jinja2

    try:
        return _compile(template).render(messages=messages, **variables)
    except jinja2.TemplateError as exc:
        reason = " ".join(str(exc).split())  # the message must stay on one line
        raise InputError(f"chat template of {source}: {reason}") from exc


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    """A chat template compiled in the sandbox transformers uses, with the same helpers."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        # jinja's own tojson escapes HTML characters, which chat templates do not want
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
