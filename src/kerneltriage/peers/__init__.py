"""Peers: other engines measured beside kerneltriage on the same weights and tokens (transformers, llama.cpp,
mlx-lm, and kerneltriage itself on its other backend).

They are engines of their own (they import their frameworks); `bench/` times them through the harness's
`Engine` protocol and never imports this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from kerneltriage.bench.compare import PeerRun
from kerneltriage.bench.harness import Progress, Settings
from kerneltriage.bench.workloads import Test
from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend import Runner
from kerneltriage.peers.backend_peer import BACKEND_PEERS, open_backend_peer, split_peer

PEERS = ("hf", "hf-static", "llama.cpp", "mlx-lm", "torch[:LEVERS]", "mlx[:LEVERS]")


def parse_peers(text: str) -> tuple[str, ...]:
    """`hf,llama.cpp,torch:graphs+last_logits` → its names; an unknown name is an InputError."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    backends = [n.partition(":")[0] for n in names if n.partition(":")[0] in BACKEND_PEERS]
    if len(backends) != len(set(backends)):
        raise InputError(f"--peers {text!r}: one peer per backend (compare two lever sets with ab)")
    for name in names:
        if name.partition(":")[0] in BACKEND_PEERS:
            split_peer(name)
        elif name not in PEERS:
            raise InputError(f"--peers: unknown peer {name!r}; expected some of {', '.join(PEERS)}")
    return names


def open_peer(name: str, runner: Runner, tests: Sequence[Test], settings: Settings,
              progress: Progress | None = None, llama_bench: Path | None = None) -> PeerRun:
    """A peer loaded and ready to be interleaved (`engine`), one that ran by itself (`results`: a
    llama-bench binary), or why it cannot run (`unavailable`). A peer that is not installed is reported, never
    silently dropped; a peer that fails raises (a failed measurement is not a result)."""
    if progress is not None:
        progress(0, f"loading {name}")
    if name in ("hf", "hf-static"):
        if runner.backend != "torch":
            return PeerRun(name, unavailable=f"copies torch weights; this runner is {runner.backend}")
        from kerneltriage.peers.hf import open_hf

        return open_hf(name, runner)
    if name.partition(":")[0] in BACKEND_PEERS:
        return open_backend_peer(name, runner)
    if name == "mlx-lm":
        from kerneltriage.peers.mlxlm import open_mlx_lm

        return open_mlx_lm(runner)
    from kerneltriage.peers.llamacpp import open_llama_cpp

    return open_llama_cpp(runner, tests, settings, progress, llama_bench)
