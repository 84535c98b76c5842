"""Shared fixtures: tiny models of every architecture whose greedy text varies, and the real default model."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from kerneltriage.engine.architectures import ARCHITECTURES
from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
from kerneltriage.engine.config import ModelConfig, RopeScaling

ARCHS = tuple(ARCHITECTURES)
# the GGUF and config.json mutators and the fuzz harness live with the fuzzing tool that shares them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "tools" / "fuzzkit"))
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # Triton kernels run in Triton's interpreter on a machine without CUDA: read when triton itself is first
    # imported, so it is set here, before any test imports it (tests/test_kernels_triton.py).
    os.environ["TRITON_INTERPRET"] = "1"
# A command run without --ledger records into the user's ledger: in tests, a throwaway one (set before any CLI module
# reads the default; subprocesses inherit it).
_LEDGER_DIR = tempfile.mkdtemp(prefix="kt-test-ledger-")
atexit.register(shutil.rmtree, _LEDGER_DIR, True)
os.environ["KERNELTRIAGE_LEDGER"] = str(Path(_LEDGER_DIR) / "ledger.db")


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread for the whole run: on a 2-core machine shared with anything else a parallel region waits
    for a busy worker (tiny steps took 7× as long, the real model's reference 77 s instead of 4 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def frozen_heap() -> None:
    """What is alive when a test module starts (imported libraries, session fixtures, earlier tests' reports) is
    frozen out of the cyclic garbage collector: a backend's release() runs gc.collect() after each model it drops,
    and each full collection walked those long-lived objects again (0.2 s a call, 66 calls in the ab and triage
    tests alone: 14 s). What the tests create is collected as before; garbage is collected before freezing, as a
    frozen cycle is never freed (nor is what was alive here and becomes a cycle later: ~450 objects a session)."""
    gc.collect()
    gc.freeze()


def tiny_config(arch: str, **changes: object) -> ModelConfig:
    """A 2-layer model of `arch` with GQA; llama gets Llama-3 rope scaling, qwen3 a head_dim ≠ hidden/heads, gemma3 a
    sliding first layer whose window (8) the tests' sequences pass, a query scale ≠ head_dim's, capped logits and an
    untied head (tied to its embedding scaled by sqrt(hidden), random weights repeat the last token)."""
    base = dict(
        arch=arch, vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_context=128, rope_theta=10000.0, rms_eps=1e-6,
        tie_embeddings=arch in ("qwen2", "qwen3"), attention_bias=ARCHITECTURES[arch].attention_bias,
        qk_norm=ARCHITECTURES[arch].qk_norm,
        eos_token_ids=(), name=f"tiny-{arch}", random_weights=False,
    )
    if arch == "llama":
        base["rope_scaling"] = RopeScaling(4.0, 1.0, 4.0, 32)
    if arch == "qwen3":
        base["head_dim"] = 32
    if arch == "gemma3":
        base |= dict(sliding_window=8, sliding_pattern=2, rope_local_theta=100.0, query_pre_attn_scalar=24,
                     final_logit_softcapping=20.0)
    base.update(changes)
    return ModelConfig(**base)


WEIGHT_STD = 0.3  # large: the stock N(0, 0.02) init mostly repeats one token, and an equality test needs variety


def tiny_tensors(config: ModelConfig, seed: int = 0) -> dict[str, RawTensor]:
    """Every weight of a `config` model as float32 tensors: matrices N(0, 0.3), norms near 1, biases small."""
    rng = np.random.default_rng(seed)
    h, q, kv, d = config.hidden_size, config.q_size, config.kv_size, config.head_dim

    def tensor(*shape: int, scale: float = WEIGHT_STD, center: float = 0.0) -> RawTensor:
        return RawTensor("F32", shape, (center + scale * rng.standard_normal(shape)).astype(np.float32))

    record = config.architecture
    norm = 1.0 - record.norm_offset  # Gemma's norms scale by 1 + w: w near 0

    tensors = {"embed": tensor(config.vocab_size, h), "norm": tensor(h, scale=0.1, center=norm)}
    if not config.tie_embeddings:
        tensors["lm_head"] = tensor(config.vocab_size, h)
    for i in range(config.num_layers):
        layer = {"attn_norm": tensor(h, scale=0.1, center=norm), "mlp_norm": tensor(h, scale=0.1, center=norm),
                 "q": tensor(q, h), "k": tensor(kv, h), "v": tensor(kv, h), "o": tensor(h, q),
                 "gate": tensor(config.intermediate_size, h), "up": tensor(config.intermediate_size, h),
                 "down": tensor(h, config.intermediate_size)}
        if config.attention_bias:
            layer |= {"q_bias": tensor(q, scale=0.1), "k_bias": tensor(kv, scale=0.1), "v_bias": tensor(kv, scale=0.1)}
        if config.qk_norm:
            layer |= {"q_norm": tensor(d, scale=0.1, center=norm), "k_norm": tensor(d, scale=0.1, center=norm)}
        if record.sandwich_norms:
            layer |= {name: tensor(h, scale=0.1, center=norm) for name in ("attn_post_norm", "mlp_post_norm")}
        tensors |= {f"layers.{i}.{name}": t for name, t in layer.items()}
    return tensors


def tiny_checkpoint(arch: str = "llama", seed: int = 0, **changes: object) -> Checkpoint:
    """A tiny `arch` model with explicit weights (not a preset: digests must match exactly across levers)."""
    from kerneltriage.engine.tokenizer import Tokenizer

    config = tiny_config(arch, **changes)
    return Checkpoint(config, tiny_tensors(config, seed), Tokenizer.synthetic(config.vocab_size), source=config.name)


def tiny_runner(arch: str, levers: str = "", dtype: str = "float32", **changes: object):
    """A torch runner of a tiny `arch` model on the CPU with `levers` (an --levers string) applied."""
    from kerneltriage.backends.torch.backend import BACKEND
    from kerneltriage.engine.configuration import RunConfig

    return BACKEND.build(tiny_checkpoint(arch, **changes), RunConfig.from_flags(levers), "cpu", dtype)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF, fetched into the user cache on first use."""
    from kerneltriage.engine.fetch import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def default_checkpoint(default_gguf: Path) -> Checkpoint:
    from kerneltriage.engine.sources import load_checkpoint

    return load_checkpoint(str(default_gguf))


@pytest.fixture(scope="session")
def default_gguf_reader(default_gguf: Path):  # noqa: ANN201 - a gguf.GGUFReader
    """gguf-py's reader of the default GGUF, parsed once for the session: a parse costs ~5 s (a Python loop per
    element of its 49k tokens and 48k merges), and the header test, transformers' model and its tokenizer all read
    it. Its ~500k objects are frozen out of the garbage collector's walks with the rest (frozen_heap)."""
    from gguf import GGUFReader

    return GGUFReader(default_gguf)


@pytest.fixture(scope="session")
def hf_gguf(default_gguf: Path, default_gguf_reader):  # noqa: ANN001, ANN201
    """transformers' loading of the default GGUF, to the same results in less time; a context manager per use.
    transformers parses the file once per load_gguf_checkpoint (twice for a model, once for a tokenizer): it gets
    `default_gguf_reader` instead. And it rebuilds gguf-py's tensor-name map, a pure function of (arch, layers),
    for every submodule (~400 times, 8 s): memoized."""
    import functools

    import gguf

    original = gguf.GGUFReader

    def reader(path, mode="r"):  # noqa: ANN001, ANN202
        same = mode == "r" and Path(path).resolve() == default_gguf.resolve()
        return default_gguf_reader if same else original(path, mode)

    @contextlib.contextmanager
    def use() -> Iterator[None]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gguf, "GGUFReader", reader)
            patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
            yield

    return use


