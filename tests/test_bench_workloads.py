"""Workloads: llama-bench's test names and cross product, deterministic tokens, context checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kerneltriage.bench.workloads import Test, check_fits, depths_and_sizes, expand, token_stream, tokens_for
from kerneltriage.core.errors import InputError


def test_names_follow_llama_bench() -> None:
    assert Test("pp", 512).name == "pp512"
    assert Test("tg", 128, 4096).name == "tg128 @ d4096"


def test_cross_product_in_llama_bench_order_and_zero_skips() -> None:
    tests = expand([512, 0], [128], [0, 4096])
    assert [t.name for t in tests] == ["pp512", "tg128", "pp512 @ d4096", "tg128 @ d4096"]
    assert [t.name for t in expand([0], [16, 16], [0])] == ["tg16"]  # duplicates dropped


@pytest.mark.parametrize("args", [([-1], [1], [0]), ([1], [1], [-5]), ([0], [0], [0])])
def test_bad_sizes_are_input_errors(args: tuple) -> None:
    with pytest.raises(InputError):
        expand(*args)


def test_tokens_are_deterministic_and_cut_from_one_stream() -> None:
    test = Test("pp", 8, 4)
    first, again = tokens_for(test, 300), tokens_for(test, 300)
    assert first == again
    assert list(first.prefix + first.prompt) == token_stream(300, 12)
    assert len(first.prefix) == 4 and len(first.prompt) == 8
    assert tokens_for(test, 300, seed=7) != first


def test_decode_at_depth_zero_prefills_one_token() -> None:
    tokens = tokens_for(Test("tg", 16, 0), 300)
    assert len(tokens.prefix) == 1 and tokens.prompt == ()
    assert Test("tg", 16, 0).context_needed == 17
    assert Test("tg", 16, 100).context_needed == 116


@given(st.integers(1, 100_000), st.integers(0, 300), st.integers(0, 2**32))
def test_stream_is_uniform_over_the_whole_vocabulary(vocab: int, length: int, seed: int) -> None:
    stream = token_stream(vocab, length, seed)
    assert len(stream) == length and all(0 <= t < vocab for t in stream)


def test_every_token_id_can_appear_eos_included() -> None:
    assert set(token_stream(5, 200)) == {0, 1, 2, 3, 4}


def test_a_test_longer_than_the_context_is_refused() -> None:
    check_fits([Test("pp", 64, 64)], 128)
    with pytest.raises(InputError, match="tg64 @ d64: needs 128 positions"):
        check_fits([Test("tg", 64, 64)], 127)


def test_sizes_for_a_llama_bench_command() -> None:
    sizes = depths_and_sizes(expand([512], [128], [0, 4096]))
    assert sizes == {"pp": [512], "tg": [128], "depth": [0, 4096]}
