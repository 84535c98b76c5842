"""`--spec` / `--spec-depth` parsing and the framework-free layering of engine/speculative.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative import SpecConfig, parse_spec


@pytest.mark.parametrize("spec, depth, expected", [
    ("ngram", None, SpecConfig("ngram")),
    ("ngram:2", "5", SpecConfig("ngram", ngram_max=2, depth=5)),
    ("selfdraft", "auto", SpecConfig("selfdraft")),
    ("selfdraft:12", "3", SpecConfig("selfdraft", layers=12, depth=3)),
    ("draft:./small.gguf", None, SpecConfig("draft", draft_model="./small.gguf")),
    (None, None, None),
])
def test_parse_spec(spec: str | None, depth: str | None, expected: SpecConfig | None) -> None:
    assert parse_spec(spec, depth) == expected


@pytest.mark.parametrize("spec, depth, message", [
    ("eagle", None, "expected ngram"), ("selfdraft:0", None, "expected ngram"), ("selfdraft:x", None, "expected"),
    ("draft:", None, "expected"), ("ngram:", None, "expected"), ("ngram", "0", "1..16"), ("ngram", "17", "1..16"),
    ("ngram", "deep", "or auto"), (None, "4", "needs --spec"),
])
def test_bad_spec_is_an_input_error(spec: str | None, depth: str | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_spec(spec, depth)


@pytest.mark.parametrize("changes, message", [
    (dict(source="medusa"), "spec source"), (dict(source="ngram", depth=0), "depth=0"),
    (dict(source="ngram", layers=2), "layers=2"), (dict(source="draft"), "draft_model=None"),
    (dict(source="selfdraft", draft_model="x"), "draft_model='x'"), (dict(source="ngram", ngram_max=0), "ngram_max"),
])
def test_spec_config_validates(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpecConfig(**changes)


def test_label_says_what_runs() -> None:
    assert parse_spec("selfdraft", "3").label == "selfdraft:half k=3"
    assert parse_spec("draft:small.gguf").label == "draft:small.gguf k=auto"


def test_engine_speculative_leaves_out_torch() -> None:
    script = "import sys, kerneltriage.engine.speculative; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
