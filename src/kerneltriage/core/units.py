"""Human-readable numbers: durations, rates, bytes, FLOP/s — all to a fixed count of significant figures.

Prefixes are decimal (SI): 1 kB = 1,000 B, 1 TB/s = 10¹² B/s, as in datasheets and roofline arithmetic.
"""

from __future__ import annotations

import math

DEFAULT_SIG = 3

# (scale, suffix), largest first; a value takes the first scale it reaches after rounding.
_DURATION_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def sig(x: float, n: int = DEFAULT_SIG) -> float:
    """`x` rounded to `n` significant figures (0, inf and nan are returned unchanged)."""
    if n < 1:
        raise ValueError(f"significant figures must be ≥ 1, got {n}")
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, n - 1 - math.floor(math.log10(abs(x))))


def format_sig(x: float, n: int = DEFAULT_SIG) -> str:
    """`x` to `n` significant figures with thousands separators: 49123 → '49,100', 4.189 → '4.19'."""
    rounded = sig(x, n)
    if rounded == 0 or not math.isfinite(rounded):
        return f"{rounded:g}"
    decimals = max(0, n - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"


def _scaled(x: float, units: tuple[tuple[float, str], ...], n: int) -> tuple[float, str]:
    """The largest unit that `x`, rounded to `n` figures in it, reaches ≥ 1 of; else the smallest."""
    for scale, suffix in units:
        if abs(sig(x / scale, n)) >= 1:
            return x / scale, suffix
    scale, suffix = units[-1]
    return x / scale, suffix


def format_duration(seconds: float, n: int = DEFAULT_SIG) -> str:
    """A duration in s, ms, µs or ns: 0.000123 → '123 µs'."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    value, suffix = _scaled(seconds, _DURATION_UNITS, n)
    return f"{format_sig(value, n)} {suffix}"


def format_rate(per_second: float, unit: str = "tok", n: int = DEFAULT_SIG) -> str:
    """A rate with thousands separators and no prefix: 49123.4 → '49,100 tok/s'."""
    return f"{format_sig(per_second, n)} {unit}/s"


def _format_si(x: float, unit: str, n: int) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}"
    value, prefix = _scaled(x, _SI_PREFIXES, n)
    return f"{format_sig(value, n)} {prefix}{unit}"


def format_bytes(count: float, n: int = DEFAULT_SIG) -> str:
    """A byte count with a decimal prefix: 269_000_000 → '269 MB', 5 → '5 B'."""
    if abs(count) < 1000 and float(count).is_integer():
        return f"{int(count)} B"
    return _format_si(count, "B", n)


def format_bandwidth(bytes_per_second: float, n: int = DEFAULT_SIG) -> str:
    """Bytes per second with a decimal prefix: 4.19e12 → '4.19 TB/s'."""
    return _format_si(bytes_per_second, "B/s", n)


def format_flops(flop_per_second: float, n: int = DEFAULT_SIG) -> str:
    """Floating-point throughput with a decimal prefix: 7.84e14 → '784 TFLOP/s'."""
    return _format_si(flop_per_second, "FLOP/s", n)
