"""The fast-path levers on attention: a pinned SDPA backend, GQA folded for one-token decode, FlexAttention's
decoding kernel, head_dim padding. Each wraps `Model.attention` and passes the `sdpa` callable on, so the ones
inside (fold, pad) call SDPA through the one a pinned backend installs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.accelerate import own_code
from kerneltriage.backends.torch.models.llama import SDPA, SdpaFn
from kerneltriage.backends.torch.runner import Runner

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
FLEX_MAX_ROWS = 16  # query rows per head FlexAttention's decoding kernel is chosen for (Inductor: under 128)
PAD_STEP, PAD_LIMIT = 8, 512  # fused SDPA kernels take head_dims in multiples of 8; no point padding past 512


def _order(backend: str) -> list[Any]:
    from torch.nn.attention import SDPBackend

    first = SDPA_BACKENDS[backend]
    return [getattr(SDPBackend, name) for name in [first] + [n for n in SDPA_BACKENDS.values() if n != first]]


@lru_cache(maxsize=256)
def serves(backend: str, q: tuple[int, ...], k: tuple[int, ...], dtype: str, device: str, mask: bool,
           is_causal: bool, enable_gqa: bool) -> bool:
    """Whether torch's dispatcher, with `backend` first in the priority order, picks `backend` for a call of
    these shapes (probed once per signature on random data of those shapes: the pick depends on metadata)."""
    from torch.nn.attention import sdpa_kernel

    from kerneltriage.backends.torch import gates
    from kerneltriage.engine.probes import SdpaCall

    call = SdpaCall(q, k, dtype, (q[-2], k[-2]) if mask else None, is_causal, enable_gqa)
    with sdpa_kernel(_order(backend), set_priority=True):
        return gates.default_backend(gates.random_inputs(call, torch.device(device))) == backend


def _served_at_trace(ctx: Any) -> None:
    """comptime: the signature from the traced call's fake tensors (their shape hints), then `serves`."""
    def value(name: str) -> Any:
        return ctx.get_local(name).as_python_constant()

    def shape(name: str) -> tuple[int, ...]:
        return tuple(int(getattr(d, "node", d).hint if hasattr(d, "node") else d)
                     for d in ctx.get_local(name).as_fake().shape)

    query = ctx.get_local("query").as_fake()
    mask = not ctx.get_local("attn_mask").is_python_constant()  # None is a constant; a tensor is not
    if serves(value("backend"), shape("query"), shape("key"), str(query.dtype).removeprefix("torch."),
              str(query.device), mask, bool(value("is_causal")), bool(value("enable_gqa"))):
        counting.traced(value("lever"))


def _count_served(runner: Runner, lever: str, backend: str, query: torch.Tensor, key: torch.Tensor,
                  attn_mask: torch.Tensor | None, is_causal: bool, enable_gqa: bool) -> None:
    """Count `lever` when `backend` serves this call; while compiling, decided at trace time from the fakes."""
    if torch.compiler.is_compiling():
        from torch._dynamo.comptime import comptime

        comptime(_served_at_trace)  # reads this frame's locals: no free variables allowed
    elif serves(backend, tuple(query.shape), tuple(key.shape), str(query.dtype).removeprefix("torch."),
                str(query.device), attn_mask is not None, bool(is_causal), bool(enable_gqa)):
        runner.counters[lever] += 1


def sdpa_backend(runner: Runner, backend: str) -> None:
    """fast-path: try one scaled_dot_product_attention backend first (flash, efficient, cudnn or math); the others
    stay behind it as fallbacks, so a call the chosen backend refuses still runs. Only the calls the chosen
    backend actually serves are counted: pinning one that never serves a call here makes the A/B invalid."""
    from torch.nn.attention import sdpa_kernel

    order, inner = _order(backend), runner.model.attention

    def pinned(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False, sdpa: SdpaFn = SDPA) -> torch.Tensor:
        _count_served(runner, f"sdpa_backend={backend}", backend, query, key, attn_mask, is_causal, enable_gqa)
        with sdpa_kernel(order, set_priority=True):
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any, sdpa: SdpaFn = SDPA) -> torch.Tensor:
        return inner(q, k, v, pos, sdpa=lambda *args, **kwargs: pinned(*args, **kwargs, sdpa=sdpa))

    runner.model.attention = attention


