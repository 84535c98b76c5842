"""Every documented way of fooling a kernel benchmark that a CPU can re-enact, planted as a kernel (candidates.py,
patch_*.py) and put through `kernel check`, `kernel run` and `ab`: each must end invalid with the guard that caught
it named, or carry its label. docs/kernels.md, "Planted cheats", maps each to its public source; the CUDA-only ones
are in test_cheats_gpu.py. An honest kernel passes every guard (the last tests)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny_checkpoint
from fake_backend import FakeBackend, fake_checkpoint
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.bench import ab
from kerneltriage.cli.main import main
from kerneltriage.core import integrity, kernel_guards
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.probes import KernelCheck, KernelTiming
from kerneltriage.triage import kernel_path

HERE = Path(__file__).resolve().parent
CANDIDATES = HERE / "candidates.py"
SETTINGS = kernel_path.KernelSettings(rows=(1, 9), depths=(0,), time_rows=1024,
                                      ab=ab.Settings(prompt=8, gen=4, pairs=5, warmups=0))
# candidate → the guards that must all be named; each is caught by the check, so it is never timed
CAUGHT_BY_CHECK = {
    "BACKGROUND_THREAD": {"background-thread", "poisoned-output"},
    "LAZY_OUTPUT": {"output-swapped"},
    "PREVIOUS_OUTPUT": {"same-pointers"},
    "CACHE_BY_POINTER": {"same-pointers"},
    "CACHE_BY_SHAPE": {"same-pointers"},
    "UNINITIALIZED": {"poisoned-output"},
    "HALF_PRECISION": {"fresh-inputs"},
    "CHECKED_SHAPES_ONLY": {"unseen-shape"},
    "NONDETERMINISTIC": {"repeat"},
}
# candidate → guards named; each passes the check (right whenever checked) and is caught by the timing. The skipped
# call's near-zero sample is also named by timing-spread where the real calls take over 10× a bare call (not always
# on a busy 2-core CI machine: CI read only timed-outputs once); that guard is tested on planted samples below
CAUGHT_BY_TIMING = {"COMPILED_PER_SHAPE": {"cold-shape"}, "SKIPS_WHEN_TIMED": {"timed-outputs"}}
# patch file → the attribute the seal names (each rebinds it at import)
PATCHES = {"patch_perf_counter.py:NORM": "time.perf_counter",
           "patch_elapsed_time.py:NORM": "torch.cuda.Event.elapsed_time",
           "patch_synchronize.py:NORM": "torch.cuda.synchronize",
           "patch_tf32.py:GEMV": "torch.get_float32_matmul_precision()"}


@pytest.fixture(scope="module")
def runner():  # noqa: ANN201
    return BACKEND.build(tiny_checkpoint("llama"), RunConfig(), "cpu", "float32")


REBOUND = ((time, "perf_counter"), (torch.cuda.Event, "elapsed_time"), (torch.cuda, "synchronize"),
           (torch.backends.cuda.matmul, "allow_tf32"))


@pytest.fixture
def restored():  # noqa: ANN201
    """What the patch cheats rebind, put back after the test; the seal must hold again."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in REBOUND]
    precision = torch.get_float32_matmul_precision()
    yield
    for owner, name, value in saved:
        setattr(owner, name, value)
    torch.set_float32_matmul_precision(precision)
    assert not integrity.broken()


@pytest.mark.parametrize("name", CAUGHT_BY_CHECK)
def test_a_cheat_the_check_catches_is_invalid_and_never_timed(runner, name: str) -> None:  # noqa: ANN001
    report = kernel_path.run_kernel(BACKEND, runner, f"{CANDIDATES}:{name}", SETTINGS)
    assert report.verdict.verdict == "invalid" and not report.timings and report.ab is None
    assert CAUGHT_BY_CHECK[name] <= set(report.guards), report.verdict.reason
    assert all(guard in report.verdict.reason for guard in CAUGHT_BY_CHECK[name])


