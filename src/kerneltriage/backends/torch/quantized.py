"""The `quantized` lever on torch: each layer projection stored in the GGUF as Q4_0, Q4_1 or Q8_0 keeps its blocks
instead of a dequantized copy, so weight memory shrinks too. Other tensor types (F16, K-quants, …), the embedding
and the output projection stay dequantized. A stock copy of a quantized model (`load.stock_copy`: `ab`'s float32
reference) takes each projection's dequantized values.

- CUDA (`QuantLinear`): the blocks on the device (`kernels/quant_gemv.py`): decode and verify rows (≤ 16) through a
  Triton GEMV, prompts through the weight dequantized for the call and a GEMM. The CPU runs the same under Triton's
  interpreter when TRITON_INTERPRET=1 (the tests of that kernel). Beside it, `int4mm` sends the decode and verify
  rows through CUDA's int4 matmul, or `q8_dot` the decode row through an integer GEMV (`kernels/q8_gemv.py`).
- CPU (`Int4Linear`): the blocks repacked for torch's int4 CPU matmul (`int4.py`), which is vectorized only for
  bf16 activations: a bf16 model's rows (≤ INT4_ROWS) go through it; float32 or fp16 activations, and longer
  prompts, through the weight dequantized from the blocks for the call (exactly stock's values: ab's float32 check).
  packed_qkv and packed_gate_up stack the blocks of a layer's parts by rows into one Int4Linear (`packed`): one
  int4 call for q, k and v and one for gate and up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.dequant import dequantize
from kerneltriage.backends.torch.device import runs_triton
from kerneltriage.backends.torch.int4 import (COMPUTE, Int4Weight, cuda_packable, int4_product, int4_product_cuda,
                                              pack, pack_blocks_cuda)
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.checkpoint import BLOCK_TYPES, Checkpoint, RawTensor
from kerneltriage.engine.kernels import READS_PROJECTIONS, load_kernel

if TYPE_CHECKING:
    from kerneltriage.kernels.quant_gemv import QuantWeight

LEVER = "quantized"
INT4MM = "int4mm"
Q8DOT = "q8_dot"
KINDS = BLOCK_TYPES
INT4_ROWS = 128  # CPU: rows through the int4 kernel; above, dequantizing + a bf16 GEMM is faster (EPYC, 1 core: even
# at 256 rows, 2× at 512); at 1 row it is 4× faster than a bf16 F.linear of the dequantized weight
ROW_MULTIPLE = 16  # the int4 packer takes output sizes that are multiples of 16
PROJECTIONS = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"), "v": ("self_attn", "v_proj"),
               "o": ("self_attn", "o_proj"), "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"),
               "down": ("mlp", "down_proj")}


class QuantLinear(nn.Module):
    """A Linear whose weight is kept as GGUF blocks (buffers: the model's bytes count them); the bias, if any, stays
    a parameter."""

    def __init__(self, runner: Runner, weight: "QuantWeight", bias: nn.Parameter | None) -> None:
        super().__init__()
        self.qtype, self.bias, self.dtype = weight.qtype, bias, runner.torch_dtype
        self.out_features, self.in_features = weight.shape
        self.register_buffer("scales", weight.scales, persistent=False)
        self.register_buffer("mins", weight.mins, persistent=False)
        self.register_buffer("quants", weight.quants, persistent=False)
        self._count = lambda: counting.ran(runner, LEVER)  # a closure: the runner is not a submodule
        self.int4: Int4Weight | None = None  # int4mm: the blocks repacked for CUDA's int4 matmul (not a buffer: the
        # blocks stay, for prompts and stock copies, and the model's bytes count them once)
        self._count_int4 = lambda: counting.ran(runner, INT4MM)
        self.q8 = False  # q8_dot: the decode row through the integer GEMV (kernels/q8_gemv.py)
        self._count_q8 = lambda: counting.ran(runner, Q8DOT)

    @property
    def quant(self) -> "QuantWeight":
        from kerneltriage.kernels.quant_gemv import QuantWeight

        return QuantWeight(self.qtype, self.scales, self.mins, self.quants, (self.out_features, self.in_features))

    def stock_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dequantized weight (N, K) in `dtype` (default: the model's); float32 is exact, as the GEMV sums it."""
        from kerneltriage.kernels.quant_gemv import dequantized

        return dequantized(self.quant, dtype or self.dtype)

    @classmethod
    def stacked(cls, runner: Runner, parts: Sequence["QuantLinear"]) -> "QuantLinear":
        """One module computing `parts`' rows in order in one GEMV (packed_qkv, packed_gate_up: an 8B's 7 calls a
        layer become 4); each part's blocks become views of its rows, so a part called alone (a stock copy) still
        reads them and nothing is held twice."""
        from kerneltriage.kernels.quant_gemv import QuantWeight

        weights = [part.quant for part in parts]
        mins = None if weights[0].mins is None else torch.cat([w.mins for w in weights])  # type: ignore[misc]
        biases = [part.bias for part in parts]
        bias = None if biases[0] is None else nn.Parameter(torch.cat(biases), requires_grad=False)  # type: ignore[arg-type]
        n = sum(part.out_features for part in parts)
        whole = cls(runner, QuantWeight(weights[0].qtype, torch.cat([w.scales for w in weights]), mins,
                                        torch.cat([w.quants for w in weights]), (n, parts[0].in_features)), bias)
        sizes = [part.out_features for part in parts]
        for name in ("scales", "mins", "quants"):
            if whole._buffers[name] is not None:
                for part, view in zip(parts, whole._buffers[name].split(sizes)):  # type: ignore[union-attr]
                    part._buffers[name] = view
        return whole

    @staticmethod
    def stackable(parts: Sequence[nn.Module]) -> bool:
        """`parts` are QuantLinears (not the CPU's) of one block type and width, each with a bias or none with one."""
        return (all(type(part) is QuantLinear for part in parts)
                and len({(part.qtype, part.in_features, part.bias is None) for part in parts}) == 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._count()
        return self.product(x)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x · Wᵀ (+ bias), uncounted (the M-sweep times it without posing as the lever's proof of execution)."""
        from kerneltriage.kernels.quant_gemv import GEMV_ROWS, dequantized, quant_gemv

        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] == 1 and self.q8:
            from kerneltriage.kernels.q8_gemv import q8_gemv

            self._count_q8()
            y = q8_gemv(rows, self.quant)
        elif rows.shape[0] <= GEMV_ROWS and self.int4 is not None and rows.dtype == COMPUTE:
            self._count_int4()
            y = int4_product_cuda(rows, self.int4)
        elif rows.shape[0] <= GEMV_ROWS:
            y = quant_gemv(rows, self.quant)
        else:
            y = F.linear(rows, dequantized(self.quant, x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class Int4Linear(QuantLinear):
    """The CPU's. A bf16 model holds the blocks repacked for torch's int4 CPU matmul (decode, verify and prompts up to
    INT4_ROWS rows) and dequantizes longer prompts from the checkpoint's mapped blocks. A float32 or fp16 one holds
    the weight dequantized, as stock does: the int4 kernel is scalar code in those dtypes, so the lever gains nothing
    there; it runs for ab's float32 rebuild of a bf16 configuration (stock's values and arithmetic exactly).
    `raws` are stacked by rows: one tensor, or the parts a packed lever joins (`stacked`)."""

    def __init__(self, runner: Runner, raws: Sequence[RawTensor], bias: nn.Parameter | None) -> None:
        nn.Module.__init__(self)
        self.qtype, self.bias, self.dtype = raws[0].qtype, bias, runner.torch_dtype
        self.out_features, self.in_features = sum(raw.shape[0] for raw in raws), raws[0].shape[1]
        self.raws = tuple(raws)  # the file's mapped bytes, as a stock model's checkpoint keeps them
        if runner.torch_dtype == COMPUTE:  # buffers, so that the model's bytes count them
            weight = pack(self.raws)
            self.register_buffer("packed", weight.packed, persistent=False)
            self.register_buffer("scale_zeros", weight.scale_zeros, persistent=False)
        else:
            self.register_buffer("dequantized", self.stock_weight(), persistent=False)  # (N, K)
        self._count = lambda: counting.ran(runner, LEVER)

    @classmethod
    def stacked(cls, runner: Runner, parts: Sequence["Int4Linear"]) -> "Int4Linear":
        """One module computing `parts`' rows in order in one call (packed_qkv, packed_gate_up). The parts give up
        the weights they held, which it now holds once (called alone, a part dequantizes per call)."""
        biases = [part.bias for part in parts]
        bias = None if biases[0] is None else nn.Parameter(torch.cat(biases), requires_grad=False)  # type: ignore[arg-type]
        whole = cls(runner, [raw for part in parts for raw in part.raws], bias)
        for part in parts:
            for name in ("packed", "scale_zeros", "dequantized"):
                part._buffers.pop(name, None)
        return whole

    @staticmethod
    def stackable(parts: Sequence[nn.Module]) -> bool:
        """`parts` are Int4Linears of one block type and width, each with a bias or none with one."""
        return (all(isinstance(part, Int4Linear) for part in parts)
                and len({(part.qtype, part.in_features, part.bias is None) for part in parts}) == 1)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, made at each access: for what reads a projection's weight (an EAGLE head borrows
        the output projection's)."""
        return self.stock_weight()

    def stock_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dequantized weight (N, K) in `dtype` (default: the model's): the values a stock model holds."""
        return torch.cat([dequantize(raw, "cpu", dtype or self.dtype) for raw in self.raws])

    def product(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if "dequantized" in self._buffers:
            y = F.linear(rows, self.dequantized)
        elif "packed" in self._buffers and rows.shape[0] <= INT4_ROWS:
            y = int4_product(rows, Int4Weight(self.packed, self.scale_zeros, (self.out_features, self.in_features)))
        else:
            y = F.linear(rows, self.stock_weight(x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def quantized(runner: Runner, value: str | None = None) -> None:
    """delete: each layer's Q4_0/Q4_1/Q8_0 projections read as their blocks (CUDA: a Triton GEMV; CPU: torch's int4
    CPU matmul for a bf16 model)."""
    triton = runs_triton(runner.device)  # the blocks through the Triton GEMV, else int4 CPU
    if any(name.rpartition(".")[2].startswith("packed_") for name, _ in runner.model.layers.named_modules()):
        raise InputError(f"--levers {LEVER}: the projections are packed already; it goes before packed_qkv and "
                         f"packed_gate_up (the lever table's order), which then stack its blocks")
    for setting in runner.run_config.levers:  # a kernel installed earlier reads its seam's weights at each call
        if setting.name == "kernel" and load_kernel(setting.value or "").seam in READS_PROJECTIONS:
            raise InputError(f"--levers {LEVER}: not with kernel={setting.value}: its seam reads the projections' "
                             "weights, which this lever keeps as blocks")
    tensors = runner.checkpoint.tensors
    kept = _kept(runner.checkpoint, triton)
    if not kept:
        types = sorted({raw.qtype for name, raw in tensors.items() if name.startswith("layers.")})
        raise InputError(f"--levers {LEVER}: {runner.checkpoint.source} has no {', '.join(KINDS)} projection weights "
                         f"(its layers are {', '.join(types) or 'random'}); expected a GGUF quantized to one of them")
    if triton:
        from kerneltriage.kernels.quant_gemv import split_blocks
    for index, suffix in kept:
        parent_name, child = PROJECTIONS[suffix]
        parent = getattr(runner.model.layers[index], parent_name)
        raw, bias = tensors[f"layers.{index}.{suffix}"], getattr(parent, child).bias
        # the dequantized weight goes with the Linear
        setattr(parent, child, QuantLinear(runner, split_blocks(raw, runner.device), bias) if triton
                else Int4Linear(runner, [raw], bias))
    if triton:
        runner.no_compile = LEVER  # (on the CPU, compile traces torch's own ops: the int4 matmul is one of them)
    else:
        _output_projection(runner)


def int4mm(runner: Runner, value: str | None = None) -> None:
    """fast-path: each Q4_0/Q4_1 projection `quantized` keeps as blocks (packed ones included) also repacked for
    CUDA's int4 matmul, which then takes its decode and verify rows. In float32 (ab's exact rebuild of a bf16
    configuration) it leaves the Triton GEMV in place: the int4 matmul computes in bf16 only."""
    modules = [m for m in runner.model.modules() if type(m) is QuantLinear]
    if not modules:
        raise InputError(f"--levers {INT4MM}: no projection is kept as blocks; expected quantized before it on a "
                         "Q4_0/Q4_1 GGUF")
    if runner.torch_dtype != COMPUTE:
        return
    taken = [m for m in modules if cuda_packable(m.qtype, (m.out_features, m.in_features))]
    if not taken:
        raise InputError(f"--levers {INT4MM}: none of the {len(modules)} block projections is Q4_0/Q4_1 with N a "
                         "multiple of 8 and K of 32 (Q8_0 stays on the Triton GEMV)")
    try:
        for module in taken:
            module.int4 = pack_blocks_cuda(module.qtype, module.scales, module.mins, module.quants,
                                           (module.out_features, module.in_features))
        _check_int4(taken[0])
    except RuntimeError as exc:  # this torch build or GPU without the kernel, or another layout: one line, not a crash
        for module in taken:
            module.int4 = None
        raise InputError(f"--levers {INT4MM}: torch's int4 matmul failed here ({str(exc).splitlines()[0][:160]}); "
                         "expected it on an sm_80+ GPU with a torch build that has it") from None


def q8_dot(runner: Runner, value: str | None = None) -> None:
    """kernel: each projection `quantized` keeps as blocks (packed ones included) takes its decode row (M = 1)
    through the integer GEMV of kernels/q8_gemv.py (x rounded to int8 per block, dp4a sums), in every dtype: it
    approximates x, so ab judges it by its declared quality in float32 too."""
    modules = [m for m in runner.model.modules() if type(m) is QuantLinear]
    if not modules:
        raise InputError(f"--levers {Q8DOT}: no projection is kept as blocks; expected quantized before it on a "
                         "Q4_0/Q4_1/Q8_0 GGUF")
    for module in modules:
        module.q8 = True


def _check_int4(module: QuantLinear) -> None:
    """One decode row through the repacked weight against the dequantized weight's product (a layout this torch
    reads otherwise than `int4.pack_blocks_cuda` writes would otherwise only show as wrong tokens)."""
    x = torch.randn(1, module.in_features, device=module.quants.device, dtype=COMPUTE)
    want = F.linear(x.float(), module.stock_weight(torch.float32))
    got = int4_product_cuda(x, module.int4).float()  # type: ignore[arg-type]
    error = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    if not error < 0.05:  # bf16 scales and activations: ~1e-2 at most
        raise RuntimeError(f"a decode row differs from the dequantized product by {error:.2g} of its largest value")


def kept_as_blocks(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> dict[str, RawTensor]:
    """The parameters the lever replaces with the file's blocks on `device`, each with its stored tensor: a build
    with the lever on gives them no memory and no values, so no dequantized copy is made only to be dropped (an 8B
    Q4_0 loads without a 16 GB bf16 copy), and counts their blocks, not their values, when it checks that the model
    fits."""
    triton = runs_triton(device)
    kept = {f"layers.{index}.{'.'.join(PROJECTIONS[suffix])}.weight": checkpoint.tensors[f"layers.{index}.{suffix}"]
            for index, suffix in _kept(checkpoint, triton)}
    head = _head(checkpoint)
    # the CPU's bf16 head too, unless tied: then it is the embedding, which its lookups still read dequantized
    if not triton and dtype == COMPUTE and head is not None and not checkpoint.config.tie_embeddings:
        kept["lm_head.weight"] = head
    return kept


def _kept(checkpoint: Checkpoint, triton: bool) -> list[tuple[int, str]]:
    """(layer, projection) of each projection the lever keeps as blocks."""
    return [(index, suffix) for index in range(checkpoint.config.num_layers) for suffix in PROJECTIONS
            if _takes(checkpoint.tensors.get(f"layers.{index}.{suffix}"), triton)]


def _head(checkpoint: Checkpoint) -> RawTensor | None:
    """The output projection's stored tensor where the CPU keeps it as blocks (a tied one: the embedding's)."""
    tensors, config = checkpoint.tensors, checkpoint.config
    raw = tensors.get("lm_head") or (tensors.get("embed") if config.tie_embeddings else None)
    return raw if raw is not None and _takes(raw, False) else None


def _output_projection(runner: Runner) -> None:
    """CPU: the output projection too (a tied one from the embedding's blocks, which the embedding keeps dequantized
    for its lookups): on the default model it is a fifth of the weights, and a bf16 GEMV of it took longer than all
    the layers' int4 ones."""
    raw = _head(runner.checkpoint)
    if raw is not None and runner.torch_dtype == COMPUTE:
        runner.model.lm_head = Int4Linear(runner, [raw], None)


def _takes(raw: RawTensor | None, triton: bool) -> bool:
    """A projection the lever keeps as blocks: Q4_0/Q4_1/Q8_0 (the int4 packer: an output size a multiple of 16)."""
    return raw is not None and raw.qtype in KINDS and (triton or raw.shape[0] % ROW_MULTIPLE == 0)


def packed(runner: Runner, lever: str, module: nn.Module, names: tuple[str, ...]) -> Callable:
    """packed_qkv / packed_gate_up beside quantized: the parts' blocks stacked by rows into one call (the CPU: one
    int4 matmul, the default model's 5 of 8 calls a layer become 2; CUDA: one Triton GEMV). Parts that cannot stack
    (block types or widths that differ, one kept dequantized) stay apart, each its own call, and the lever does not
    count them."""
    parts = [getattr(module, name) for name in names]
    kind = type(parts[0])
    if not (issubclass(kind, QuantLinear) and kind.stackable(parts)):
        return lambda x: tuple(part(x) for part in parts)
    whole = kind.stacked(runner, parts)
    module.add_module(f"packed_{'_'.join(names)}", whole)
    sizes = [part.out_features for part in parts]

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        counting.ran(runner, lever)
        return tuple(whole(x).split(sizes, dim=-1))

    return forward
