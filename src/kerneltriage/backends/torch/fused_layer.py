"""The `fused_layer` lever on torch: each decoder layer's decode and verify rows (≤ 32, batch 1) through the six
Triton kernels of `kernels/fused_layer.py`; prompts, tree verifies and batches keep the stock layer.

The layer reads its positions from the device (`Positions.ids`), so a graph replay at a new position needs no
recapture, and attends over keys ≤ each row's position: the static cache's window and mask are not read, only
the window's size bounds the grid. q, k and v are stacked once per layer; the originals become views into the
stack (no second copy of the weights). Beside `quantized` the kernels read a layer's Q4_0/Q4_1 blocks in place for
decode rows (verify rows then take the stock layer and its block GEMVs); with `q8_dot` (applied first, the table's
order) against x rounded to int8 words.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.cache import KVCache, StaticKVCache
from kerneltriage.backends.torch.models.llama import MLP, Attention, RMSNorm, Step, TransformerBlock
from kerneltriage.backends.torch.quantized import QuantLinear
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError

LEVER = "fused_layer"
PDL_MAJOR = 9  # programmatic dependent launch: Hopper (sm_90) and newer


def _stack(module: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases) of `names` stacked by rows: the stack they already are views of (packed_qkv's),
    or a new one, each original then made a view into it (no second copy either way)."""
    parts = [getattr(module, name) for name in names]
    weight = _adjacent([p.weight for p in parts])
    bias = _adjacent([p.bias for p in parts]) if parts[0].bias is not None else None
    if weight is not None and (bias is not None or parts[0].bias is None):
        return weight, bias
    weight = torch.cat([p.weight.detach() for p in parts])
    bias = torch.cat([p.bias.detach() for p in parts]) if parts[0].bias is not None else None
    rows = 0
    for part in parts:
        size = part.weight.shape[0]
        part.weight = nn.Parameter(weight[rows:rows + size], requires_grad=False)
        if bias is not None:
            part.bias = nn.Parameter(bias[rows:rows + size], requires_grad=False)
        rows += size
    return weight, bias


