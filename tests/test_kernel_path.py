"""The custom-kernel path's planted faults: a kernel that writes half its output, one correct at M = 1 but wrong at
M = 9, one registered but never dispatched, one 2× faster in isolation on a seam ~1% of the step; and the kernel
ledger they all land in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_checkpoint
from fake_backend import Effect, FakeBackend, fake_checkpoint
from kerneltriage.backends.torch import kernel_lever
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.bench import ab, harness
from kerneltriage.cli.main import main
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.ledger_export import to_markdown
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.probes import KernelCheck, KernelTiming
from kerneltriage.triage import kernel_path

KERNELS = '''
import torch
import torch.nn.functional as F
from kerneltriage.engine.kernels import Kernel

def _norm(x, weight, eps):
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)

def good(x, weight, eps, out):
    out.copy_(_norm(x, weight, eps))

def half(x, weight, eps, out):  # writes the first half of each row only
    n = out.shape[-1] // 2
    out[..., :n] = _norm(x, weight, eps)[..., :n]

def wrong_at_9(x, weight, eps, out):  # right for a decode row, 5% off for a k = 8 verify's 9 rows
    out.copy_(_norm(x, weight, eps) * (1.05 if x.shape[-2] == 9 else 1.0))

def gemv(x, weight, out):
    torch.matmul(x, weight.T, out=out)

def attention(q, k, v, mask, out):  # the stock op's arithmetic, its mask as given (None: every key)
    out.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))

GOOD = Kernel("norm", good, exact=True)
HALF = Kernel("norm", half)
WRONG9 = Kernel("norm", wrong_at_9)
GEMV = Kernel("linear.gemv", gemv)
DECODE = Kernel("attn.decode", attention)
PREFILL = Kernel("attn.prefill", attention)
'''
SETTINGS = kernel_path.KernelSettings(rows=(1, 9), depths=(0,), ab=ab.Settings(prompt=8, gen=4, pairs=5, warmups=0))


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kernels") / "planted.py"
    path.write_text(KERNELS)
    return path


def _runner():  # noqa: ANN202
    return BACKEND.build(tiny_checkpoint("llama"), RunConfig(), "cpu", "float32")


def test_a_correct_kernel_passes_at_every_shape(kernels: Path) -> None:
    report = kernel_path.check_kernel(BACKEND, _runner(), f"{kernels}:GOOD", SETTINGS)
    recorded = {c.rows for c in report.checks if c.trial != "unseen-shape"}
    assert report.passed and report.verdict is None and recorded == {1, 9}
    assert len({c.rows for c in report.checks} - recorded) == 1  # a row count drawn at random, checked too
    assert all(c.exact and c.unwritten == 0 for c in report.checks)


def test_a_kernel_that_writes_half_its_output_fails(kernels: Path) -> None:
    report = kernel_path.check_kernel(BACKEND, _runner(), f"{kernels}:HALF", SETTINGS)
    assert not report.passed and report.verdict.verdict == "invalid"
    assert all(c.unwritten == c.rows * 32 for c in report.checks)  # half of the 64-wide rows
    assert "left unwritten" in report.verdict.reason


def test_a_kernel_correct_at_one_row_but_wrong_at_nine_fails(kernels: Path) -> None:
    report = kernel_path.check_kernel(BACKEND, _runner(), f"{kernels}:WRONG9", SETTINGS)
    by_rows = {c.rows: c.passed for c in report.checks if c.trial != "unseen-shape"}
    assert by_rows == {1: True, 9: False} and report.verdict.verdict == "invalid"
    assert "at 9 rows" in report.verdict.reason


def test_a_failing_kernel_is_never_timed(kernels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BACKEND.__class__, "kernel_time", lambda *args: pytest.fail("timed a wrong kernel"))
    report = kernel_path.run_kernel(BACKEND, _runner(), f"{kernels}:HALF", SETTINGS)
    assert report.ab is None and report.verdict.verdict == "invalid"


def test_a_kernel_registered_but_never_dispatched_is_invalid(kernels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(kernel_lever.WIRED, "norm", lambda runner, call: None)  # planted: the seam keeps stock
    report = kernel_path.run_kernel(BACKEND, _runner(), f"{kernels}:GOOD", SETTINGS)
    assert report.ab is not None and report.ab.silent == [f"kernel={kernels}:GOOD"]
    assert report.verdict.verdict == "invalid" and "never executed" in report.verdict.reason


def test_a_gemv_kernel_runs_at_decode_rows_only(kernels: Path) -> None:
    runner = BACKEND.build(tiny_checkpoint("llama"), RunConfig.from_flags(f"kernel={kernels}:GEMV"), "cpu", "float32")
    stock = _runner()
    from kerneltriage.engine.generation import generate_step
    from kerneltriage.engine.sampling import SamplingParams

    prompt = list(range(1, 40))  # 39 rows: above GEMV_ROWS, so the prompt's projections stay stock
    assert list(generate_step(runner, prompt, SamplingParams(), 6)) == list(generate_step(stock, prompt,
                                                                                             SamplingParams(), 6))
    per_step = 7 * 2 + 1  # seven projections per layer and the output head
    assert runner.counters[f"kernel={kernels}:GEMV"] == 5 * per_step  # decode steps only, not the prompt


@pytest.fixture
def fake_host_clock(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    holder: dict = {}
    monkeypatch.setattr(harness, "host_clock", lambda: holder["backend"].clock())
    return holder


def test_twice_as_fast_in_isolation_on_a_one_percent_seam_is_no_lever(fake_host_clock: dict,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ref = "planted.py:FAST"
    monkeypatch.setattr(kernel_path, "load_kernel", lambda text: type("Kernel", (), {"seam": "norm"})())
    checks = [KernelCheck("norm", 1, 0, "1x1x16", 0.0, 0.0, 1e-5, 0, None)]
    timings = [KernelTiming("norm", 1, 0, lane, 1e-6, 2e-6, "fake") for lane in ("chained", "queued")]
    backend = FakeBackend({f"kernel={ref}": Effect(prefill=1 / 1.005, decode=1 / 1.005)}, noise=0.01, seed=3,
                          classes={"norms": 0.01, "q_proj": 0.6, "attention": 0.3}, kernel=(checks, timings))
    fake_host_clock["backend"] = backend
    runner = backend.build(fake_checkpoint(), RunConfig())
    report = kernel_path.run_kernel(backend, runner, ref, SETTINGS)
    assert all(t.ratio == 2.0 for t in report.timings)  # 2× faster alone …
    assert report.shares == {"prefill": pytest.approx(0.01, rel=0.05), "decode": pytest.approx(0.01, rel=0.05)}
    assert report.verdict.verdict == "no-lever"  # … on 1% of the step: no speed-up of it can register


def test_the_kernel_ledger_renders_every_verdict(kernels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint("llama"))
    ledger = tmp_path / "ledger.db"
    for name in ("GOOD", "WRONG9"):
        assert main(["kernel", "run", "--kernel", f"{kernels}:{name}", "--model", "tiny", "--device", "cpu",
                     "--rows", "1,9", "--depths", "0", "-p", "8", "-n", "4", "-r", "5", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "isolation chained" in out and "verdict: INVALID" in out
    with Ledger(ledger) as opened:
        records = [opened.get_experiment(r.id) for r in opened.list_experiments()]
    table = to_markdown(records)
    assert "## Kernel ledger" in table and "FAIL at 1 of 3 shapes" in table and "| invalid |" in table
    assert table.count(":GOOD`") == 1 and "×" in table.split("## Kernel ledger")[1].split("##")[0]


@pytest.mark.parametrize("name", ["DECODE", "PREFILL"])
def test_an_attention_kernel_takes_its_paths_calls_and_keeps_greedy_tokens(kernels: Path, name: str) -> None:
    """attn.decode takes one-row calls, attn.prefill the prompt's (its causal mask made for it), and a chunk after a
    cached prefix (a mask that sees the prefix)."""
    from kerneltriage.engine.generation import generate_step
    from kerneltriage.engine.sampling import SamplingParams

    stock, runner = _runner(), BACKEND.build(tiny_checkpoint("llama"), RunConfig.from_flags(f"kernel={kernels}:{name}"),
                                             "cpu", "float32")
    prompt = [5, 17, 101, 3, 42, 250, 9]
    expected = list(generate_step(stock, prompt, SamplingParams(), 6))
    assert len(set(expected)) > 1 and list(generate_step(runner, prompt, SamplingParams(), 6)) == expected
    calls = sum(count for lever, count in runner.counters.items() if lever.startswith("kernel"))
    assert calls == 2 * (5 if name == "DECODE" else 1)  # 2 layers: 5 decode steps, or the one prefill
    stock.reset_cache(16), runner.reset_cache(16)
    stock.prefill(prompt[:3], 0), runner.prefill(prompt[:3], 0)
    assert torch.allclose(runner.prefill(prompt[3:], 3), stock.prefill(prompt[3:], 3), atol=1e-5)


def test_a_triton_kernel_off_a_gpu_without_the_interpreter_is_refused_before_it_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton finds no driver on a CPU: the first launch used to raise mid-run (a traceback, not an error naming the
    input); the refusal comes at build. (Under the interpreter, this suite's CPU runs, the Triton kernels' tests take
    them: tests/test_kernels_triton.py.)"""
    from kerneltriage.core.errors import InputError

    import kerneltriage.kernels.rmsnorm  # noqa: F401 - decorated now, under the interpreter: imported first with the
    # variable unset, the module would keep compiled-only kernels for every later test in this process

    ref = "kerneltriage.kernels.rmsnorm:RMSNORM"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(InputError, match=f"kernel={ref}: a Triton kernel, and Triton has no backend for cpu"):
        BACKEND.build(tiny_checkpoint("llama"), RunConfig.from_flags(f"kernel={ref}"), "cpu", "float32")


def test_kernel_run_takes_the_depth_its_ab_and_timing_run_at(kernels: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """-d sets the A/B's cache depth and the isolation timing's (an attention kernel's worth shows at depth);
    a negative one is one line and exit status 2."""
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint("llama"))
    seen = []

    def run_kernel(backend, runner, ref, settings, progress):  # noqa: ANN001, ANN202 - records the settings only
        seen.append(settings)
        return kernel_path.check_kernel(backend, runner, ref, settings)

    monkeypatch.setattr(kernel_path, "run_kernel", run_kernel)
    base = ["kernel", "run", "--kernel", f"{kernels}:GOOD", "--model", "tiny", "--device", "cpu", "--rows", "1",
            "--depths", "0", "--ledger", str(tmp_path / "ledger.db")]
    assert main(base + ["-d", "24"]) == 0 and main(base) == 0
    assert [(s.ab.depth, s.time_depth) for s in seen] == [(24, 24), (0, kernel_path.TIME_DEPTH)]
    assert main(base + ["-d", "-3"]) == 2
    assert "depth ≥ 0" in capsys.readouterr().err
