"""What a report records of a model's path: the user's home as `~`, so result files carry no machine's home."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneltriage.engine.paths import shown


def test_a_path_under_home_is_written_from_tilde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("/home/ada")))
    assert shown("/home/ada/.cache/kerneltriage/models/m.gguf") == "~/.cache/kerneltriage/models/m.gguf"
    assert shown(Path("/home/ada")) == "~"
    assert shown("/home/adam/m.gguf") == "/home/adam/m.gguf"  # a sibling folder, not under home
    assert shown("/data/m.gguf") == "/data/m.gguf" and shown("smollm2-135m") == "smollm2-135m"


def test_a_home_at_the_root_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("/")))
    assert shown("/data/m.gguf") == "/data/m.gguf"
