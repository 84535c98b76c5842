"""`kerneltriage triage` end to end on a tiny model (load_checkpoint patched, ceilings fixed), in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from conftest import tiny_checkpoint
from kerneltriage.backends.torch import ceilings as ceilings_mod
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


def test_json_html_and_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger, page = tmp_path / "ledger.db", tmp_path / "report.html"
    assert main(["triage", *SMALL, "--output", "json", "--html", str(page), "--ledger", str(ledger)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["prefill"]["test"] == "pp16" and report["setup"]["decode"]["test"] == "tg8"
    assert set(report["stage_seconds"]) == set(STAGES[:-1])
    decode = report["breakdown"]["decode"]
    assert sum(decode["shares"].values()) == pytest.approx(1.0) and "sampling" in decode["shares"]
    codes = {f["code"] for f in report["findings"]}
    assert {"all-position-logits", "lever-packed_qkv", "lever-packed_gate_up", "lever-one_sync",
            "kernel-outlook-decode"} <= codes
    # every lever triage measures runs through ab: both phases, MIN_PAIRS pairs, ab's correctness and counters
    assert set(report["levers"]) == {"last_logits", "packed_qkv", "packed_gate_up", "one_sync"}
    assert report["config"]["budget"]["lever_pairs"] == 5
    for name, lever in report["levers"].items():
        assert lever["lever"] == name and lever["verdict"] in VERDICTS
        assert lever["verdict"] not in ("invalid", "indicative"), lever["reason"]  # ran, proven, 5 pairs
        assert lever["counters"][name] > 0 and set(lever["phases"]) == {"prefill", "decode"}
        assert all(p["ratio"]["confidence"] == pytest.approx(0.9375) for p in lever["phases"].values())
        assert "greedy digests equal" in lever["correctness"]
    # a measured lever is recommended only on ab's win
    measured = {f["code"]: f for f in report["findings"] if (f["evidence"].get("ab") or {}).get("verdict")}
    assert measured and all(measured[code]["evidence"]["ab"]["verdict"] == "win"
                            for code in report["recommendations"] if code in measured)
    cuda_only = "graphs: not measured — --levers graphs: needs a CUDA device"
    assert any(note.startswith(cuda_only) for note in report["notes"])
    assert any(note.startswith("compile: not measured") for note in report["notes"])
    assert not any("sparse-V: not measured" in note for note in report["notes"])  # real weights: measured
    assert len(report["headlines"]) == 6 and set(report["answers"]) == {"delete", "fast-path", "dispatch"}
    assert report["gates"][0]["default"].endswith("(cpu)") and report["sweep"][0]["timer"] == "cpu clock"
    context = report["context"]  # tg8 at depth 0 and as deep as the tiny model's context allows
    assert context["depth"] + context["tokens"] <= 128 and context["shallow_seconds"] > 0
    text = page.read_text()
    assert text.count("<img") >= 3 and "where time goes" in text
    assert not list(tmp_path.glob(".report.html-*"))  # the temporary file was renamed, not left behind
    with Ledger(ledger) as opened:
        (experiment,) = opened.all_experiments()
    assert experiment.kind == "triage" and experiment.id == report["experiment_id"]
    assert {f.code for f in experiment.findings} == codes and len(experiment.measurements) == 4
    assert experiment.summary["headlines"] == report["headlines"]


def test_table_output_has_every_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["triage", *SMALL, "-p", "8", "-n", "4", "--levers", "last_logits,packed_gate_up,packed_qkv",
            "--ledger", str(tmp_path / "l.db")]
    assert main(args) == 0
    out = capsys.readouterr().out
    positions = [out.index(title) for title in ("0 setup", "1 where time goes", "2 Q1", "3 Q2", "4 Q3",
                                                 "5 custom-kernel outlook", "6 recommendations", "headlines")]
    assert positions == sorted(positions)
    assert "levers: packed_qkv, packed_gate_up, last_logits" in out  # the baseline as configured, in table order
    assert "prefill computes logits for all" not in out  # the lever is on: the detector stays silent
    measured = [line.split()[1] for line in out.splitlines() if line.startswith("│ ") and "±" in line]
    assert measured == ["one_sync"]  # the levers already on are not A/B'd again
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
