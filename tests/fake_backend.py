"""A backend with no framework: a deterministic toy model, numpy logits and a fake clock whose steps cost what a
test says. It implements `engine/backend.py`'s protocol, so bench, ab and triage run on it unchanged — and a
test can plant a lever's exact effect on time and see what the verdict rule makes of it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from kerneltriage.core.errors import InputError
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.decoding import plain_loop
from kerneltriage.engine.levers import Place
from kerneltriage.engine.probes import PhaseProfile
from kerneltriage.engine.tokenizer import Tokenizer

VOCAB = 256
TABLE = np.random.default_rng(0).standard_normal((VOCAB, 7, VOCAB))  # the toy model: logits of (token, position)


class FakeClock:
    """Seconds that move only when the fake device works (or a test advances them)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Effect:
    """What a lever does to time: prefill and decode seconds are multiplied by these factors — only once every
    lever of `needs` is on too, and as `instead[other]` says where `other` is on (levers that interact)."""

    prefill: float = 1.0
    decode: float = 1.0
    counts: bool = True  # False: a lever whose code never runs (its counter stays at zero)
    needs: tuple[str, ...] = ()
    instead: dict[str, "Effect"] = field(default_factory=dict)

    def under(self, on: set[str]) -> "Effect":
        """This lever's effect with the levers `on` beside it."""
        if not set(self.needs) <= on:
            return Effect(counts=self.counts)
        return next((effect for other, effect in self.instead.items() if other in on), self)


def fake_checkpoint() -> Checkpoint:
    config = ModelConfig("llama", VOCAB, 16, 32, 2, 2, 1, 8, 512, name="fake", random_weights=False)
    return Checkpoint(config, {}, Tokenizer.synthetic(VOCAB), source="fake")


class _Read:
    def __init__(self, token: int) -> None:
        self.value = int(token)

    def result(self) -> int:
        return self.value


class FakeSampler:
    host_bound = False  # no constraint: the loops never wait for a token to sample the next

    def __init__(self, prompt: Sequence[int]) -> None:
        self.prompt = list(prompt)

    def __call__(self, logits: np.ndarray) -> int:
        return int(np.argmax(logits))

    def accept(self, logits: np.ndarray, draft: Any) -> list[int]:
        raise NotImplementedError("the fake backend does not speculate")


@dataclass
class FakeRunner:
    """The protocol's runner over a toy model: the next token's logits are a fixed table row of the last token
    and the position. Each prefilled token and each decode step costs `prefill_seconds` / `decode_seconds`
    on the fake clock, times the levers' factors, times lognormal noise of spread `noise`."""

    checkpoint: Checkpoint
    run_config: RunConfig
    clock_: FakeClock
    effects: dict[str, Effect]
    rng: random.Random
    noise: float = 0.02
    prefill_seconds: float = 1e-4
    decode_seconds: float = 1e-3
    calls: list[str] = field(default_factory=list)  # the fake device's log: what ran, in order
    name: str = ""
    counters: Counter = field(default_factory=Counter)
    approximations: list[str] = field(default_factory=list)
    backend: str = "fake"
    device: str = "cpu"
    device_type: str = "cpu"
    dtype: str = "float32"
    dtype_bytes: int = 4
    gpu_index: int | None = None
    speculation: Any = None
    capacity: int = 0

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config

    @property
    def place(self) -> Place:
        return Place(self.backend, self.device_type, self.config.arch)

    def factor(self, phase: str) -> float:
        """What the levers on multiply a `phase` step's seconds by."""
        factor, on = 1.0, set(self.run_config.lever_names)
        for setting in self.run_config.levers:
            factor *= getattr(self.effects.get(setting.text, Effect()).under(on), phase)
        return factor

    def _work(self, phase: str, seconds: float) -> None:
        for setting in self.run_config.levers:
            if self.effects.get(setting.text, Effect()).counts:
                self.counters[setting.text] += 1
        self.clock_.now += seconds * self.factor(phase) * self.rng.lognormvariate(0.0, self.noise)
        self.calls.append(f"{self.name} {phase}")

    def _logits(self, token: int, position: int) -> np.ndarray:
        return TABLE[int(token), position % 7][None]  # (1, V)

    def reset_cache(self, needed: int) -> None:
        self.capacity = max(self.capacity, needed)

    def drop_cache(self) -> None:
        self.capacity = 0

    def trim_cache(self, length: int) -> None:
        pass

    @property
    def cache_capacity(self) -> int:
        return self.capacity

    pads_verify = False

    def prefill(self, tokens: Sequence[int], start: int) -> np.ndarray:
        self._work("prefill", self.prefill_seconds * len(tokens))
        return self._logits(tokens[-1], start + len(tokens) - 1)

    def decode(self, token: int, position: int) -> np.ndarray:
        self._work("decode", self.decode_seconds)
        return self._logits(token, position)

    def verify(self, last: int, drafts: Sequence[int], start: int, rows: int) -> np.ndarray:
        raise NotImplementedError("the fake backend does not speculate")

    def sampler(self, params: Any, prompt: Sequence[int], processors: Sequence[Any] = ()) -> FakeSampler:
        if processors:
            raise NotImplementedError("the fake backend samples greedily, without logits processors")
        return FakeSampler(prompt)

    def loop(self, logits: np.ndarray, start: int, count: int, sampler: FakeSampler) -> Iterator[int]:
        return plain_loop(self, logits, start, count, sampler)

    def read_later(self, token: int) -> _Read:
        return _Read(token)

    def greedy(self, logits: np.ndarray) -> int:
        return int(np.argmax(logits))

    def clock(self) -> float:
        return self.clock_()

    def synchronize(self) -> None:
        pass

    def forced_logits(self, prompt: Sequence[int], fed: Sequence[int] | None, count: int
                      ) -> tuple[np.ndarray, list[int]]:
        rows, fed = [self._logits(prompt[-1], len(prompt) - 1)[0]], list(fed or [])
        while len(rows) < count:
            if len(fed) < len(rows):
                fed.append(int(np.argmax(rows[-1])))
            rows.append(self._logits(fed[len(rows) - 1], len(prompt) + len(rows) - 1)[0])
        return np.stack(rows), fed

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory(self) -> int:
        return 0

    def held_bytes(self) -> int:
        return 0


