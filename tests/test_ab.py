"""`ab` on tiny CPU models: configuration parsing, correctness and proof-of-execution gates, the CLI end to end.

Tiny CPU models time in microseconds, so their A/A band is huge: no test here asserts a timing verdict from real
timers (the verdict rule itself is tested with fake clocks in test_verdict.py and test_triage_measure.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_checkpoint
from kerneltriage.backends.torch import levers as torch_levers
from kerneltriage.bench import ab
from kerneltriage.bench.equivalence import (DIGEST_TOKENS, LOGIT_FLOOR, LOGIT_RTOL, REFERENCE_FACTOR, Correctness,
                                            check_outputs, check_timed)
from kerneltriage.cli import ab as cli_ab
from kerneltriage.cli.main import main
from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.verdict import VERDICTS
from kerneltriage.engine.backend import get_backend
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.speculative.config import Speculation

BACKEND = get_backend("torch")
FAST = ab.Settings(prompt=8, gen=4, pairs=2, warmups=0)
# With 2 pairs a real-timer A/B can be no more than indicative, or contended when the tiny model's A/A band is wide.
REAL_TIMER_VERDICTS = ("indicative", "contended")


def build(b: str, a: str = "levers=", dtype: str = "float32", **changes: object) -> dict:
    return ab.build_runners(BACKEND, tiny_checkpoint(**changes), RunConfig.parse(a, "--a"), RunConfig.parse(b, "--b"),
                            "cpu", dtype)


def run(b: str, settings: ab.Settings = FAST) -> ab.Report:
    return ab.run_ab(BACKEND, build(b), settings, lambda what: None)


@pytest.mark.parametrize(
    ("text", "levers"),
    [("levers=", ()), ("", ()), ("levers=graphs,one_sync", ("graphs", "one_sync")),
     (" levers = last_logits ; ", ("last_logits",)), ("levers=sdpa_backend=math", ("sdpa_backend=math",)),
     ("levers=one_sync,last_logits,packed_qkv", ("packed_qkv", "last_logits", "one_sync"))],  # table order
)
def test_configuration_parsing(text: str, levers: tuple[str, ...]) -> None:
    parsed = RunConfig.parse(text, "--b")
    assert parsed.lever_names == levers and parsed.speculation is None
    assert RunConfig.parse(parsed.text, "--b") == parsed


def test_spec_key_parses_speculation_and_round_trips() -> None:
    parsed = RunConfig.parse("levers=last_logits; spec=selfdraft:1; depth=3", "--b")
    assert parsed.lever_names == ("last_logits",)
    assert parsed.speculation == Speculation("selfdraft", layers=1, depth=3)
    assert parsed.text == "levers=last_logits;spec=selfdraft:1;depth=3"
    assert RunConfig.parse(parsed.text, "--b") == parsed
    assert parsed.label == "levers=last_logits + spec selfdraft:1 k=3" and RunConfig().label == "levers=(stock)"
    assert parsed.changes_numerics and not RunConfig.parse("levers=last_logits", "--b").changes_numerics


@pytest.mark.parametrize(
    ("text", "expected"),
    [("graphs", "key=value"), ("kernel=mine", "key=value"), ("levers=warp_drive", "unknown lever"),
     ("levers=graphs;levers=one_sync", "given twice"), ("levers=graphs,graphs", "named twice"),
     ("levers=compile", "compile=default"), ("levers=sdpa_backend=warp", "expected one of flash"),
     ("spec=psychic", "--spec"), ("depth=4", "needs --spec"), ("spec=ngram;depth=99", "--spec-depth")],
)
def test_bad_configurations_name_the_flag(text: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected) as caught:
        RunConfig.parse(text, "--b")
    assert str(caught.value).startswith("--b ")


def test_report_holds_both_phases_both_blocks_and_the_executions() -> None:
    report = run("levers=last_logits,one_sync")
    assert [p.test.phase for p in report.phases] == ["prefill", "decode"]
    assert report.phase("decode") is report.phases[1] and report.phase("verify") is None
    c = report.correctness
    assert c.passed and c.digest_a == c.digest_b and c.logit_error is None  # exact levers: equal digests, no logits
    assert c.tokens == DIGEST_TOKENS  # one_sync on the decode path, but no static cache: no graph window to cross
    assert all(len(m.samples) == FAST.pairs for m in report.measurements)
    assert len(report.measurements) == 8  # 2 phases × (A, A') and (A, B)
    # last_logits runs once per prefill (pp samples and each tg sample's prefill), one_sync once per token
    assert report.counters["B"] == {"last_logits": 2 * FAST.pairs, "one_sync": FAST.pairs * (FAST.gen + 1)}
    assert report.counters["A"] == {} and report.silent == []
    decode, prefill = report.phase("decode"), report.phase("prefill")
    assert prefill.tokens == ((), ()) and len(decode.tokens[0]) == FAST.gen + 1
    assert decode.tokens[0] == decode.tokens[1]  # the timed runs emitted the same tokens
    for phase in report.phases:
        assert phase.ratio.confidence == pytest.approx(0.5)  # [min, max] of 2 pairs: a 50% interval
        assert phase.ratio.low <= phase.ratio.estimate <= phase.ratio.high
        assert phase.slower == (phase.ratio.estimate < 1 - phase.band) and phase.band >= 0.01
    assert report.verdict.verdict in REAL_TIMER_VERDICTS
    assert (report.verdict.verdict == "contended") == (report.contention is not None)
    points = [item.point for item in report.checklist]
    assert points == ["synthetic-or-end-to-end", "question", "baseline", "prefill-and-decode", "thermals"]
    assert report.checklist[1].answer == "last_logits (delete), one_sync (dispatch)"
    summary = json.loads(json.dumps(report.summary(), allow_nan=False))
    assert summary["verdict"] == report.verdict.verdict and summary["counters"]["B"]["one_sync"] == 10


def test_speculation_is_measured_and_proven_to_run() -> None:
    report = run("spec=selfdraft:1;depth=2")
    c = report.correctness
    assert c.passed and c.logit_error is not None and c.logit_error <= c.tolerance == LOGIT_RTOL
    assert report.counters["B"]["spec"] > 0 and "spec" not in report.counters["A"]
    assert report.config["b"]["spec"] == "selfdraft:1 k=2" and report.config["a"]["spec"] is None
    assert "spec selfdraft:1 k=2" in report.checklist[1].answer
    assert report.verdict.verdict in REAL_TIMER_VERDICTS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_broken_verify_is_caught_through_the_verify_path(dtype: str) -> None:
    runners = build("spec=selfdraft:1;depth=3", dtype=dtype, max_context=64)  # a 47-token window: bf16 is slow
    fair = check_outputs(BACKEND, runners["A"], runners["B"])
    assert fair.passed and fair.reference == ("A" if dtype == "float32" else "float32")
    stock = runners["B"].verify_step
    runners["B"].verify_step = lambda model, tokens, start: stock(model, tokens, start).roll(1, dims=0)  # rows shifted
    broken = check_outputs(BACKEND, runners["A"], runners["B"])
    assert not broken.passed and broken.logit_error > 10 * broken.tolerance


def test_speculation_that_never_drafts_is_invalid() -> None:
    report = run("spec=ngram:3;depth=2", ab.Settings(prompt=8, gen=2, pairs=2, warmups=0))
    # random prompt tokens and 2 new tokens: nothing for prompt lookup to match
    assert report.silent == ["spec"] and report.verdict.verdict == "invalid"
    assert "never executed" in report.verdict.reason


def test_a_lever_that_never_runs_makes_the_result_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(torch_levers.APPLIERS, "last_logits", lambda runner, value: None)
    report = run("levers=last_logits")
    assert report.correctness.passed  # same outputs: only the counter tells that nothing changed
    assert report.silent == ["last_logits"] and report.counters["B"] == {"last_logits": 0}
    assert report.verdict.verdict == "invalid"
    assert report.verdict.reason == "never executed in the timed runs: last_logits"


@pytest.mark.parametrize(("backend", "served"), [("efficient", False), ("flash", True)])
def test_a_pinned_sdpa_backend_counts_only_the_calls_it_serves(backend: str, served: bool) -> None:
    """On the CPU torch serves every call with flash whatever the priority order: pinning efficient runs nothing."""
    report = run(f"levers=sdpa_backend={backend}")
    assert report.correctness.passed
    count = report.counters["B"][f"sdpa_backend={backend}"]
    if served:  # every layer of every forward in the timed runs: 2 layers × (pp + tg prefill + tg steps) per pair
        assert count == FAST.pairs * 2 * (1 + 1 + FAST.gen) and report.verdict.verdict in REAL_TIMER_VERDICTS
    else:
        assert count == 0 and report.verdict.verdict == "invalid"
        assert "never executed" in report.verdict.reason and f"sdpa_backend={backend}" in report.verdict.reason


def test_different_outputs_make_the_result_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(runner, value) -> None:  # noqa: ANN001 - a lever that runs, but changes the answer
        stock = runner.prefill_step

        def prefill(model, tokens, start):  # noqa: ANN001, ANN202
            runner.counters["last_logits"] += 1
            return -stock(model, tokens, start)

        runner.prefill_step = prefill

    monkeypatch.setitem(torch_levers.APPLIERS, "last_logits", broken)
    report = run("levers=last_logits")
    assert not report.correctness.passed and report.correctness.tolerance is None  # exact lever: no tolerance
    assert report.counters["B"]["last_logits"] > 0  # it ran: the outputs, not the counter, make it invalid
    assert report.verdict.verdict == "invalid" and "digests differ" in report.verdict.reason


def test_reordering_levers_are_judged_on_logits_and_per_op() -> None:
    runners = build("levers=packed_qkv,fused_norm")
    outputs = check_outputs(BACKEND, runners["A"], runners["B"])
    assert outputs.passed and outputs.logit_error is not None and outputs.logit_error <= outputs.tolerance == LOGIT_RTOL
    assert "‖ΔB‖/‖A‖" in outputs.detail and set(outputs.seams) == {"qkv", "norm"}
    assert all(b <= bound for b, _, bound in outputs.seams.values()) and "per-op ok" in outputs.detail
    exact = check_outputs(BACKEND, runners["A"], runners["A'"])
    assert exact.passed and exact.logit_error is None and exact.tolerance is None and exact.seams == {}
    with torch.no_grad():  # every logit 3% too large: the same argmax, so only the logits can tell
        runners["B"].model.lm_head.weight.mul_(1.03)
    scaled = check_outputs(BACKEND, runners["A"], runners["B"])
    assert scaled.digest_a == scaled.digest_b and not scaled.passed
    assert scaled.logit_error == pytest.approx(0.03, rel=1e-3)


def test_low_precision_is_judged_against_a_float32_reference() -> None:
    runners = build("levers=packed_qkv,fused_norm", dtype="bfloat16")
    fair = check_outputs(BACKEND, runners["A"], runners["B"])  # another rounding order: about as far from float32
    assert fair.reference == "float32" and fair.error_a > 0 and fair.passed
    assert fair.tolerance == pytest.approx(max(REFERENCE_FACTOR * fair.error_a, LOGIT_FLOOR))
    assert fair.logit_error <= fair.tolerance and "against float32" in fair.detail
    assert set(fair.seams) == {"qkv", "norm"}
    with torch.no_grad():  # a wrong result, 10% off: further from float32 than bf16 rounding takes A (3% here)
        runners["B"].model.lm_head.weight.mul_(1.10)
    wrong = check_outputs(BACKEND, runners["A"], runners["B"])
    assert wrong.error_a == pytest.approx(fair.error_a) and wrong.logit_error > wrong.tolerance and not wrong.passed


def test_the_timed_runs_tokens_are_checked() -> None:
    runners = build("levers=packed_qkv")
    a, twin, b = runners["A"], runners["A'"], runners["B"]
    prefix = list(range(1, 9))
    assert check_timed(BACKEND, a, twin, prefix, (5, 6, 7), (5, 6, 7)) is None
    # an exact pair must emit the same tokens
    assert check_timed(BACKEND, a, twin, prefix, (5, 6, 7), (5, 9, 7)) == \
        "the timed runs' tokens differ from position 1 of 3"
    # a reordering lever may flip a near tie: judged on its logits over the timed prefix
    assert check_timed(BACKEND, a, b, prefix, (5, 6, 7), (5, 9, 7)) is None
    with torch.no_grad():
        b.model.lm_head.weight.mul_(1.03)
    off = check_timed(BACKEND, a, b, prefix, (5, 6, 7), (5, 9, 7))
    assert off is not None and "logits off by 3.0e-02" in off


@pytest.mark.parametrize(
    ("changes", "passed"),
    [(dict(), True), (dict(digest_b="y"), False),  # differing digests without a tolerance fail …
     (dict(digest_b="y", logit_error=1e-5, tolerance=1e-4), True),  # … within a declared one pass
     (dict(digest_b="y", logit_error=1e-3, tolerance=1e-4), False),
     (dict(logit_error=1e-3, tolerance=1e-4), False),  # equal digests, logits beyond the tolerance
     (dict(seams={"qkv": (2e-3, 1e-3, 1.5e-3)}), False),  # a per-op check beyond its bound
     (dict(seams={"qkv": (1e-3, 1e-3, 1.5e-3)}), True),
     (dict(timed="the timed runs' tokens differ from position 0 of 5"), False)],
)
def test_correctness_passes_only_within_every_declared_bound(changes: dict, passed: bool) -> None:
    result = Correctness(**({"digest_a": "x", "digest_b": "x"} | changes))
    assert result.passed is passed
    if "seams" in changes and not passed:
        assert "per-op FAILED: qkv" in result.detail


def test_sustained_window_reports_first_and_last_rates() -> None:
    report = run("levers=last_logits", ab.Settings(prompt=8, gen=4, pairs=2, warmups=0, sustain=0.05))
    assert set(report.windows) == {"A pp8", "A tg4", "B pp8", "B tg4"}
    assert all(first > 0 and last > 0 for first, last in report.windows.values())
    assert len(report.sustained) == 4 and all(m.n >= 2 for m in report.sustained)
    assert report.checklist[-1].status in ("ok", "warn")  # a sustained window answers the thermals point


def _cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint())
    return main(["ab", "--model", "tiny", "--device", "cpu", "-p", "8", "-n", "4", "-r", "2", "--warmups", "0",
                 *argv])


def test_cli_end_to_end_json_and_ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    ledger_path = tmp_path / "ledger.db"
    assert _cli(monkeypatch, "--b", "levers=last_logits,one_sync", "--output", "json",
                "--ledger", str(ledger_path)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] in REAL_TIMER_VERDICTS and len(result["phases"]) == 2
    assert result["correctness"]["passed"] and result["counters"]["B"] == {"last_logits": 4, "one_sync": 10}
    assert all(p["ratio"]["confidence"] == 0.5 and p["verdict"] in VERDICTS for p in result["phases"])
    with Ledger(ledger_path) as ledger:
        (row,) = ledger.list_experiments()
        record = ledger.get_experiment(row.id)
    assert record.kind == "ab" and record.verdict == result["verdict"] and row.id == result["experiment_id"]
    assert len(record.measurements) == 8 and all(m.n == 2 for m in record.measurements)
    assert {f.code for f in record.findings} >= {"question", "thermals"}
    assert record.config["b"]["levers"] == ["last_logits", "one_sync"] and record.config["a"]["levers"] == []
    assert record.config["backend"] == "torch" and record.config["dtype"] == "float32"


def test_cli_table_and_markdown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    for output, marker in (("table", "B/A [CI] (its level)"), ("md", "| phase |")):
        assert _cli(monkeypatch, "--b", "levers=last_logits", "--output", output,
                    "--ledger", str(tmp_path / "ledger.db")) == 0
        out = capsys.readouterr().out
        assert marker in out and "verdict:" in out and "thermals" in out
        assert "(50%)" in out and "last_logits ×4" in out  # the CI's real level; the executions counted


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(("--b", "levers=warp_drive"), "unknown lever"), (("--b", "graphs"), "key=value"),
     (("--b", "levers=last_logits", "-r", "1"), "≥ 2"), (("--b", "levers=graphs"), "needs a CUDA device"),
     (("--b", "levers=last_logits", "--backend", "jax"), "--backend 'jax'")],
)
def test_cli_bad_input_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               argv: tuple[str, ...], expected: str) -> None:
    assert _cli(monkeypatch, *argv, "--ledger", str(tmp_path / "ledger.db")) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_prompts_file_drives_the_decode_samples_and_speculation_is_judged_on_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "copy.jsonl"
    repeated = "abc abd abc abd abc abd abc "  # prompt lookup finds continuations here, never in random tokens
    prompts.write_text("\n".join(json.dumps({"prompt": repeated * k}) for k in (1, 2)) + "\n")
    assert _cli(monkeypatch, "--b", "levers=;spec=ngram;depth=3", "--prompts", str(prompts), "--no-chat",
                "-r", "5", "--output", "json", "--ledger", str(tmp_path / "ledger.db")) == 0
    result = json.loads(capsys.readouterr().out)
    decode = next(p for p in result["phases"] if p["phase"] == "decode")
    assert decode["test"] == "tg4 × 2 prompts (copy)"
    # a decode sample emits 4 tokens after each of the 2 prompts: its rate counts all 8
    units = {m["spec"]["units_per_sample"] for m in result["measurements"] if m["spec"]["phase"] == "decode"}
    assert units == {8}
    assert result["counters"]["B"]["spec"] > 0  # the drafts came from the prompts
    assert result["correctness"]["passed"] and result["correctness"]["timed"] is None
    spec = result["speculation"]["B"]  # the source's own figures over the timed runs: every verify counted
    assert list(result["speculation"]) == ["B"] and spec["source"] == "ngram:3"
    assert spec["verify_steps"] == result["counters"]["B"]["spec"] and spec["tokens_per_verify_step"] >= 1
    assert len(spec["acceptance_by_position"]) >= 1


def test_ab_text_names_each_side_s_draft_source() -> None:
    stats = {"source": "suffix:16", "verify_steps": 3, "plain_steps": 2, "tokens_per_verify_step": 2.5,
             "acceptance_by_position": [0.75, 0.5], "shadow_drafts": 4, "shadow_acceptance_by_position": [0.25]}
    assert cli_ab._spec_line("B", stats) == ("spec B suffix:16: 3 verify + 2 plain steps, 2.50 tok/verify step, "
                                             "acceptance by position 75% 50%; shadow drafts 4 (by position 25%)")


@pytest.mark.parametrize(("content", "expected"), [("not json\n", "JSON-lines"), ('{"text": "x"}\n', "JSON-lines"),
                                                   ("", "at least one prompt")])
def test_a_bad_prompts_file_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str], content: str, expected: str) -> None:
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text(content)
    assert _cli(monkeypatch, "--b", "levers=last_logits", "--prompts", str(prompts),
                "--ledger", str(tmp_path / "ledger.db")) == 2
    assert expected in capsys.readouterr().err
