"""Constrained decoding: every output matches its constraint (hypothesis-generated JSON schemas, on a tiny model with
the byte tokenizer), through every loop (plain, pipelined, speculative); `vocab_compact` picks the same greedy tokens as
the full projection plus a mask, eagerly and under (fake-captured) graphs; the host mask is computed while the step
runs where the loop allows; the climb's table refuses vocab_compact without a constraint."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import rerun_capture, tiny_checkpoint
from kerneltriage.backends.torch import accelerate, vocab_compact
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.constraint import Constraint, parse_constraint
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.grammar import Grammar
from kerneltriage.engine.levers import LEVERS, LeverSetting, Place, refusal
from kerneltriage.engine.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPT = [5, 17, 3, 40]
SCALARS = st.sampled_from([{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 999},
                           {"type": "string", "maxLength": 4}, {"type": "null"},
                           {"enum": ["a", "bc", "def"]}])


def _object(children: st.SearchStrategy) -> st.SearchStrategy:
    props = st.dictionaries(st.sampled_from(["id", "ok", "xs", "v"]), children, min_size=1, max_size=3)
    return props.map(lambda p: {"type": "object", "properties": p, "required": sorted(p),
                                "additionalProperties": False})


SCHEMAS = st.recursive(SCALARS, lambda inner: st.one_of(
    _object(inner), inner.map(lambda item: {"type": "array", "items": item, "maxItems": 2})), max_leaves=4)


def constrained(constraint: Constraint, seed: int = 0, **changes: object):  # noqa: ANN201 - a Checkpoint
    checkpoint = tiny_checkpoint("llama", seed=seed, **changes)
    checkpoint.grammar = Grammar(constraint, checkpoint.tokenizer, checkpoint.config.vocab_size)
    return checkpoint


def output(checkpoint, levers: str = "", params: SamplingParams = GREEDY, spec: str | None = None,  # noqa: ANN001
           max_tokens: int = 100) -> tuple[list[int], object]:
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers, spec), "cpu", "float32")
    return list(generate_step(runner, PROMPT, params, max_tokens)), runner


def text_of(checkpoint, tokens: list[int]) -> str:  # noqa: ANN001
    eos = checkpoint.grammar.eos
    assert eos in tokens, "the output never ended"
    return checkpoint.tokenizer.decode(tokens[:tokens.index(eos)])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS.filter(lambda s: s.get("type") == "object" or "items" in s), seed=st.integers(0, 3),
       temperature=st.sampled_from([0.0, 1.0]))
def test_every_output_is_valid_against_its_generated_schema(schema: dict, seed: int, temperature: float) -> None:
    # room for the longest output SCHEMAS allow: two arrays of two objects of three properties is ~145 bytes compact,
    # and the grammar lets a space in at every separator (a random model takes many: 124 bytes had not closed it)
    checkpoint = constrained(Constraint("json", json.dumps(schema)), seed, max_context=512)
    tokens, _ = output(checkpoint, "one_sync", SamplingParams(temperature=temperature, seed=seed), max_tokens=500)
    text = text_of(checkpoint, tokens)
    assert checkpoint.grammar.constraint.matches(text), (schema, text)
    assert all(t == checkpoint.grammar.eos for t in tokens[tokens.index(checkpoint.grammar.eos):])  # then EOS only


def test_choices_and_regex_hold_through_every_loop() -> None:
    for constraint in (Constraint("choices", "alpha,beta,gamma"), Constraint("regex", r"[a-c]{2}-\d{3}")):
        checkpoint = constrained(constraint)
        plain, _ = output(checkpoint, max_tokens=20)
        assert constraint.matches(text_of(checkpoint, plain))
        for levers, spec in (("one_sync", None), ("vocab_compact", None), ("vocab_compact,one_sync", None),
                             ("", "ngram"), ("vocab_compact", "suffix")):
            assert output(checkpoint, levers, spec=spec, max_tokens=20)[0] == plain, (constraint, levers, spec)


def test_vocab_compact_picks_the_full_projections_greedy_tokens_and_runs() -> None:
    checkpoint = constrained(Constraint("json", json.dumps({"type": "array", "items": {"type": "integer"}})))
    full, _ = output(checkpoint, max_tokens=60)
    compact, runner = output(checkpoint, "vocab_compact", max_tokens=60)
    assert compact == full
    assert runner.counters["vocab_compact"] == len(full) - 1  # every decode step: its allowed set is small here


def test_vocab_compact_above_the_crossover_takes_the_full_projection(monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = constrained(Constraint("regex", "[a-z ]{30}"))  # 27 tokens allowed at every step
    monkeypatch.setitem(vocab_compact.CROSSOVER, "cpu", 10 / 300)  # 10 of the tiny model's 300 tokens
    tokens, runner = output(checkpoint, "vocab_compact", max_tokens=12)
    assert tokens == output(checkpoint, max_tokens=12)[0]
    assert runner.counters["vocab_compact"] == 0


def test_vocab_compact_under_graphs_replays_a_fixed_row_buffer() -> None:
    checkpoint = constrained(Constraint("choices", "alpha,beta,gamma"))
    runner = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    accelerate.graphs(runner, capture_fn=rerun_capture(runner))  # CPU: a "replay" reruns what was captured
    vocab_compact.vocab_compact(runner, capture_fn=rerun_capture(runner))
    tokens = list(generate_step(runner, PROMPT, GREEDY, 8))
    assert tokens == output(checkpoint, max_tokens=8)[0]
    head = runner.compact_step.head
    assert head.rows.shape == (runner.compact_limit,) and head.graph is not None
    assert runner.counters["vocab_compact"] == runner.counters["graphs"] == len(tokens) - 1


def _calls(checkpoint, levers: str) -> list[str]:  # noqa: ANN001
    """The order of a 4-token loop's decode steps and its sampler's follows."""
    runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cpu", "float32")
    calls, decode = [], runner.decode
    runner.decode = lambda *a, **k: calls.append("decode") or decode(*a, **k)
    runner.reset_cache(16)
    sampler = runner.sampler(GREEDY, PROMPT)
    follow = sampler.follow
    sampler.follow = lambda token: calls.append("follow") or follow(token)
    list(runner.loop(runner.prefill(PROMPT, 0), len(PROMPT), 4, sampler))
    return calls


def test_the_mask_is_computed_while_the_step_runs_unless_the_step_needs_it() -> None:
    checkpoint = constrained(Constraint("choices", "alpha,beta"))
    for levers, order in (("", ["decode", "follow"]), ("one_sync", ["decode", "follow"]),
                          ("vocab_compact", ["follow", "decode"])):
        assert _calls(checkpoint, levers) == order * 3, levers


def test_a_path_that_never_tells_the_processor_still_gets_the_right_mask() -> None:
    checkpoint = constrained(Constraint("regex", r"[a-c]{2}-\d{3}"))
    runner = BACKEND.build(checkpoint, RunConfig(), "cpu", "float32")
    runner.reset_cache(16)
    sampler, logits, tokens = runner.sampler(GREEDY, PROMPT), runner.prefill(PROMPT, 0), []
    sampler.follow = lambda token: None  # a loop that never calls follow: the processor reads the history itself
    for position in range(len(PROMPT), len(PROMPT) + 7):
        token = sampler(logits)
        tokens.append(int(token))
        logits = runner.decode(token, position)
    assert tokens == output(checkpoint, max_tokens=7)[0]


def test_the_climb_is_refused_vocab_compact_without_a_constraint() -> None:
    setting = LeverSetting(LEVERS["vocab_compact"])
    assert "constraint" in refusal(setting, (), Place("torch", "cpu", "llama"))
    assert refusal(setting, (), Place("torch", "cpu", "llama", constrained=True)) is None
    with pytest.raises(InputError, match="only under a constraint"):
        BACKEND.build(tiny_checkpoint("llama"), RunConfig.from_flags("vocab_compact"), "cpu", "float32")


def test_bad_constraint_flags_name_the_flag() -> None:
    for args, flag in ((("a,,b", None, None), "--choices"), ((None, "(", None), "--regex"),
                       ((None, None, "/no/such.json"), "--json-schema"), (("a", "b", None), "--choices and --regex")):
        with pytest.raises(InputError, match=flag.replace("-", r"\-")):
            parse_constraint(*args)
    assert parse_constraint(None, None, None) is None


def test_mlx_decodes_under_the_constraint_and_compacts_to_the_same_tokens() -> None:
    pytest.importorskip("mlx.core")
    from mlx_helpers import mlx_runner

    checkpoint = constrained(Constraint("regex", r"[a-c]{2}-\d{3}"))
    full = list(generate_step(mlx_runner(checkpoint), PROMPT, GREEDY, 10))
    runner = mlx_runner(checkpoint, "vocab_compact,one_sync")
    assert list(generate_step(runner, PROMPT, GREEDY, 10)) == full
    assert checkpoint.grammar.constraint.matches(text_of(checkpoint, full))
    assert runner.counters["vocab_compact"] == len(full) - 1


@pytest.mark.gpu
def test_vocab_compact_under_real_cuda_graphs_keeps_the_graphed_steps_tokens() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    checkpoint = constrained(Constraint("json", json.dumps({"type": "array", "items": {"type": "integer"}})))
    runs = {}
    for levers in ("graphs,one_sync", "graphs,vocab_compact,one_sync"):
        runner = BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cuda", "float32")
        runs[levers] = (list(generate_step(runner, PROMPT, GREEDY, 40)), runner.counters)
    (plain, _), (compact, counters) = runs.values()
    assert compact == plain and counters["vocab_compact"] == counters["graphs"] == len(plain) - 1


def test_abs_digests_of_a_constrained_workload_are_the_constrained_outputs() -> None:
    from kerneltriage.bench.outputs import digests

    checkpoint = constrained(Constraint("regex", r"[a-c]{2}-\d{3}"))
    a, b = (BACKEND.build(checkpoint, RunConfig.from_flags(levers), "cpu", "float32")
            for levers in ("", "vocab_compact"))
    (digest_a, ids_a), (digest_b, ids_b) = digests(a, b, [PROMPT], 12, None)
    assert digest_a == digest_b and checkpoint.grammar.constraint.matches(text_of(checkpoint, ids_a[0]))
