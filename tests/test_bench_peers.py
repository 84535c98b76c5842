"""Peers: HF on a tiny model carrying our weights, unavailable peers reported, skipped tests recorded, engines
closed, llama.cpp mapped one to one."""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
import torch

from conftest import tiny_runner
from kerneltriage.bench.compare import NOT_INSTALLED, PeerRun, run_bench
from kerneltriage.bench.harness import Sample, Settings
from kerneltriage.bench.workloads import Test, expand
from kerneltriage.core.errors import InputError
from kerneltriage.peers import llamacpp, open_peer, parse_peers


def preset_runner(arch: str):
    """A runner of a preset-like model (random_weights: the hf peer copies the runner's weights), carrying the
    tiny model's explicit weights so that greedy text varies and a token-for-token match means something."""
    runner = tiny_runner(arch, random_weights=True)
    explicit = tiny_runner(arch)
    with torch.no_grad():
        for target, source in zip(runner.model.parameters(), explicit.model.parameters(), strict=True):
            target.copy_(source)
    return runner


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_hf_peer_on_a_tiny_model_with_our_weights(arch: str) -> None:
    runner = preset_runner(arch)
    tests = [Test("pp", 8, 4), Test("tg", 6, 3)]
    run = open_peer("hf", runner, tests, Settings(repeats=2))
    assert run.unavailable is None and run.engine is not None and run.note.startswith("attention ")
    results = run_bench(runner, tests, [run], Settings(repeats=2))
    assert [(r.engine, r.test) for r in results] == [
        ("kerneltriage", tests[0]), ("hf", tests[0]), ("kerneltriage", tests[1]), ("hf", tests[1])]
    ours_tg, pp, tg = results[2], results[1], results[3]
    assert (pp.timed.spec.phase, pp.timed.n, len(pp.timed.warmups)) == ("prefill", 2, 1)
    assert tg.timed.spec.phase == "decode" and tg.timed.spec.units_per_sample == 6
    assert pp.peak_memory is None and results[0].peak_memory > 0  # hf reports no CPU peak; ours the process's
    # same weights, same prompt tokens: greedy decoding gives the same tokens as ours
    assert tg.tokens == ours_tg.tokens and len(tg.tokens) == 7 and len(set(tg.tokens)) > 1
    assert not hasattr(run.engine, "model")  # closed: the peer's copy of the weights is freed


def test_unavailable_peers_say_why() -> None:
    runner = tiny_runner("llama")
    tests = [Test("tg", 4)]
    assert open_peer("hf-static", runner, tests, Settings(1)).unavailable == "needs CUDA"
    assert open_peer("llama.cpp", runner, tests, Settings(1)).unavailable == "needs a GGUF"
    other = SimpleNamespace(backend="mlx")  # hf copies torch weights: another backend's runner has none
    assert open_peer("hf", other, tests, Settings(1)).unavailable == "copies torch weights; this runner is mlx"


def test_unknown_peer_is_an_input_error() -> None:
    assert parse_peers("hf, llama.cpp,hf") == ("hf", "llama.cpp")
    with pytest.raises(InputError, match="unknown peer 'vllm'"):
        parse_peers("hf,vllm")


class DecodeOnly:
    """A peer engine that runs decode only and fails (or not) on its samples; it notes being closed."""

    name, params = "decode-only", {}

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.closed = fail, False

    def supports(self, test: Test) -> str | None:
        return None if test.kind == "tg" else "n/a: decode only"

    def prepare(self, test: Test, tokens: object) -> Callable[[], Sample]:
        def run_sample() -> Sample:
            if self.fail:
                raise RuntimeError("peer crashed")
            return Sample(1.0, 2.0, tuple(range(test.n + 1)))
        return run_sample

    def start_memory(self) -> None:
        pass

    def peak_memory(self) -> int | None:
        return None

    def close(self) -> None:
        self.closed = True


def test_run_bench_skips_what_a_peer_does_not_run_and_closes_every_engine() -> None:
    runner = tiny_runner("llama")
    tests = [Test("pp", 8), Test("tg", 4)]
    engine = DecodeOnly()
    binary = PeerRun("bench-binary", results=["its own result"])  # a peer that ran by itself (llama-bench)
    runs = [PeerRun("decode-only", engine=engine), binary, PeerRun("absent", unavailable=NOT_INSTALLED)]
    results = run_bench(runner, tests, runs, Settings(repeats=1, warmups=0))
    assert [(r.engine, r.test.name) for r in results[:-1]] == [
        ("kerneltriage", "pp8"), ("kerneltriage", "tg4"), ("decode-only", "tg4")]
    assert results[-1] == "its own result"  # appended after the interleaved ones
    assert runs[0].skipped == {"pp8": "n/a: decode only"} and engine.closed
    failing = DecodeOnly(fail=True)
    with pytest.raises(RuntimeError, match="peer crashed"):  # a failed peer is an error, not a result
        run_bench(runner, tests[1:], [PeerRun("decode-only", engine=failing)], Settings(repeats=1, warmups=0))
    assert failing.closed