def test_what_each_check_guard_saw(runner) -> None:  # noqa: ANN001
    """The precision downgrade is told apart from a plain error; a kernel right only where it is known to be checked
    passes every recorded shape; a cache by pointer passes fresh inputs and fails their pointers refilled."""
    half = kernel_path.check_kernel(BACKEND, runner, f"{CANDIDATES}:HALF_PRECISION", SETTINGS)
    assert "significant bits survive of float32's 24" in half.verdict.reason
    shapes = kernel_path.check_kernel(BACKEND, runner, f"{CANDIDATES}:CHECKED_SHAPES_ONLY", SETTINGS)
    assert all(c.passed == (c.trial != "unseen-shape") for c in shapes.checks)
    pointer = kernel_path.check_kernel(BACKEND, runner, f"{CANDIDATES}:CACHE_BY_POINTER", SETTINGS)
    assert {c.trial for c in pointer.checks if not c.passed} == {"same-pointers"}
    first_row = kernel_path.check_kernel(BACKEND, runner, f"{CANDIDATES}:FIRST_ROW_ONLY", SETTINGS)
    assert {c.rows: c.passed for c in first_row.checks}[1] and not {c.rows: c.passed for c in first_row.checks}[9]


@pytest.mark.parametrize("name", CAUGHT_BY_TIMING)
def test_a_cheat_right_whenever_checked_is_caught_by_the_timing(runner, name: str) -> None:  # noqa: ANN001
    report = kernel_path.run_kernel(BACKEND, runner, f"{CANDIDATES}:{name}", SETTINGS)
    assert all(c.passed for c in report.checks) and report.timings and report.ab is None
    assert report.verdict.verdict == "invalid" and CAUGHT_BY_TIMING[name] <= set(report.guards), report.verdict.reason
    for timing in report.timings:  # a lane's time is its samples' median, whatever one of them says
        assert timing.kernel_seconds == statistics.median(timing.kernel_samples)


@pytest.mark.parametrize("ref", PATCHES)
def test_a_timer_or_flag_rebound_at_import_breaks_the_seal(runner, restored, ref: str) -> None:  # noqa: ANN001
    report = kernel_path.check_kernel(BACKEND, runner, f"{HERE / ref}", SETTINGS)
    assert report.verdict.verdict == "invalid" and report.guards == ["judge-seal"] and not report.checks
    assert PATCHES[ref] in report.verdict.reason


