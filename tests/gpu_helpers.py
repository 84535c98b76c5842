"""What the real-model GPU tests share (test_gpu_levers.py, test_gpu_speculation.py, test_gpu_probes.py): the prompt,
how many tokens cross a graph window, and CUDA runners of the default model."""

from __future__ import annotations

from pathlib import Path

from kerneltriage.backends.torch.accelerate import GRAPH_WINDOW
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.engine.configuration import RunConfig

PROMPT = "List three facts about the Moon, one per line:\n1."
REPETITIVE = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts" / "repetitive.jsonl"


def crossing(prompt: list[int], past: int = 16) -> int:
    """Tokens to generate after `prompt` for the steps to write `past` positions into the second graph window:
    a second graph is captured and used (the fewest tokens that test it: each one is a decode step)."""
    return GRAPH_WINDOW + past - len(prompt)


def cuda_runner(checkpoint, levers: str, spec: str | None = None, depth: str | None = None):  # noqa: ANN001, ANN201
    # float32: the tests are about the levers' logic; bf16 kernels of other shapes may round near-ties apart
    return BACKEND.build(checkpoint, RunConfig.from_flags(levers, spec, depth), "cuda", "float32")
