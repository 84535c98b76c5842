"""Ceilings carry the load they were measured under, and are measured again when the machine is quieter
(bench's re-measuring of ceilings under a rate above 100% of the roofline: test_cli_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kerneltriage.backends.torch import ceilings as ceilings_mod
from kerneltriage.core import ceilings_cache
from kerneltriage.core.roofline import Ceilings

CPU = torch.device("cpu")
BUSY = "other processes used 1.00 of 2 CPU cores during the run"


@pytest.fixture
def fake_measure(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """measure() returns bandwidths from a list (the first call the first value), counting its calls."""
    values = [1e9, 2e9, 3e9]
    calls: list[float] = []

    def measure(device: torch.device, dtype: torch.dtype) -> Ceilings:
        calls.append(values[len(calls)])
        return Ceilings(calls[-1], 1e10, "measured", "cpu test", "float32")
    monkeypatch.setattr(ceilings_mod, "measure", measure)
    monkeypatch.setattr(ceilings_cache, "PROBE_S", 0.0)
    return calls


def machine(monkeypatch: pytest.MonkeyPatch, reason: str | None) -> None:
    monkeypatch.setattr(ceilings_cache, "contention", lambda start, end: reason)


def test_ceilings_measured_on_a_busy_machine_record_it_and_are_remeasured_once_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_measure: list[float]) -> None:
    path = tmp_path / "c.json"
    machine(monkeypatch, BUSY)
    assert ceilings_mod.get_ceilings(CPU, torch.float32, path=path).bandwidth == 1e9
    assert ceilings_mod.cached_entry(CPU, torch.float32, path)["contended"] == BUSY
    assert ceilings_mod.get_ceilings(CPU, torch.float32, path=path).bandwidth == 1e9  # still busy: kept
    machine(monkeypatch, None)
    assert ceilings_mod.get_ceilings(CPU, torch.float32, path=path).bandwidth == 2e9  # quiet now: measured again
    assert ceilings_mod.cached_entry(CPU, torch.float32, path)["contended"] is None
    assert ceilings_mod.get_ceilings(CPU, torch.float32, path=path).bandwidth == 2e9  # quiet entry: kept
    assert fake_measure == [1e9, 2e9]


def test_an_entry_without_a_load_record_is_measured_again_when_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_measure: list[float]) -> None:
    path = tmp_path / "c.json"
    old = {"bandwidth": 5e8, "matmul_flops": 1e10, "source": "measured", "device": "cpu", "dtype": "float32",
           "measured_at": "2026-01-01T00:00:00+00:00"}
    path.write_text(json.dumps({ceilings_mod.cache_key(CPU, torch.float32): old}))
    machine(monkeypatch, None)
    assert ceilings_mod.get_ceilings(CPU, torch.float32, path=path).bandwidth == 1e9


def test_a_real_measurement_records_the_load(tmp_path: Path) -> None:
    ceilings_mod.get_ceilings(CPU, torch.float32, path=tmp_path / "c.json")
    entry = ceilings_mod.cached_entry(CPU, torch.float32, tmp_path / "c.json")
    assert {"other_cores", "load_avg_1m", "contended", "measured_at"} <= set(entry)
    assert entry["other_cores"] is None or entry["other_cores"] >= 0.0
