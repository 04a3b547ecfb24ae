"""The harness: statistics, warm-up and first-call separation, adaptive stop."""
import time

from lzsolve.bench import Budget, CpuHarness, summarize


def test_summarize_statistics():
    t = summarize([float(x) for x in range(1, 101)])
    assert t.median_ms == 50.5 and t.min_ms == 1.0 and t.samples == 100
    assert 95 <= t.p95_ms <= 96
    assert abs(t.spread - (75.25 - 25.75) / 50.5) < 1e-9
    single = summarize([2.0])
    assert single.median_ms == single.p95_ms == 2.0 and single.spread == 0.0


def test_first_call_is_not_in_steady_state():
    calls = []

    def kernel():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.001)  # a "JIT" first call

    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=5, max_samples=20, time_cap_s=0.2))
    _, first_ms = harness.first_call(kernel)
    timing = harness.measure(kernel)
    assert first_ms >= 50
    assert timing.median_ms < 20, "the compile-like first call must not leak into the median"
    assert 5 <= timing.samples <= 20


def test_stops_at_sample_cap_and_time_cap():
    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=7, time_cap_s=10, target_spread=0.0))
    assert harness.measure(lambda: None).samples == 7
    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=10_000, time_cap_s=0.05,
                                target_spread=0.0))
    assert harness.measure(lambda: time.sleep(0.01)).samples < 20
