"""`ab` on tiny CPU models: spec parsing, correctness and proof-of-execution gates, the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from kerneltriage.backends.torch import accelerate
from kerneltriage.bench import ab
from kerneltriage.bench.equivalence import Correctness, check_outputs
from kerneltriage.cli.main import main
from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import Ledger
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.tokenizer import Tokenizer

FAST = ab.Settings(prompt=8, gen=4, pairs=2, warmups=0)
CPU = torch.device("cpu")


def tiny_checkpoint(arch: str = "llama") -> Checkpoint:
    config = tiny_config(arch)
    return Checkpoint(config, {}, Tokenizer.synthetic(config.vocab_size), source=config.name)


def run(b: str, settings: ab.Settings = FAST) -> ab.Report:
    runners = ab.build_runners(tiny_checkpoint(), ab.Spec(), ab.parse_spec(b, "--b"), CPU, torch.float32)
    return ab.run_ab(runners, settings, lambda what: None)


@pytest.mark.parametrize(
    ("text", "levers"),
    [("levers=", ()), ("", ()), ("levers=graphs,one_sync", ("graphs", "one_sync")),
     (" levers = last_logits ; ", ("last_logits",)), ("levers=sdpa_backend=math", ("sdpa_backend=math",))],
)
def test_spec_parsing(text: str, levers: tuple[str, ...]) -> None:
    assert ab.parse_spec(text, "--b").levers == levers


def test_spec_key_parses_speculation() -> None:
    parsed = ab.parse_spec("levers=last_logits; spec=selfdraft:1; depth=3", "--b")
    assert parsed == ab.Spec(("last_logits",), "selfdraft:1", "3")
    assert ab.parse_spec(parsed.text, "--b") == parsed


@pytest.mark.parametrize(
    ("text", "expected"),
    [("graphs", "key=value"), ("kernel=mine", "key=value"), ("levers=warp_drive", "unknown lever"),
     ("levers=graphs;levers=one_sync", "given twice"), ("levers=graphs,graphs", "named twice"),
     ("spec=psychic", "--spec"), ("depth=4", "needs --spec"), ("spec=ngram;depth=99", "--spec-depth")],
)
def test_bad_specs_name_the_flag(text: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected) as caught:
        ab.parse_spec(text, "--b")
    assert str(caught.value).startswith("--b ")


def test_report_holds_both_phases_both_blocks_and_the_executions() -> None:
    report = run("levers=last_logits,one_sync")
    assert [p.test.phase for p in report.phases] == ["prefill", "decode"]
    assert report.correctness.passed and report.correctness.digest_a == report.correctness.digest_b
    assert all(len(m.samples) == FAST.pairs for m in report.measurements)
    assert len(report.measurements) == 8  # 2 phases × (A, A') and (A, B)
    # last_logits runs once per prefill (pp samples and each tg sample's one-token prefill), one_sync per token
    assert report.counters["B"]["last_logits"] == 2 * FAST.pairs
    assert report.counters["B"]["one_sync"] == FAST.pairs * (FAST.gen + 1)
    assert report.silent == [] and report.verdict.verdict != "invalid"
    points = [item.point for item in report.checklist]
    assert points == ["synthetic-or-end-to-end", "question", "baseline", "prefill-and-decode", "thermals"]


def test_speculation_is_measured_and_proven_to_run() -> None:
    report = run("spec=selfdraft:1;depth=2")
    assert report.correctness.passed  # exact greedy acceptance: the same digests
    assert report.counters["B"]["spec"] > 0 and "spec" not in report.counters["A"]
    assert report.config["b"]["spec"] == "selfdraft:1 k=2" and report.config["a"]["spec"] is None
    assert "spec selfdraft:1 k=2" in report.checklist[1].answer
    assert report.verdict.verdict != "invalid"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_broken_verify_is_caught_through_the_verify_path(dtype: torch.dtype) -> None:
    runners = ab.build_runners(tiny_checkpoint(), ab.Spec(), ab.parse_spec("spec=selfdraft:1;depth=3", "--b"), CPU,
                               dtype)
    assert check_outputs(runners["A"], runners["B"]).passed
    stock = runners["B"].verify
    runners["B"].verify = lambda model, tokens, start: stock(model, tokens, start).roll(1, dims=0)  # rows shifted
    broken = check_outputs(runners["A"], runners["B"])
    assert not broken.passed and broken.max_logit_diff > 10 * broken.tolerance


def test_speculation_that_never_drafts_is_invalid() -> None:
    report = run("spec=ngram:3;depth=2", ab.Settings(prompt=8, gen=2, pairs=2, warmups=0))
    # random prompt tokens and 2 new tokens: nothing for prompt lookup to match
    assert report.silent == ["spec"] and report.verdict.verdict == "invalid"


def test_a_lever_that_never_runs_makes_the_result_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(accelerate.APPLY, "last_logits", lambda runner: None)
    report = run("levers=last_logits")
    assert report.correctness.passed  # same outputs: only the counter tells that nothing changed
    assert report.silent == ["last_logits"]
    assert report.verdict.verdict == "invalid" and "last_logits" in report.verdict.reason


def test_different_outputs_make_the_result_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(runner) -> None:  # noqa: ANN001 - a lever that runs, but changes the answer
        stock = runner.prefill

        def prefill(model, tokens, start):  # noqa: ANN001, ANN202
            runner.counters["last_logits"] += 1
            return -stock(model, tokens, start)

        runner.prefill = prefill

    monkeypatch.setitem(accelerate.APPLY, "last_logits", broken)
    report = run("levers=last_logits")
    assert not report.correctness.passed
    assert report.verdict.verdict == "invalid" and "digests differ" in report.verdict.reason


def test_numerics_changing_levers_report_the_logit_difference() -> None:
    checkpoint = tiny_checkpoint()
    runners = ab.build_runners(checkpoint, ab.Spec(), ab.Spec(("sdpa_backend=math",)), CPU, torch.float32)
    checkpoint.config = checkpoint.config.replace(random_weights=False)  # as if real: digests must match
    outputs = check_outputs(runners["A"], runners["B"])
    assert outputs.max_logit_diff is not None and outputs.max_logit_diff < outputs.tolerance
    assert outputs.passed and "max |Δlogit|" in outputs.detail
    exact = check_outputs(runners["A"], runners["A'"])
    assert exact.passed and exact.max_logit_diff is None and exact.tolerance is None


def test_low_precision_is_judged_against_a_float32_reference() -> None:
    runners = ab.build_runners(tiny_checkpoint(), ab.Spec(), ab.Spec(("packed_qkv", "fused_norm")), CPU,
                               torch.bfloat16)
    fair = check_outputs(runners["A"], runners["B"])  # another rounding order: about as far from float32 as A
    assert fair.reference == "float32" and fair.error_a > 0 and fair.passed
    assert fair.tolerance == pytest.approx(max(2 * fair.error_a, 1e-3))
    with torch.no_grad():  # a wrong result, 3% off: further from float32 than bf16 rounding takes A
        runners["B"].model.lm_head.weight.mul_(1.03)
    wrong = check_outputs(runners["A"], runners["B"])
    assert wrong.digest_a != wrong.digest_b and wrong.max_logit_diff > wrong.tolerance and not wrong.passed
    assert "against float32" in wrong.detail


@pytest.mark.parametrize(
    ("digests", "diff", "tolerance", "passed"),
    [(("x", "x"), None, None, True), (("x", "y"), 1e-9, None, False), (("x", "y"), 1e-5, 1e-4, True),
     (("x", "y"), 1e-3, 1e-4, False)],
)
def test_differing_digests_pass_only_within_a_declared_tolerance(
        digests: tuple[str, str], diff: float | None, tolerance: float | None, passed: bool) -> None:
    assert Correctness(*digests, diff, tolerance).passed is passed


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
    assert result["verdict"] in ("win", "loss", "neutral") and len(result["phases"]) == 2
    with Ledger(ledger_path) as ledger:
        (row,) = ledger.list_experiments()
        record = ledger.get_experiment(row.id)
    assert record.kind == "ab" and record.verdict == result["verdict"] and row.id == result["experiment_id"]
    assert len(record.measurements) == 8 and all(m.n == 2 for m in record.measurements)
    assert {f.code for f in record.findings} >= {"question", "thermals"}
    assert record.config["b"]["levers"] == ["last_logits", "one_sync"]


def test_cli_table_and_markdown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    for output, marker in (("table", "B/A [95% CI]"), ("md", "| phase |")):
        assert _cli(monkeypatch, "--b", "levers=last_logits", "--output", output,
                    "--ledger", str(tmp_path / "ledger.db")) == 0
        out = capsys.readouterr().out
        assert marker in out and "verdict:" in out and "thermals" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(("--b", "levers=warp_drive"), "unknown lever"), (("--b", "graphs"), "key=value"),
     (("--b", "levers=last_logits", "-r", "1"), "≥ 2"), (("--b", "levers=graphs"), "needs a CUDA device")],
)
def test_cli_bad_input_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               argv: tuple[str, ...], expected: str) -> None:
    assert _cli(monkeypatch, *argv, "--ledger", str(tmp_path / "ledger.db")) == 2
    assert expected in capsys.readouterr().err
