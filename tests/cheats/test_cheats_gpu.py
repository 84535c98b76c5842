"""The cheats only CUDA can run, through `kernel check` and `kernel run` on a tiny model on the GPU (skipped
without CUDA): a side stream, L2 persistence, an output computed lazily when read, and the uninitialized output that
fooled the "150×" kernel's harness. docs/kernels.md says how to run them on the H200."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from conftest import tiny_checkpoint
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.bench import ab
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage import kernel_path

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
HERE = Path(__file__).resolve().parent
SETTINGS = kernel_path.KernelSettings(rows=(1, 9), depths=(0,), ab=ab.Settings(prompt=8, gen=4, pairs=5, warmups=0))


@pytest.fixture(scope="module")
def runner():  # noqa: ANN201
    return BACKEND.build(tiny_checkpoint("llama"), RunConfig(), "cuda", "float32")


def test_work_left_on_a_side_stream_is_caught_by_the_check_and_by_the_timing(runner) -> None:  # noqa: ANN001
    ref = f"{HERE}/gpu_candidates.py:SIDE_STREAM"
    report = kernel_path.run_kernel(BACKEND, runner, ref, SETTINGS)
    assert report.verdict.verdict == "invalid" and not report.timings, report.verdict
    assert "outlived-call" in report.guards, report.verdict.reason
    timings = {t.lane: t for t in BACKEND.kernel_time(runner, ref, 1, 0)}  # timed as if the check had missed it
    assert any(m.startswith("device-sync") for m in timings["queued"].caught), timings["queued"]
    chained = {m.split(":")[0] for m in timings["chained"].caught}
    assert chained & {"graph-capture", "timed-outputs", "device-sync"}, timings["chained"]


def test_l2_lines_kept_persistent_are_caught_by_the_timing(runner) -> None:  # noqa: ANN001
    report = kernel_path.run_kernel(BACKEND, runner, f"{HERE}/gpu_candidates.py:L2_PERSISTENT", SETTINGS)
    assert all(c.passed for c in report.checks) and report.timings and report.ab is None  # right, so timed
    assert report.verdict.verdict == "invalid" and "l2-persistence" in report.guards, report.verdict.reason
    limit = ctypes.c_size_t(1)
    ctypes.CDLL("libcuda.so.1").cuCtxGetLimit(ctypes.byref(limit), ctypes.c_int(0x06))
    assert limit.value == 0  # the judge left no carve-out behind


def test_a_lazy_cuda_output_is_caught(runner) -> None:  # noqa: ANN001
    report = kernel_path.check_kernel(BACKEND, runner, f"{HERE}/candidates.py:LAZY_OUTPUT", SETTINGS)
    assert report.verdict.verdict == "invalid" and "output-swapped" in report.guards, report.verdict


def test_an_uninitialized_output_is_caught_on_the_caching_allocator(runner) -> None:  # noqa: ANN001
    """main_horse's finding on the "150×" kernel: after a harness computed the reference and freed it, an output buffer
    from the caching allocator could hold the reference's result, so a kernel that writes nothing passed (in one
    order only). The check calls the kernel first, on inputs nothing has computed on, into a poisoned buffer."""
    report = kernel_path.check_kernel(BACKEND, runner, f"{HERE}/candidates.py:UNINITIALIZED", SETTINGS)
    assert report.verdict.verdict == "invalid" and "poisoned-output" in report.guards, report.verdict
