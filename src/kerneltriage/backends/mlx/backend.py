"""The MLX backend: builds runners and answers triage's probes, as `engine/backend.py` describes.

MLX's Python API is the same on Metal, CUDA and the CPU: everything here runs unchanged on a Mac. What depends on
the device is said where it is decided (`device.py`, `gates.py`).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Sequence

import mlx.core as mx

from kerneltriage.backends.mlx import device as devices
from kerneltriage.backends.mlx.levers import apply_config
from kerneltriage.backends.mlx.load import build_runner
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.kernels import Kernel
from kerneltriage.engine.probes import GateRow, KernelCheck, KernelTiming, PhaseProfile, SdpaCall, Sparsity, SweepCurve

if TYPE_CHECKING:
    from kerneltriage.engine.backend import BackendOf


def _restocked(runner: Runner, dtype: str) -> Runner:
    """A stock runner over `runner`'s stock weights (shared, or cast exactly to `dtype`)."""
    from kerneltriage.backends.mlx.load import stock_copy

    model = stock_copy(runner.model, None if dtype == runner.dtype else getattr(mx, dtype))
    return Runner(model, runner.checkpoint, runner.device, runner.device_type, dtype)


def _runnable(runner: Runner, ref: str) -> Kernel:
    """The kernel `ref`, at a seam MLX wires and run once at the model's shapes on this device (kernel_lever.py):
    an InputError, in MLX's own words, where it cannot run here."""
    from kerneltriage.backends.mlx.kernel_lever import runnable

    return runnable(runner, ref)


class MlxBackend:
    name = "mlx"
    trainer: str | None = None  # no trainer of drafters on MLX yet (train/)

    def resolve_device(self, name: str) -> str:
        return devices.resolve_device(name)

    def resolve_dtype(self, name: str | None, device: str) -> str:
        return devices.resolve_dtype(name, device)

    def build(self, checkpoint: Checkpoint, config: RunConfig, device: str, dtype: str) -> Runner:
        # the levers apply before the weights are evaluated: what one replaces (the matrices `quantized` keeps as
        # blocks) is never made
        runner = apply_config(build_runner(checkpoint, device, dtype, evaluate=False), config)
        mx.eval(runner.model.parameters())
        return runner

    def copy(self, runner: Runner, config: RunConfig) -> Runner:
        return apply_config(_restocked(runner, runner.dtype), config)

    def float32_reference(self, runner: Runner, config: RunConfig | None = None) -> Runner:
        reference = _restocked(runner, "float32")  # exact upcasts of the same weights: only the arithmetic differs
        return reference if config is None else apply_config(reference, config)

    def release(self, runner: Runner) -> None:
        """Drop the runner's cache and collect (lever closures hold cycles), then MLX's buffer cache."""
        runner.drop_cache()
        gc.collect()
        mx.clear_cache()

    def seam_errors(self, runner: Runner) -> dict[str, tuple[float, float]]:
        from kerneltriage.backends.mlx.seams import seam_errors

        seams = runner.run_config.numeric_seams
        return seam_errors(runner, seams) if seams else {}

    def ceilings(self, device: str, dtype: str, refresh: bool = False) -> Any:
        from kerneltriage.backends.mlx.ceilings import get_ceilings

        return get_ceilings(device, dtype, refresh=refresh)

    def ceilings_key(self, device: str, dtype: str) -> str:
        from kerneltriage.backends.mlx.ceilings import cache_key

        return cache_key(device, dtype)

    def profile(self, runner: Runner, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int
                ) -> PhaseProfile:
        from kerneltriage.backends.mlx import profile

        if phase == "prefill":
            assert not isinstance(tokens, int), "a prefill's tokens are its prompt"
            return profile.profile_prefill(runner, prefix, tokens)
        assert isinstance(tokens, int), "a decode's tokens are a count of steps"
        return profile.profile_decode(runner, prefix, tokens)

    def host_issue_seconds(self, runner: Runner, prefix: Sequence[int], steps: int) -> float | None:
        from kerneltriage.backends.mlx import profile

        return profile.host_issue_seconds(runner, prefix, steps)

    def census(self, runner: Runner, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int
               ) -> dict[str, Any]:
        from kerneltriage.backends.mlx import census

        return census.per_unit(runner, phase, prefix, tokens)

    def attention_gates(self, phase: str, call: SdpaCall, calls_per_pass: float, device: str) -> GateRow:
        from kerneltriage.backends.mlx import gates

        return gates.gate_row(phase, call, calls_per_pass, device)

    def sweep_projections(self, runner: Runner, rows: tuple[int, ...] | None) -> list[SweepCurve]:
        from kerneltriage.backends.mlx import msweep

        return msweep.m_sweep(runner, rows)

    def kernel_check(self, runner: Runner, ref: str, rows: Sequence[int], depths: Sequence[int]
                     ) -> list[KernelCheck]:
        from kerneltriage.backends.mlx import kernel_check

        return kernel_check.check(runner, _runnable(runner, ref), rows, depths)

    def kernel_time(self, runner: Runner, ref: str, rows: int, depth: int) -> list[KernelTiming]:
        from kerneltriage.backends.mlx import kernel_check

        return kernel_check.time_lanes(runner, _runnable(runner, ref), rows, depth)

    def attention_sparsity(self, runner: Runner) -> Sparsity:
        from kerneltriage.backends.mlx.sparsity import attention_sparsity
        from kerneltriage.engine.sparsity import on_stock_copy

        return on_stock_copy(self, runner, attention_sparsity)


# declared as the protocol: the type checker holds this backend and its Runner to engine/backend.py
BACKEND: BackendOf[Runner] = MlxBackend()
