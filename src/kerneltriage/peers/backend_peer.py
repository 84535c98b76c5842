"""kerneltriage itself on another backend as a peer (`--peers torch` beside an MLX run, `--peers mlx` beside a
torch one): the same checkpoint and tokens, built by the other backend with its own levers
(`torch:packed_qkv+graphs`; `+` joins levers, since `,` separates peers), timed interleaved with the main runner,
its row named by the backend (its levers are in the peer's note)."""

from __future__ import annotations

from kerneltriage.bench.compare import NOT_INSTALLED, PeerRun
from kerneltriage.bench.harness import KerneltriageEngine
from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend import BACKENDS, Backend, Runner, get_backend
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.levers import parse_levers

BACKEND_PEERS = tuple(BACKENDS)  # kerneltriage itself, on each backend


def split_peer(name: str) -> tuple[str, str]:
    """`torch:packed_qkv+graphs` → ('torch', 'packed_qkv,graphs'); levers checked against the one table."""
    backend, _, levers = name.partition(":")
    text = levers.replace("+", ",")
    try:
        parse_levers(text)
    except InputError as exc:
        raise InputError(f"--peers {name!r}: {exc} (join a peer's levers with '+')") from None
    return backend, text


def open_backend_peer(name: str, runner: Runner) -> PeerRun:
    """The checkpoint built again by the backend `name` names, on the same kind of device and in the same dtype."""
    backend_name, levers = split_peer(name)
    if backend_name == runner.backend:
        return PeerRun(backend_name, unavailable=f"the main run is already on {backend_name}: use ab to compare "
                                                "levers")
    try:
        backend = get_backend(backend_name)
    except InputError:
        return PeerRun(backend_name, unavailable=NOT_INSTALLED)
    device = backend.resolve_device("cpu" if runner.device_type == "cpu" else "auto")
    other = backend.build(runner.checkpoint, RunConfig(parse_levers(levers)), device, runner.dtype)
    shown = f" with {levers}" if levers else " stock"
    return PeerRun(backend_name, engine=BackendPeerEngine(backend_name, other, backend),
                   note=f"kerneltriage on {backend_name} ({device}, {other.dtype}){shown}",
                   ceilings=backend.ceilings(device, other.dtype))


class BackendPeerEngine(KerneltriageEngine):
    """The other backend's runner, timed like the main one under the peer's name, released when closed."""

    def __init__(self, name: str, runner: Runner, backend: Backend) -> None:
        super().__init__(runner)
        self.name = name
        self.backend = backend

    def close(self) -> None:
        self.backend.release(self.runner)
