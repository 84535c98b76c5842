"""Where a measurement ran (code, software, OS, CPU, GPU) and the conditions at the start and end of a run.

Standard library only: package versions come from `importlib.metadata` (never by importing torch or mlx),
GPU facts from NVML (`pynvml`, from nvidia-ml-py), imported lazily. Anything that cannot be determined
on this machine — no git, no NVML, no GPU — is recorded as None, never guessed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Mapping

from kerneltriage import __version__
from kerneltriage.core.contention import cpu_readings, gpu_readings

PACKAGES = ("torch", "transformers", "gguf", "numpy", "mlx", "nvidia-ml-py")
GIT_TIMEOUT_S = 5.0
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_POWER_SUPPLY_DIR = Path("/sys/class/power_supply")


@dataclass(frozen=True)
class Snapshot:
    """Conditions at one instant, taken at the start and at the end of a run; None = not measurable here."""

    time: float
    on_battery: bool | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    # Machine load (core/contention.py judges it): the load average counts our own threads too; the
    # cumulative busy seconds of the machine and of this process give what others used between two snapshots.
    load_avg_1m: float | None = None
    cpu_count: int | None = None
    cpu_busy_s: float | None = None
    self_cpu_s: float | None = None
    gpu_utilization_pct: int | None = None
    gpu_other_processes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        """Inverse of `to_dict`. Rows written before a field existed lack it (it reads as None); fields this
        version does not know, from a newer one, are dropped."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def _run_git(*args: str, cwd: Path = _PACKAGE_DIR) -> str | None:
    """stdout of `git args` run in `cwd` (the package folder), or None when git is missing or refuses."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(cwd: Path = _PACKAGE_DIR) -> dict[str, Any]:
    """Commit, dirty flag and the SHA-256 of `git diff HEAD` (the uncommitted changes to tracked files) of the
    kerneltriage source tree; None for each when not run from a checkout.

    The sha alone does not pin the code that ran when the tree was dirty; the diff's hash does (two runs with the
    same sha and hash ran the same tracked code). Untracked files count for neither, as in `git status -uno`.
    `ls-files` guards against an installed copy inside some other repository (e.g. a venv in a project).
    """
    unknown = {"sha": None, "dirty": None, "diff_sha256": None}
    if _run_git("ls-files", "--error-unmatch", "__init__.py", cwd=cwd) is None:
        return unknown
    sha = _run_git("rev-parse", "HEAD", cwd=cwd)
    status = _run_git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
    diff = _run_git("diff", "HEAD", "--binary", cwd=cwd)
    return {"sha": None if sha is None else sha.strip(),
            "dirty": None if status is None else bool(status.strip()),
            "diff_sha256": None if diff is None else hashlib.sha256(diff.encode()).hexdigest()}


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a user would type it again: `kerneltriage ab …`, `python -m kerneltriage
    …`, `python benchmarks/tools/x.py …` (a script inside the repository by its path from the root, so that no
    machine's own folders are recorded)."""
    argv = list(sys.argv if argv is None else argv) or [""]
    program = Path(argv[0])
    if program.name == "__main__.py":
        head = ["python", "-m", program.parent.name]
    elif program.suffix == ".py":
        root = _PACKAGE_DIR.parent.parent
        inside = program.resolve().is_relative_to(root)
        head = ["python", str(program.resolve().relative_to(root)) if inside else program.name]
    else:
        head = [program.name]
    return shlex.join(head + argv[1:])


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """kerneltriage's own version and installed distribution versions (torch's names its CUDA build,
    e.g. '2.13.0+cu130'); a package that is not installed → None."""
    versions: dict[str, str | None] = {"kerneltriage": __version__}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str | None:
    """The CPU's marketing name, from /proc/cpuinfo (Linux) or sysctl (macOS)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() or None
    return platform.processor() or None


def _linux_on_battery() -> bool | None:
    supplies = [p for p in _POWER_SUPPLY_DIR.iterdir() if (p / "type").is_file()]
    kinds = {p: (p / "type").read_text().strip() for p in supplies}
    if "Battery" not in kinds.values():
        return False
    mains = [p for p, kind in kinds.items() if kind == "Mains" and (p / "online").is_file()]
    if not mains:
        return None
    return not any((p / "online").read_text().strip() == "1" for p in mains)


def on_battery() -> bool | None:
    """True when running on battery power; False on mains or without a battery; None if unknown."""
    if _POWER_SUPPLY_DIR.is_dir():
        return _linux_on_battery()
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["pmset", "-g", "batt"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if "Battery Power" in out.stdout:
            return True
        return False if "AC Power" in out.stdout else None
    return None


def _nvml_init() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or no GPU: there is nothing to record
        return None
    return pynvml


@contextmanager
def _nvml() -> Iterator[ModuleType | None]:
    """An initialized pynvml module for the block, or None when NVML is unavailable."""
    nvml = _nvml_init()
    try:
        yield nvml
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()


def _query(nvml: ModuleType, fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML reading; None when this device does not support it."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _device_info(nvml: ModuleType, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    return {
        "index": index,
        "name": _query(nvml, nvml.nvmlDeviceGetName, handle),
        "memory_bytes": None if memory is None else int(memory.total),
        "max_sm_clock_mhz": _query(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        "max_memory_clock_mhz": _query(
            nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM
        ),
    }


def gpu_info() -> dict[str, Any] | None:
    """Driver, CUDA driver version and every visible device (name, memory, max clocks); None without NVML."""
    with _nvml() as nvml:
        if nvml is None:
            return None
        cuda = _query(nvml, nvml.nvmlSystemGetCudaDriverVersion)
        return {
            "driver": _query(nvml, nvml.nvmlSystemGetDriverVersion),
            "cuda_driver": None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            "devices": [_device_info(nvml, i) for i in range(nvml.nvmlDeviceGetCount())],
        }


def gpu_snapshot(index: int = 0) -> dict[str, Any] | None:
    """Current SM/memory clocks (MHz), temperature (°C), power (W), utilization (%) and other processes of
    GPU `index`; None without NVML."""
    with _nvml() as nvml:
        if nvml is None or index >= nvml.nvmlDeviceGetCount():
            return None
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        milliwatts = _query(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
        return {
            "sm_clock_mhz": _query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            "memory_clock_mhz": _query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
            "temperature_c": _query(
                nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": None if milliwatts is None else milliwatts / 1000.0,
            **gpu_readings(nvml, handle),
        }


def take_snapshot(gpu_index: int = 0) -> Snapshot:
    """Power source, machine load and GPU conditions now: call at the start (after warm-ups: an idle GPU sits
    at low clocks, e.g. 405 MHz SM on an H200) and at the end of every timed run; `contention(start, end)`
    says whether the machine was shared in between."""
    return Snapshot(time=time.time(), on_battery=on_battery(), **cpu_readings(), **(gpu_snapshot(gpu_index) or {}))


def capture_environment() -> dict[str, Any]:
    """Everything that must match before two runs are compared, as a JSON-ready dict."""
    return {
        "captured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": git_state(),
        "command": command_line(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "cpu": {"model": cpu_model(), "cores": os.cpu_count()},
        "on_battery": on_battery(),
        "gpu": gpu_info(),
    }
