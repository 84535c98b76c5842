"""Sampling filters and determinism; the repetition penalty as a logits processor, in sampling and in speculative
acceptance; stop strings."""

from __future__ import annotations

import pytest
import torch

from kerneltriage.backends.torch.sampling import (REPETITION_CONTEXT, TorchSampler, filter_logits, make_generator,
                                                  repetition_penalty, sample)
from kerneltriage.engine.generation import StopStrings
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative.draft import Draft

CPU = torch.device("cpu")

LOGITS = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.07, 0.03]]))


def kept(params: SamplingParams) -> list[int]:
    return torch.isfinite(filter_logits(LOGITS, params))[0].nonzero().flatten().tolist()


def test_filters_keep_the_expected_tokens() -> None:
    assert kept(SamplingParams(temperature=1.0, top_k=2)) == [0, 1]
    assert kept(SamplingParams(temperature=1.0, top_p=0.8)) == [0, 1, 2]  # 0.5+0.25 < 0.8 ≤ +0.15
    assert kept(SamplingParams(temperature=1.0, top_p=0.75)) == [0, 1]
    assert kept(SamplingParams(temperature=1.0, min_p=0.2)) == [0, 1, 2]  # ≥ 0.1
    assert kept(SamplingParams(temperature=1.0)) == [0, 1, 2, 3, 4]


def test_greedy_is_argmax_and_seeded_sampling_repeats() -> None:
    assert sample(LOGITS, SamplingParams()).item() == 0
    params = SamplingParams(temperature=1.0, seed=7)
    draws = lambda: [sample(LOGITS, params, g).item() for g in [make_generator(params, CPU)] for _ in range(50)]  # noqa: E731
    first, second = draws(), draws()
    assert first == second
    assert len(set(first)) > 1


def test_sampling_follows_the_distribution() -> None:
    params = SamplingParams(temperature=1.0, seed=3)
    generator = make_generator(params, CPU)
    draws = sample(LOGITS.expand(20000, -1), params, generator)
    freq = torch.bincount(draws, minlength=5).float() / 20000
    torch.testing.assert_close(freq, LOGITS.exp()[0], atol=0.015, rtol=0)


@pytest.mark.parametrize("bad, message", [(dict(temperature=-1), "temperature=-1"), (dict(top_p=0), "top_p=0"),
                                          (dict(top_k=-1), "top_k=-1"), (dict(min_p=1), "min_p=1"),
                                          (dict(repetition_penalty=0.0), "repetition_penalty=0.0"),
                                          (dict(repetition_penalty=-1.3), "repetition_penalty=-1.3")])
def test_bad_sampling_params_raise(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**bad)


def test_repetition_penalty_lowers_the_tokens_seen_in_its_window() -> None:
    """Positive logits are divided by the penalty, negative ones multiplied: both less likely; tokens seen only
    before the last REPETITION_CONTEXT, or never, keep their logits."""
    logits = torch.tensor([[2.6, -1.3, 0.5, 4.0, -2.0]])
    history = torch.tensor([3] + [0] * (REPETITION_CONTEXT - 2) + [1, 0])  # token 3 just out of the window
    out = repetition_penalty(1.3)(history, logits)
    torch.testing.assert_close(out, torch.tensor([[2.0, -1.69, 0.5, 4.0, -2.0]]))
    assert torch.equal(logits, torch.tensor([[2.6, -1.3, 0.5, 4.0, -2.0]]))  # the input is left as it was


def test_a_penalized_sampler_keeps_its_history_and_avoids_repeats() -> None:
    sampler = TorchSampler(SamplingParams(repetition_penalty=2.0), [4], CPU)
    logits = torch.tensor([[3.0, 2.5, 2.0, 0.0, 3.2]])
    assert [int(sampler(logits)) for _ in range(3)] == [0, 1, 2]  # token 4 (in the prompt) first lost to 0
    assert sampler.history.tolist() == [4, 0, 1, 2]
    assert int(TorchSampler(SamplingParams(), [4], CPU)(logits)) == 4  # no penalty: the argmax


def test_acceptance_processes_each_row_as_plain_sampling_would() -> None:
    """Row i of a verify is processed with the history and the first i drafts: the tokens accepted are those plain
    decoding would emit, one row at a time, through the same processors."""
    rows = torch.tensor([[2.0, 1.9, 0.0, 0.0, 0.0],  # after the prompt [0]: 0 is penalized (1.54), 1 wins
                         [0.0, 2.0, 1.8, 0.0, 0.0],  # after [0, 1]: 1 is penalized (1.54), 2 wins
                         [0.0, 0.0, 0.0, 5.0, 0.0]])
    penalized = SamplingParams(repetition_penalty=1.3)
    sampler = TorchSampler(penalized, [0], CPU)
    assert sampler.accept(rows, Draft([1, 1])) == [1, 2]  # d1 kept, d2 rejected: the target's own token instead
    assert sampler.history.tolist() == [0, 1, 2]
    plain = TorchSampler(penalized, [0], CPU)
    assert [int(plain(rows[i:i + 1])) for i in range(2)] == [1, 2]
    assert TorchSampler(SamplingParams(), [0], CPU).accept(rows, Draft([1, 1])) == [0]  # unpenalized: d1 rejected


def test_stop_strings_hold_back_partial_matches() -> None:
    stops = StopStrings(("</end>",))
    assert stops.feed("hello </") == ("hello ", False)
    assert stops.feed("en") == ("", False)
    assert stops.feed("d> tail") == ("", True)
    other = StopStrings(("</end>",))
    assert other.feed("a </b") == ("a </b", False)
    assert other.flush() == ""
