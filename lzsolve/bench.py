"""The timing harness: one interface, a CPU clock and CUDA events behind it.

`first_call` times the first call of a candidate on a workload (JIT, compile,
autotune, handle creation: what a server's first request would pay);
`measure` times the steady state with warm-up and adaptive repeats, and never
includes that first call.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass(frozen=True)
class Budget:
    warmup_s: float = 0.05  # at least one warm-up call, then more until this much time passed
    min_samples: int = 5
    max_samples: int = 200
    time_cap_s: float = 0.5  # stop sampling after this long even if still noisy
    target_spread: float = 0.02  # stop once IQR / median is below this


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p95_ms: float
    min_ms: float
    samples: int
    spread: float  # IQR / median of the samples


def summarize(samples_ms: list[float]) -> Timing:
    ordered = sorted(samples_ms)
    n = len(ordered)
    q = statistics.quantiles(ordered, n=20, method="inclusive") if n > 1 else [ordered[0]] * 19
    median = statistics.median(ordered)
    iqr = (q[14] - q[4]) if n > 1 else 0.0  # 75th - 25th percentile
    return Timing(median, q[18], ordered[0], n, iqr / median if median > 0 else 0.0)


class Harness(Protocol):
    name: str

    def first_call(self, fn: Callable[[], object]) -> tuple[object, float]: ...

    def measure(self, fn: Callable[[], object]) -> Timing: ...


class _Adaptive:
    """Warm-up, then samples until the spread target, the sample cap or the time cap."""

    name = "abstract"

    def __init__(self, budget: Budget = Budget()):
        self.budget = budget

    def _sync(self) -> None:
        pass

    def _sample_ms(self, fn) -> float:
        raise NotImplementedError

    def first_call(self, fn):
        self._sync()
        start = time.perf_counter()
        out = fn()
        self._sync()
        return out, (time.perf_counter() - start) * 1e3

    def measure(self, fn) -> Timing:
        b = self.budget
        start = time.perf_counter()
        fn()
        self._sync()
        while time.perf_counter() - start < b.warmup_s:
            fn()
            self._sync()
        samples: list[float] = []
        start = time.perf_counter()
        while len(samples) < b.max_samples:
            samples.append(self._sample_ms(fn))
            if len(samples) >= b.min_samples:
                if time.perf_counter() - start > b.time_cap_s or summarize(samples).spread < b.target_spread:
                    break
        return summarize(samples)


class CpuHarness(_Adaptive):
    name = "cpu_perf_counter"

    def _sample_ms(self, fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3


class CudaEventHarness(_Adaptive):
    name = "cuda_events"

    def _sync(self) -> None:
        torch.cuda.synchronize()

    def _sample_ms(self, fn) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)


def make_harness(device: torch.device, budget: Budget | None = None) -> Harness:
    budget = budget or Budget()
    return CudaEventHarness(budget) if device.type == "cuda" else CpuHarness(budget)