class FakeLlama:
    """Just enough of llama_cpp.Llama: eval extends the context from n_tokens on; sample reads it."""

    instances: list["FakeLlama"] = []

    def __init__(self, model_path: str, **kwargs: object) -> None:
        self.kwargs, self.n_tokens, self.evaluated = kwargs, 0, []
        FakeLlama.instances.append(self)

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: list[int]) -> None:
        self.evaluated.append((self.n_tokens, len(tokens)))
        self.n_tokens += len(tokens)

    def sample(self, temp: float) -> int:
        assert temp == 0.0
        return self.n_tokens % 7


@pytest.fixture()
def gguf_runner(tmp_path: Path):
    runner = tiny_runner("llama")
    runner.checkpoint.source = str(tmp_path / "tiny.gguf")
    Path(runner.checkpoint.source).write_bytes(b"GGUF")
    return runner


def test_llama_cpp_package_runs_every_test_at_its_depth(gguf_runner, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("llama_cpp")
    module.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
    module.Llama = FakeLlama
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    tests = [Test("pp", 8, 4), Test("tg", 5, 2)]
    run = open_peer("llama.cpp", gguf_runner, tests, Settings(repeats=2))
    assert run.unavailable is None and "flash attention" in run.note
    results = run_bench(gguf_runner, tests, [run], Settings(repeats=2))
    assert [(r.engine, r.test) for r in results if r.engine == "llama.cpp"] == [("llama.cpp", t) for t in tests]
    llm = FakeLlama.instances[-1]
    assert llm.kwargs["flash_attn"] is True and llm.kwargs["n_gpu_layers"] == 0  # CPU here
    assert llm.kwargs["n_ctx"] == max(t.context_needed for t in tests) + 1
    # pp: the 4-token depth once, then every sample (1 warm-up + 2 timed) prefills 8 tokens at position 4
    assert llm.evaluated[:4] == [(0, 4), (4, 8), (4, 8), (4, 8)]
    # tg: each sample prefills its 2-token prefix, then feeds back every token but the last
    assert llm.evaluated[4:10] == [(0, 2), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
    assert len(results[-1].tokens) == 6  # first token + 5 decode steps


def test_llama_cpp_not_installed(gguf_runner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp.importlib.util, "find_spec", lambda name: None)
    run = open_peer("llama.cpp", gguf_runner, [Test("tg", 4)], Settings(1))
    assert run.unavailable == NOT_INSTALLED and run.engine is None


LLAMA_BENCH_ROWS = [
    {"n_prompt": 512, "n_gen": 0, "n_depth": 0, "samples_ns": [10_000_000, 12_000_000]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "samples_ns": [1_000_000_000, 1_100_000_000]},
    {"n_prompt": 512, "n_gen": 0, "n_depth": 4096, "samples_ns": [20_000_000, 22_000_000]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 4096, "samples_ns": [1_200_000_000, 1_300_000_000]},
]


def test_llama_bench_command_covers_every_test_once() -> None:
    tests = expand([512], [128], [0, 4096])
    command = llamacpp.llama_bench_command(Path("/opt/llama-bench"), Path("/m.gguf"), "cuda", tests, 3)
    assert command == ["/opt/llama-bench", "-m", "/m.gguf", "-p", "512", "-n", "128", "-d", "0,4096", "-r", "3",
                       "-ngl", "99", "-fa", "1", "-o", "json"]
    cpu = llamacpp.llama_bench_command(Path("b"), Path("m.gguf"), "cpu", [Test("tg", 16)], 1)
    assert cpu[cpu.index("-p") + 1] == "0" and cpu[cpu.index("-ngl") + 1] == "0"  # no pp test: -p 0


def test_llama_bench_rows_map_one_to_one(gguf_runner, monkeypatch: pytest.MonkeyPatch) -> None:
    tests = expand([512], [128], [0, 4096])
    seen = []

    def fake_run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, json.dumps(LLAMA_BENCH_ROWS), "")

    monkeypatch.setattr(llamacpp.subprocess, "run", fake_run)
    run = open_peer("llama.cpp", gguf_runner, tests, Settings(repeats=2), llama_bench=Path("/opt/llama-bench"))
    assert seen == [llamacpp.llama_bench_command(Path("/opt/llama-bench"), Path(gguf_runner.checkpoint.source),
                                                 "cpu", tests, 2)]
    assert run.engine is None and [r.test for r in run.results] == tests
    tg_deep = run.results[3]
    assert tg_deep.timed.samples == (1.2, 1.3) and tg_deep.timed.rate == pytest.approx(256 / 2.5)
    assert tg_deep.first_token is None  # llama-bench reports none


def test_llama_bench_failures_are_errors(gguf_runner, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="no row for tg64"):
        llamacpp.parse_llama_bench(LLAMA_BENCH_ROWS, [Test("tg", 64)])

    def crashed(command: list[str], **kwargs: object) -> None:
        raise subprocess.CalledProcessError(1, command, "", "loading model\nerror: out of memory\n")

    monkeypatch.setattr(llamacpp.subprocess, "run", crashed)
    with pytest.raises(RuntimeError, match="exit 1\\): error: out of memory"):
        open_peer("llama.cpp", gguf_runner, [Test("tg", 4)], Settings(1), llama_bench=Path("/opt/llama-bench"))
