"""The torch backend: builds runners and answers triage's probes, as `engine/backend.py` describes."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kerneltriage.backends.torch.device import resolve_device, resolve_dtype
from kerneltriage.backends.torch.levers import apply_config
from kerneltriage.backends.torch.load import build_runner
from kerneltriage.backends.torch.quantized import LEVER as QUANTIZED, kept_as_blocks
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.probes import (GateRow, KernelCheck, KernelTiming, PhaseProfile, SdpaCall, Sparsity,
                                        SweepCurve)

if TYPE_CHECKING:
    from kerneltriage.engine.backend import BackendOf


class TorchBackend:
    name = "torch"
    trainer: str | None = "kerneltriage.train.torch_trainer"  # drafts and EAGLE heads train on torch runners (train/)

    def resolve_device(self, name: str) -> str:
        return str(resolve_device(name))

    def resolve_dtype(self, name: str | None, device: str) -> str:
        return str(resolve_dtype(name, torch.device(device))).removeprefix("torch.")

    def build(self, checkpoint: Checkpoint, config: RunConfig, device: str, dtype: str) -> Runner:
        place, torch_dtype = torch.device(device), getattr(torch, dtype)
        # what `quantized` replaces with the file's blocks is not dequantized first only to be dropped
        unfilled = kept_as_blocks(checkpoint, place, torch_dtype) if config.has(QUANTIZED) else {}
        return apply_config(build_runner(checkpoint, place, torch_dtype, unfilled), config)

    def copy(self, runner: Runner, config: RunConfig) -> Runner:
        from kerneltriage.backends.torch.load import stock_copy

        stock = Runner(stock_copy(runner.model), runner.checkpoint, runner.device, runner.torch_dtype)
        return apply_config(stock, config)

    def float32_reference(self, runner: Runner, config: RunConfig | None = None) -> Runner:
        from kerneltriage.backends.torch.load import stock_copy

        model = stock_copy(runner.model, torch.float32)  # the same weights, upcast exactly: only the arithmetic differs
        reference = Runner(model, runner.checkpoint, runner.device, torch.float32)
        return reference if config is None else apply_config(reference, config)

    def release(self, runner: Runner) -> None:
        """Free what the runner holds now, weights included, whoever still refers to it (lever closures hold
        cycles, and the caller's own variable is alive while it releases): a large copy must not linger. The runner
        is unusable after."""
        runner.drop_cache()
        with torch.no_grad():
            for tensor in (*runner.model.parameters(), *runner.model.buffers()):
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        gc.collect()
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()

    def seam_errors(self, runner: Runner) -> dict[str, tuple[float, float]]:
        from kerneltriage.backends.torch.seams import seam_errors

        seams = runner.run_config.numeric_seams
        return seam_errors(runner.model, seams) if seams else {}

    def ceilings(self, device: str, dtype: str, refresh: bool = False) -> Any:
        from kerneltriage.backends.torch.ceilings import get_ceilings

        return get_ceilings(torch.device(device), getattr(torch, dtype), refresh=refresh)

    def ceilings_key(self, device: str, dtype: str) -> str:
        from kerneltriage.backends.torch.ceilings import cache_key

        return cache_key(torch.device(device), getattr(torch, dtype))

    def profile(self, runner: Runner, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int
                ) -> PhaseProfile:
        from kerneltriage.backends.torch import profile

        if phase == "prefill":
            return profile.profile_prefill(runner, prefix, tokens, warmup=runner.device.type == "cuda")
        return profile.profile_decode(runner, prefix, tokens)

    def host_issue_seconds(self, runner: Runner, prefix: Sequence[int], steps: int) -> float | None:
        from kerneltriage.backends.torch import profile

        return profile.host_issue_seconds(runner, prefix, steps) if runner.device.type == "cuda" else None

    def census(self, runner: Runner, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int
               ) -> dict[str, Any]:
        from kerneltriage.backends.torch import census

        return census.per_unit(runner, phase, prefix, tokens)

    def attention_gates(self, phase: str, call: SdpaCall, calls_per_pass: float, device: str) -> GateRow:
        from kerneltriage.backends.torch import gates

        return gates.gate_row(phase, call, calls_per_pass, torch.device(device))

    def sweep_projections(self, runner: Runner, rows: tuple[int, ...] | None) -> list[SweepCurve]:
        from kerneltriage.backends.torch import msweep

        return msweep.m_sweep(runner.model, runner.device, rows)

    def kernel_check(self, runner: Runner, ref: str, rows: Sequence[int], depths: Sequence[int]
                     ) -> list[KernelCheck]:
        from kerneltriage.backends.torch import kernel_check
        from kerneltriage.engine.kernels import load_kernel

        return kernel_check.check(runner.model, load_kernel(ref), rows, depths)

    def kernel_time(self, runner: Runner, ref: str, rows: int, depth: int) -> list[KernelTiming]:
        from kerneltriage.backends.torch import kernel_check
        from kerneltriage.engine.kernels import load_kernel

        return kernel_check.time_lanes(runner.model, load_kernel(ref), rows, depth)

    def attention_sparsity(self, runner: Runner) -> Sparsity:
        from kerneltriage.backends.torch.sparsity import attention_sparsity
        from kerneltriage.engine.sparsity import on_stock_copy

        return on_stock_copy(self, runner, attention_sparsity)


# declared as the protocol: the type checker holds this backend and its Runner to engine/backend.py
BACKEND: BackendOf[Runner] = TorchBackend()
