"""The harness: right phases and units, rates as total/total with the first token excluded, a timer that
waits for asynchronous work, and device ceilings measured, cached and labelled."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from conftest import tiny_config, tiny_runner
from kerneltriage.backends.torch import ceilings as ceilings_mod
from kerneltriage.backends.torch import timing
from kerneltriage.bench import harness
from kerneltriage.bench.harness import (KerneltriageEngine, Sample, Settings, decode_sample, run_interleaved, run_test,
                                        run_tests)
from kerneltriage.bench.workloads import Test
from kerneltriage.core import ceilings_cache
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.configuration import RunConfig


def test_tiny_model_gives_prefill_and_decode_measurements() -> None:
    runner = tiny_runner("qwen3")
    steps: list[str] = []
    pp, tg = run_tests(runner, [Test("pp", 8, 4), Test("tg", 6, 3)], Settings(repeats=3),
                       lambda n, what: steps.append(what))
    assert (pp.timed.spec.phase, pp.timed.spec.units_per_sample, pp.timed.n) == ("prefill", 8, 3)
    assert (tg.timed.spec.phase, tg.timed.spec.units_per_sample, tg.timed.n) == ("decode", 6, 3)
    for result in (pp, tg):
        assert len(result.timed.warmups) == 1 and result.first_token.spec.phase == "ttft"
        assert result.timed.rate == pytest.approx(result.timed.n * result.timed.spec.units_per_sample
                                                  / sum(result.timed.samples))
        assert result.peak_memory and result.peak_memory > 0
    assert len(tg.tokens) == 7  # the first token (from the prefill) and the 6 decoded after it
    assert len(steps) == 2 * (1 + 3)  # every warm-up and sample reported


def test_decode_tokens_equal_plain_greedy_generation() -> None:
    from kerneltriage.bench.workloads import tokens_for
    from kerneltriage.engine.generation import generate_step
    from kerneltriage.engine.sampling import SamplingParams

    runner = tiny_runner("llama")
    test = Test("tg", 10, 5)
    result = run_test(runner, test, Settings(repeats=1, warmups=0))
    prompt = list(tokens_for(test, runner.config.vocab_size).prefix)
    expected = list(generate_step(runner, prompt, SamplingParams(), 11))
    assert list(result.tokens) == expected and len(set(expected)) > 1  # a model whose greedy text varies


def test_prefill_sample_trims_back_to_its_depth_every_time() -> None:
    from kerneltriage.bench.workloads import tokens_for

    runner = tiny_runner("qwen2")
    test = Test("pp", 8, 4)
    engine = KerneltriageEngine(runner)
    run_sample = engine.prepare(test, tokens_for(test, runner.config.vocab_size))  # the 4-token depth, untimed
    assert runner.model.cache.length == 4
    for _ in range(3):
        sample = run_sample()
        assert runner.model.cache.length == 4 + 8  # the prompt after the depth, never after the last sample
        assert 0 < sample.timed <= sample.first_token and sample.tokens == ()
    tokens = tokens_for(Test("tg", 3, 4), runner.config.vocab_size)
    decoded = decode_sample(runner, tokens, 3)
    assert len(decoded.tokens) == 4 and runner.model.cache.length == 4 + 3  # the last token is never fed back


class FakeClock:
    """A clock that only moves when the fake runner below says work took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """The harness's side of the runner protocol: prefill takes PREFILL_S, decode steps `step_s[sample]` each."""

    PREFILL_S = 100.0

    def __init__(self, clock: FakeClock, step_s: list[float]) -> None:
        self.clock, self.step_s, self.samples = clock, step_s, 0
        self.config, self.run_config, self.counters = tiny_config("llama"), RunConfig(), Counter()
        self.device_type, self.gpu_index = "cpu", None

    def reset_cache(self, needed: int) -> None:
        pass

    def trim_cache(self, length: int) -> None:
        pass

    def prefill(self, tokens: list[int], start: int) -> str:
        self.clock.now += self.PREFILL_S
        return "logits"

    def greedy(self, logits: str) -> int:
        return 0

    def sampler(self, params: object, prompt: list[int]) -> None:
        return None

    def loop(self, logits: str, start: int, count: int, sampler: object) -> Iterator[int]:
        step = self.step_s[self.samples]
        self.samples += 1
        for i in range(count):
            if i:
                self.clock.now += step
            yield i

    def synchronize(self) -> None:
        pass

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> int:
        return 1


def test_decode_rate_is_total_over_total_and_excludes_the_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(harness, "host_clock", clock)
    # two samples of 4 decode steps: 1 s per step, then 3 s per step
    result = run_test(FakeRunner(clock, [1.0, 3.0]), Test("tg", 4), Settings(repeats=2, warmups=0))
    assert result.timed.samples == (4.0, 12.0)  # the 100 s prefill is not in the decode time
    assert result.first_token.samples == (100.0, 100.0)
    assert result.timed.rate == pytest.approx(8 / 16)  # total tokens / total time
    mean_of_rates = (4 / 4 + 4 / 12) / 2
    assert result.timed.rate != pytest.approx(mean_of_rates)
    assert result.tokens == (0, 1, 2, 3, 4) and result.peak_memory is None  # no warm-up ran alone: no peak


