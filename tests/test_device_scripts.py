"""The GPU machine's shell tools (benchmarks/tools/device_run.sh, device_prep.sh): their help runs nothing and names
every step the script takes; a bad step or a missing interpreter is one line and exit status 2. Device time is the
scarcest thing this project has: a broken script must fail here, not there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "benchmarks" / "tools"


def _run(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(TOOLS / script), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env=env)


def test_device_run_help_names_every_step_and_runs_nothing(tmp_path: Path) -> None:
    done = _run("device_run.sh", "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert not list(tmp_path.iterdir())  # a help line that ran as a command would have left a file or an error
    text = (TOOLS / "device_run.sh").read_text()
    steps = set(re.findall(r"^    ([a-z][a-z-]*)\)", text, flags=re.M))  # the case statement's steps
    helped = set(re.findall(r"^  ([a-z][a-z-]*) ", done.stdout, flags=re.M))
    assert {"smoke", "gpu-tests", "gemv", "delete", "llama-build"} <= steps and steps <= helped, steps - helped


def test_device_run_refuses_an_unknown_step(tmp_path: Path) -> None:
    done = _run("device_run.sh", "warp-drive", cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert done.returncode == 2 and "unknown step 'warp-drive'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_device_prep_help_and_a_missing_interpreter(tmp_path: Path) -> None:
    done = _run("device_prep.sh", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "device_prep.sh whl" in done.stdout and not list(tmp_path.iterdir())
    done = _run("device_prep.sh", cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PY": str(tmp_path / "no-python")})
    assert done.returncode == 2 and "no-python: not found" in done.stderr


def test_placeholders_write_the_machines_paths_as_names(tmp_path: Path) -> None:
    """A result's absolute paths (the cache, $OUT, the tree, the temporary folder, the home) come back as names, and
    what is no path stays as it was."""
    out, cache, home, tmp = (tmp_path / name for name in ("out", "cache", "home", "tmp"))
    out.mkdir()
    result = out / "r.json"
    result.write_text(f'{{"model": "{cache}/models/m.gguf", "ledger": "{out}/ledger.db", "src": "{ROOT}/src", '
                      f'"tmp": "{tmp}/x.gguf", "home": "{home}/y", "rate": 1.5}}\n')
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "KERNELTRIAGE_CACHE": str(cache), "HOME": str(home),
           "TMPDIR": str(tmp)}
    done = _run("device_run.sh", "placeholders", cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert result.read_text() == ('{"model": "$KERNELTRIAGE_CACHE/models/m.gguf", "ledger": "$OUT/ledger.db", '
                                  f'"src": "{ROOT.name}/src", "tmp": "$TMPDIR/x.gguf", "home": "~/y", "rate": 1.5}}\n')


def test_fused_tiles_refuses_bad_settings_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    import sys

    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location("fused_tiles", TOOLS / "fused_tiles.py")
    tool = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tool)  # type: ignore[union-attr]
    for args, said in ((["last_logits"], "expected fused_layer among them"),
                       (["fused_layer", "--set", "QUANT_BK=1024,NOPE=2"], "'NOPE' is no integer constant"),
                       (["fused_layer", "--set", "BN=0"], "BN='0': expected a positive integer")):
        monkeypatch.setattr(sys, "argv", ["fused_tiles.py", "--levers", *args])
        assert tool.main() == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
