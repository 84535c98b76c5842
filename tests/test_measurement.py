"""Measurement: derived statistics, warnings on planted problems (and none on clean data), JSON roundtrip."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from kerneltriage.core import measurement as mm
from kerneltriage.core.environment import Snapshot
from kerneltriage.core.measurement import Measurement, MeasurementSpec

SPEC = MeasurementSpec("decode", "decode", units_per_sample=128, params={"batch": 1, "levers": ["graphs"]})
STEADY = Snapshot(time=0.0, on_battery=False, sm_clock_mhz=1980, memory_clock_mhz=3201, temperature_c=45, power_w=300.0)


def _clean(n: int = 20, seed: int = 0) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(0.02 * rng.lognormvariate(0.0, 0.01) for _ in range(n))


def _codes(m: Measurement) -> set[str]:
    return {check.code for check in m.warnings()}


def test_clean_data_has_no_warnings() -> None:
    m = Measurement(SPEC, _clean(), warmups=(0.5,), start=STEADY, end=dataclasses.replace(STEADY, time=9.0))
    assert m.warnings() == ()


def test_high_spread_fires() -> None:
    m = Measurement(SPEC, (0.02, 0.03) * 10)
    assert m.spread > mm.HIGH_SPREAD_RATIO
    assert _codes(m) == {"high-spread"}


def test_few_samples_fires() -> None:
    m = Measurement(SPEC, _clean(mm.MIN_SAMPLES - 1))
    assert _codes(m) == {"few-samples"}
    assert "few-samples" not in _codes(Measurement(SPEC, _clean(mm.MIN_SAMPLES)))


def test_trend_fires_on_a_slowing_device() -> None:
    rising = tuple(0.020 * (1.0 + 0.5 * i / 29) for i in range(30))  # 50% slower by the end
    assert "sample-trend" in _codes(Measurement(SPEC, rising))


def test_snapshot_checks_fire_on_planted_drift() -> None:
    hot_and_slow = dataclasses.replace(STEADY, sm_clock_mhz=1500, temperature_c=45 + mm.TEMPERATURE_DRIFT_C + 5)
    m = Measurement(SPEC, _clean(), start=STEADY, end=hot_and_slow)
    assert _codes(m) == {"clock-drift", "temperature-drift"}
    on_battery = Measurement(SPEC, _clean(), start=dataclasses.replace(STEADY, on_battery=True), end=STEADY)
    assert _codes(on_battery) == {"on-battery"}


def test_snapshots_without_gpu_readings_raise_nothing() -> None:
    cpu_only = Snapshot(time=0.0, on_battery=False)
    assert Measurement(SPEC, _clean(), start=cpu_only, end=cpu_only).warnings() == ()


def test_every_warning_has_advice() -> None:
    m = Measurement(SPEC, (0.02, 0.03, 0.05), start=STEADY, end=dataclasses.replace(STEADY, sm_clock_mhz=900))
    assert len(m.warnings()) >= 3
    assert all(check.message and check.advice for check in m.warnings())


def test_derived_statistics() -> None:
    m = Measurement(SPEC, (0.1, 0.2, 0.3, 0.4, 1.0))
    assert m.median == pytest.approx(0.3)
    assert m.iqr == pytest.approx(0.2)
    assert m.mad == pytest.approx(0.1)
    assert m.rate == pytest.approx(5 * 128 / 2.0)
    assert m.median_ci().low <= m.median <= m.median_ci().high


def test_json_roundtrip() -> None:
    m = Measurement(SPEC, _clean(), warmups=(0.4, 0.1), start=STEADY, end=dataclasses.replace(STEADY, power_w=310.5))
    loaded = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert loaded == m
    assert loaded.warmups == (0.4, 0.1)
    assert dict(loaded.spec.params) == {"batch": 1, "levers": ["graphs"]}
    assert loaded.end is not None and loaded.end.power_w == 310.5


def test_warmups_stay_out_of_the_statistics() -> None:
    with_warmup = Measurement(SPEC, (0.1,) * 5, warmups=(10.0,))
    assert with_warmup.median == 0.1 and with_warmup.rate == pytest.approx(1280.0)


@pytest.mark.parametrize("samples", [(), (0.1, -0.1), (0.1, float("nan")), (0.0,)])
def test_bad_samples_are_rejected(samples: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="decode"):
        Measurement(SPEC, samples)


def test_spec_validation_and_immutability() -> None:
    with pytest.raises(ValueError, match="units_per_sample"):
        MeasurementSpec("x", "decode", units_per_sample=0)
    with pytest.raises(ValueError, match="non-empty"):
        MeasurementSpec("", "decode", units_per_sample=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPEC.label = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        SPEC.params["batch"] = 2  # type: ignore[index]
