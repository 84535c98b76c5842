"""The llama.cpp peer: the `llama_cpp` package (llama-cpp-python) or a `llama-bench` binary.

llama-cpp-python: all layers on the GPU on CUDA, flash attention on, every thread; each sample goes
through `Llama.eval` and its greedy sampler (the sampler reads the logits, which makes llama.cpp finish
the batch, so a plain clock after it is a synchronized one). A `llama-bench` binary runs once for all
tests (`-p/-n/-d` lists, `-r`, `-o json`) and its rows map one to one onto ours; it reports no separate
time to first token. Both need a GGUF.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from kerneltriage.bench.compare import NOT_INSTALLED, PeerRun
from kerneltriage.bench.harness import Progress, Sample, Settings, TestResult, build_result
from kerneltriage.engine.backend import Runner
from kerneltriage.bench.workloads import Test, Tokens, depths_and_sizes
from kerneltriage.core.environment import Snapshot
from kerneltriage.core.errors import InputError

LLAMA_BENCH_TIMEOUT_S = 3600


def _gguf_path(runner: Runner) -> Path | None:
    source = Path(runner.checkpoint.source)
    return source if source.suffix == ".gguf" and source.is_file() else None


def open_llama_cpp(runner: Runner, tests: Sequence[Test], settings: Settings, progress: Progress | None,
                   llama_bench: Path | None) -> PeerRun:
    """The binary when given (it runs every test now, by itself), else the Python package as an engine."""
    gguf = _gguf_path(runner)
    if gguf is None:
        return PeerRun("llama.cpp", unavailable="needs a GGUF", note="presets and HF folders have none")
    if llama_bench is not None:
        return run_llama_bench(llama_bench, gguf, runner.device_type, tests, settings, progress)
    if importlib.util.find_spec("llama_cpp") is None:
        return PeerRun("llama.cpp", unavailable=NOT_INSTALLED)
    from llama_cpp import Llama

    cuda = runner.device_type == "cuda"
    context = max(t.context_needed for t in tests) + 1
    llm = Llama(model_path=str(gguf), n_ctx=context, n_batch=min(2048, context), n_gpu_layers=-1 if cuda else 0,
                flash_attn=True, n_threads=os.cpu_count(), verbose=False)
    where = "all layers on the GPU" if cuda else f"CPU, {os.cpu_count()} threads"
    return PeerRun("llama.cpp", engine=LlamaCppEngine(llm), note=f"llama-cpp-python, {where}, flash attention")


class LlamaCppEngine:
    """llama-cpp-python's `Llama`: eval and its greedy sampler."""

    name = "llama.cpp"
    params: dict = {}

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def supports(self, test: Test) -> str | None:
        return None

    def prepare(self, test: Test, tokens: Tokens) -> Callable[[], Sample]:
        return _llama_prefill_fn(self.llm, tokens) if test.kind == "pp" else _llama_decode_fn(self.llm, tokens, test.n)

    def start_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None  # its memory is its own: no reading of it here

    def close(self) -> None:
        getattr(self.llm, "close", lambda: None)()  # frees the model and context now, not at exit


def _llama_prefill_fn(llm: Any, tokens: Tokens) -> Callable[[], Sample]:
    """Prefill the prompt after the prefix; the greedy sample reads the logits (llama.cpp syncs there)."""
    llm.reset()
    llm.eval(list(tokens.prefix))  # the depth, untimed; each sample trims back to it

    def run_sample() -> Sample:
        llm.n_tokens = len(tokens.prefix)  # eval() drops cache entries from n_tokens on
        start = time.perf_counter()
        llm.eval(list(tokens.prompt))
        llm.sample(temp=0.0)
        seconds = time.perf_counter() - start
        return Sample(seconds, seconds)

    return run_sample


def _llama_decode_fn(llm: Any, tokens: Tokens, count: int) -> Callable[[], Sample]:
    def run_sample() -> Sample:
        llm.reset()
        start = time.perf_counter()
        llm.eval(list(tokens.prefix))
        generated = [llm.sample(temp=0.0)]
        first = time.perf_counter()
        for _ in range(count):
            llm.eval([generated[-1]])
            generated.append(llm.sample(temp=0.0))
        return Sample(time.perf_counter() - first, first - start, tuple(generated))

    return run_sample


def llama_bench_command(binary: Path, gguf: Path, device: str, tests: Sequence[Test],
                        repeats: int) -> list[str]:
    """One llama-bench invocation covering every test (its cross product equals ours)."""
    sizes = depths_and_sizes(tests)
    join = lambda values: ",".join(map(str, values or [0]))  # noqa: E731
    gpu_layers = "99" if device == "cuda" else "0"
    return [str(binary), "-m", str(gguf), "-p", join(sizes["pp"]), "-n", join(sizes["tg"]),
            "-d", join(sizes["depth"]), "-r", str(repeats), "-ngl", gpu_layers, "-fa", "1", "-o", "json"]


def parse_llama_bench(rows: list[dict[str, Any]], tests: Sequence[Test]) -> list[TestResult]:
    """llama-bench's JSON rows → results, one per test of ours (an unmatched test is an error)."""
    by_test = {}
    for row in rows:
        kind, n = ("pp", row["n_prompt"]) if row["n_prompt"] else ("tg", row["n_gen"])
        by_test[Test(kind, int(n), int(row.get("n_depth", 0)))] = row
    results = []
    for test in tests:
        if test not in by_test:
            raise RuntimeError(f"llama-bench gave no row for {test.name}")
        samples = [Sample(ns / 1e9, None) for ns in by_test[test]["samples_ns"]]
        now = Snapshot(time=time.time())
        results.append(build_result("llama.cpp", test, [], samples, (now, now), None))
    return results


def run_llama_bench(binary: Path, gguf: Path, device: str, tests: Sequence[Test], settings: Settings,
                    progress: Progress | None) -> PeerRun:
    """Run the binary once for all tests and map its rows onto ours."""
    command = llama_bench_command(binary, gguf, device, tests, settings.repeats)
    if progress is not None:
        progress(0, f"llama-bench ({len(tests)} tests)")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=LLAMA_BENCH_TIMEOUT_S, check=True)
    except FileNotFoundError:
        raise InputError(f"--llama-bench {binary}: no such program") from None
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"llama-bench failed (exit {exc.returncode}): {tail[0]}") from None
    results = parse_llama_bench(json.loads(done.stdout), tests)
    if progress is not None:
        progress(len(tests) * (settings.warmups + settings.repeats), "llama-bench done")
    return PeerRun("llama.cpp", results=results, note=f"llama-bench: {' '.join(command[1:])}")