def sdpa_fold(runner: Runner) -> None:
    """fast-path: a one-token decode over grouped KV heads (H query heads, Hkv < H) as plain attention of G = H/Hkv
    queries per KV head — no backend then needs GQA support, and K/V are not expanded. Masked calls (static
    caches) are folded by the model already; prefill keeps `is_causal` (a folded prompt would need a mask)."""
    inner = runner.model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any, sdpa: SdpaFn = SDPA) -> torch.Tensor:
        batch, heads, length, dim = q.shape
        if length != 1 or pos.mask is not None or heads == k.shape[1]:
            return inner(q, k, v, pos, sdpa=sdpa)
        counting.ran(runner, "sdpa_fold")
        folded = q.reshape(batch, k.shape[1], heads // k.shape[1], dim)  # query head j*G+i → KV head j, row i
        return sdpa(folded, k, v).reshape(batch, heads, 1, dim)

    runner.model.attention = attention


def flex_decode(runner: Runner) -> None:
    """fast-path: decode attention (one query row per head; a verify's few under a static cache) through compiled
    FlexAttention, whose decoding kernel splits the keys across the SMs (flash-decoding). Masked SDPA at batch 1
    runs one block per KV head, each scanning the whole window alone: on an H200 the default model's best set
    spends ~0.9 ms per token per 512 positions of context there. Prompts keep SDPA (but a one-token prompt,
    which is a decode step's shape). CUDA only (the lever table says so): Inductor's CPU FlexAttention template
    (torch 2.13) returns wrong rows at some key lengths and ignores a view's storage offset."""
    from torch.nn.attention.flex_attention import flex_attention

    # compiled for eager callers (graphs alone); a compiled step inlines it into its own graph
    runner.model.attention = flex_decoding(runner, torch.compile(own_code(flex_attention), fullgraph=True))


def flex_decoding(runner: Runner, flex: Callable) -> Callable:
    """The attention function of `flex_decode` around `flex` (FlexAttention, compiled or not). A static cache's
    mask becomes a score_mod that reads the live positions, so a captured graph stays right as they move."""
    inner = runner.model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any, sdpa: SdpaFn = SDPA) -> torch.Tensor:
        if q.shape[2] > (1 if pos.mask is None else FLEX_MAX_ROWS):
            return inner(q, k, v, pos, sdpa=sdpa)
        counting.ran(runner, "flex_decode")
        if pos.mask is None:  # one new token over exactly the keys so far
            return flex(q, k, v, enable_gqa=True)
        ids = pos.ids  # (T,) positions of the new rows: row i sees keys ≤ ids[i]

        def visible(score: torch.Tensor, b, h, row, key) -> torch.Tensor:  # noqa: ANN001
            return torch.where(key <= ids[row], score, -float("inf"))

        return flex(q, k, v, score_mod=visible, enable_gqa=True)

    return attention


def padded_attention(inner: Callable, size: int) -> Callable:
    """`inner` attention on q, k, v zero-padded from head_dim D to `size`, the output sliced back to D.
    Zero dims add nothing to q·k nor to the output; q is scaled by √(size/D) so that SDPA's default
    1/√size scale applies 1/√D, the model's own."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any, sdpa: SdpaFn = SDPA) -> torch.Tensor:
        extra, dim = size - q.shape[-1], q.shape[-1]
        out = inner(F.pad(q * (size / dim) ** 0.5, (0, extra)), F.pad(k, (0, extra)), F.pad(v, (0, extra)), pos,
                    sdpa=sdpa)
        return out[..., :dim]

    return attention


def fused_head_dim(dim: int, dtype: torch.dtype, device: torch.device) -> int:
    """The smallest head_dim ≥ `dim` (a multiple of 8, ≤ 512) that a fused CUDA SDPA backend takes for a plain
    call of this dtype; `dim` itself when one takes it, or on the CPU (its flash kernel takes any size), or when
    none takes any size up to the limit."""
    if device.type != "cuda":
        return dim
    from kerneltriage.backends.torch import gates
    from kerneltriage.engine.probes import SdpaCall

    for size in [dim] + list(range(-(-dim // PAD_STEP) * PAD_STEP, PAD_LIMIT + 1, PAD_STEP)):
        call = SdpaCall((1, 8, 16, size), (1, 8, 16, size), str(dtype).removeprefix("torch."), None, True, False)
        inputs = gates.random_inputs(call, device)
        if any(gates.probe(probe_name, inputs)[0] for _, _, probe_name in gates.FUSED):
            return size
    return dim


def sdpa_pad(runner: Runner, size: int | None = None) -> None:
    """fast-path: when no fused SDPA backend takes the model's head_dim (only math would run), zero-pad it to
    the nearest size one does (e.g. 100 → 104). Counts only the calls it padded: on a model whose head_dim a
    fused backend already takes, it never runs, and `ab` says so. `size` forces a size (tests)."""
    dim = runner.config.head_dim
    size = size or fused_head_dim(dim, runner.torch_dtype, runner.device)
    if size == dim:
        return
    padded = padded_attention(runner.model.attention, size)

    def attention(*args: Any, **kwargs: Any) -> torch.Tensor:
        counting.ran(runner, "sdpa_pad")
        return padded(*args, **kwargs)

    runner.model.attention = attention
