"""The layering rule: `core` is standard library only, and `core` + `engine` never pull torch or mlx."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CORE_MODULES = (
    "kerneltriage.core.errors",
    "kerneltriage.core.stats",
    "kerneltriage.core.units",
    "kerneltriage.core.measurement",
    "kerneltriage.core.environment",
    "kerneltriage.core.ledger",
    "kerneltriage.core.ledger_schema",
    "kerneltriage.core.ledger_export",
)
ENGINE_MODULES = ("kerneltriage.engine.config", "kerneltriage.engine.names")


def _imported_after(modules: tuple[str, ...], extra: str = "") -> set[str]:
    """Top-level package names present in sys.modules after importing `modules` (and running `extra`)."""
    script = (
        "import importlib, pkgutil, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import kerneltriage.core as core\n"
        "for info in pkgutil.iter_modules(core.__path__): importlib.import_module(f'kerneltriage.core.{info.name}')\n"
        f"{extra}\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_core_is_standard_library_only() -> None:
    # Capturing the environment reads versions via importlib.metadata and GPUs via NVML: still no torch.
    loaded = _imported_after(CORE_MODULES, "core.environment.capture_environment()")
    assert "kerneltriage" in loaded
    assert not loaded & {"torch", "mlx", "numpy", "rich"}


def test_core_and_engine_leave_out_torch_and_mlx() -> None:
    loaded = _imported_after(CORE_MODULES + ENGINE_MODULES)
    assert "kerneltriage" in loaded
    assert not loaded & {"torch", "mlx"}
