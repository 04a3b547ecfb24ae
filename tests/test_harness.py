"""The harness: statistics, rotation sets, warm-up and first-call separation, adaptive stop, graph mode."""
import dataclasses
import itertools
import statistics
import subprocess
import sys
import time

import pytest
import torch

from lzsolve.measure.harness import Budget, CpuHarness, CudaHarness, rotation_sets, slowest, summarize


def test_summarize_statistics():
    t = summarize([float(x) for x in range(1, 101)])
    assert t.median_ms == 50.5 and t.min_ms == 1.0 and t.samples == 100
    assert 95 <= t.p95_ms <= 96
    assert abs(t.spread - (75.25 - 25.75) / 50.5) < 1e-9
    single = summarize([2.0])
    assert single.median_ms == single.p95_ms == 2.0 and single.spread == 0.0


def test_rotation_sets_cover_twice_the_cache_within_bounds():
    b = Budget(max_sets=32, max_set_bytes=1 << 30)
    assert rotation_sets(10 << 20, 50 << 20, b) == 10  # 2 x 50 MB / 10 MB
    assert rotation_sets(1 << 10, 50 << 20, b) == 32  # tiny inputs: capped
    assert rotation_sets(600 << 20, 50 << 20, b) == 1  # one set already evicts the cache
    assert rotation_sets(30 << 20, 50 << 20, Budget(max_set_bytes=64 << 20)) == 2  # memory cap


class SharedWarmup(CpuHarness):
    shared_warmup = True  # as CudaHarness, whose warm-up is the device's


@pytest.mark.parametrize("harness, shared", [(CpuHarness, False), (SharedWarmup, True)])
def test_a_shared_warm_up_is_spent_on_the_first_candidate_alone(harness, shared):
    calls = {name: 0 for name in "abc"}

    def kernel(name):
        def call():
            calls[name] += 1
            time.sleep(0.001)
        return [call]
    h = harness(Budget(warmup_s=0.06, min_samples=3, max_samples=3))
    assert set(h.measure({name: kernel(name) for name in calls})) == set(calls)
    assert calls["a"] >= 25, "the first candidate warms for warmup_s"
    for name in "bc":
        assert (calls[name] <= 15) if shared else (calls[name] >= 25)
        assert calls[name] >= 2 + 3, "two warm-up calls at least, then its samples"


def test_a_measurement_right_after_another_warms_its_first_candidate_briefly(monkeypatch):
    """The device's clocks are still up where the last measurement ended within STILL_WARM_S (on a
    GPU, the next workload's parity checks run in between): its first candidate warms as the others
    do. After a longer pause, or where candidates do not share a warm-up (CPU), it warms for warmup_s."""
    from lzsolve.measure import harness as harness_module

    calls = {"n": 0}

    def call():
        calls["n"] += 1
        time.sleep(0.001)

    def warm_up_calls(h) -> int:
        calls["n"] = 0
        h.measure({"a": [call]})
        return calls["n"] - 3  # its samples
    shared, alone = SharedWarmup(Budget(warmup_s=0.06, min_samples=3, max_samples=3)), CpuHarness(
        Budget(warmup_s=0.06, min_samples=3, max_samples=3))
    assert warm_up_calls(shared) >= 25, "a first measurement warms for warmup_s"
    assert warm_up_calls(shared) <= 15, "right after another: briefly"
    monkeypatch.setattr(harness_module, "STILL_WARM_S", 0.0)
    warm_up_calls(shared)
    assert warm_up_calls(shared) >= 25, "after a pause longer than STILL_WARM_S: warmup_s again"
    monkeypatch.undo()
    assert warm_up_calls(alone) >= 25 and warm_up_calls(alone) >= 25, "no shared warm-up: each warms fully"


def test_first_call_is_not_in_steady_state():
    calls = []

    def kernel():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.001)  # a "JIT" first call

    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=5, max_samples=20, time_cap_s=0.2))
    _, first_ms = harness.first_call(kernel)
    m = harness.measure({"k": [kernel]})["k"]
    assert first_ms >= 50
    assert m.eager.median_ms < 20, "the compile-like first call must not leak into the median"
    assert 5 <= m.eager.samples <= 20
    assert m.graph is None and "CUDA" in m.graph_error


def test_each_sample_calls_every_set_once_and_divides():
    seen = []
    sets = [lambda i=i: (seen.append(i), time.sleep(0.002)) for i in range(4)]
    m = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=3, max_sample_s=1.0)).measure({"k": sets})["k"]
    assert m.sets == 4
    assert seen[-4:] == [0, 1, 2, 3]
    assert 1.5 < m.eager.median_ms < 10, "per-call time, not per-sample time"


