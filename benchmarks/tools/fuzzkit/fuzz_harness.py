"""Load mutated model files in a worker process under a memory cap and a per-case timeout, and classify what
happened. Shared by the CI fuzz test (tiny files) and `benchmarks/tools/fuzz_load.py` (the real default model).

Outcomes: `loaded` (logits of a short prompt all finite), `input-error` (the project's one-line error),
`non-finite` (loaded, but NaN/inf logits: a corrupt header accepted), `traceback` (any other exception),
`memory` (an allocation past the cap: something was allocated before validation refused it), `hang` (no
answer within the timeout) and `crash` (the worker died). Only the first two are acceptable.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
ACCEPTABLE = ("loaded", "input-error")
PROMPT = "hello world"
_MEMORY_MESSAGES = ("can't allocate memory", "not enough memory", "out of memory")


@dataclass(frozen=True)
class Case:
    """One file or folder to load, and what was done to it."""

    path: Path
    what: str
    reference: Path | None = None  # the pristine GGUF: its converted tokenizer is reused when unchanged
    disposable: bool = False  # removed once loaded (mutants of a real model are 98 MB each)


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@functools.lru_cache(maxsize=4)
def _tokenizer_meta(path: Path) -> dict[str, Any]:
    from kerneltriage.engine.gguf_header import read_header

    return {k: v for k, v in read_header(path).meta.items() if k.startswith("tokenizer.")}


def _seed_tokenizer(case: Case) -> None:
    """Reuse the pristine file's converted tokenizer when the mutant's tokenizer metadata is unchanged:
    conversion (transformers, seconds on a real vocabulary) would then rebuild the same tokenizer."""
    from kerneltriage.core.errors import InputError
    from kerneltriage.engine.paths import converted_dir

    if case.reference is None or not case.path.is_file():
        return
    try:
        mutant = _tokenizer_meta.__wrapped__(case.path)
    except InputError:
        return
    pristine = _tokenizer_meta(case.reference)
    cached = converted_dir(case.reference) / "tokenizer.json"
    if mutant == pristine and cached.is_file():
        target = converted_dir(case.path)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(cached, target / "tokenizer.json")


def _model_fingerprint(path: Path, config: dict[str, Any]) -> tuple:
    """What the built model depends on: its config and where each tensor's bytes are (the data is untouched)."""
    from kerneltriage.engine.gguf_header import read_header

    return model_config(config), [(t.name, t.qtype, t.shape, t.offset) for t in read_header(path).tensors]


def model_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config without its `name` (the file's stem: every mutant's differs) — what the model is built from."""
    return {key: value for key, value in config.items() if key != "name"}


@functools.lru_cache(maxsize=4)
def _reference_fingerprint(path: Path) -> tuple:
    from kerneltriage.engine.sources import load_checkpoint

    return _model_fingerprint(path, load_checkpoint(str(path)).config.to_dict())


def load_and_run(path: Path, reference: Path | None = None) -> dict[str, Any]:
    """Load `path` on the CPU in float32 and run a short prompt; the outcome as a JSON-ready dict.

    A mutant that builds exactly the reference's model (same config, same tensor bytes: only a name, a
    token string or an unused key changed) is not built again: its weights are the reference's, whose logits
    the run checks first. On a real model this saves seconds a case."""
    import torch

    from kerneltriage.backends.torch.backend import build_runner
    from kerneltriage.cli.generate import encode_prompt
    from kerneltriage.core.errors import InputError
    from kerneltriage.engine.sources import load_checkpoint

    try:
        checkpoint = load_checkpoint(str(path))
        config = checkpoint.config.to_dict()
        if reference is not None and _model_fingerprint(path, config) == _reference_fingerprint(reference):
            return {"outcome": "loaded", "config": config, "same_model": True}
        ids = encode_prompt(checkpoint, PROMPT, chat=False) or [0]  # the CLI's rule: fewer than the context
        runner = build_runner(checkpoint, torch.device("cpu"), torch.float32)
        runner.reset_cache(len(ids))
        with torch.inference_mode():
            logits = runner.model(torch.tensor([ids]), 0)
        finite = bool(torch.isfinite(logits).all())
        return {"outcome": "loaded" if finite else "non-finite", "config": checkpoint.config.to_dict()}
    except InputError as exc:
        lines = str(exc).splitlines()
        return {"outcome": "input-error" if len(lines) == 1 else "traceback", "message": str(exc)}
    except MemoryError as exc:
        return {"outcome": "memory", "message": f"MemoryError: {exc}"}
    except Exception as exc:  # the point of the fuzz: any other exception is a finding, recorded
        memory = any(m in str(exc) for m in _MEMORY_MESSAGES)
        return {"outcome": "memory" if memory else "traceback", "message": f"{type(exc).__name__}: {exc}"[:300]}


def serve(cap_bytes: int) -> None:
    """Worker loop: JSON cases on stdin, one JSON result per line on stdout, under RLIMIT_AS."""
    import torch  # noqa: F401 - imported before the cap, so the cap counts what loading adds

    import kerneltriage.backends.torch.backend  # noqa: F401
    import kerneltriage.engine.sources  # noqa: F401
    from kerneltriage.engine.paths import converted_dir

    limit = _vm_bytes() + cap_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    results, sys.stdout = sys.stdout, sys.stderr  # whatever a library prints must not mix with the results
    print(json.dumps({"ready": True}), file=results, flush=True)
    for line in sys.stdin:
        spec = json.loads(line)
        case = Case(Path(spec["path"]), spec["what"], spec["reference"] and Path(spec["reference"]),
                    spec["disposable"])
        started = time.perf_counter()
        _seed_tokenizer(case)
        result = load_and_run(case.path, case.reference) | {"seconds": round(time.perf_counter() - started, 3)}
        if case.disposable and case.path.is_file():  # its converted tokenizer would pile up: 1.5 MB a mutant
            shutil.rmtree(converted_dir(case.path), ignore_errors=True)
        print(json.dumps(result), file=results, flush=True)


class Worker:
    """A `serve` process; restarted after a hang or a crash."""

    def __init__(self, cap_bytes: int, cache: Path) -> None:
        self.cap_bytes, self.cache, self.proc = cap_bytes, cache, None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{TESTS}", "KERNELTRIAGE_CACHE": str(self.cache),
               "KERNELTRIAGE_OFFLINE": "1"}
        code = f"from fuzz_harness import serve; serve({self.cap_bytes})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, case: Case, timeout_s: float) -> dict[str, Any]:
        if self.proc is None:
            self.start()
        spec = {"path": str(case.path), "what": case.what, "reference": case.reference and str(case.reference),
                "disposable": case.disposable}
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        code = self.proc.poll()
        self.stop()
        if not ready:
            return {"outcome": "hang", "seconds": timeout_s}
        return {"outcome": "crash", "message": f"worker exited with status {code}"}


def run_cases(cases: Iterator[Case], cap_bytes: int, timeout_s: float, cache: Path) -> list[dict[str, Any]]:
    """Every case through one worker (restarted as needed); each result carries its case's description."""
    worker = Worker(cap_bytes, cache)
    results = []
    try:
        for case in cases:
            results.append({"what": case.what} | worker.run(case, timeout_s))
            if case.disposable:
                shutil.rmtree(case.path) if case.path.is_dir() else case.path.unlink(missing_ok=True)
    finally:
        worker.stop()
    return results


def tally(results: list[dict[str, Any]]) -> dict[str, int]:
    """Outcome → count."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result["outcome"]] = counts.get(result["outcome"], 0) + 1
    return dict(sorted(counts.items()))
