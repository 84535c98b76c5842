"""The MLX backend through the commands: generate, ab, triage and bench (with the mlx-lm peer) end to end on tiny
models, and `--backend auto`'s choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

mx = pytest.importorskip("mlx.core")

from conftest import ARCHS, tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.backends.mlx import ceilings as mlx_ceilings  # noqa: E402
from kerneltriage.bench.harness import KerneltriageEngine, Settings  # noqa: E402
from kerneltriage.bench.workloads import Test, tokens_for  # noqa: E402
from kerneltriage.cli.main import main  # noqa: E402
from kerneltriage.core.roofline import Ceilings  # noqa: E402
from kerneltriage.engine import backend as backends  # noqa: E402
from kerneltriage.engine import sources  # noqa: E402
from kerneltriage.peers import open_peer  # noqa: E402

CEILINGS = Ceilings(2e9, 4e9, "measured", "cpu test", "float32")
MLX = ["--backend", "mlx", "--device", "cpu"]


@pytest.fixture(autouse=True)
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """--model tiny → the tiny llama with Q4_1/Q8_0 blocks (so `quantized` applies); fixed ceilings."""
    monkeypatch.setattr(sources, "load_checkpoint", lambda spec="default": quantized_checkpoint("llama"))
    monkeypatch.setattr(mlx_ceilings, "get_ceilings", lambda device, dtype, refresh=False: CEILINGS)
    yield


def test_auto_is_mlx_on_a_mac_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends.sys, "platform", "darwin")
    assert backends.get_backend("auto").name == "mlx"
    monkeypatch.setattr(backends.sys, "platform", "linux")
    assert backends.get_backend("auto").name == "torch"


def test_generate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "tiny", *MLX, "--levers", "quantized,one_sync", "--prompt", "hello",
                 "--max-tokens", "8"]) == 0
    captured = capsys.readouterr()
    assert "mlx" in captured.err and "levers quantized,one_sync" in captured.err


def test_ab_judges_an_mlx_lever(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["ab", "--model", "tiny", *MLX, "-p", "8", "-n", "4", "-r", "2", "--warmups", "0",
            "--b", "levers=quantized,one_sync", "--output", "json", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correctness"]["passed"] and result["counters"]["B"]["one_sync"] > 0
    assert result["counters"]["B"]["quantized"] > 0 and len(result["phases"]) == 2


def test_triage_asks_the_three_questions_on_mlx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["triage", "--model", "tiny", *MLX, "-p", "16", "-n", "8", "--output", "json",
            "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["backend"] == "mlx" and set(report["answers"]) == {"delete", "fast-path", "dispatch"}
    ladder = report["ladder"]  # the same climb as on torch, over MLX's rows of the lever table
    # each lever tried alone, in the stack (a+b+…) or left out of it (-a, or -a,-b together)
    tried = {name.removeprefix("-") for t in ladder["trials"]
             for name in t["candidate"]["text"].replace(",", "+").split("+")}
    assert {"packed_qkv", "packed_gate_up", "last_logits"} <= tried
    ran = [(t["ab"]["counters"], name) for t in ladder["trials"]  # a lever, or the stack's members (a+b+…)
           if t["ab"] and not t["candidate"]["text"].startswith("-") for name in t["candidate"]["text"].split("+")]
    assert all(counters[name] > 0 for counters, name in ran)
    refused = {r["lever"]: r["why"] for r in ladder["refused"]}
    assert refused["graphs"] == "runs on the torch backend, not mlx"
    assert any("MLX has no fused attention" in note for note in report["notes"])
    assert report["gates"][0]["default"] == "unfused (cpu)" and report["sweep"][0]["kernels"]
    assert report["census"]["decode"]["readbacks"] == 1.0
    assert "sampling" in report["breakdown"]["decode"]["shares"]


def test_bench_with_the_mlx_lm_peer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--model", "tiny", *MLX, "--levers", "quantized", "-p", "8", "-n", "4", "-r", "2",
            "--peers", "mlx-lm", "--output", "json", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    engines = {(row["engine"], row["test"]) for row in report["rows"] if row["status"] == "ok"}
    assert engines == {("kerneltriage", "pp8"), ("kerneltriage", "tg4"), ("mlx-lm", "pp8"), ("mlx-lm", "tg4")}
    assert "native blocks" in report["peers"]["mlx-lm"]["note"]


@pytest.mark.parametrize("arch", ARCHS)
def test_mlx_lm_emits_our_greedy_tokens_on_the_same_blocks(arch: str) -> None:
    runner = mlx_runner(quantized_checkpoint(arch), "quantized")
    test = Test("tg", 12, 8)
    tokens, settings = tokens_for(test, runner.config.vocab_size), Settings(1, 0)
    peer = open_peer("mlx-lm", runner, [test], settings)
    ours = KerneltriageEngine(runner).prepare(test, tokens)().tokens
    assert len(set(ours)) >= 3 and peer.engine.prepare(test, tokens)().tokens == ours


def test_mlx_lm_has_nothing_to_load_from_a_preset() -> None:
    runner = mlx_runner(tiny_checkpoint("llama", random_weights=True))
    assert open_peer("mlx-lm", runner, [], Settings(1)).unavailable == "a preset has no weights for mlx-lm to load"


def test_triage_tables_name_mlxs_kernels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate table's columns are MLX's (its fused kernel here, on Metal, on CUDA), the sweep table says each
    device's quantized-matmul family by M, in the text and in the HTML report."""
    page = tmp_path / "r.html"
    argv = ["triage", "--model", "tiny", *MLX, "--levers", "quantized,last_logits,packed_qkv,packed_gate_up,one_sync",
            "-p", "8", "-n", "4", "--html", str(page), "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # torch's SDPA backends (flash, efficient, cudnn) are no columns here; the kernel outlook may name the
    # split-KV candidate's technique (flash-decoding)
    assert "fused on metal" in out and "fused here (cpu)" in out and "flash" not in out.replace("flash-decoding", "")
    assert "kernel family by M" in out and "cpu qmm_t" in out and "metal applegpu_g15s" in out
    assert "fused on metal" in page.read_text()


@pytest.mark.parametrize("preset, expected", [(None, "0"), ("1", "1")])
def test_float32_is_float32_on_mlx_unless_the_user_asked_for_tf32(preset: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLX_ENABLE_TF32"}
    if preset is not None:
        env["MLX_ENABLE_TF32"] = preset
    code = "import os, kerneltriage.backends.mlx.backend; print(os.environ['MLX_ENABLE_TF32'])"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == expected