def test_a_rebound_clock_makes_kernel_run_and_ab_invalid(restored, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the commands: `kernel run` stops at the seal; `ab` with the kernel as B's lever times everything
    under the rebound clock, and its verdict is invalid all the same."""
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint("llama"))
    ref, common = f"{HERE}/patch_perf_counter.py:NORM", ["--model", "tiny", "--device", "cpu", "-p", "8", "-n", "4",
                                                            "-r", "5", "--ledger", str(tmp_path / "ledger.db")]
    assert main(["kernel", "run", "--kernel", ref, "--rows", "1,9", "--depths", "0", *common]) == 0
    assert "verdict: INVALID — caught: judge-seal: time.perf_counter replaced" in capsys.readouterr().out
    assert main(["ab", "--a", "levers=", "--b", f"levers=kernel={ref}", "--output", "json", *common]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "invalid" and result["reason"].startswith("judge-seal: time.perf_counter replaced")


def test_a_stale_kernel_in_the_model_makes_ab_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """ab checks B's outputs against A's on its own: the previous call's output, returned inside the model, changes
    the logits."""
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint("llama"))
    assert main(["ab", "--a", "levers=", "--b", f"levers=kernel={CANDIDATES}:PREVIOUS_OUTPUT", "--model", "tiny",
                 "--device", "cpu", "-p", "8", "-n", "4", "-r", "5", "--output", "json",
                 "--ledger", str(tmp_path / "ledger.db")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "invalid" and result["reason"].startswith("outputs differ"), result["reason"]


def test_the_stock_op_called_under_another_name_is_labelled(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kerneltriage.engine.sources.load_checkpoint", lambda spec: tiny_checkpoint("llama"))
    assert main(["kernel", "check", "--kernel", f"{CANDIDATES}:STOCK_CALL", "--model", "tiny", "--device", "cpu",
                 "--rows", "1,9", "--depths", "0", "--ledger", str(tmp_path / "ledger.db")]) == 0
    out = capsys.readouterr().out
    assert "label stock-call: the kernel calls rms_norm" in out and "check: passed" in out


def test_a_bimodal_kernel_is_labelled_and_timed_by_its_median(runner) -> None:  # noqa: ANN001
    """`kernel run`'s isolation timing: labelled (not invalid: a slow path is real cost), its time the median."""
    timings = BACKEND.kernel_time(runner, f"{CANDIDATES}:BIMODAL", SETTINGS.time_rows, SETTINGS.time_depth)
    lane = timings[0]
    assert any(label.startswith("bimodal: ") for label in lane.labels) and not lane.caught, lane
    assert lane.kernel_seconds == statistics.median(lane.kernel_samples) > 2 * min(lane.kernel_samples)


def test_a_rate_above_the_roofline_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layered: a time no device can reach (from a clock the seal missed) is refused against the measured ceilings
    wherever the caches were emptied before each sample (llm.c's over-peak bandwidth; TileGym #82)."""
    checks = [KernelCheck("norm", 1, 0, "1x1x16", 0.0, 0.0, 1e-5, 0, None)]
    fast = [KernelTiming("norm", 1, 0, lane, 1e-9, 2e-6, "fake", (1e-9,) * 5, (2e-6,) * 5, bytes_moved=1e8,
                         flushed=True) for lane in ("chained", "queued")]
    backend = FakeBackend({}, kernel=(checks, fast))
    monkeypatch.setattr(kernel_path, "load_kernel", lambda text: type("Kernel", (), {"seam": "norm"})())
    report = kernel_path.run_kernel(backend, backend.build(fake_checkpoint(), RunConfig()), "planted.py:FAST", SETTINGS)
    assert report.verdict.verdict == "invalid" and report.guards == ["roofline"] and report.ab is None
    assert "100000000 GB/s" in report.verdict.reason
    unflushed = [KernelTiming(**{**t.__dict__, "flushed": False}) for t in fast]  # a CPU lane: caches not emptied
    backend = FakeBackend({}, kernel=(checks, unflushed))
    monkeypatch.setattr(kernel_path, "measure_shares", lambda *args: {"prefill": 0.01, "decode": 0.01})
    monkeypatch.setattr(kernel_path.ab, "run_ab", _reached)
    with pytest.raises(Reached):  # not refused: a rate over memory bandwidth is no proof where a cache served it
        kernel_path.run_kernel(backend, backend.build(fake_checkpoint(), RunConfig()), "planted.py:FAST", SETTINGS)


class Reached(Exception):
    """The kernel path went on to its A/B."""


def _reached(*args: object, **kwargs: object) -> None:
    raise Reached


def test_aggregation_rules_on_planted_samples() -> None:
    """A near-zero sample is named (and moves the median nowhere); two modes are named; one slow outlier is not."""
    samples = [20e-6] * 9 + [1e-9]
    assert statistics.median(samples) == 20e-6 and kernel_guards.near_zero(samples).startswith("timing-spread")
    assert statistics.geometric_mean(samples) < 9e-6  # what a geometric mean would have reported
    assert kernel_guards.bimodal([20e-6, 21e-6, 80e-6, 82e-6, 20e-6, 79e-6]).startswith("bimodal: 3 of 6")
    assert kernel_guards.bimodal([20e-6] * 9 + [80e-6]) is None and kernel_guards.near_zero([20e-6] * 10) is None
    assert kernel_guards.cold([(0.02, 1e-5)] * 2, [(2e-5, 1e-5)] * 2, ["2 rows", "5 rows"]).startswith("cold-shape")
    assert kernel_guards.cold([(0.02, 1e-5), (1.2e-5, 1e-5)], [(2e-5, 1e-5)] * 2, ["2 rows", "5 rows"]) is None


def test_an_honest_kernel_passes_every_guard(runner) -> None:  # noqa: ANN001
    """The check and every timing lane of `kernel run` (its A/B is test_kernel_path.py's ledger test)."""
    report = kernel_path.check_kernel(BACKEND, runner, f"{CANDIDATES}:HONEST", SETTINGS)
    timings = BACKEND.kernel_time(runner, f"{CANDIDATES}:HONEST", SETTINGS.time_rows, SETTINGS.time_depth)
    assert report.passed and not report.guards and not report.labels and len(report.checks) == 3
    assert {t.lane for t in timings} == {"chained", "queued", "cold"}
    assert not [m for t in timings for m in t.caught] and not integrity.broken()
    # a label fails nothing: bimodal can also come from a shared CPU's bursts (4 lanes of 120 honest ones at load 8)
    assert all(label.startswith("bimodal: ") for t in timings for label in t.labels)
