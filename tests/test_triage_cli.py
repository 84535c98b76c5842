"""`kerneltriage triage` end to end on a tiny model (load_checkpoint patched, ceilings fixed), in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from conftest import tiny_checkpoint
from kerneltriage.backends.torch import ceilings as ceilings_mod
from kerneltriage.bench import ab as ab_module
from kerneltriage.cli.main import main
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.roofline import Ceilings
from kerneltriage.core.verdict import VERDICTS
from kerneltriage.engine import sources
from kerneltriage.triage.run import STAGES

CEILINGS = Ceilings(20e9, 100e9, "measured", "cpu test", "float32")
SMALL = ["--model", "tiny", "-p", "16", "-n", "8", "--device", "cpu"]


@pytest.fixture(autouse=True)
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """--model tiny → a 2-layer llama with explicit weights; fixed ceilings."""
    monkeypatch.setattr(sources, "load_checkpoint", lambda spec="default": tiny_checkpoint("llama"))
    monkeypatch.setattr(ceilings_mod, "get_ceilings", lambda device, dtype, refresh=False: CEILINGS)
    yield


def test_json_html_and_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ab_module, "_load_contention", lambda report: None)  # another job on the cores: not ours
    ledger, page = tmp_path / "ledger.db", tmp_path / "report.html"
    assert main(["triage", *SMALL, "--output", "json", "--html", str(page), "--ledger", str(ledger)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["prefill"]["test"] == "pp16" and report["setup"]["decode"]["test"] == "tg8"
    assert set(report["stage_seconds"]) == {"load", *STAGES[:-1]}  # the model's load first
    decode = report["breakdown"]["decode"]
    assert sum(decode["shares"].values()) == pytest.approx(1.0) and "sampling" in decode["shares"]
    codes = {f["code"] for f in report["findings"]}
    assert {"all-position-logits", "kernel-outlook-decode"} <= codes
    ladder = report["ladder"]
    # the climb: every candidate judged by ab against the configuration of its round, sequential pairs, or not
    # timed with the reason (its ceiling inside the band, refused when built)
    assert ladder["rungs"][0]["added"] == "" and ladder["rungs"][0]["config"] == "levers="
    assert ladder["stop"] and ladder["rounds"] >= 1
    timed = [t for t in ladder["trials"] if t["ab"] is not None]
    assert timed and all(t["verdict"] in VERDICTS for t in timed)
    for trial in timed:
        ab = trial["ab"]
        assert trial["verdict"] not in ("indicative", "invalid"), ab["reason"]  # ran, proven, ≥ 5 pairs
        assert set(ab["phases"]) == {"prefill", "decode"}
        assert all(p["ratio"]["confidence"] >= 0.9 for p in ab["phases"].values())  # the sequential level
        text = trial["candidate"]["text"]  # a lever, the stack (a+b+…) or a member left out of it (-a)
        assert all(ab["counters"][name] > 0 for name in ([] if text.startswith("-") else text.split("+")))
        assert ("greedy digests equal" in ab["correctness"]) == (trial["verdict"] in ("win", "traded"))
    untimed = [t for t in ladder["trials"] if t["ab"] is None]
    assert all(t["note"] for t in untimed)
    refused = {r["lever"]: r["why"] for r in ladder["refused"]}
    assert refused["graphs"] == "needs a CUDA device, not cpu" and refused["pdl"].startswith("needs a CUDA")
    assert "measured with --budget full" in refused["compile=default"]
    for rung in ladder["rungs"][1:]:  # each rung a win (or a traded lever its favour takes) on the one below, or
        removal = rung["added"].startswith("-")  # members left out of the stack that changed nothing (neutral)
        assert rung["verdict"] in (("win", "neutral") if removal else ("win", "traded")), rung["added"]
        assert rung["rates"]["decode"] > 0
    assert report["recommendations"] == [f"lever-{rung['added']}" for rung in ladder["rungs"][1:]]
    assert len(report["headlines"]) == 6 and set(report["answers"]) == {"delete", "fast-path", "dispatch"}
    assert report["headlines"][2].startswith("climb: ")
    assert report["gates"][0]["default"].endswith("(cpu)") and report["sweep"][0]["timer"] == "cpu clock"
    context = report["context"]  # tg8 at depth 0 and as deep as the tiny model's context allows
    assert context["depth"] + context["tokens"] <= 128 and context["shallow_seconds"] > 0
    text = page.read_text()
    assert text.count("<img") >= 4 and "where time goes" in text and "the climb" in text
    assert not list(tmp_path.glob(".report.html-*"))  # the temporary file was renamed, not left behind
    with Ledger(ledger) as opened:
        (experiment,) = opened.all_experiments()
    assert experiment.kind == "triage" and experiment.id == report["experiment_id"]
    assert {f.code for f in experiment.findings} == codes and len(experiment.measurements) == 4
    assert experiment.summary["headlines"] == report["headlines"]
    assert experiment.summary["ladder"]["final"] == ladder["final"]


def test_the_final_configuration_stands_beside_a_peer(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ab_module, "_load_contention", lambda report: None)
    # random weights: the hf peer copies the runner's weights instead of loading the model's files
    monkeypatch.setattr(sources, "load_checkpoint",
                        lambda spec="default": tiny_checkpoint("llama", random_weights=True))
    argv = ["triage", *SMALL, "--peers", "hf", "--output", "json", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    ladder = json.loads(capsys.readouterr().out)["ladder"]
    peer = ladder["peer"]
    assert peer["peer"] == "hf" and peer["config"] == ladder["final"]  # the final set, benched beside the peer
    rows = {row["test"]: row for row in peer["rows"]}
    assert set(rows) == {"pp16", "tg8"} and all(r["peer"] == "hf" and r["ours"] > 0 and r["theirs"] > 0
                                                 and r["ratio"] == pytest.approx(r["ours"] / r["theirs"])
                                                 for r in rows.values())


def test_the_frameworks_own_chatter_goes_to_the_notes_not_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    import os
    import warnings

    from kerneltriage.triage import run as triage_run

    real = triage_run.stage_outlook

    def chatty(state):  # noqa: ANN001, ANN202 - what torch's SDPA and the profiler do: a Python warning, a C line
        warnings.warn("Both fused kernels require query, key and value to have the same num_heads", stacklevel=1)
        os.write(2, b"USDT:2026-12-02 06:15:18 12110:12110 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        return real(state)

    monkeypatch.setattr(triage_run, "stage_outlook", chatty)
    monkeypatch.setattr(triage_run, "STAGE_FUNCTIONS", tuple(chatty if f is real else f
                                                              for f in triage_run.STAGE_FUNCTIONS))
    assert main(["triage", *SMALL, "--output", "json", "--ledger", str(tmp_path / "l.db")]) == 0
    out, err = capfd.readouterr()
    assert "fused kernels" not in err and "USDT" not in err  # the terminal saw none of it …
    notes = json.loads(out)["notes"]
    assert any("UserWarning: Both fused kernels require" in n for n in notes)  # … the report has both
    assert any(n.startswith("framework: USDT:SyncActivityProfilerHandler.cpp:52] profiler_start") for n in notes)


def test_with_prompts_speculation_is_a_candidate_and_too_long_prompts_are_refused_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ab_module, "_load_contention", lambda report: None)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": text}) for text in ("a b a b a b", "c d c d")) + "\n")
    argv = ["triage", *SMALL, "--prompts", str(prompts), "--no-chat", "--output", "json",
            "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    ladder = json.loads(capsys.readouterr().out)["ladder"]
    spec = [t for t in ladder["trials"] if t["candidate"]["text"].startswith("spec=")]
    assert {t["candidate"]["text"] for t in spec} == {"spec=ngram", "spec=suffix"}
    assert all(t["ab"]["counters"]["spec"] > 0 for t in spec)  # judged by ab over the prompts, speculating
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "word " * 400}) + "\n")
    assert main([*argv[:argv.index("--prompts") + 1], str(long), *argv[argv.index("--prompts") + 2:]]) == 2
    assert "exceed the model's context" in capsys.readouterr().err


def test_table_output_has_every_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["triage", *SMALL, "-p", "8", "-n", "4", "--levers", "last_logits,packed_gate_up,packed_qkv",
            "--ledger", str(tmp_path / "l.db")]
    assert main(args) == 0
    out = capsys.readouterr().out
    positions = [out.index(title) for title in ("0 setup", "1 where time goes", "2 Q1", "3 Q2", "4 Q3", "5 the climb",
                                                 "6 custom-kernel outlook", "7 recommendations", "headlines")]
    assert positions == sorted(positions)
    assert "levers: packed_qkv, packed_gate_up, last_logits" in out  # the baseline as configured, in table order
    assert "prefill computes logits for all" not in out  # the lever is on: the detector stays silent
    tried = {line.split("│")[2].strip() for line in out.splitlines() if line.startswith("│ 1 ")}
    assert tried and not tried & {"last_logits", "packed_gate_up", "packed_qkv"}  # levers on are not tried again
    assert "(start)" in out and "paste: " in out
    assert "op time" in out and "launches" not in out and "0 kernels" not in out  # no GPU counts on the CPU


@pytest.mark.parametrize("args, needle", [
    (["-p", "0"], "-p"),
    (["-d", "200"], "context"),
    (["--spec", "bogus"], "--spec"),
    (["--html", "/no/such/folder/r.html"], "--html"),
    (["--levers", "warp_speed"], "unknown lever 'warp_speed'; expected some of quantized, packed_qkv"),
    (["--levers", "graphs"], "--levers graphs: needs a CUDA device"),
    (["--backend", "jax"], "--backend 'jax'"),
])
def test_bad_input_is_a_one_line_error(args: list[str], needle: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["triage", *SMALL, *args, "--ledger", str(tmp_path / "l.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kerneltriage: error: ") and needle in err[-1]
    assert not (tmp_path / "l.db").exists() or not Ledger(tmp_path / "l.db").all_experiments()
