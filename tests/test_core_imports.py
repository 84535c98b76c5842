"""The layering rule: `core` is standard library only; `core` and `engine` pull in no framework; `bench/` and
`triage/` reach a framework only through the backend protocol (no torch import of their own, none of backends/)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "kerneltriage"
FRAMEWORKS = {"torch", "mlx", "triton", "llama_cpp"}  # transformers serves tokenizers in engine/


def _modules(folder: str) -> tuple[str, ...]:
    """Every module of a subpackage, as dotted names."""
    return tuple(f"kerneltriage.{folder}." + ".".join(p.relative_to(PACKAGE / folder).with_suffix("").parts)
                 .removesuffix(".__init__") for p in sorted((PACKAGE / folder).rglob("*.py")))


def _imported_after(modules: tuple[str, ...], extra: str = "") -> set[str]:
    """Top-level package names present in sys.modules after importing `modules` (and running `extra`)."""
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"{extra}\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_core_is_standard_library_only() -> None:
    # Capturing the environment reads versions via importlib.metadata and GPUs via NVML: still no torch.
    loaded = _imported_after(_modules("core"), "import kerneltriage.core.environment as e; e.capture_environment()")
    assert "kerneltriage" in loaded
    assert not loaded & (FRAMEWORKS | {"numpy", "rich"})


def test_core_engine_bench_and_triage_leave_out_every_framework() -> None:
    loaded = _imported_after(_modules("core") + _modules("engine") + _modules("bench") + _modules("triage"))
    assert "kerneltriage" in loaded
    assert not loaded & FRAMEWORKS


def _framework_imports(path: Path) -> list[str]:
    """Imports in `path`'s source (also lazy ones inside functions) of a framework or of backends/, peers/."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [n for n in names if n.split(".")[0] in FRAMEWORKS
                  or n.startswith(("kerneltriage.backends", "kerneltriage.peers"))]
    return found


@pytest.mark.parametrize("folder", ["core", "engine", "bench", "triage"])
def test_no_framework_import_anywhere_in_the_protocol_layers(folder: str) -> None:
    offenders = {str(p.relative_to(PACKAGE)): names for p in (PACKAGE / folder).rglob("*.py")
                 if (names := _framework_imports(p)) and not (folder == "engine" and p.name == "backend.py")}
    assert offenders == {}
