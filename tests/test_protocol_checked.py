"""The backend protocol (engine/backend.py) is held by the type checker, not just written down: .ci/run runs mypy,
and each backend declares its runner and its BACKEND as the protocol. Here mypy reads copies of the MLX backend's
runner and backend with one violation planted in each (a method missing, a signature changed) and must report it
where the copy is declared as the protocol; the unchanged copies, the control, must pass. With .ci/run's mypy cache
this takes ~3 s (~10 s cold)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ROOT / "src" / "kerneltriage" / "backends"


class Plant(NamedTuple):
    file: str  # the copy's name (unique: mypy's cache knows modules by name)
    source: str  # the file copied, under backends/
    old: str = ""  # the text replaced ("": the control, unchanged)
    new: str = ""
    says: str | None = None  # what mypy must report ({path}:{line} of the declaration); None: nothing


PLANTS = (
    Plant("planted_control_runner.py", "mlx/runner.py"),
    Plant("planted_control_backend.py", "mlx/backend.py"),
    Plant("planted_missing_method.py", "mlx/runner.py", old="    def greedy(self, logits",
          new="    def greedy_first(self, logits",
          says='is missing following "Runner" protocol member:\n{path}:{line}: note:     greedy'),
    Plant("planted_wrong_signature.py", "mlx/runner.py", old="    def clock(self) -> float:",
          new="    def clock(self, device: str) -> float:", says="Got:\n{path}:{line}: note:         def clock(self, "
                                                                "device: str) -> float"),
    Plant("planted_backend_signature.py", "mlx/backend.py", old="    def release(self, runner: Runner) -> None:",
          new="    def release(self, runner: Runner, now: bool) -> None:",
          says="Got:\n{path}:{line}: note:         def release(self, runner: Runner, now: bool) -> None"),
)


def _planted(folder: Path, plant: Plant) -> Path:
    text = (BACKENDS / plant.source).read_text()
    assert plant.old in text, f"{plant.source} no longer has {plant.old!r}: plant another violation"
    path = folder / plant.file
    path.write_text(text.replace(plant.old, plant.new, 1) if plant.old else text)
    return path


def test_mypy_reports_a_planted_protocol_violation_and_passes_the_control(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    paths = {plant: _planted(tmp_path, plant) for plant in PLANTS}
    cache = tmp_path / "mypy_cache"  # a copy of .ci/run's: warm, and left as it was (planted modules kept out)
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", cache)
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
                                *map(str, paths.values())])
    assert status == 1, out + err
    for plant, path in paths.items():
        reported = "\n".join(line for line in out.splitlines() if line.startswith(f"{path}:"))
        if plant.says is None:
            assert reported == "", f"the control {plant.file} fails the check:\n{reported}"
            continue
        # reported where the runner or the backend is declared as the protocol (_conforms, BACKEND)
        declared = [line for line in reported.splitlines() if "[return-value]" in line or "[assignment]" in line]
        assert declared, reported
        assert plant.says.format(path=path, line=declared[0].split(":")[1]) in reported, reported
