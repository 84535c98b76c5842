"""CUDA-only probes on real shapes: the projection sweep times GEMVs by graph replay, sdpa_pad finds the head dims
the fused kernels take, bench counts the kernels a decode token launches. Skipped without CUDA. The sweep asserts a
bandwidth: run it with the GPU to itself (the suite's command runs this file last, alone)."""

from __future__ import annotations

import json

import pytest
import torch

from kerneltriage.backends.torch.backend import build_runner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_m_sweep_times_the_gemv_not_the_host(default_checkpoint) -> None:  # noqa: ANN001
    from kerneltriage.backends.torch.msweep import m_sweep

    runner = build_runner(default_checkpoint, torch.device("cuda"), torch.bfloat16)
    curves = m_sweep(runner.model, torch.device("cuda"), (1, 5))
    assert curves and all(c.timer == "cuda graph replay" and min(c.seconds) > 0 for c in curves)
    # the 57 MB output projection streams at well over 2.5 TB/s on an H200-class GPU; timed through eager
    # launches on a slow host it measured ~30 µs per call, i.e. under 2 TB/s
    head = next(c for c in curves if "lm_head" in c.name)
    assert head.bandwidth() > 2.5e12


def test_sdpa_pad_finds_the_head_dims_fused_kernels_take() -> None:
    from kerneltriage.backends.torch import gates
    from kerneltriage.backends.torch.attention_levers import PAD_STEP, fused_head_dim
    from kerneltriage.engine.probes import SdpaCall

    cuda = torch.device("cuda")

    def taken(size: int) -> bool:
        call = SdpaCall((1, 8, 16, size), (1, 8, 16, size), "bfloat16", None, True, False)
        return any(gates.probe(name, gates.random_inputs(call, cuda))[0] for _, _, name in gates.FUSED)

    assert fused_head_dim(64, torch.bfloat16, cuda) == 64  # flash takes it: nothing to pad
    size = fused_head_dim(300, torch.bfloat16, cuda)  # over flash's 256 and not 8-aligned for the others
    assert not taken(300)  # only math would run it: the case the lever exists for
    assert size > 300 and size % PAD_STEP == 0 and taken(size)
    assert not any(taken(smaller) for smaller in range(304, size, PAD_STEP))  # the nearest size a kernel takes


def test_bench_reports_kernels_per_decode_token(tmp_path, capsys) -> None:  # noqa: ANN001
    from kerneltriage.cli.main import main

    argv = ["bench", "--model", "smollm2-135m", "--levers", "fused_layer,graphs", "-p", "0", "-n", "16", "-r", "1",
            "--output", "json", "--ledger", str(tmp_path / "l.db")]
    assert main(argv) == 0
    kernels = json.loads(capsys.readouterr().out)["decode_kernels_per_token"]
    assert 30 * 6 <= kernels < 30 * 8  # six fused kernels per layer and a few stock ones around them
