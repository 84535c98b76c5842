"""What a constrained workload's output must match: one of N choices, a regular expression, or a JSON schema
(`--choices A,B,C`, `--regex RE`, `--json-schema FILE`), checked once when the flags are read and turned into a
grammar for llguidance (engine/grammar.py compiles it for a tokenizer; docs/constrained.md says why llguidance).

The constraint belongs to the workload, not to a configuration: both sides of an A/B decode under the same one, so
it rides on the checkpoint every runner is built from (`Checkpoint.constraint`), and each generation's sampler
follows it with a fresh matcher (engine/constrained.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltriage.core.errors import InputError

KINDS = {"choices": "--choices", "regex": "--regex", "json": "--json-schema"}  # kind → the flag that gives it
JSON_SPACE = "[ ]?"  # whitespace a JSON output may have between tokens (llguidance's default is unbounded)


@dataclass(frozen=True)
class Constraint:
    """`kind` is choices, regex or json; `value` the choices joined by commas, the regex, or the schema's JSON text;
    `source` where it came from (the schema's file), for messages."""

    kind: str
    value: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind {self.kind!r}: expected one of {', '.join(KINDS)}")

    @property
    def flag(self) -> str:
        return KINDS[self.kind]

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.value.split(",")) if self.kind == "choices" else ()

    @property
    def label(self) -> str:
        """For summaries: `--json-schema person.json`, `--choices yes,no`."""
        shown = self.source or (self.value if len(self.value) <= 40 else self.value[:37] + "...")
        return f"{self.flag} {shown}"

    def grammar(self) -> str:
        """The llguidance grammar of this constraint (its JSON form; the library is imported by the caller)."""
        from llguidance import LLMatcher

        if self.kind == "json":  # one optional space where JSON allows whitespace: a model cannot pad forever
            return LLMatcher.grammar_from_json_schema(self.value, defaults={"whitespace_pattern": JSON_SPACE})
        pattern = "|".join(re.escape(choice) for choice in self.choices) if self.kind == "choices" else self.value
        return LLMatcher.grammar_from_regex(pattern)

    def matches(self, text: str) -> bool:
        """Whether `text` (a finished output) satisfies the constraint; JSON is checked by parsing and by the
        schema's own keywords as far as `_fits` reads them (the tests' oracle, not the decoder's)."""
        if self.kind == "choices":
            return text in self.choices
        if self.kind == "regex":
            return re.fullmatch(self.value, text) is not None
        try:
            return _fits(json.loads(text), json.loads(self.value))
        except json.JSONDecodeError:
            return False


def parse_constraint(choices: str | None, regex: str | None, schema: Path | str | None) -> Constraint | None:
    """The constraint the flags give (at most one of them), checked now: a bad regex, an unreadable or non-JSON
    schema file, or empty choices is an InputError naming the flag."""
    given = [flag for flag, value in (("--choices", choices), ("--regex", regex), ("--json-schema", schema))
             if value is not None]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)}: expected at most one constraint")
    if choices is not None:
        parts = [part for part in choices.split(",")]
        if not all(parts):
            raise InputError(f"--choices {choices!r}: expected comma-separated non-empty choices, e.g. yes,no")
        return Constraint("choices", ",".join(parts))
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise InputError(f"--regex {regex!r}: not a regular expression ({exc})") from None
        if not regex:
            raise InputError("--regex '': expected a pattern")
        return Constraint("regex", regex)
    if schema is not None:
        return Constraint("json", _schema_text(Path(schema)), str(schema))
    return None


def _schema_text(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"--json-schema {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--json-schema {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(schema, (dict, bool)):
        raise InputError(f"--json-schema {path}: expected a JSON object (a schema), got {type(schema).__name__}")
    return json.dumps(schema)


def _fits(value: Any, schema: Any) -> bool:
    """`value` against the schema keywords the tests generate: type, properties, required, additionalProperties,
    items, enum, minItems, maxItems."""
    if schema is True or schema == {}:
        return True
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "null": lambda v: v is None, "object": lambda v: isinstance(v, dict),
              "array": lambda v: isinstance(v, list)}
    if kind is not None and not checks[kind](value):
        return False
    if kind == "object":
        props = schema.get("properties", {})
        if any(key not in value for key in schema.get("required", ())):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(_fits(item, props[key]) for key, item in value.items() if key in props)
    if kind == "array":
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        return all(_fits(item, schema.get("items", True)) for item in value)
    return True