def test_candidates_are_interleaved_in_rotating_order():
    order = []
    candidates = {name: [lambda name=name: order.append(name)] for name in "abc"}
    CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=3)).measure(candidates)
    sampled = order[-9:]  # after each candidate's warm-up pass
    assert sampled == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_no_garbage_collection_lands_in_a_sample(monkeypatch):
    """Cyclic garbage made by the calls is not collected while samples are taken (a full
    collection in a big process is tens of ms in one candidate's sample), and the collector
    is back on afterwards."""
    import gc
    collections, sampling = [], [False]

    def cyclic_garbage():
        for _ in range(200):
            node = {}
            node["self"] = node

    def interleaved(self, samplers, original=CpuHarness._interleaved):
        sampling[0] = True
        try:
            return original(self, samplers)
        finally:
            sampling[0] = False

    def on_collection(phase, info):
        if phase == "start" and sampling[0]:
            collections.append(info["generation"])

    monkeypatch.setattr(CpuHarness, "_interleaved", interleaved)
    gc.callbacks.append(on_collection)  # the list the collector holds: not one to replace
    try:
        CpuHarness(Budget(warmup_s=0.0, min_samples=50, max_samples=50)).measure({"garbage": [cyclic_garbage]})
    finally:
        gc.callbacks.remove(on_collection)
    assert collections == [] and gc.isenabled()


def test_a_raising_candidate_does_not_stop_the_others():
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("fails on its 4th call")

    out = CpuHarness(Budget(warmup_s=0.0, min_samples=5, max_samples=5)).measure(
        {"flaky": [flaky], "fine": [lambda: None], "broken": [lambda: 1 / 0]})
    assert isinstance(out["flaky"], RuntimeError) and isinstance(out["broken"], ZeroDivisionError)
    assert out["fine"].eager.samples == 5


def test_stops_at_sample_cap_and_time_cap():
    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=7, time_cap_s=10, target_spread=0.0))
    assert harness.measure({"k": [lambda: None]})["k"].eager.samples == 7
    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=10_000, time_cap_s=0.05,
                                target_spread=0.0))
    assert harness.measure({"k": [lambda: time.sleep(0.01)]})["k"].eager.samples < 20


def test_a_candidate_clearly_behind_the_leader_stops_sampling():
    """Racing: after min_samples, a candidate whose fastest quarter is race_margin slower than the
    leader's slowest quarter (of its mode) stops; the leader, one within the margin, and the other
    mode's candidates sample on to the cap. Samplers of fixed times with a little spread."""
    def sampler(ms: float):
        times = itertools.cycle([ms * 0.95, ms, ms * 1.05])
        return lambda: next(times)

    budget = Budget(min_samples=5, max_samples=30, time_cap_s=10, target_spread=0.0)
    times = {("fast", "eager"): 1.0, ("close", "eager"): 1.2, ("slow", "eager"): 1.5, ("slow", "graph"): 0.5}
    timings, errors = CpuHarness(budget)._interleaved({key: sampler(ms) for key, ms in times.items()})
    assert not errors and {key: t.samples for key, t in timings.items()} == {
        ("fast", "eager"): 30, ("close", "eager"): 30, ("slow", "eager"): 5, ("slow", "graph"): 30}
    assert timings[("slow", "eager")].median_ms == 1.5
    off = CpuHarness(dataclasses.replace(budget, race_margin=float("inf")))
    assert off._interleaved({key: sampler(ms) for key, ms in times.items()})[0][("slow", "eager")].samples == 30


def test_a_spread_out_timing_stops_once_its_median_is_pinned():
    """A timing spread 5% (IQR / median) does not reach the 2% target spread and sampled to the
    cap; its median is within 1% (95% confidence) after some tens of samples, where it now stops.
    One whose median cannot be pinned (spread 40%) samples on to the cap, as before."""
    import random

    from lzsolve.measure.harness import median_pinned

    rng = random.Random(0)
    normal = [rng.gauss(1.0, 0.03) for _ in range(400)]
    assert not median_pinned(normal[:10], 0.01) and median_pinned(normal[:150], 0.01)
    assert not median_pinned(normal[:150], 0.0), "precision 0: never"
    assert not median_pinned([1.0], 0.01) and median_pinned([1.0] * 5, 0.01)

    def sampler(sd: float):
        draws = random.Random(2)  # its first samples spread over 2%, as a busy host's eager timings do
        return lambda: draws.gauss(1.0, sd)
    budget = Budget(min_samples=5, max_samples=200, time_cap_s=10)
    timings, _ = CpuHarness(budget)._interleaved({("k", "eager"): sampler(0.04), ("wide", "graph"): sampler(0.3)})
    assert 20 <= timings[("k", "eager")].samples <= 150 and timings[("k", "eager")].spread > budget.target_spread
    assert timings[("wide", "graph")].samples == 200
    never = CpuHarness(dataclasses.replace(budget, target_precision=0.0))
    assert never._interleaved({("k", "eager"): sampler(0.04)})[0][("k", "eager")].samples == 200


