"""The backend protocol: what `bench/` and `triage/` may ask of an engine, whatever framework runs it.

A backend (torch, mlx) builds runners from a checkpoint and a `RunConfig`, and answers triage's
probes with plain records (`engine/probes.py`). A runner holds one model with its levers and cache, and
exposes tokens in and out, a synchronized clock and logits on the host. The decode loops
(`engine/decoding.py`) and speculative decoding (`engine/speculative/`) are written against `Steps`, the part
of a runner the token loop needs; device arrays (logits, tokens) pass through them as opaque handles.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence, TypeAlias, TypeVar

from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend_names import BACKENDS as BACKENDS  # re-exported: callers name backends from here

if TYPE_CHECKING:
    import numpy as np

    from kerneltriage.engine.checkpoint import Checkpoint
    from kerneltriage.engine.config import ModelConfig
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.levers import Place
    from kerneltriage.engine.probes import (GateRow, KernelCheck, KernelTiming, PhaseProfile, SdpaCall, Sparsity,
                                            SweepCurve)
    from kerneltriage.engine.sampling import LogitsProcessor, SamplingParams
    from kerneltriage.engine.speculative.config import Speculation
    from kerneltriage.engine.speculative.stats import SpecStats
    from kerneltriage.engine.speculative.tree import TokenTree

Array = Any  # a backend's device array (torch.Tensor, mx.array): opaque to the engine


class Pending(Protocol):
    """A token id on its way to the host (a non-blocking copy, or an async evaluation)."""

    def result(self) -> int:
        """Wait for it and return it."""


class Queued(Protocol):
    """A resident step's outcome on its way to the host."""

    def result(self) -> tuple[list[int], int, int]:
        """Wait for it: (the tokens it emitted, the length of the match its draft came from, the rows it computed:
        1 for a plain step, 0 — and no tokens — for one queued past the run's end)."""


class Sampler(Protocol):
    """Sampling with the logits processors `(tokens, logits) → logits` of one generation; it keeps the token
    history on the device (prompt, then every token it emitted), so no host sync is needed to sample."""

    prompt: list[int]  # the host tokens the generation started from
    params: "SamplingParams"

    @property
    def argmax_only(self) -> bool:
        """Sampling is the argmax of the raw logits (greedy, no logits processors): what a resident step accepts."""

    @property
    def host_bound(self) -> bool:
        """A processor keeps its state on the host (a constraint): it must be told each token (`follow`)."""

    def __call__(self, logits: Array) -> Array:
        """The next token (a device array) from logits (1, V); the token joins the history."""

    def follow(self, token: int) -> None:
        """A token this sampler's `__call__` emitted, read on the host: the host-side processors commit it (and compute
        the next step's mask). The loops call it once per such token; `accept` follows what it emits itself."""

    def rows(self, limit: int) -> Any:
        """The token ids a constraint allows next when there are at most `limit` (host ints), else None."""

    def accept(self, logits: Array, draft: Any) -> list[int]:
        """Speculative acceptance over verify logits (k+1, V) of `draft` (backend's draft record): the tokens
        to emit, exact for this sampler's distribution; they join the history. One host sync."""


class TreeSampler(Sampler, Protocol):
    """A sampler that accepts a token tree's verify (torch's; a tree draft is refused where there is none)."""

    def accept_tree(self, logits: Array, tree: "TokenTree") -> tuple[list[int], list[int]]:
        """Greedy acceptance over a tree verify's logits (N+1, V): the tokens to emit and the accepted nodes'
        path; they join the history."""


class Steps(Protocol):
    """What a token loop needs from a runner."""

    counters: Counter
    compact_limit: int  # the most allowed rows a decode step computes alone (`vocab_compact`); 0: never

    def decode(self, token: int | Array, position: int, rows: Sequence[int] | None = None) -> Array:
        """One decode step of a token (a host id or a device array (1,)) at `position`: logits (1, V). With `rows`
        (at most `compact_limit` ids a constraint allows), only those rows' logits are computed, the others -inf."""

    def verify(self, last: int, drafts: Sequence[int] | Array, start: int, rows: int) -> Array:
        """One forward over [last, drafts…] at positions start…: logits (k+1, V) of the real rows; padded to
        `rows` rows when that is larger (a fixed-shape verify: the padded rows are computed and dropped)."""

    def prepare_steps(self, start: int, end: int, rows: Sequence[int], lookback: int = 0) -> None:
        """Before a run from position `start` to `end`: capture now whatever fixed-shape steps it may replay (plain
        steps, verifies of each of `rows`, and with `lookback` resident steps, drafting from matches of up to
        `lookback` tokens, instead of the verifies), so that no capture lands inside the run; nothing where none are
        captured."""

    def begin_resident(self, context: list[int], lookback: int) -> None:
        """Where `resident`: the device's copy of the text ← `context`; resident drafts match up to `lookback`
        tokens."""

    def queue_step(self, reach: int, limits: tuple[int, int, int]) -> Queued:
        """Where `resident`: queue a step that drafts from the device's text and chooses there a plain step or a
        verify within `limits` = (widest, least, end): of the padded shapes the widest-th at most (0: plain steps
        only), from a match of `least` tokens, and nothing once the text has `end` tokens (resident.device_choice
        has the rule); it runs the step and accepts greedily, appending what it emits; its writes end before
        position `reach`. Nothing waits for the host between two of them."""

    def queue(self, logits: Array) -> Array:
        """Start the device on a step's work now, before the host waits on something else: `logits` itself. (MLX
        builds a step lazily for the sampler to queue with its token; a torch step is queued as it is built.)"""

    def read_later(self, token: Array) -> Pending:
        """Start copying a device token to the host without waiting for it."""

    def trim_cache(self, length: int) -> None:
        """Forget cache positions from `length` on."""

    def clock(self) -> float:
        """Seconds, after all queued device work has finished."""

    @property
    def cache_capacity(self) -> int:
        """Positions the current cache holds."""

    @property
    def pads_verify(self) -> bool:
        """True when steps are captured at fixed shapes: every verify then has the deepest step's rows."""

    @property
    def resident(self) -> bool:
        """True when speculative steps can run resident on the device (`queue_step`)."""


