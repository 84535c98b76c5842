"""Sampling filters and determinism; stop strings."""

from __future__ import annotations

import pytest
import torch

from kerneltriage.backends.torch.sampling import filter_logits, make_generator, sample
from kerneltriage.engine.generation import StopStrings
from kerneltriage.engine.sampling import SamplingParams

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
    draws = lambda: [sample(LOGITS, params, g).item() for g in [make_generator(params, torch.device("cpu"))] for _ in range(50)]  # noqa: E731
    first, second = draws(), draws()
    assert first == second
    assert len(set(first)) > 1


def test_sampling_follows_the_distribution() -> None:
    params = SamplingParams(temperature=1.0, seed=3)
    generator = make_generator(params, torch.device("cpu"))
    draws = sample(LOGITS.expand(20000, -1), params, generator)
    freq = torch.bincount(draws, minlength=5).float() / 20000
    torch.testing.assert_close(freq, LOGITS.exp()[0], atol=0.015, rtol=0)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(min_p=1)])
def test_bad_sampling_params_raise(bad: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_stop_strings_hold_back_partial_matches() -> None:
    stops = StopStrings(("</end>",))
    assert stops.feed("hello </") == ("hello ", False)
    assert stops.feed("en") == ("", False)
    assert stops.feed("d> tail") == ("", True)
    other = StopStrings(("</end>",))
    assert other.feed("a </b") == ("a </b", False)
    assert other.flush() == ""