@pytest.mark.gpu
def test_cuda_graph_and_eager_modes():
    harness = CudaHarness(Budget(time_cap_s=0.2))
    x = [torch.randn(4096, 4096, device="cuda") for _ in range(2)]
    out = harness.measure({"mm": [lambda a=a: a @ a for a in x], "sync": [lambda: x[0].sum().item()]})
    m, unsafe = out["mm"], out["sync"]
    assert m.graph is not None and m.graph_error is None
    assert m.graph.median_ms > 0.05  # a 4096^3 fp32 matmul is not free
    assert abs(m.graph.median_ms / m.eager.median_ms - 1) < 0.1, "GPU-bound: both modes agree"
    assert unsafe.graph is None and unsafe.graph_error  # a host sync cannot be captured
    assert unsafe.eager.median_ms > 0
    torch.cuda.synchronize()


def test_slow_calls_rotate_fewer_sets():
    sets = [lambda: time.sleep(0.004) for _ in range(8)]
    m = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=3, max_sample_s=0.01)).measure({"k": sets})["k"]
    # 2 at 4 ms a call; 1 where a loaded machine stretches the sleep past 5 ms
    assert m.sets in (1, 2), "a 4 ms call refills any cache; 8 sets would only slow tuning down"


def test_one_mode_alone():
    """Probes and validation time the table's mode alone: the other is neither sampled nor reported."""
    m = CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=3)).measure({"k": [lambda: None]}, ("eager",))["k"]
    assert m.eager.samples == 3 and m.graph is None and m.graph_error is None


@pytest.mark.gpu
def test_cuda_graph_mode_alone():
    harness = CudaHarness(Budget(time_cap_s=0.2))
    # A generator of its own: a failed capture (as in the test above) can leave the default one unusable.
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = [torch.randn(2048, 2048, device="cuda", generator=gen) for _ in range(2)]
    out = harness.measure({"mm": [lambda a=a: a @ a for a in x]}, ("eager",))
    assert out["mm"].graph is None and not out["mm"].graph_tried and out["mm"].eager.median_ms > 0
    out = harness.measure({"mm": [lambda a=a: a @ a for a in x], "sync": [lambda: x[0].sum().item()]}, ("graph",))
    assert out["mm"].eager is None and out["mm"].graph.median_ms > 0 and out["mm"].graph_tried
    assert out["sync"].graph is None and out["sync"].graph_error, "not capturable: the reason stays"
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_eager_mode_counts_the_host_cost_of_launches():
    """A call of a dozen tiny launches is host-bound: its eager time is its host time. (Started
    while the L2 flush still ran, the launches hid behind it and looked nearly free.)"""
    harness = CudaHarness(Budget(time_cap_s=0.2))
    t = torch.zeros(8, device="cuda")

    def launches():
        for _ in range(12):
            t.add_(1)

    host_ms = []
    for _ in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        launches()
        host_ms.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    eager = harness.measure({"launches": [launches]}, ("eager",))["launches"].eager
    assert eager.median_ms >= 0.8 * statistics.median(host_ms), (eager.median_ms, statistics.median(host_ms))
    assert harness.measure({"launches": [launches]}, ("eager",))["launches"].host_ms >= 0.8 * statistics.median(host_ms)


@pytest.mark.gpu
def test_the_host_time_of_a_gpu_bound_call_is_its_launch_alone():
    """An eager solve compares host times (solve.HOST_LOSS): a long matmul costs the host a launch,
    a dozen tiny ones a dozen, whatever their GPU times."""
    harness = CudaHarness(Budget(time_cap_s=0.2))
    gen = torch.Generator(device="cuda").manual_seed(0)  # its own: a failed capture above can break the default one
    a, t = torch.randn(4096, 4096, device="cuda", generator=gen), torch.zeros(8, device="cuda")

    def launches():
        for _ in range(12):
            t.add_(1)
    out = harness.measure({"mm": [lambda: a @ a], "launches": [launches]}, ("eager",))
    mm, small = out["mm"], out["launches"]
    assert mm.host_ms < 0.2 * mm.eager.median_ms, "GPU-bound: the host waits for nothing"
    assert small.host_ms > 2 * mm.host_ms, (small.host_ms, mm.host_ms)


