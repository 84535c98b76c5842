"""Torch implementations of the levers named in `engine/levers.py`, each applied to a Runner from outside.

Every replacement counts its own executions in `runner.counters[lever]`: a lever whose counter stays at
zero did not run, whatever the timings say. Levers inside the model count through `_ran`, which under
torch.compile counts through the compiled step they were traced into (see there).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.backends.torch.models.llama import Attention, Model, RMSNorm
from kerneltriage.backends.torch.runner import Runner, StepFn, decode_one, verify_rows
from kerneltriage.backends.torch.sampling import sample
from kerneltriage.core.errors import InputError
from kerneltriage.engine.sampling import SamplingParams

GRAPH_WINDOW = 256  # captured decode graphs attend over a multiple of this many cache slots
GRAPH_WARMUPS = 2  # eager runs before capture (lazy inits must not land in the graph)


def last_logits(runner: Runner) -> None:
    """delete: the prefill's output projection for the last prompt position only."""

    def prefill(model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        runner.counters["last_logits"] += 1
        return model.logits(model.hidden(tokens, start)[:, -1])  # (1, hidden) → (1, V)

    runner.prefill = prefill


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # (1, T) input slot
    logits: torch.Tensor  # output slot: (1, V) for a decode step, (T, V) for a verify


class GraphedStep:
    """A step (decode, or a speculative verify of T rows) replayed from CUDA graphs: one graph per
    (attention window, T), the window a multiple of `window_step`, captured on first use; recaptured when the
    cache is reallocated.

    `step` is the function captured: the stock one, or a compiled one (then one window: the whole cache,
    since every new window would be a new compilation)."""

    def __init__(self, runner: Runner, step: StepFn, window_step: int | None) -> None:
        self.runner, self.step, self.window_step = runner, step, window_step
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.cache: StaticKVCache | None = None

    def __call__(self, model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        cache, rows = model.cache, tokens.shape[1]
        if cache is not self.cache:
            self.graphs.clear()
            self.cache = cache
        step = self.window_step or cache.max_len
        window = min(cache.max_len, -(-(start + rows) // step) * step)
        entry = self.graphs.get((window, rows)) or self._capture(model, cache, window, tokens, start)
        entry.tokens.copy_(tokens)
        cache.position.fill_(start)
        entry.graph.replay()
        cache.length = start + rows
        self.runner.counters["graphs"] += 1
        return entry.logits

    def _capture(self, model: Model, cache: StaticKVCache, window: int, tokens: torch.Tensor, start: int) -> _Graph:
        # Warm-up and capture write slots start… with these very tokens, exactly what the replay writes next.
        slot = tokens.clone()
        cache.position.fill_(start)
        cache.window = window
        try:
            with _capturable_attention():
                graph, logits = capture(lambda: self.step(model, slot, start), GRAPH_WARMUPS)
        finally:
            cache.window = None
        self.graphs[window, slot.shape[1]] = _Graph(graph, slot, logits)
        return self.graphs[window, slot.shape[1]]


def _capturable_attention():  # noqa: ANN202 - a context manager
    """SDPA backends that survive stream capture. cuDNN attention broke capture of the default model's masked
    bf16 decode on an H200 (cudaErrorStreamCaptureInvalidated), so it is left out while capturing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def graphs(runner: Runner) -> None:
    """dispatch: the decode step (and a speculative verify) captured in CUDA graphs (static cache, one graph
    per window bucket and row count)."""
    if runner.device.type != "cuda":
        raise InputError(f"--levers graphs: needs a CUDA device, not {runner.device}")
    runner.cache_type = StaticKVCache
    window = None if isinstance(runner.decode, CompiledStep) else GRAPH_WINDOW
    runner.decode = GraphedStep(runner, runner.decode, window)
    runner.verify = GraphedStep(runner, runner.verify, window)


class CompiledStep:
    """A step through torch.compile (Inductor fuses the elementwise ops and generates its own GEMVs).

    Positions are dynamic after the second step (ints are specialised once, then made symbolic), so one
    compilation serves the eager token loop; under `graphs` it is compiled once in the static layout.
    Compilation is lazy: a verify that never runs is never compiled."""

    def __init__(self, runner: Runner, step: StepFn, mode: str) -> None:
        self.runner, self.mode = runner, mode
        self.compiled = torch.compile(_own_code(step), mode=None if mode == "default" else mode, fullgraph=True)
        self.inside: set[str] = set()  # levers traced into this step (see `_ran`): each call runs them

    def __call__(self, model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        self.runner.counters[f"compile={self.mode}"] += 1
        _TRACING.append(self)  # a compilation happens inside this call
        try:
            logits = self.compiled(model, tokens, start)
        finally:
            _TRACING.pop()
        for lever in self.inside:
            self.runner.counters[lever] += 1
        return logits


_TRACING: list[CompiledStep] = []  # the compiled step being called, whose tracing `_ran` reports to


def _traced(lever: str) -> None:
    if _TRACING:
        _TRACING[-1].inside.add(lever)


def _own_code(step: StepFn) -> StepFn:
    """`step` with a code object of its own. Dynamo keeps compiled code, and counts recompilations (8 at most,
    then a hard failure under fullgraph), per code object: runners compiling the shared `decode_one` would each
    add entries to one cache while they live (a benchmark builds several per process). A copy per runner keeps
    one cache per runner, freed with it."""
    code = step.__code__.replace()  # an equal but distinct code object
    copy = types.FunctionType(code, step.__globals__, step.__name__, step.__defaults__, step.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = step.__kwdefaults__, step.__qualname__
    return copy


def compile_steps(runner: Runner, mode: str) -> None:
    """dispatch: torch.compile of the decode step and the verify forward (apply before `graphs`, which then
    captures them)."""
    runner.decode = CompiledStep(runner, decode_one, mode)
    runner.verify = CompiledStep(runner, verify_rows, mode)


def one_sync(runner: Runner) -> None:
    """dispatch: one host readback per token, and the next step queued before the previous token is read."""

    def loop(runner: Runner, logits: torch.Tensor, start: int, count: int, params: SamplingParams,
             generator: torch.Generator | None) -> Iterator[int]:
        cuda = runner.device.type == "cuda"
        host = torch.empty(1, dtype=torch.long, pin_memory=cuda)
        token = sample(logits, params, generator)  # (1,)
        for position in range(start, start + count):
            runner.counters["one_sync"] += 1
            host.copy_(token, non_blocking=cuda)
            ready = torch.cuda.Event() if cuda else None
            if ready is not None:
                ready.record()
            if position + 1 < start + count:  # queue step i+1 before waiting for token i
                logits = runner.decode(runner.model, token.view(1, 1), position)
                token = sample(logits, params, generator)
            if ready is not None:
                ready.synchronize()  # waits for the copy only, not for the step queued after it
            yield int(host[0])

    runner.decode_loop = loop


def _ran(runner: Runner, lever: str) -> None:
    """Count one execution of a lever that runs inside the model, hence maybe inside a compiled step. While
    torch.compile traces, the count is not traced (Dynamo would guard on the counter's value and recompile the step
    whenever it moved: with fullgraph, a hard failure after 8): the lever is reported once, at trace time, to the
    compiled step being called, which then counts it at each of its calls."""
    if torch.compiler.is_compiling():
        from torch._dynamo.comptime import comptime  # runs its function at trace time (not imported eagerly: 1.7 s)

        comptime(lambda ctx: _traced(ctx.get_local("lever").as_python_constant()))  # no free variables allowed
    else:
        runner.counters[lever] += 1


def _packed(runner: Runner, lever: str, module: nn.Module, names: tuple[str, ...]) -> Callable:
    """One Linear holding the weights of `names` stacked by rows; the originals become views into it."""
    parts = [getattr(module, name) for name in names]
    bias = parts[0].bias is not None
    packed = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=bias,
                       device=runner.device, dtype=parts[0].weight.dtype).requires_grad_(False)
    sizes = [p.out_features for p in parts]
    with torch.no_grad():
        packed.weight.copy_(torch.cat([p.weight for p in parts]))
        if bias:
            packed.bias.copy_(torch.cat([p.bias for p in parts]))
    for part, weight in zip(parts, packed.weight.split(sizes)):
        part.weight = nn.Parameter(weight, requires_grad=False)  # share storage: no second copy
    module.add_module(f"packed_{'_'.join(names)}", packed)

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _ran(runner, lever)
        return tuple(packed(x).split(sizes, dim=-1))

    return forward


def packed_qkv(runner: Runner) -> None:
    """dispatch: q, k and v from one matmul instead of three."""
    for layer in runner.model.layers:
        attn: Attention = layer.self_attn
        attn.qkv = _packed(runner, "packed_qkv", attn, ("q_proj", "k_proj", "v_proj"))


def packed_gate_up(runner: Runner) -> None:
    """dispatch: gate and up from one matmul instead of two."""
    for layer in runner.model.layers:
        layer.mlp.gate_up = _packed(runner, "packed_gate_up", layer.mlp, ("gate_proj", "up_proj"))


def fused_norm(runner: Runner) -> None:
    """fast-path: each RMSNorm as one `F.rms_norm` call with its weight (torch's fused kernel) instead of
    cast up + normalise + cast down + weight multiply: 3 fewer kernels per norm, 2 norms per layer.
    Numerics: bf16 rounds once (after the weight) instead of twice, so it is judged by ab's logit tolerance."""
    for module in runner.model.modules():
        if isinstance(module, RMSNorm):
            module.forward = functools.partial(_fused_rms_norm, runner, module)


def _fused_rms_norm(runner: Runner, module: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    _ran(runner, "fused_norm")
    return F.rms_norm(x, (x.shape[-1],), module.weight, module.eps)


def sdpa_backend(runner: Runner, backend: str) -> None:
    """fast-path: try one scaled_dot_product_attention backend first (flash, efficient, cudnn or math).

    The others stay behind it as fallbacks, so a call the chosen backend refuses (e.g. a GQA prefill that
    efficient attention does not take) still runs; triage reports which backend each call really got.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    first = getattr(SDPBackend, SDPA_BACKENDS[backend])
    order = [first] + [getattr(SDPBackend, name) for name in SDPA_BACKENDS.values() if name != SDPA_BACKENDS[backend]]
    inner = runner.model.attention

    def attention(*args: torch.Tensor) -> torch.Tensor:
        _ran(runner, f"sdpa_backend={backend}")
        with sdpa_kernel(order, set_priority=True):
            return inner(*args)

    runner.model.attention = attention


def sdpa_fold(runner: Runner) -> None:
    """fast-path: a one-token decode over grouped KV heads (H query heads, Hkv < H) as plain attention of G = H/Hkv
    queries per KV head — no backend then needs GQA support, and K/V are not expanded. Masked calls (static
    caches) are folded by the model already; prefill keeps `is_causal` (a folded prompt would need a mask)."""
    inner = runner.model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos) -> torch.Tensor:  # noqa: ANN001
        batch, heads, length, dim = q.shape
        if length != 1 or pos.mask is not None or heads == k.shape[1]:
            return inner(q, k, v, pos)
        _ran(runner, "sdpa_fold")
        folded = q.reshape(batch, k.shape[1], heads // k.shape[1], dim)  # query head j*G+i → KV head j, row i
        return F.scaled_dot_product_attention(folded, k, v).reshape(batch, heads, 1, dim)

    runner.model.attention = attention


FLEX_MAX_ROWS = 16  # query rows per head FlexAttention's decoding kernel is chosen for (Inductor: under 128)


def flex_decode(runner: Runner) -> None:
    """fast-path: decode attention (one query row per head; a verify's few under a static cache) through compiled
    FlexAttention, whose decoding kernel splits the keys across the SMs (flash-decoding). Masked SDPA at batch 1
    runs one block per KV head, each scanning the whole window alone: on an H200 the default model's best set
    spends ~0.9 ms per token per 512 positions of context there. Prompts keep SDPA (but a one-token prompt,
    which is a decode step's shape). CUDA only: Inductor's CPU
    FlexAttention template (torch 2.13) returns wrong rows at some key lengths (8, 24, 40, … under dynamic shapes)
    and ignores a view's storage offset (every layer of the cache would read layer 0)."""
    if runner.device.type != "cuda":
        raise InputError(f"--levers flex_decode: needs a CUDA device, not {runner.device} (Inductor's CPU "
                         "FlexAttention kernel is not exact)")
    from torch.nn.attention.flex_attention import flex_attention

    # compiled for eager callers (graphs alone); a compiled step inlines it into its own graph
    runner.model.attention = flex_decoding(runner, torch.compile(_own_code(flex_attention), fullgraph=True))


def flex_decoding(runner: Runner, flex: Callable) -> Callable:
    """The attention function of `flex_decode` around `flex` (FlexAttention, compiled or not). A static cache's
    mask becomes a score_mod that reads the live positions, so a captured graph stays right as they move."""
    inner = runner.model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos) -> torch.Tensor:  # noqa: ANN001
        if q.shape[2] > (1 if pos.mask is None else FLEX_MAX_ROWS):
            return inner(q, k, v, pos)
        _ran(runner, "flex_decode")
        if pos.mask is None:  # one new token over exactly the keys so far
            return flex(q, k, v, enable_gqa=True)
        ids = pos.ids  # (T,) positions of the new rows: row i sees keys ≤ ids[i]

        def visible(score: torch.Tensor, b, h, row, key) -> torch.Tensor:  # noqa: ANN001
            return torch.where(key <= ids[row], score, -float("inf"))

        return flex(q, k, v, score_mod=visible, enable_gqa=True)

    return attention


PAD_STEP, PAD_LIMIT = 8, 512  # fused SDPA kernels take head_dims in multiples of 8; no point padding past 512


def padded_attention(inner: Callable, size: int) -> Callable:
    """`inner` attention on q, k, v zero-padded from head_dim D to `size`, the output sliced back to D.
    Zero dims add nothing to q·k nor to the output; q is scaled by √(size/D) so that SDPA's default
    1/√size scale applies 1/√D, the model's own."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos) -> torch.Tensor:  # noqa: ANN001
        extra, dim = size - q.shape[-1], q.shape[-1]
        out = inner(F.pad(q * (size / dim) ** 0.5, (0, extra)), F.pad(k, (0, extra)), F.pad(v, (0, extra)), pos)
        return out[..., :dim]

    return attention


def fused_head_dim(dim: int, dtype: torch.dtype, device: torch.device) -> int:
    """The smallest head_dim ≥ `dim` (a multiple of 8, ≤ 512) that a fused CUDA SDPA backend takes for a plain
    call of this dtype; `dim` itself when one takes it, or on the CPU (its flash kernel takes any size), or when
    none takes any size up to the limit."""
    if device.type != "cuda":
        return dim
    from kerneltriage.backends.torch import gates

    for size in [dim] + list(range(-(-dim // PAD_STEP) * PAD_STEP, PAD_LIMIT + 1, PAD_STEP)):
        call = gates.SdpaCall((1, 8, 16, size), (1, 8, 16, size), str(dtype).removeprefix("torch."), None, True, False)
        inputs = gates.random_inputs(call, device)
        if any(gates.probe(probe_name, inputs)[0] for _, _, probe_name in gates.FUSED):
            return size
    return dim


def sdpa_pad(runner: Runner) -> None:
    """fast-path: when no fused SDPA backend takes the model's head_dim (only math would run), zero-pad it to
    the nearest size one does (e.g. 100 → 104). Counts only the calls it padded: on a model whose head_dim a
    fused backend already takes, it never runs, and `ab` says so."""
    dim = runner.config.head_dim
    size = fused_head_dim(dim, runner.dtype, runner.device)
    if size == dim:
        return
    padded = padded_attention(runner.model.attention, size)

    def attention(*args: torch.Tensor) -> torch.Tensor:
        _ran(runner, "sdpa_pad")
        return padded(*args)

    runner.model.attention = attention


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# Canonical order: model changes first (sdpa_fold innermost, so sdpa_pad pads what it folds), then compile, then
# graphs (which captures what came before).
APPLY: dict[str, Callable[[Runner], None]] = {
    "packed_qkv": packed_qkv, "packed_gate_up": packed_gate_up, "fused_norm": fused_norm,
    "sdpa_fold": sdpa_fold, "sdpa_pad": sdpa_pad, "flex_decode": flex_decode,
    **{f"sdpa_backend={name}": functools.partial(sdpa_backend, backend=name) for name in SDPA_BACKENDS},
    **{f"compile={mode}": functools.partial(compile_steps, mode=mode) for mode in COMPILE_MODES},
    "graphs": graphs, "one_sync": one_sync, "last_logits": last_logits,
}


def apply_levers(runner: Runner, names: tuple[str, ...]) -> Runner:
    """Apply the named levers in their canonical order (compile before graphs captures it), whatever order
    they were named in; the runner remembers which are on."""
    for name in sorted(names, key=lambda lever: list(APPLY).index(lever)):
        APPLY[name](runner)
    runner.levers = runner.levers + names
    return runner
