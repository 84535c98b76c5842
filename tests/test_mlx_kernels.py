"""The kernel path on MLX: a kernel checked at the model's shapes against the stock op in float32 (eager and compiled
attention alike: a kernel that ignores the window's mask fails), timed beside it, and MLX's CUDA custom kernel
refused on a device without CUDA in MLX's own words."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from conftest import tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner  # noqa: E402
from kerneltriage.backends.mlx import kernel_check  # noqa: E402
from kerneltriage.backends.mlx.attention_levers import unfused_sdpa  # noqa: E402
from kerneltriage.backends.mlx.backend import BACKEND  # noqa: E402
from kerneltriage.core.errors import InputError  # noqa: E402
from kerneltriage.engine.kernels import Kernel  # noqa: E402


def composed(q, k, v, mask):  # noqa: ANN001, ANN201
    return unfused_sdpa(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)


COMPOSED = Kernel("attn.decode", composed)
UNMASKED = Kernel("attn.decode", lambda q, k, v, mask: composed(q, k, v, None))  # planted: the window's mask ignored


def test_a_right_kernel_passes_and_one_that_ignores_the_window_mask_fails_there() -> None:
    runner = mlx_runner(tiny_checkpoint("llama"))
    right = kernel_check.check(runner, COMPOSED, (1, 3), (0, 5))
    assert len(right) == 8 and all(c.passed for c in right)
    wrong = kernel_check.check(runner, UNMASKED, (1,), (5,))
    assert [c.passed for c in wrong] == [True, False]  # eager decode has no mask; the compiled window has one
    assert "x256x" in wrong[1].shape and wrong[1].error > wrong[1].tolerance


def test_a_kernel_is_timed_beside_the_stock_op_in_both_lanes() -> None:
    timings = kernel_check.time_lanes(mlx_runner(tiny_checkpoint("llama")), COMPOSED, 1, 5)
    assert [t.lane for t in timings] == ["chained", "queued"]
    assert all(t.kernel_seconds > 0 and t.stock_seconds > 0 for t in timings)


def test_the_cuda_candidate_is_refused_where_mlx_has_no_cuda() -> None:
    if mx.cuda.is_available():
        pytest.skip("a CUDA device: the candidate runs here")
    with pytest.raises(InputError, match="does not run on MLX's cpu device here .*CUDA"):
        BACKEND.kernel_check(mlx_runner(tiny_checkpoint("llama")),
                             "kerneltriage.kernels.mlx_masked_decode:MASKED_DECODE", (1,), (0,))
