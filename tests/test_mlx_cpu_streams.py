"""`cpu_streams` on MLX's CPU: each projection's rows in parts on their own streams computes the same numbers bit for
bit (dense and quantized, packed or not, the head too), counts itself, keeps small projections whole, and is refused
beside compile."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from conftest import tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.backends.mlx import cpu_streams  # noqa: E402
from kerneltriage.core.errors import InputError  # noqa: E402

PROMPT = [9, 10, 11, 12, 40, 41]


@pytest.fixture(autouse=True)
def _small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_streams, "MIN_ROWS", 8)  # the tiny model's projections split too
    monkeypatch.setattr(cpu_streams, "cores", lambda: 3)  # three parts where rows allow, whatever this machine has


@pytest.mark.parametrize(("arch", "base"), [("llama", ""), ("qwen2", "packed_qkv,packed_gate_up"),
                                            ("llama", "quantized,packed_qkv,packed_gate_up,last_logits,one_sync")])
def test_rows_on_streams_give_the_same_logits_bit_for_bit(arch: str, base: str) -> None:
    checkpoint = quantized_checkpoint(arch)  # qwen2: the q/k/v biases are split with their rows
    stock = mlx_runner(checkpoint, base)
    split = mlx_runner(checkpoint, ",".join(filter(None, [base, "cpu_streams"])))
    a, _ = stock.forced_logits(PROMPT, None, 6)
    b, _ = split.forced_logits(PROMPT, None, 6)
    assert (a == b).all() and a.std() > 0  # exact: every output row is the same dot product in the same order
    assert split.counters["cpu_streams"] > 0 and "cpu_streams" not in stock.counters


def test_each_projection_is_in_parts_that_view_its_rows() -> None:
    runner = mlx_runner(tiny_checkpoint("llama"), "packed_gate_up,cpu_streams")
    splits = [m for _, m in runner.model.named_modules() if isinstance(m, cpu_streams.SplitRows)]
    layers = runner.config.num_layers
    assert len(splits) == layers * 6 + 1  # q, k, v, o, gate·up, down per layer, and the head
    for module in splits:
        rows = [part.weight.shape[0] for part in module.split.parts]
        assert sum(rows) == module.whole.weight.shape[0] and max(rows) - min(rows) <= 1 and len(rows) > 1
        assert len({id(s) for s in module.split.streams}) == len(rows)
    head = runner.model.lm_head
    assert head.weight is head.whole.weight  # the whole weight stays reachable (the lm_head kernel seam reads it)


def test_a_projection_too_small_to_split_stays_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_streams, "MIN_ROWS", 10**6)
    runner = mlx_runner(tiny_checkpoint("llama"), "cpu_streams")
    assert all(len(m.split.parts) == 1 for _, m in runner.model.named_modules()
               if isinstance(m, cpu_streams.SplitRows))


def test_cpu_streams_is_refused_beside_compile() -> None:
    with pytest.raises(InputError, match="not with compile"):
        mlx_runner(tiny_checkpoint("llama"), "cpu_streams,compile=default")