class LoggedEngine:
    """An engine that logs what the harness asks of it, in order, into a shared list."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.params = name, log, {"engine": name}
        self.runs = 0

    def supports(self, test: Test) -> str | None:
        return None

    def prepare(self, test: Test, tokens: object) -> Callable[[], Sample]:
        self.log.append(f"{self.name} prepare")

        def run_sample() -> Sample:
            self.runs += 1
            self.log.append(f"{self.name} {self.runs}")
            return Sample(float(self.runs), None)

        return run_sample

    def start_memory(self) -> None:
        self.log.append(f"{self.name} start_memory")

    def peak_memory(self) -> int | None:
        self.log.append(f"{self.name} peak_memory")
        return 1000

    def close(self) -> None:
        pass


def test_engines_warm_up_apart_then_alternate() -> None:
    log: list[str] = []
    engines = [LoggedEngine("x", log), LoggedEngine("y", log)]
    told: list[str] = []
    test = Test("pp", 4)
    results = run_interleaved(engines, test, None, Settings(repeats=3, warmups=1), None,
                              lambda n, what: told.append(what))
    assert log == ["x prepare", "y prepare",
                   "x start_memory", "x 1", "x peak_memory", "y start_memory", "y 1", "y peak_memory",
                   "x 2", "y 2", "y 3", "x 3", "x 4", "y 4"]  # timed: x y, y x, x y
    x, y = results
    assert (x.engine, y.engine) == ("x", "y") and x.timed.warmups == (1.0,) and x.timed.samples == (2.0, 3.0, 4.0)
    assert x.peak_memory == 1000 and x.first_token is None  # the engine reports no first-token time
    assert x.timed.spec.params["engine"] == "x" and len(told) == 2 * (1 + 3)


class AsyncDevice:
    """A fake asynchronous backend: queued work finishes only when someone synchronizes."""

    def __init__(self) -> None:
        self.pending = 0.0

    def queue(self, seconds: float) -> None:
        self.pending += seconds

    def synchronize(self, device: object) -> None:
        time.sleep(self.pending)
        self.pending = 0.0


def test_the_timer_waits_for_asynchronous_work(monkeypatch: pytest.MonkeyPatch) -> None:
    work_s = 0.05
    backend = AsyncDevice()
    monkeypatch.setattr(timing, "synchronize", backend.synchronize)
    runner = tiny_runner("llama")
    runner.prefill_step = lambda model, tokens, start: (backend.queue(work_s), torch.zeros(1, 300))[1]
    result = run_test(runner, Test("pp", 4), Settings(repeats=3, warmups=0))
    assert min(result.timed.samples) >= work_s  # the clock waited for the queued work

    # The control: a clock that does not synchronize returns before the work is done.
    start = time.perf_counter()
    runner.prefill([1, 2, 3, 4], 0)
    assert time.perf_counter() - start < work_s
    backend.synchronize(None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_synced_clock_waits_for_a_cuda_kernel() -> None:
    device = torch.device("cuda")
    torch.cuda._sleep(1000)  # warm the kernel up
    timing.synchronize(device)
    start = time.perf_counter()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles, queued asynchronously
    queued = time.perf_counter() - start
    waited = timing.synced_clock(device) - start
    assert queued < 0.01 < waited


def test_ceilings_are_measured_once_then_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ceilings.json"
    cpu = torch.device("cpu")
    monkeypatch.setattr(ceilings_cache, "contention", lambda start, end: None)  # quiet: see test_ceilings_load.py
    started = time.perf_counter()
    first = ceilings_mod.get_ceilings(cpu, torch.float32, path=path)
    assert time.perf_counter() - started < 2 * 3.0  # 3 s budget, doubled for a shared 2-core machine
    assert first.source == "measured" and first.bandwidth > 1e8 and first.matmul_flops > 1e8
    assert list(json.loads(path.read_text())) == [ceilings_mod.cache_key(cpu, torch.float32)]

    def must_not_measure(*args: object) -> Ceilings:
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(ceilings_mod, "measure", must_not_measure)
    assert ceilings_mod.get_ceilings(cpu, torch.float32, path=path) == first
    monkeypatch.setattr(ceilings_mod, "measure", lambda d, t: Ceilings(1.0, 2.0, "measured", "x", "float32"))
    assert ceilings_mod.get_ceilings(cpu, torch.float32, refresh=True, path=path).bandwidth == 1.0


def test_datasheet_only_when_measuring_fails_and_labelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object) -> Ceilings:
        raise torch.cuda.OutOfMemoryError("busy")

    monkeypatch.setattr(ceilings_mod, "measure", fails)
    monkeypatch.setattr(ceilings_mod, "device_name", lambda device: "NVIDIA H200")
    fallback = ceilings_mod.get_ceilings(torch.device("cpu"), torch.bfloat16, path=tmp_path / "c.json")
    assert (fallback.source, fallback.bandwidth, fallback.matmul_flops) == ("datasheet", 4.8e12, 989e12)
    assert not (tmp_path / "c.json").exists()  # a fallback is never cached
    monkeypatch.setattr(ceilings_mod, "device_name", lambda device: "some unknown GPU")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ceilings_mod.get_ceilings(torch.device("cpu"), torch.bfloat16, path=tmp_path / "c.json")


def test_a_corrupt_cache_is_measured_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ceilings.json"
    path.write_text("{not json")
    monkeypatch.setattr(ceilings_mod, "measure", lambda d, t: Ceilings(5.0, 6.0, "measured", "cpu", "float32"))
    assert ceilings_mod.get_ceilings(torch.device("cpu"), torch.float32, path=path).bandwidth == 5.0
    assert json.loads(path.read_text())
