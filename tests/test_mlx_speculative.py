"""Speculative decoding on MLX through the shared engine loop: greedy output equals plain greedy for every draft
source and architecture, the sampled acceptance reproduces the target distribution, sampling and the logits
processors behave as on torch."""

from __future__ import annotations

import functools

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from conftest import ARCHS, tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner  # noqa: E402
from kerneltriage.backends.mlx.acceptance import rejection_accept  # noqa: E402
from kerneltriage.backends.mlx.sampling import MlxSampler, filter_logits, repetition_penalty  # noqa: E402
from kerneltriage.backends.mlx.speculative import install_speculation, model_drafter  # noqa: E402
from kerneltriage.engine.generation import generate_step  # noqa: E402
from kerneltriage.engine.sampling import SamplingParams  # noqa: E402
from kerneltriage.engine.speculative.config import Speculation  # noqa: E402
from kerneltriage.engine.speculative.decoder import SPEC_COUNTER, SpeculativeDecoder  # noqa: E402

GREEDY = SamplingParams()
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
NEW = 32
CHI2_CRITICAL = {3: 16.266, 4: 18.467, 5: 20.515}  # χ² at α = 0.001 by degrees of freedom (standard tables)


@functools.cache
def plain(arch: str) -> tuple[int, ...]:
    return tuple(generate_step(mlx_runner(tiny_checkpoint(arch)), PROMPT, GREEDY, NEW))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", ["ngram", "suffix", "selfdraft:1", "draft"])
def test_greedy_speculation_equals_plain_greedy(arch: str, source: str) -> None:
    if source == "draft":  # the target's first layer as a model of its own
        runner = mlx_runner(tiny_checkpoint(arch))
        drafter = model_drafter(mlx_runner(tiny_checkpoint(arch, num_layers=1)))
        decoder = install_speculation(runner, Speculation("draft", draft_model="test", depth=3), drafter)
    else:
        runner = mlx_runner(tiny_checkpoint(arch), spec=source, depth="3")
        decoder = runner.speculation
    assert isinstance(runner.token_loop, SpeculativeDecoder)  # the shared engine loop
    assert tuple(generate_step(runner, PROMPT, GREEDY, NEW)) == plain(arch)
    assert runner.counters[SPEC_COUNTER] == decoder.stats.verify_steps > 0


def test_speculation_through_compiled_levered_steps_equals_plain() -> None:
    runner = mlx_runner(tiny_checkpoint("qwen2"), "packed_qkv,compile=default", spec="selfdraft:1", depth="2")
    assert tuple(generate_step(runner, PROMPT, GREEDY, NEW)) == plain("qwen2")
    assert runner.counters[SPEC_COUNTER] > 0 and runner.counters["compile=default"] > 0


@pytest.mark.parametrize("levers", ["", "one_sync"])
def test_speculation_pipelines_its_plain_steps_as_one_sync_and_counts_them_where_asked(levers: str) -> None:
    """MLX runs no resident steps: under `one_sync` the speculative loop's pipelined plain steps are the lever's
    (an A/B of speculation on a stack with it would otherwise read `one_sync` as never run)."""
    runner = mlx_runner(tiny_checkpoint("llama"), levers, spec="suffix", depth="auto")
    assert tuple(generate_step(runner, PROMPT, GREEDY, NEW)) == plain("llama")
    assert (runner.counters["one_sync"] > 0) == (levers == "one_sync")


def test_sampled_speculation_is_seeded() -> None:
    def sampled(seed: int) -> list[int]:
        runner = mlx_runner(tiny_checkpoint("llama"), spec="selfdraft:2", depth="3")  # the whole target drafts
        return list(generate_step(runner, PROMPT, SamplingParams(temperature=0.8, top_k=50, seed=seed), NEW))

    first = sampled(3)
    assert first == sampled(3) and first != sampled(4) and first != list(plain("llama"))


def test_rejection_sampling_reproduces_the_target_distribution() -> None:
    """Every emitted position follows p, whatever the draft's q (Leviathan et al., Theorem 1)."""
    vocab, k, trials = 6, 3, 100_000
    rng = np.random.default_rng(11)
    p = rng.dirichlet(np.ones(vocab), size=k + 1)
    q = rng.random((k, vocab)) ** 3 + 0.01
    q /= q.sum(-1, keepdims=True)
    drafts = np.stack([rng.choice(vocab, size=trials, p=row) for row in q], axis=1)  # (B, k) with d_i ~ q_i
    pb, qb = (mx.broadcast_to(mx.array(a, dtype=mx.float32), (trials, *a.shape)) for a in (p, q))
    n, last = rejection_accept(pb, qb, mx.array(drafts), (mx.random.key(1), mx.random.key(2)))
    n, last = np.array(n), np.array(last)
    emitted = np.where(np.arange(k + 1)[None] < n[:, None], np.pad(drafts, ((0, 0), (0, 1))), -1)
    emitted[np.arange(trials), n] = last
    for position in range(k + 1):
        reached = emitted[:, position][emitted[:, position] >= 0]
        counts = np.bincount(reached, minlength=vocab)
        expected = p[position] * counts.sum()
        assert reached.size > 1000 and ((counts - expected) ** 2 / expected).sum() < CHI2_CRITICAL[vocab - 1]


def test_filters_keep_the_expected_tokens() -> None:
    logits = mx.array([[4.0, 3.0, 2.0, 1.0, 0.0]])
    kept = lambda **kw: (np.array(filter_logits(logits, SamplingParams(temperature=1.0, **kw))) > -np.inf)[0]  # noqa: E731
    assert kept(top_k=2).tolist() == [True, True, False, False, False]
    assert kept(top_p=0.7).tolist() == [True, True, False, False, False]
    assert kept(min_p=0.3).tolist() == [True, True, False, False, False]


def test_repetition_penalty_lowers_the_tokens_seen_and_joins_the_history() -> None:
    logits = mx.array([[2.0, -2.0, 1.0, 0.5]])
    out = np.array(repetition_penalty(2.0)(mx.array([0, 1]), logits))
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]] and np.array(logits).tolist() == [[2.0, -2.0, 1.0, 0.5]]
    sampler = MlxSampler(SamplingParams(repetition_penalty=100.0), [3])
    tokens = [int(sampler(mx.array([[0.0, 0.1, 0.2, 5.0]])).item()) for _ in range(2)]
    # 3 was seen: penalized away; then 2 was emitted and is penalized in its turn
    assert tokens == [2, 1] and np.array(sampler.history).tolist() == [3, 2, 1]