class FakeBackend:
    """Builds FakeRunners on one shared fake clock; `effects` says what each lever (by its text) does."""

    name = "fake"

    def __init__(self, effects: dict[str, Effect] | None = None, noise: float = 0.02, seed: int = 0,
                 noise_by_runner: dict[int, float] | None = None, classes: dict[str, float] | None = None,
                 kernel: tuple[list, list] = ([], []), device: str = "cpu", kernels: float = 10.0,
                 graphed_classes: dict[str, float] | None = None, class_kernels: dict[str, float] | None = None,
                 backend_name: str = "fake") -> None:
        self.classes = classes or {"q_proj": 0.2, "attention": 0.2, "norms": 0.1}  # op class → share of a step
        self.graphed_classes = graphed_classes or self.classes  # … of a step of a runner with `graphs` on
        self.kernels = kernels  # kernels per token the profile counts
        self.class_kernels = class_kernels or {}  # op class → kernels per token, where the profile attributes them
        self.device = device  # "cuda": a fake GPU (levers for CUDA build; triage asks its GPU questions)
        self.backend_name = backend_name  # "torch": the lever table's torch rows apply (the climb's candidates)
        self.kernel_records = kernel  # (KernelChecks, KernelTimings) the kernel probes answer
        self.clock = FakeClock()
        self.effects = effects or {}
        self.noise, self.rng = noise, random.Random(seed)
        self.noise_by_runner = noise_by_runner or {}  # the n-th runner built → its own noise
        self.built: list[FakeRunner] = []
        self.calls: list[str] = []  # the device log of every runner, in order

    def resolve_device(self, name: str) -> str:
        return "cpu"

    def resolve_dtype(self, name: str | None, device: str) -> str:
        return "float32"

    def build(self, checkpoint: Checkpoint, config: RunConfig, device: str = "cpu", dtype: str = "float32"
              ) -> FakeRunner:
        for setting in config.levers:  # as a real backend: a lever runs only on its devices
            if self.device not in setting.lever.devices:
                raise InputError(f"--levers {setting.text}: needs a CUDA device, not {self.device}")
        index = len(self.built)
        runner = FakeRunner(checkpoint, config, self.clock, self.effects, random.Random(self.rng.random()),
                            self.noise_by_runner.get(index, self.noise), calls=self.calls, name=f"r{index}",
                            device=self.device, device_type=self.device, backend=self.backend_name)
        self.built.append(runner)
        return runner

    def copy(self, runner: FakeRunner, config: RunConfig) -> FakeRunner:
        return self.build(runner.checkpoint, config)

    def float32_reference(self, runner: FakeRunner, config: RunConfig | None = None) -> FakeRunner:
        return self.build(runner.checkpoint, config or RunConfig())

    def release(self, runner: FakeRunner) -> None:
        runner.drop_cache()

    def seam_errors(self, runner: FakeRunner) -> dict[str, tuple[float, float]]:
        return {}

    def ceilings(self, device: str, dtype: str, refresh: bool = False) -> Ceilings:
        return Ceilings(1e11, 1e12, "measured", "fake", dtype)

    def ceilings_key(self, device: str, dtype: str) -> str:
        return f"fake {device} | {dtype}"

    def profile(self, runner: FakeRunner, phase: str, prefix: Sequence[int], tokens: Any) -> PhaseProfile:
        step = runner.prefill_seconds * len(tokens) if phase == "prefill" else runner.decode_seconds
        step *= runner.factor(phase)
        shares = self.graphed_classes if runner.run_config.has("graphs") else self.classes
        classes = {name: share * step for name, share in shares.items()}
        counts = {} if runner.run_config.has("graphs") else self.class_kernels  # a replay's kernels: unattributed
        return PhaseProfile(phase, 1, 1, classes, sum(classes.values()), self.kernels, 10.0, 0.0, 0.0, step,
                            class_kernels=dict(counts))

    def kernel_check(self, runner: FakeRunner, ref: str, rows: Sequence[int], depths: Sequence[int]) -> list:
        return self.kernel_records[0]

    def kernel_time(self, runner: FakeRunner, ref: str, rows: int, depth: int) -> list:
        return self.kernel_records[1]

    def host_issue_seconds(self, runner: FakeRunner, prefix: Sequence[int], steps: int) -> None:
        return None

    def census(self, runner: FakeRunner, phase: str, prefix: Sequence[int], tokens: Any) -> dict[str, Any]:
        return {"ops": 10.0, "readbacks": 1.0, "readback_sites": {}, "cpu_ops": 0.0, "cpu_op_sites": {},
                "casts": 0.0, "cast_kinds": {}, "strided_copies": 0.0}


def use_fake_host_clock(monkeypatch: Any) -> None:
    """The bench harness's host clock reads the fake clock of whichever FakeBackend a test builds last."""
    from kerneltriage.bench import harness

    clocks: list = []
    original = FakeBackend.__init__

    def init(self: FakeBackend, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        clocks.append(self.clock)

    monkeypatch.setattr(FakeBackend, "__init__", init)
    monkeypatch.setattr(harness, "host_clock", lambda: clocks[-1]())
