"""`kerneltriage triage` end to end on a tiny model (load_checkpoint patched, ceilings fixed), in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import torch

from conftest import tiny_config
from kerneltriage.backends.torch import ceilings as ceilings_mod
from kerneltriage.cli.main import main
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine import sources
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.tokenizer import Tokenizer
from kerneltriage.triage.run import STAGES

CEILINGS = Ceilings(20e9, 100e9, "measured", "cpu test", "float32")
SMALL = ["--model", "tiny", "-p", "16", "-n", "8", "--device", "cpu"]


@pytest.fixture(autouse=True)
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """--model tiny → a 2-layer random llama; fixed ceilings; one intra-op thread (a shared 2-core machine)."""
    def load(spec: str = "default") -> Checkpoint:
        config = tiny_config("llama")
        return Checkpoint(config, {}, Tokenizer.synthetic(config.vocab_size), source="tiny (random weights)")

    monkeypatch.setattr(sources, "load_checkpoint", load)
    monkeypatch.setattr(ceilings_mod, "get_ceilings", lambda device, dtype, refresh=False: CEILINGS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_json_html_and_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger, page = tmp_path / "ledger.db", tmp_path / "report.html"
    assert main(["triage", *SMALL, "--output", "json", "--html", str(page), "--ledger", str(ledger)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["prefill"]["test"] == "pp16" and report["setup"]["decode"]["test"] == "tg8"
    assert set(report["stage_seconds"]) == set(STAGES[:-1])
    decode = report["breakdown"]["decode"]
    assert sum(decode["shares"].values()) == pytest.approx(1.0) and "sampling" in decode["shares"]
    codes = {f["code"] for f in report["findings"]}
    assert {"all-position-logits", "lever-one_sync", "kernel-outlook-decode"} <= codes
    assert report["levers"]["last_logits"]["ran"] and report["levers"]["last_logits"]["phase"] == "prefill"
    assert any("graphs: not measured" in note for note in report["notes"])
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
    args = ["triage", *SMALL, "-n", "4", "--levers", "last_logits", "--ledger", str(tmp_path / "l.db")]
    assert main(args) == 0
    out = capsys.readouterr().out
    positions = [out.index(title) for title in ("0 setup", "1 where time goes", "2 Q1", "3 Q2", "4 Q3",
                                                 "5 custom-kernel outlook", "6 recommendations", "headlines")]
    assert positions == sorted(positions)
    assert "last_logits: not measured — lever last_logits is already on" in out
    assert "prefill computes logits for all" not in out  # the lever is on: the detector stays silent


@pytest.mark.parametrize("args, needle", [
    (["-p", "0"], "-p"),
    (["-d", "200"], "context"),
    (["--spec", "bogus"], "--spec"),
    (["--html", "/no/such/folder/r.html"], "--html"),
    (["--levers", "warp_speed"], "--levers"),
])
def test_bad_input_is_a_one_line_error(args: list[str], needle: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["triage", *SMALL, *args, "--ledger", str(tmp_path / "l.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kerneltriage: error: ") and needle in err[-1]
    assert not (tmp_path / "l.db").exists() or not Ledger(tmp_path / "l.db").all_experiments()
