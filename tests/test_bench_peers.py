"""Peers: HF on a tiny model carrying our weights, unavailable peers reported, llama.cpp mapped one to one."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import types
from pathlib import Path

import pytest

from conftest import tiny_runner
from kerneltriage.bench import llamacpp_peer
from kerneltriage.bench.harness import Settings
from kerneltriage.bench.peers import open_peer, parse_peers, run_bench
from kerneltriage.bench.workloads import Test, expand
from kerneltriage.core.errors import InputError


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_hf_peer_on_a_tiny_model_with_our_weights(arch: str) -> None:
    runner = tiny_runner(arch)
    tests = [Test("pp", 8, 4), Test("tg", 6, 3)]
    results, (run,) = run_bench(runner, tests, ["hf"], Settings(repeats=2))
    assert run.unavailable is None and [(r.engine, r.test) for r in results] == [
        ("kerneltriage", tests[0]), ("hf", tests[0]), ("kerneltriage", tests[1]), ("hf", tests[1])]
    ours_tg, pp, tg = results[2], results[1], results[3]
    assert (pp.timed.spec.phase, pp.timed.n, len(pp.timed.warmups)) == ("prefill", 2, 1)
    assert tg.timed.spec.phase == "decode" and tg.timed.spec.units_per_sample == 6
    # same weights, same prompt tokens: greedy decoding gives the same tokens as ours
    assert tg.tokens == ours_tg.tokens and len(tg.tokens) == 7


def test_unavailable_peers_say_why() -> None:
    runner = tiny_runner("llama")
    tests = [Test("tg", 4)]
    assert open_peer("hf-static", runner, tests, Settings(1)).unavailable == "needs CUDA"
    assert open_peer("llama.cpp", runner, tests, Settings(1)).unavailable == "needs a GGUF"


def test_unknown_peer_is_an_input_error() -> None:
    assert parse_peers("hf, llama.cpp,hf") == ("hf", "llama.cpp")
    with pytest.raises(InputError, match="unknown peer 'vllm'"):
        parse_peers("hf,vllm")


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
    results, (run,) = run_bench(gguf_runner, tests, ["llama.cpp"], Settings(repeats=2))
    assert [(r.engine, r.test) for r in results if r.engine == "llama.cpp"] == [("llama.cpp", t) for t in tests]
    llm = FakeLlama.instances[-1]
    assert llm.kwargs["flash_attn"] is True and llm.kwargs["n_gpu_layers"] == 0  # CPU here
    # pp: the 4-token depth once, then every sample prefills 8 tokens at position 4
    assert llm.evaluated[:4] == [(0, 4), (4, 8), (4, 8), (4, 8)]
    assert len(results[-1].tokens) == 6  # first token + 5 decode steps
    assert run.unavailable is None and "flash attention" in run.note


def test_llama_cpp_not_installed(gguf_runner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp_peer.importlib.util, "find_spec", lambda name: None)
    assert open_peer("llama.cpp", gguf_runner, [Test("tg", 4)], Settings(1)).unavailable == "not installed"


LLAMA_BENCH_ROWS = [
    {"n_prompt": 512, "n_gen": 0, "n_depth": 0, "samples_ns": [10_000_000, 12_000_000]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "samples_ns": [1_000_000_000, 1_100_000_000]},
    {"n_prompt": 512, "n_gen": 0, "n_depth": 4096, "samples_ns": [20_000_000, 22_000_000]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 4096, "samples_ns": [1_200_000_000, 1_300_000_000]},
]


def test_llama_bench_rows_map_one_to_one(gguf_runner, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    tests = expand([512], [128], [0, 4096])
    seen = []

    def fake_run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, json.dumps(LLAMA_BENCH_ROWS), "")

    monkeypatch.setattr(llamacpp_peer.subprocess, "run", fake_run)
    run = open_peer("llama.cpp", gguf_runner, tests, Settings(repeats=2), llama_bench=Path("/opt/llama-bench"))
    assert seen[0][seen[0].index("-p") + 1:seen[0].index("-p") + 2] == ["512"]
    assert seen[0][seen[0].index("-d") + 1] == "0,4096" and seen[0][-2:] == ["-o", "json"]
    assert [r.test for r in run.results] == tests
    tg_deep = run.results[3]
    assert tg_deep.timed.samples == (1.2, 1.3) and tg_deep.timed.rate == pytest.approx(256 / 2.5)
    assert tg_deep.first_token is None  # llama-bench reports none


def test_llama_bench_missing_row_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no row for tg64"):
        llamacpp_peer.parse_llama_bench(LLAMA_BENCH_ROWS, [Test("tg", 64)])