@pytest.mark.gpu
def test_a_device_still_warm_times_as_one_warmed_up():
    """harness.STILL_WARM_S: idle for nearly that long after a measurement, the device times a
    small kernel with the brief warm-up as it does with the full one."""
    from lzsolve.measure.harness import STILL_WARM_S

    harness = CudaHarness(Budget(time_cap_s=0.1))
    x = torch.randn(2048, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    kernel = {"mm": [lambda: x @ x]}
    harness.measure(kernel, ("graph",))
    medians = {}
    for warm_up in ("brief", "full", "brief", "full"):
        time.sleep(0.9 * STILL_WARM_S)
        if warm_up == "full":
            harness._warm_until = 0.0
        medians.setdefault(warm_up, []).append(harness.measure(kernel, ("graph",))["mm"].graph.median_ms)
    brief, full = min(medians["brief"]), min(medians["full"])
    assert abs(brief / full - 1) < 0.05, medians


def test_the_host_time_per_call_on_a_cpu_is_its_time():
    """On a CPU the host's time is all of a call's: host_ms is the eager samples' median, per
    call; a graph-only timing has none; rounds on other inputs keep the slowest host time."""
    sets = [lambda: time.sleep(0.002) for _ in range(2)]
    m = CpuHarness(Budget(warmup_s=0.0, min_samples=5, max_samples=5, max_sample_s=1.0)).measure({"k": sets})["k"]
    assert m.host_ms == pytest.approx(m.eager.median_ms, rel=1e-9) and 1.5 < m.host_ms < 10
    assert CpuHarness(Budget(warmup_s=0.0, min_samples=3, max_samples=3)).measure(
        {"k": [lambda: None]}, ())["k"].host_ms is None
    fast, slow = (dataclasses.replace(m, host_ms=ms) for ms in (1.0, 3.0))
    assert slowest([fast, slow]).host_ms == 3.0
    assert slowest([fast, dataclasses.replace(m, host_ms=None)]).host_ms is None


FAULTS = """
import resource, sys, torch
from lzsolve.measure.harness import CpuHarness
if sys.argv[1] == "harness":
    CpuHarness()
x = torch.randn(1200, 8192, dtype=torch.bfloat16)
def rms_add():  # an eager op with fp32 temporaries over glibc's largest adaptive threshold (32 MiB)
    h = x.float() + x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
for _ in range(5):  # the heap grows to its working size
    rms_add()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    rms_add()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")
def test_cpu_kernels_are_timed_without_a_page_fault_per_call():
    """With glibc's defaults each call maps its temporaries afresh (a fault per 4 KiB); the
    harness keeps freed memory on the heap, as a warm server's allocator would."""
    faults = {how: int(subprocess.run([sys.executable, "-c", FAULTS, how], capture_output=True, text=True,
                                      check=True).stdout) for how in ("default", "harness")}
    temporaries = 40 << 20 >> 12  # pages in one
    assert faults["default"] > 20 * temporaries and faults["harness"] * 20 < faults["default"], faults


def test_the_rounds_of_one_workload_share_its_budget():
    """On CPU the tuner times each workload in CPU_PLACEMENTS rounds (measure.run_timing); together
    they get about the time one round had."""
    from lzsolve.measure.harness import CPU_PLACEMENTS, make_harness
    budget = Budget(min_samples=5, max_samples=200, time_cap_s=0.5)
    assert budget.shared_by(1) is budget
    assert (budget.shared_by(2).min_samples, budget.shared_by(2).time_cap_s) == (3, 0.25)
    harness = make_harness(torch.device("cpu"), budget)
    assert harness.placements == CPU_PLACEMENTS == 2 and harness.budget == budget.shared_by(2)


def test_a_shorter_sample_time_caps_sampling_and_warm_up():
    """tune --sample-time: the time cap per candidate and mode, the warm-up a tenth of it at most."""
    default = Budget()
    assert default.sampling(default.time_cap_s) == default
    quick = default.sampling(0.02)
    assert (quick.time_cap_s, quick.warmup_s) == (0.02, 0.002)
    assert quick.min_samples == default.min_samples and quick.target_spread == default.target_spread
    harness = CpuHarness(dataclasses.replace(quick, target_spread=0.0, max_samples=10_000))
    started = time.perf_counter()
    harness.measure({"k": [lambda: time.sleep(0.001)]})
    assert time.perf_counter() - started < 0.2  # the default budget spends 0.55 s here
