"""`kerneltriage bench` and `kerneltriage ceilings` end to end on a tiny model (load_checkpoint patched)."""

from __future__ import annotations

import csv
import io
import json
import warnings
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from conftest import tiny_checkpoint
from kerneltriage.backends.torch import ceilings as ceilings_mod
from kerneltriage.bench import compare
from kerneltriage.cli.main import main
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine import sources
from kerneltriage.engine.checkpoint import Checkpoint

SRC = Path(__file__).resolve().parents[1] / "src"
CEILINGS = Ceilings(20e9, 100e9, "measured", "cpu test", "float32")
SMALL = ["-p", "8", "-n", "4", "-d", "0,8", "-r", "2", "--device", "cpu"]


@pytest.fixture(autouse=True)
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """--model tiny → a 2-layer llama with explicit weights, tiny-preset → one with random weights (the hf peer
    copies a preset's weights from our runner); ceilings fixed (no measuring in CLI tests); one intra-op thread."""
    real = sources.load_checkpoint

    def load(spec: str = "default") -> Checkpoint:
        if spec == "tiny":
            return tiny_checkpoint("llama")
        if spec == "tiny-preset":
            return tiny_checkpoint("llama", random_weights=True, name="tiny-preset")
        return real(spec)

    monkeypatch.setattr(sources, "load_checkpoint", load)
    monkeypatch.setattr(ceilings_mod, "get_ceilings", lambda device, dtype, refresh=False: CEILINGS)
    yield