class TreeSteps(Steps, Protocol):
    """Steps that verify a token tree in one forward (torch's runner; MLX refuses tree drafts at install)."""

    def verify_tree(self, last: int, tree: "TokenTree", start: int) -> Array:
        """One forward over [last, tree nodes…] at `start` under the tree mask: logits (N+1, V), row r the
        prediction after node r's path."""

    def keep_branch(self, start: int, path: list[int]) -> None:
        """After a tree verify at `start`: keep the root and the accepted nodes `path` in order, drop the rest."""


class Speculating(Protocol):
    """Speculative decoding installed as a runner's token loop (engine/speculative/decoder.py: SpeculativeDecoder),
    as bench, triage and the commands read it."""

    speculation: "Speculation"
    stats: "SpecStats"  # the last generation's
    total: "SpecStats"  # every generation's since `reset_total`

    def reset_total(self) -> None: ...

    def deepest(self, runner: Steps) -> int:
        """The deepest k a run on `runner` drafts."""

    def shapes(self, runner: Steps) -> list[int]:
        """The rows of each padded verify shape a run on `runner` may compute ([] where verifies are not padded)."""


class Runner(Steps, Protocol):
    """One model, its levers and cache: what bench, ab and triage use."""

    checkpoint: "Checkpoint"
    run_config: "RunConfig"
    backend: str
    speculation: "Speculating | None"
    approximations: list[str]  # the declared quality metrics of the custom kernels it runs that approximate

    @property
    def device(self) -> object:
        """The backend's own device (torch.device("cuda:0"); MLX: "gpu", "cpu"): `str()` names it, and a backend's
        methods that take a device name take it too."""

    @property
    def device_type(self) -> str:
        """"cuda", "cpu", "metal"."""

    @property
    def dtype(self) -> str:
        """"bfloat16", "float32"."""

    @property
    def dtype_bytes(self) -> int: ...

    @property
    def gpu_index(self) -> int | None:
        """The GPU whose clocks and temperature snapshots read (None: no GPU)."""

    @property
    def config(self) -> "ModelConfig": ...

    @property
    def place(self) -> "Place":
        """Where levers would run: the backend, device type, architecture and the model's named seams."""

    def reset_cache(self, needed: int) -> None:
        """A cache with room for `needed` positions, emptied; reused when big enough."""

    def drop_cache(self) -> None:
        """Free the cache (the next reset allocates exactly what it needs)."""

    def use_loop(self, loop: Any | None = None, slack: int = 0) -> None:
        """Decode through `loop` (None: keep the current one), with at least `slack` cache slots past the last
        position: how one_sync and speculation change a runner's token loop (engine/runner_base.py)."""

    def prefill(self, tokens: Sequence[int], start: int) -> Array:
        """Prefill host tokens at positions start…: logits (1, V) of the last position."""

    def sampler(self, params: "SamplingParams", prompt: Sequence[int],
                processors: Sequence["LogitsProcessor"] = ()) -> Sampler:
        """A sampler for one generation after `prompt`, applying `processors` in order, then the workload's
        constraint where its checkpoint has one (a fresh matcher each call), then the repetition penalty."""

    def loop(self, logits: Array, start: int, count: int, sampler: Sampler) -> Iterator[int]:
        """The token loop (stock, pipelined or speculative, as the levers chose): `count` host token ids."""

    def greedy(self, logits: Array) -> int:
        """The argmax token of logits (1, V), read on the host."""

    def synchronize(self) -> None:
        """Wait for all queued device work."""

    def forced_logits(self, prompt: Sequence[int], fed: Sequence[int] | None, count: int
                      ) -> tuple["np.ndarray", list[int]]:
        """Float32 logits (count, V) on the host after the prompt and after each token fed (None: its own greedy
        tokens), through the runner's own steps (a speculating runner through its verify); and the tokens fed."""

    def reset_peak_memory(self) -> None: ...

    def peak_memory(self) -> int:
        """Peak device bytes since the last reset (CPU: the process's peak resident set)."""

    def held_bytes(self) -> int:
        """Bytes the runner holds: weights and cache."""

    def named_weights(self) -> dict[str, Array]:
        """The model's weights as device arrays by parameter path, which is each one's HF name without `model.`
        (engine/names.param_name; a tied head under both names): what a peer built on the same weights copies."""


