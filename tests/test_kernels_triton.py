"""The Triton candidates of `kerneltriage.kernels` against the stock ops through the kernel path's own check (at a
tiny model's shapes: every row count, depth and shape, poisoned outputs), and one end to end in the model. On a
machine without CUDA they run in Triton's interpreter (`TRITON_INTERPRET=1`, numpy on the CPU): their logic is
checked everywhere (conftest sets TRITON_INTERPRET before triton is first imported); their speed is judged on a
GPU with `kerneltriage kernel run`."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_checkpoint
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.triage import kernel_path

pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # in the GPU suite too: on CUDA its kernels run compiled (here, in the interpreter)
CANDIDATES = {"split_kv_attention": "SPLIT_KV", "rmsnorm": "RMSNORM", "silu_gemv": "SILU_GEMV"}


def _runner(levers: str = "", arch: str = "llama"):  # noqa: ANN202
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return BACKEND.build(tiny_checkpoint(arch, max_context=512), RunConfig.from_flags(levers), device, "float32")


@pytest.mark.parametrize("module", CANDIDATES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: head_dim 32 ≠ hidden / heads
def test_candidate_passes_the_kernel_check(module: str, arch: str) -> None:
    settings = kernel_path.KernelSettings(rows=(1, 9), depths=(0, 70))
    report = kernel_path.check_kernel(BACKEND, _runner(arch=arch), f"kerneltriage.kernels.{module}:"
                                      f"{CANDIDATES[module]}", settings)
    assert report.passed, [c.to_dict() for c in report.checks if not c.passed]
    assert all(c.unwritten == 0 for c in report.checks)


def test_split_kv_attention_keeps_greedy_tokens_in_the_model() -> None:
    prompt, ref = list(range(3, 19)), "kerneltriage.kernels.split_kv_attention:SPLIT_KV"
    plain = list(generate_step(_runner(), prompt, SamplingParams(), 8))
    runner = _runner(f"kernel={ref}")
    assert list(generate_step(runner, prompt, SamplingParams(), 8)) == plain
    assert runner.counters[f"kernel={ref}"] == 7 * 2  # every decode step, both layers
