"""`--spec` / `--spec-depth` parsing into a `Speculation`, and the framework-free layering of engine/speculative/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative.config import Speculation, parse_speculation

SPECULATIVE = Path(__file__).resolve().parents[1] / "src" / "kerneltriage" / "engine" / "speculative"


@pytest.mark.parametrize("spec, depth, expected", [
    ("ngram", None, Speculation("ngram")),
    ("ngram:2", "5", Speculation("ngram", ngram_max=2, depth=5)),
    ("suffix", None, Speculation("suffix")),
    ("suffix:4", "auto", Speculation("suffix", suffix_max=4)),
    ("selfdraft", "auto", Speculation("selfdraft")),
    ("selfdraft:12", "3", Speculation("selfdraft", layers=12, depth=3)),
    ("draft:./small.gguf", None, Speculation("draft", draft_model="./small.gguf")),
    (None, None, None),
    (None, "auto", None),
])
def test_parse_speculation(spec: str | None, depth: str | None, expected: Speculation | None) -> None:
    assert parse_speculation(spec, depth) == expected


@pytest.mark.parametrize("spec, depth, message", [
    ("medusa", None, "expected ngram"), ("eagle:", None, "eagle\\[:PATH\\]"), ("selfdraft:0", None, "expected ngram"),
    ("selfdraft:x", None, "expected"),
    ("draft:", None, "expected"), ("ngram:", None, "expected"), ("ngram:0", None, "expected ngram"),
    ("ngram", "0", "1..31"), ("ngram", "32", "1..31"), ("ngram", "deep", "or auto"), (None, "4", "needs --spec"),
    ("suffix:0", None, "expected ngram"), ("suffix:32", None, "1..31"), ("suffix:", None, "expected"),
])
def test_bad_spec_is_an_input_error(spec: str | None, depth: str | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_speculation(spec, depth)


@pytest.mark.parametrize("changes, message", [
    (dict(source="medusa"), "spec source"), (dict(source="ngram", depth=0), "depth=0"),
    (dict(source="ngram", depth=32), "depth=32"), (dict(source="ngram", layers=2), "layers=2"),
    (dict(source="selfdraft", layers=0), "layers=0"), (dict(source="draft"), "draft_model=None"),
    (dict(source="selfdraft", draft_model="x"), "draft_model='x'"), (dict(source="ngram", ngram_max=0), "ngram_max"),
    (dict(source="suffix", suffix_max=0), "suffix_max"), (dict(source="suffix", suffix_max=32), "suffix_max"),
])
def test_speculation_validates(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Speculation(**changes)


def test_label_says_what_runs() -> None:
    assert parse_speculation("selfdraft", "3").label == "selfdraft:half k=3"
    assert parse_speculation("ngram").label == "ngram:3 k=auto"
    assert parse_speculation("suffix:8", "4").label == "suffix:8 k=4"
    assert parse_speculation("draft:small.gguf").label == "draft:small.gguf k=auto"


@pytest.mark.parametrize("spec, depth, text", [
    ("ngram", None, "ngram:3"), ("ngram:5", "2", "ngram:5"), ("suffix", None, "suffix:31"),
    ("suffix:6", "4", "suffix:6"), ("selfdraft", "4", "selfdraft"),
    ("selfdraft:7", None, "selfdraft:7"), ("draft:models/small.gguf", "auto", "draft:models/small.gguf"),
])
def test_source_text_parses_back_to_the_same_speculation(spec: str, depth: str | None, text: str) -> None:
    speculation = parse_speculation(spec, depth)
    assert speculation.source_text == text
    assert parse_speculation(speculation.source_text, str(speculation.depth or "auto")) == speculation


def test_engine_speculative_leaves_out_torch() -> None:
    modules = sorted(f"kerneltriage.engine.speculative.{p.stem}" for p in SPECULATIVE.glob("*.py"))
    assert {"kerneltriage.engine.speculative.decoder", "kerneltriage.engine.speculative.ngram"} <= set(modules)
    script = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(SPECULATIVE.parents[2])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