def _adjacent(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors as one row-stacked view when each follows the last in one storage, else None."""
    first, rows = tensors[0].detach(), 0
    storage = first.untyped_storage().data_ptr()
    for t in tensors:  # one storage: tensors allocated one after another may also sit end to end
        if (not t.is_contiguous() or t.untyped_storage().data_ptr() != storage
                or t.data_ptr() != first.data_ptr() + rows * first[0].numel() * t.element_size()):
            return None
        rows += t.shape[0]
    return first.as_strided((rows, *first.shape[1:]), first.stride())


def _stack_blocks(runner: Runner, module: nn.Module, names: tuple[str, ...]):  # noqa: ANN202 - QuantWeight, bias
    """The blocks of `names` (QuantLinears) stacked by rows: packed_qkv's stack where it made one, else a new one
    whose rows the parts then view (`QuantLinear.stacked`: nothing held twice)."""
    parts = [getattr(module, name) for name in names]
    packed = getattr(module, f"packed_{'_'.join(names)}", None)
    whole = packed if isinstance(packed, QuantLinear) else QuantLinear.stacked(runner, parts)
    return whole.quant, whole.bias.detach() if whole.bias is not None else None


def _matrix(linear: nn.Module):  # noqa: ANN202 - kernels.fused_layer.Matrix
    return linear.quant if isinstance(linear, QuantLinear) else linear.weight.detach()


def _weights(runner: Runner, block: TransformerBlock):  # noqa: ANN202 - kernels.fused_layer.Weights
    from kerneltriage.kernels.fused_layer import weights

    attn, mlp = block.self_attn, block.mlp
    names = ("q_proj", "k_proj", "v_proj")
    blocks = isinstance(attn.q_proj, QuantLinear)
    qkv, bias = _stack_blocks(runner, attn, names) if blocks else _stack(attn, names)
    q_norm, k_norm = (attn.q_norm.weight.detach(), attn.k_norm.weight.detach()) if _qk_norms(attn) else (None, None)
    return weights(input_norm=block.input_layernorm.weight.detach(), qkv=qkv, qkv_bias=bias,
                   o_proj=_matrix(attn.o_proj), post_norm=block.post_attention_layernorm.weight.detach(),
                   gate=_matrix(mlp.gate_proj), up=_matrix(mlp.up_proj), down=_matrix(mlp.down_proj),
                   eps=block.input_layernorm.eps, q_norm=q_norm, k_norm=k_norm, q8=blocks and attn.q_proj.q8)


def _qk_norms(attn: Attention) -> bool:
    """The layer normalises each q and k head before RoPE: llama's q_norm and k_norm, which its architecture record
    asks for (qwen3's)."""
    return attn.q_norm is not None


def _takes(block: TransformerBlock) -> str | None:
    """Why this layer cannot take the fused kernels, or None."""
    attn = block.self_attn
    norms = {type(attn.q_norm), type(attn.k_norm)}
    # llama's qk_norm over llama's RMSNorm (or none): not Gemma-3's (1 + w) norms and its scaled q
    if type(attn).qk_norm is not Attention.qk_norm or norms not in ({type(None)}, {RMSNorm}):
        return "per-head q/k norms other than qwen3's"
    if type(block.mlp) is not MLP or type(block).forward is not TransformerBlock.forward:
        return "a layer other than llama's"
    if attn.head_dim % 2:
        return f"an odd head_dim {attn.head_dim}"
    if _qk_norms(attn) and attn.head_dim & (attn.head_dim - 1):  # one head per program: tl.arange's power of two
        return f"per-head q/k norms with head_dim {attn.head_dim}, not a power of two"
    if _qk_norms(attn) and not attn.q_norm.eps == attn.k_norm.eps == block.input_layernorm.eps:
        return "per-head q/k norms whose eps differs from the layer norms'"
    projections = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, block.mlp.gate_proj, block.mlp.up_proj,
                   block.mlp.down_proj]
    blocks = [p for p in projections if isinstance(p, QuantLinear)]
    if any(type(p) is not QuantLinear for p in blocks):
        return "blocks repacked for the CPU's int4 matmul (it reads the CUDA layout)"
    if blocks and _qk_norms(attn):
        return "per-head q/k norms beside quantized blocks (their tiles read values only)"
    if any(p.qtype not in ("Q4_0", "Q4_1") for p in blocks):
        return f"{sorted({p.qtype for p in blocks} - {'Q4_0', 'Q4_1'})[0]} blocks (it reads Q4_0 and Q4_1 in place)"
    kinds = [isinstance(p, QuantLinear) for p in projections]
    if len(set(kinds[:3])) > 1 or (isinstance(attn.q_proj, QuantLinear)
                                   and not QuantLinear.stackable(projections[:3])) or kinds[4] != kinds[5] \
            or (kinds[4] and projections[4].qtype != projections[5].qtype):
        return "q, k and v (or gate and up) of different kinds"
    return None


class FusedForward:
    """A layer's forward with its decode and verify rows through the fused kernels (`pdl`: launched with
    programmatic dependent launch, the `pdl` lever)."""

    def __init__(self, runner: Runner, block: TransformerBlock, weights, stock: Callable) -> None:  # noqa: ANN001
        from kerneltriage.kernels.fused_layer import Shape, layer, max_rows

        self.runner, self.weights, self.stock = runner, weights, stock
        self.layer = layer
        attn = block.self_attn
        self.shape = Shape(attn.num_heads, attn.num_kv_heads, attn.head_dim)
        self.pdl = False
        self.max_rows = max_rows(weights)  # one row where the layer reads blocks

    def __call__(self, x: torch.Tensor, index: int, step: Step) -> torch.Tensor:
        batch, rows, _ = x.shape
        cache = step.cache
        # Prompts, batches, tree verifies (their own positions and mask), and whatever torch.compile traces (a
        # compiled prefill): the kernels would break its graph at every layer, and dynamo would then compile this
        # frame per layer index until its recompile limit (on the H200 that made compile_prefill 0.67× of eager).
        if (batch != 1 or rows > self.max_rows or type(cache) not in (KVCache, StaticKVCache)
                or torch.compiler.is_compiling()):
            return self.stock(x, index, step)
        counting.ran(self.runner, LEVER)
        if self.weights.q8:
            counting.ran(self.runner, "q8_dot")
        if self.pdl:
            counting.ran(self.runner, "pdl")
        window = cache.window if isinstance(cache, StaticKVCache) and cache.window is not None else None
        upper = window if window is not None else step.pos.start + rows
        out = self.layer(x[0], self.weights, self.shape, step.cos, step.sin, step.pos.ids, cache.keys[index, 0],
                         cache.values[index, 0], upper, self.pdl)
        return out.unsqueeze(0)


def fused_layer(runner: Runner, value: str | None = None) -> None:
    """kernel: each layer's decode and verify rows as six Triton kernels (norm → QKV (+ bias, → q/k norms) → RoPE →
    cache write; split-KV attention; combine; o_proj → + residual; norm → gate_up → SiLU·mul; down → + residual)."""
    for block in runner.model.layers:
        why = _takes(block)
        if why is not None:
            raise InputError(f"--levers {LEVER}: a {runner.config.arch} model has {why}; expected llama, qwen2 or "
                             "qwen3 layers (with quantized: llama or qwen2 over Q4_0/Q4_1 blocks)")
    for block in runner.model.layers:
        block.forward = FusedForward(runner, block, _weights(runner, block), block.forward)
    runner.no_compile = LEVER


def pdl(runner: Runner, value: str | None = None) -> None:
    """dispatch: fused_layer's kernels launched with programmatic dependent launch — each may start while the one
    before it finishes, requesting its weights, and waits (griddepcontrol.wait) where it reads that one's output."""
    forwards = [block.forward for block in runner.model.layers if isinstance(block.forward, FusedForward)]
    if not forwards:
        raise InputError(f"--levers pdl: launches {LEVER}'s kernels; expected {LEVER} in the same --levers")
    major, minor = torch.cuda.get_device_capability(runner.device)
    if major < PDL_MAJOR:
        raise InputError(f"--levers pdl: programmatic dependent launch needs compute capability {PDL_MAJOR}.0 or "
                         f"newer; {torch.cuda.get_device_name(runner.device)} is {major}.{minor}")
    for forward in forwards:
        forward.pdl = True