def test_json_output_and_one_ledger_experiment(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "ledger.db"
    assert main(["bench", "--model", "tiny", *SMALL, "--output", "json", "--ledger", str(ledger)]) == 0
    captured = capfd.readouterr()  # the file descriptors: the progress lines bypass the chatter collected from fd 2
    report = json.loads(captured.out)
    assert [r["test"] for r in report["rows"]] == ["pp8", "tg4", "pp8 @ d8", "tg4 @ d8"]
    # stderr is no terminal here: one progress line per step done, not a bar that prints nothing into a log
    progress = [line for line in captured.err.splitlines() if line.startswith("bench: ")]
    assert progress[0].startswith("bench: kerneltriage pp8 warm-up 1/1 done (1/12 steps")
    assert progress[-1].startswith("bench: kerneltriage tg4 @ d8 sample 2/2 done (12/12 steps")
    for row in report["rows"]:
        assert row["engine"] == "kerneltriage" and row["status"] == "ok" and row["ratio"] == 1.0
        assert row["rate"] > 0 and 0 < row["roofline_pct"] <= 100 and row["first_token_s"] > 0
    assert report["ceilings"]["source"] == "measured" and report["config"]["repeats"] == 2
    config = report["config"]
    assert (config["backend"], config["device"], config["dtype"], config["levers"]) == ("torch", "cpu", "float32", [])
    assert report["decode_kernels_per_token"] is None  # a GPU figure (the CPU profiler counts host ops)
    with Ledger(ledger) as opened:
        (experiment,) = opened.all_experiments()
    assert experiment.id == report["experiment_id"] and experiment.kind == "bench"
    assert len(experiment.measurements) == 4 * 2  # the timed phase and time to first token per test
    assert experiment.environment["python"] and experiment.summary["rows"] == report["rows"]


def test_levers_are_applied_counted_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--model", "tiny", "-p", "8", "-n", "4", "-r", "2", "--warmups", "0", "--device", "cpu",
            "--levers", "one_sync,last_logits", "--output", "json", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["levers"] == ["last_logits", "one_sync"]  # the table's composition order
    assert report["config"]["spec"] == "levers=last_logits,one_sync"
    # last_logits: once per prefill (2 pp samples, 2 tg samples); one_sync: once per token (2 × (4 + 1))
    assert report["lever_counters"] == {"last_logits": 4, "one_sync": 10}
    assert all(m["spec"]["params"]["levers"] == ["last_logits", "one_sync"] for m in report["measurements"])


def test_a_lever_that_cannot_run_here_is_refused_and_records_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "l.db"
    assert main(["bench", "--model", "tiny", *SMALL, "--levers", "graphs", "--ledger", str(ledger)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--levers graphs: needs a CUDA device" in err[-1]
    with Ledger(ledger) as opened:
        assert opened.all_experiments() == []


def test_peer_rows_with_ratio_and_missing_peers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--model", "tiny-preset", "-p", "8", "-n", "4", "-r", "2", "--device", "cpu",
            "--peers", "hf,hf-static,llama.cpp", "--output", "csv", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["engine"], r["test"]) for r in rows] == [
        ("kerneltriage", "pp8"), ("hf", "pp8"), ("kerneltriage", "tg4"), ("hf", "tg4"),
        ("hf-static", "all tests"), ("llama.cpp", "all tests")]
    hf = rows[1]
    assert float(hf["ratio"]) == pytest.approx(float(hf["rate"]) / float(rows[0]["rate"]))
    assert (rows[4]["status"], rows[5]["status"]) == ("needs CUDA", "needs a GGUF")


def test_table_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for output, marker in (("table", "% roofline"), ("md", "|---")):
        argv = ["bench", "--model", "tiny", "-p", "8", "-n", "0", "-r", "1", "--device", "cpu",
                "--output", output, "--ledger", str(tmp_path / "l.db")]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert marker in out and "pp8" in out and "tg" not in out


def test_ctrl_c_leaves_nothing_in_the_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run_interleaved", interrupted)  # mid-benchmark
    ledger = tmp_path / "ledger.db"
    assert main(["bench", "--model", "tiny-preset", *SMALL, "--peers", "hf", "--ledger", str(ledger)]) == 130
    with Ledger(ledger) as opened:
        assert opened.all_experiments() == []


@pytest.mark.parametrize("argv, expected", [
    (["-p", "-1"], "expected whole numbers ≥ 0"),
    (["-d", "0,x"], "expected whole numbers ≥ 0"),
    (["-r", "0"], "expected a whole number ≥ 1"),
    (["--output", "xml"], "invalid choice: 'xml'"),
    (["--peers", "hf,vllm"], "unknown peer 'vllm'"),
    (["-p", "0", "-n", "0"], "no test to run"),
    (["-p", "200"], "expected at most the model's context of 128"),
    (["--llama-bench", "/nonexistent/llama-bench"], "no such file"),
    (["--levers", "warp_drive"], "unknown lever 'warp_drive'"),
    (["--spec-depth", "4"], "needs --spec"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], expected: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--model", "tiny", "--ledger", str(tmp_path / "l.db"), *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "l.db").exists()  # refused before the ledger was opened


def test_real_entry_point_refuses_a_non_ledger(tmp_path: Path) -> None:
    noise = tmp_path / "noise.db"
    noise.write_bytes(os.urandom(4096))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "kerneltriage", "bench", "--model", "smollm2-135m", "-p", "8",
                           "-n", "0", "--device", "cpu", "--ledger", str(noise)],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "not a kerneltriage ledger" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_ceilings_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ceilings", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "20.0 GB/s" in out and "100 GFLOP/s (float32)" in out and "measured" in out


def test_a_rate_above_the_roofline_measures_the_ceilings_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ceilings 1000× too low (cached on a busy machine) put every row far above 100%: bench measures them again,
    says so, and the rows are judged against the new ones."""
    asked: list[bool] = []

    def ceilings(device: object, dtype: object, refresh: bool = False) -> Ceilings:
        asked.append(refresh)
        return CEILINGS if refresh else Ceilings(20e6, 100e6, "measured", "cpu test", "float32")
    monkeypatch.setattr(ceilings_mod, "get_ceilings", ceilings)
    argv = ["bench", "--model", "tiny", "-p", "8", "-n", "4", "-r", "2", "--device", "cpu", "--output", "json"]
    assert main([*argv, "--ledger", str(tmp_path / "l.db")]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert asked == [False, True]
    assert "ran above 100% of the cached ceilings' roofline: the ceilings were measured again" in captured.err
    assert report["config"]["ceilings"]["bandwidth"] == CEILINGS.bandwidth
    assert all(0 < row["roofline_pct"] <= 100 for row in report["rows"])


def test_the_frameworks_warnings_go_to_the_notes_not_the_terminal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def ceilings(device: object, dtype: object, refresh: bool = False) -> Ceilings:
        warnings.warn("Both fused kernels require query, key and value to have the same num_heads.", UserWarning,
                      stacklevel=2)
        return CEILINGS
    monkeypatch.setattr(ceilings_mod, "get_ceilings", ceilings)
    argv = ["bench", "--model", "tiny", *SMALL, "--output", "json", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("Both fused kernels") == 1  # once, as the report's note, not as a raw warning
    assert "framework: UserWarning: Both fused kernels require query, key and value to have the same num_heads." \
        in json.loads(captured.out)["notes"]


def test_kerneltriage_on_its_other_backend_is_a_peer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--peers mlx:LEVERS` beside a torch run: the same checkpoint built by MLX, timed interleaved, its row named
    by the backend; the roofline is the best either framework measured on the device."""
    pytest.importorskip("mlx.core")
    from kerneltriage.backends.mlx import ceilings as mlx_ceilings

    faster = Ceilings(10e9, 400e9, "measured", "cpu test", "float32")
    monkeypatch.setattr(mlx_ceilings, "get_ceilings", lambda device, dtype, refresh=False: faster)
    argv = ["bench", "--model", "tiny", "-p", "8", "-n", "4", "-r", "2", "--device", "cpu", "--output", "json",
            "--peers", "mlx:last_logits", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["engine"], r["test"]) for r in report["rows"]] == [
        ("kerneltriage", "pp8"), ("mlx", "pp8"), ("kerneltriage", "tg4"), ("mlx", "tg4")]
    assert all(r["status"] == "ok" and r["rate"] > 0 for r in report["rows"])
    assert report["peers"]["mlx"]["note"] == "kerneltriage on mlx (cpu, float32) with last_logits"
    ceilings = report["config"]["ceilings"]
    assert (ceilings["bandwidth"], ceilings["matmul_flops"]) == (CEILINGS.bandwidth, faster.matmul_flops)


@pytest.mark.parametrize("peers, expected", [
    ("torch,torch:graphs", "one peer per backend"),
    ("torch:warp_drive", "unknown lever 'warp_drive'"),
    ("mlx-llm", "unknown peer 'mlx-llm'"),
])
def test_bad_backend_peers_are_refused_before_loading(peers: str, expected: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--model", "tiny", "--peers", peers, "--device", "cpu"]) == 2
    assert expected in capsys.readouterr().err
