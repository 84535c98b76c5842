"""The kernel path's rules on isolation timings, framework-free: how a lane's raw samples are aggregated, what they
may look like before their median is believed, what a first call at a new shape may cost, and the least time a call
can take.

- A lane's time is the MEDIAN of its raw samples, shown with their interquartile range: never a geometric mean (one
  sample driven to ~0 takes a geometric mean to ~0 — GPU MODE's `eigh` leaderboard was topped at 0.000 that way,
  reference-kernels #162) nor a best-of-N (the fast mode of a bimodal kernel).
- timing-spread: a sample below 1/SPREAD_LIMIT of its lane's lower quartile is a time the kernel did not earn (no
  honest call runs 10× faster than a quarter of its own samples; contention only slows samples down): invalid.
- bimodal: the sorted samples split by a gap over BIMODAL_GAP with at least BIMODAL_SHARE of them on each side: a
  label (a slow path taken part of the time is real cost, which the median carries and a best-of-N would hide; a
  shared CPU's bursts raise it too — 4 of 120 lanes of an honest kernel at load 8 on 2 cores — so it fails nothing).
- cold-shape: at every unseen shape, the first call costs over COLD_RATIO times the second and the excess is over
  max(COLD_FACTOR × stock's excess, COLD_FLOOR): a compile or a cache fill per shape that warm-ups hid (a model sees
  new row counts all the time): invalid.
- roofline: a call faster than its floor — bytes it must move / measured copy bandwidth, FLOPs / measured matmul
  peak — by more than ROOFLINE_SLACK is impossible where no cache can serve its inputs (CUDA: the L2 emptied before
  every sample, each call of a sample on inputs not touched since): invalid, as `bench` refuses a rate above 100% of
  the roofline.
"""

from __future__ import annotations

from typing import Sequence

from kerneltriage.core import stats

SPREAD_LIMIT = 10.0
BIMODAL_GAP, BIMODAL_SHARE = 1.5, 0.25
COLD_RATIO, COLD_FACTOR, COLD_FLOOR = 3.0, 10.0, 1e-3  # seconds: above any launch or allocator effect
# The ceilings are a copy's rate (read + write) and a square matmul's: a pure read can beat the copy by ~10%, a
# well-shaped GEMM the probe's a little. Past this, it is no kernel's doing (the rates refused in public were 4× over).
ROOFLINE_SLACK = 1.5


def spread(samples: Sequence[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles of the samples."""
    return stats.quantile(samples, 0.25), stats.quantile(samples, 0.75)


def near_zero(samples: Sequence[float]) -> str | None:
    """Why a sample is too fast to believe beside its lane's others (its lower quartile: a bimodal kernel's fast
    mode is no outlier), or None."""
    quartile, low = stats.quantile(samples, 0.25), min(samples)
    if low * SPREAD_LIMIT >= quartile:
        return None
    return (f"timing-spread: a sample took {low * 1e6:.2f} µs where a quarter of them took {quartile * 1e6:.2f} µs "
            f"or less (over {SPREAD_LIMIT:.0f}× faster): a time the kernel did not earn — a geometric mean would "
            "follow it toward 0, the median reported does not")


def bimodal(samples: Sequence[float]) -> str | None:
    """A label when the samples fall in two modes, or None."""
    ordered = sorted(samples)
    if len(ordered) < 4:
        return None
    gaps = [(ordered[i + 1] / max(ordered[i], 1e-30), i + 1) for i in range(len(ordered) - 1)]
    gap, split = max(gaps)
    if gap <= BIMODAL_GAP or min(split, len(ordered) - split) < BIMODAL_SHARE * len(ordered):
        return None
    fast, slow = stats.median(ordered[:split]), stats.median(ordered[split:])
    return (f"bimodal: {split} of {len(ordered)} samples at ~{fast * 1e6:.1f} µs, {len(ordered) - split} at "
            f"~{slow * 1e6:.1f} µs; the median is reported (a best-of-N would report the fast mode)")


def cold(kernel: Sequence[tuple[float, float]], stock: Sequence[tuple[float, float]], shapes: Sequence[str]
         ) -> str | None:
    """(first, second) call seconds at each unseen shape for kernel and stock: why the first calls hide a cost
    per shape, or None."""
    def excessive(k: tuple[float, float], s: tuple[float, float]) -> bool:
        excess = k[0] - k[1]
        return k[0] > COLD_RATIO * k[1] and excess > max(COLD_FACTOR * max(s[0] - s[1], 0.0), COLD_FLOOR)

    if not kernel or not all(excessive(k, s) for k, s in zip(kernel, stock)):
        return None
    firsts = ", ".join(f"{shape}: {k[0] * 1e3:.1f} ms then {k[1] * 1e3:.2f} ms" for shape, k in zip(shapes, kernel))
    return (f"cold-shape: the first call at each unseen shape costs far more than the next ({firsts}; stock's "
            f"first calls {max(s[0] for s in stock) * 1e3:.2f} ms at most): a compile or cache fill per shape that "
            "the warm-ups hid")


def floor_seconds(bytes_moved: float, flops: float, bandwidth: float, matmul_flops: float) -> float:
    """The least time a call can take: max(bytes / copy bandwidth, FLOPs / matmul peak)."""
    return max(bytes_moved / bandwidth, flops / matmul_flops)


def over_roofline(seconds: float, bytes_moved: float, flops: float, bandwidth: float, matmul_flops: float
                  ) -> str | None:
    """Why `seconds` per call is impossible on this device, or None."""
    floor = floor_seconds(bytes_moved, flops, bandwidth, matmul_flops)
    if seconds * ROOFLINE_SLACK >= floor:
        return None
    return (f"roofline: {seconds * 1e6:.2f} µs per call for {bytes_moved / 1e6:.2f} MB and {flops / 1e9:.3f} GFLOP "
            f"is {bytes_moved / seconds / 1e9:.0f} GB/s, {flops / seconds / 1e12:.1f} TFLOP/s — above the measured "
            f"{bandwidth / 1e9:.0f} GB/s and {matmul_flops / 1e12:.1f} TFLOP/s (floor {floor * 1e6:.2f} µs)")
