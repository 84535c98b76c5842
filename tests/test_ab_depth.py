"""`ab -d`: both phases timed after a filled cache (llama-bench's depth), the decode-path levers judged there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_checkpoint
from kerneltriage.bench import ab
from kerneltriage.cli.main import main


def _cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str) -> int:
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint())
    return main(["ab", "--model", "tiny", "--device", "cpu", "-p", "8", "-n", "4", "-r", "2", "--warmups", "0",
                 "--ledger", str(tmp_path / "ledger.db"), *argv])


def test_settings_put_the_depth_in_every_test() -> None:
    assert [t.name for t in ab.Settings(prompt=8, gen=4, depth=40).tests] == ["pp8 @ d40", "tg4 @ d40"]
    assert ab.Settings(prompt=8, gen=4, depth=40).context_needed == 48
    with pytest.raises(ValueError):
        ab.Settings(depth=-1)


def test_sparse_v_at_depth_is_timed_there_and_judged_by_its_metrics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(monkeypatch, tmp_path, "--b", "levers=sparse_v", "-d", "40", "--output", "json") == 0
    result = json.loads(capsys.readouterr().out)
    assert [p["test"] for p in result["phases"]] == ["pp8 @ d40", "tg4 @ d40"]
    assert result["counters"]["B"]["sparse_v"] > 0
    assert "declared quality maxlogit<=0.1" in result["correctness"]["detail"], result["correctness"]


def test_depth_with_a_prompt_file_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    assert _cli(monkeypatch, tmp_path, "--b", "levers=sparse_v", "-d", "40", "--prompts", str(prompts)) == 2
    err = capsys.readouterr().err
    assert "-d with --prompts" in err and len(err.strip().splitlines()) == 1
