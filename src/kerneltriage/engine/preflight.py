"""What the command line names, checked before any model loads: a model that cannot be there, a draft model or an
EAGLE head file that is not, a device or dtype no backend spells so.

Each of these surfaced only after loading before (`--spec draft:/no/such.gguf` after 20 s of loading the main model,
`--dtype fp8` after 4 s); here each costs a stat or a four-byte read. The backends check again what only they can
tell (whether a GPU is there, whether the file's header is sound)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend import backend_name
from kerneltriage.engine.fetch import PUBLISHED
from kerneltriage.engine.memory import DTYPE_NAMES
from kerneltriage.engine.presets import PRESETS

if TYPE_CHECKING:
    from kerneltriage.engine.speculative.config import Speculation

DEFAULT_MODEL = "default"
GGUF_MAGIC = b"GGUF"
# --device as each backend spells it (torch also takes cuda:N for any N); availability is the backend's check.
MLX_GPU_NAMES = ("gpu", "metal", "cuda", "cuda:0")
DEVICES = {"torch": ("auto", "cpu", "cuda"), "mlx": ("auto", "cpu", *MLX_GPU_NAMES)}
DEVICES_EXPECTED = {"torch": "auto, cuda, cuda:N or cpu", "mlx": "auto, cpu or (MLX) gpu, metal, cuda"}


def check_engine(backend: str, device: str, dtype: str) -> None:
    """--backend, --device and --dtype spelled as the chosen backend reads them."""
    name = backend_name(backend)
    torch_index = name == "torch" and device.startswith("cuda:") and device[5:].isdigit()
    if device not in DEVICES[name] and not torch_index:
        raise InputError(f"--device {device!r}: expected {DEVICES_EXPECTED[name]}")
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise InputError(f"--dtype {dtype!r}: expected auto or one of {', '.join(DTYPE_NAMES)}")


def check_model_spec(spec: str, label: str | None = None) -> None:
    """`spec` names the default model, a preset, a GGUF file or a Hugging Face folder; `label` is how messages
    name it (default `--model 'SPEC'`)."""
    label = label or f"--model {spec!r}"
    if spec == DEFAULT_MODEL or spec in PRESETS or spec in PUBLISHED:
        return
    path = Path(spec).expanduser()
    if spec.strip() and path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{label}: the folder {path} has no config.json; expected a Hugging Face folder "
                             "(config.json + *.safetensors) or a .gguf file")
        return
    if spec.strip() and path.exists():
        _check_gguf_magic(path, label)
        return
    if path.suffix == ".gguf":
        raise InputError(f"{label}: model file {path}: not found")
    published = ", ".join(name for name in PUBLISHED if name != DEFAULT_MODEL)
    raise InputError(f"{label}: expected 'default', a preset ({', '.join(PRESETS)}), a published model "
                     f"({published}), a .gguf file or a Hugging Face folder with config.json")


def check_speculation(speculation: Speculation | None) -> None:
    """A draft model or an EAGLE head file named by --spec is there."""
    if speculation is None:
        return
    if speculation.source == "draft":
        assert speculation.draft_model is not None  # Speculation's own check: a draft source names its model
        check_model_spec(speculation.draft_model, f"--spec {speculation.source_text!r}")
    head = speculation.head
    if head is not None and not Path(head).expanduser().is_file():
        raise InputError(f"--spec eagle:{head}: no such head file; expected one written by "
                         "`kerneltriage distill --eagle`")


def _check_gguf_magic(path: Path, label: str) -> None:
    if not path.is_file():
        raise InputError(f"{label}: {path} is not a file; expected a .gguf file or a Hugging Face folder")
    try:
        with path.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise InputError(f"{label}: model file {path}: cannot be read ({exc.strerror})") from None
    if magic != GGUF_MAGIC:
        raise InputError(f"{label}: {path} is not a GGUF file (magic {magic!r}; expected 'GGUF')")