def rerun_capture(runner):  # noqa: ANN001, ANN201 - a capture function for GraphedStep
    def capture(fn, warmups: int):  # noqa: ANN001, ANN202
        for _ in range(warmups):
            fn()
        window, output = runner.model.cache.window, fn()

        class Graph:
            def replay(self) -> None:
                cache, counts = runner.model.cache, Counter(runner.counters)
                cache.window = window
                try:
                    output.copy_(fn())
                finally:
                    cache.window = None
                    runner.counters.clear()
                    runner.counters.update(counts)  # a replay's Python does not run: GraphedStep counts it

        return Graph(), output

    return capture


@pytest.fixture(scope="session")
def shared_answers():  # noqa: ANN201
    """distill.training_sequences memoized for the session: the distill and EAGLE tests train on the same greedy
    answers of the real model (the same prompts and lengths), generated once. A context manager per use."""
    from kerneltriage.train import distill

    original, cache = distill.training_sequences, {}

    def cached(target, continuation, progress, prompts=None,  # noqa: ANN001, ANN202
               params=(distill.SamplingParams(),)):  # noqa: B008 - frozen: one shared default is safe
        answers = []
        for prompt in distill.PROMPTS if prompts is None else prompts:  # prompt by prompt: the tests' sets overlap
            key = (id(target.checkpoint), target.dtype, continuation, prompt, tuple(params))
            if key not in cache:
                cache[key] = original(target, continuation, progress, [prompt], params)
            answers += cache[key]
        return answers

    @contextlib.contextmanager
    def use():  # noqa: ANN202
        distill.training_sequences = cached
        try:
            yield
        finally:
            distill.training_sequences = original

    return use


@pytest.fixture(scope="session")
def gpu_greedy(default_checkpoint):  # noqa: ANN001, ANN201
    """The real default model's greedy tokens on CUDA (float32) after a prompt under a lever set, memoized for the
    session: the GPU tests' references, each decoded once however many tests compare against it."""
    from kerneltriage.backends.torch.backend import BACKEND
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.generation import generate_step
    from kerneltriage.engine.sampling import SamplingParams

    cache: dict[tuple, list[int]] = {}

    def greedy(prompt: list[int], new: int, levers: str = "") -> list[int]:
        key = (tuple(prompt), new, levers)
        if key not in cache:
            runner = BACKEND.build(default_checkpoint, RunConfig.from_flags(levers), "cuda", "float32")
            cache[key] = list(generate_step(runner, prompt, SamplingParams(), new))
            BACKEND.release(runner)
        return cache[key]

    return greedy