R = TypeVar("R", bound=Runner)


class BackendOf(Protocol[R]):
    """Builds runners of its own kind (`R`: a class that implements `Runner`) and answers triage's probes on them.
    Each backend module declares its `BACKEND` as `BackendOf[its Runner]`, so the type checker holds both the backend
    and its runner to these protocols (pyproject.toml: [tool.mypy])."""

    name: str
    trainer: str | None  # the module of train/ that trains drafters on its runners (train.Trainer), if any

    def resolve_device(self, name: str) -> str: ...

    def resolve_dtype(self, name: str | None, device: str) -> str: ...

    def build(self, checkpoint: "Checkpoint", config: "RunConfig", device: str, dtype: str) -> R:
        """Load the weights on the device and apply the configuration (levers, then speculation)."""

    def copy(self, runner: R, config: "RunConfig") -> R:
        """A runner on a stock copy of `runner`'s weights (made on its device, no reload), configured anew."""

    def float32_reference(self, runner: R, config: "RunConfig | None" = None) -> R:
        """The weights `runner` holds, upcast exactly to float32 (only the arithmetic differs), with stock steps, or
        with `config` applied (the same levers in float32: what a lever computes, free of rounding)."""

    def release(self, runner: R) -> None:
        """Free what the runner holds now (a large copy must not outlive its A/B)."""

    def seam_errors(self, runner: R) -> dict[str, tuple[float, float]]:
        """Per-op check at the model's real shapes: for each seam the runner's levers replace, (its error, stock's
        error) against a float32 stock op on the same random inputs."""

    def ceilings(self, device: str, dtype: str, refresh: bool = False) -> Any: ...

    def ceilings_key(self, device: str, dtype: str) -> str:
        """What this backend's cached ceilings for (device, dtype) are valid for: their key in the cache."""

    def profile(self, runner: R, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int
                ) -> "PhaseProfile":
        """One profiled window of prefill (`tokens` the prompt) or decode (`tokens` steps)."""

    def host_issue_seconds(self, runner: R, prefix: Sequence[int], steps: int) -> float | None: ...

    def census(self, runner: R, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int
               ) -> dict[str, Any]:
        """Per token (decode) or per prefill: ops, host readbacks with their call sites, casts, strided copies,
        ops left on the CPU."""

    def attention_gates(self, phase: str, call: "SdpaCall", calls_per_pass: float, device: str) -> "GateRow": ...

    def sweep_projections(self, runner: R, rows: tuple[int, ...] | None) -> list["SweepCurve"]: ...

    def attention_sparsity(self, runner: R) -> "Sparsity": ...

    def kernel_check(self, runner: R, ref: str, rows: Sequence[int], depths: Sequence[int]
                     ) -> list["KernelCheck"]:
        """The custom kernel `ref` against the stock op at its seam, at the runner's model's shapes: one record per
        (row count, cache depth, input shape)."""

    def kernel_time(self, runner: R, ref: str, rows: int, depth: int) -> list["KernelTiming"]:
        """Seconds per call of the kernel and of the stock op in isolation, per lane (chained, queued)."""


# What bench and triage hold: a backend whose runners they see only through the Runner protocol (which backend's
# runner a method is handed back is not a static fact: get_backend picks the backend by name).
Backend: TypeAlias = BackendOf[Runner]


def auto_backend() -> str:
    """MLX on a Mac where it is installed (Metal is its home), torch elsewhere."""
    return "mlx" if sys.platform == "darwin" and importlib.util.find_spec("mlx") is not None else "torch"


def backend_name(name: str = "auto") -> str:
    """The backend `name` stands for (`auto`: MLX on a Mac where it is installed, torch elsewhere); an unknown
    name is an InputError. No framework is imported: a bad flag is refused before any framework loads."""
    name = auto_backend() if name == "auto" else name
    if name not in BACKENDS:
        raise InputError(f"--backend {name!r}: expected auto or one of {', '.join(BACKENDS)}")
    return name


def get_backend(name: str = "auto") -> Backend:
    """The named backend (imported on first use: engine/ itself pulls in no framework)."""
    name = backend_name(name)
    try:
        module = importlib.import_module(BACKENDS[name])
    except ImportError as exc:
        raise InputError(f"--backend {name}: its framework is not installed ({exc.name})") from None
    return module.BACKEND
