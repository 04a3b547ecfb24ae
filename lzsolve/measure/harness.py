"""The timing harness: one interface, a CPU clock and CUDA events behind it.

A candidate is timed on `k` input sets (fresh random data each), one call per
set per sample, so that no call finds its inputs in cache from the previous
call; on CUDA the L2 is also flushed before every sample (as
triton.testing.do_bench does). Two numbers per record:

- eager: the k calls launched back to back from Python and timed with events from
  an idle GPU, so host-side launch overhead counts wherever it exceeds the GPU time
  (what an eager server pays); beside it the host's own time per call in those passes
  (`host_ms`: what issuing the call costs the CPU, which is all an eager model pays for it
  where the model is host-bound);
- graph: the k calls captured once in a CUDA graph and replayed (what a server
  with CUDA graphs pays: GPU time alone). A candidate that cannot be captured
  gets no graph time and the capture error instead.

All admitted candidates of a workload are timed together, interleaved round by
round on the same input sets (see _Base). Each keeps sampling until its spread
(IQR / median) is under a target, a sample cap or its time cap, or until it is clearly
behind the fastest of its mode (Budget.race_margin). `first_call` times the very first call
on a workload (JIT, compile, autotune), which never enters the steady-state numbers.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

WARM_EACH_S = 0.005  # a candidate's warm-up after the first of a shared warm-up (CudaHarness)
# A shared warm-up brings the device's clocks up; a device that ended a measurement this recently has
# them up still (the next workload's parity checks ran on it in between), so the next measurement's
# first candidate warms as the others do. The full warm-up, 50 ms a workload, was most of what a
# probe or a validation timing cost (55 s for 775 probes of a workload tune, benchmarks/runs/2026-12-06.txt).
STILL_WARM_S = 0.2


@dataclass(frozen=True)
class Budget:
    warmup_s: float = 0.05  # at least one warm-up pass, then more until this much time passed
    min_samples: int = 5
    max_samples: int = 200
    time_cap_s: float = 0.5  # per mode: stop sampling after this long even if still noisy
    target_spread: float = 0.02  # stop once IQR / median is below this...
    # ...or once the median is known this closely (median_pinned): more samples of a spread-out
    # timing (a small kernel's eager launches from a busy host spread 3-10%) only sharpen a median
    # that is already that sure
    target_precision: float = 0.01
    max_sets: int = 32  # input sets rotated per sample
    max_set_bytes: int = 1 << 30  # never hold more than this in rotation sets
    max_sample_s: float = 0.005  # rotate fewer sets when one pass would take longer: a call this
    # long refills the cache itself, so more sets would only slow the tuning
    race_margin: float = 0.25  # a candidate whose fastest quarter of samples is this much slower than
    # the slowest quarter of the leader's (in its mode) stops sampling: no more samples change that
    # decision, and most GPU timings never reach the target spread, sampling for the whole time cap

    def sampling(self, seconds: float) -> Budget:
        """This budget with `seconds` of sampling per candidate and mode (tune's --sample-time), its
        warm-up a tenth of that at most: a quicker, noisier tune, as a smoke test of a pipeline wants."""
        return dataclasses.replace(self, time_cap_s=seconds, warmup_s=min(self.warmup_s, seconds / 10))

    def shared_by(self, rounds: int) -> Budget:
        """This budget split over `rounds` timings of one workload: each round gets its part of the
        time cap and of the minimum samples (3 at least), so the rounds together cost about one."""
        if rounds == 1:
            return self
        return dataclasses.replace(self, time_cap_s=self.time_cap_s / rounds, min_samples=min(
            self.max_samples, max(3, math.ceil(self.min_samples / rounds))))


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p95_ms: float
    min_ms: float
    samples: int
    spread: float  # IQR / median of the samples


@dataclass(frozen=True)
class Measurement:
    eager: Timing | None  # None: not asked for
    graph: Timing | None  # None: not asked for, not measured (CPU) or not capturable (see graph_error)
    graph_error: str | None = None
    sets: int = 1  # input sets rotated per sample
    graph_tried: bool = True  # whether graph timing was asked for (graph_error then says why it is missing)
    host_ms: float | None = None  # median host time per call of the eager passes (None: no eager timing)


def slowest(rounds: list[Measurement]) -> Measurement:
    """Several rounds of one kernel's timing, each on newly allocated inputs, as one measurement:
    per mode the slowest round's figures (its spread too: the slower round is already the
    cautious figure, and a wider spread would only excuse more of a loss), the samples of all."""
    def combine(timings: list[Timing | None]) -> Timing | None:
        if any(t is None for t in timings):
            return None
        slow = max(timings, key=lambda t: t.median_ms)
        return dataclasses.replace(slow, samples=sum(t.samples for t in timings))
    first, hosts = rounds[0], [m.host_ms for m in rounds]
    return Measurement(combine([m.eager for m in rounds]), combine([m.graph for m in rounds]), first.graph_error,
                       first.sets, first.graph_tried, None if None in hosts else max(hosts))


def summarize(samples_ms: list[float]) -> Timing:
    ordered = sorted(samples_ms)
    n = len(ordered)
    q = statistics.quantiles(ordered, n=20, method="inclusive") if n > 1 else [ordered[0]] * 19
    median = statistics.median(ordered)
    iqr = (q[14] - q[4]) if n > 1 else 0.0  # 75th - 25th percentile
    return Timing(median, q[18], ordered[0], n, iqr / median if median > 0 else 0.0)


def median_pinned(samples_ms: list[float], precision: float) -> bool:
    """Whether the 95% confidence interval of the samples' median (order statistics: the samples
    ranked n/2 -+ 0.98 sqrt(n), the binomial's normal approximation) is within -+precision of it.
    Its width falls as 1/sqrt(n) whatever the spread: a timing spread 5% has its median within 1%
    after about 80 samples, where the spread itself never falls under a 2% target."""
    if precision <= 0 or len(samples_ms) < 2:
        return False
    ordered, n = sorted(samples_ms), len(samples_ms)
    reach = 0.98 * math.sqrt(n)
    low, high = ordered[max(0, math.floor(n / 2 - reach))], ordered[min(n - 1, math.ceil(n / 2 + reach))]
    median = statistics.median(ordered)
    return median > 0 and (high - low) / 2 <= precision * median


def rotation_sets(bytes_per_set: float, cache_bytes: int, budget: Budget) -> int:
    """How many input sets to rotate so one pass covers twice the cache (bounded)."""
    if bytes_per_set <= 0:
        return 1
    wanted = math.ceil(2 * cache_bytes / bytes_per_set)
    affordable = max(1, int(budget.max_set_bytes // bytes_per_set))
    return max(1, min(wanted, budget.max_sets, affordable))


MODES = ("eager", "graph")


class Harness(Protocol):
    name: str
    cache_bytes: int
    budget: Budget
    placements: int  # rounds of timing per workload, each on newly allocated inputs (measure.run_timing)

    def first_call(self, fn: Callable[[], object]) -> tuple[object, float]: ...

    def measure(self, candidates: dict[str, list[Callable[[], object]]],
                modes: tuple[str, ...] = MODES) -> dict[str, Measurement | Exception]: ...


def describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


@contextlib.contextmanager
def garbage_collection_paused():
    """Python's cyclic collector off while samples are taken, as timeit does: a full collection
    in a process holding many objects (a tune in a long-lived process, a test session) costs
    tens of ms, and whichever candidate's sample it lands in looks slower for it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Base:
    """Times several candidates of one workload interleaved: each round takes one sample of
    every candidate (and mode) still sampling, in a rotating order, so that clock, power
    and temperature drift fall on all of them alike and their ratios stay honest."""

    name = "abstract"
    cache_bytes = 0
    placements = 1
    no_graph = "CUDA graphs need a CUDA device"

    def __init__(self, budget: Budget = Budget()):
        self.budget = budget
        self._warm_until = 0.0  # perf_counter time until which the device counts as warm (STILL_WARM_S)

    def sync(self) -> None:
        pass

    def first_call(self, fn):
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return out, (time.perf_counter() - start) * 1e3

    # Whether the candidates of one measurement share its warm-up: see CudaHarness.
    shared_warmup = False

    def _warmup(self, calls, seconds: float) -> list:
        """Warm up for `seconds` (two calls at least); returns the calls to rotate: all of them,
        or fewer when one pass over all would take longer than max_sample_s."""
        start = time.perf_counter()
        calls[0]()  # may still set something up (a worker restarted since the parity call)
        self.sync()
        second = time.perf_counter()
        calls[0]()
        self.sync()
        per_call = time.perf_counter() - second
        calls = calls[:max(1, min(len(calls), int(self.budget.max_sample_s / max(per_call, 1e-9))))]
        while time.perf_counter() - start < seconds:
            for call in calls:
                call()
            self.sync()
        return calls

    def _eager_sampler(self, calls, host: list[float]) -> Callable[[], float]:
        """A sample of the eager mode (ms per call); each appends the host's ms per call to `host`."""
        raise NotImplementedError

    def _graph_sampler(self, calls, keep: list) -> tuple[Callable[[], float] | None, str | None]:
        return None, self.no_graph

    def _done(self, samples: list[float], spent_s: float) -> bool:
        b, n = self.budget, len(samples)
        return n >= b.max_samples or (n >= b.min_samples and (spent_s > b.time_cap_s or
                                                             summarize(samples).spread < b.target_spread
                                                             or median_pinned(samples, b.target_precision)))

    def _behind(self, samples: dict, errors: dict) -> set:
        """The (candidate, mode) keys clearly behind the leader of their mode: after min_samples each,
        their lower quartile over the leader's upper quartile by more than race_margin. Racing, as
        in F-Race: the interleaved rounds gave both the same clocks, so more samples would only
        sharpen a time the decision does not need."""
        quartiles = {k: statistics.quantiles(v, n=4, method="inclusive") for k, v in samples.items()
                     if k not in errors and len(v) >= max(2, self.budget.min_samples)}
        behind = set()
        for mode in {k[1] for k in quartiles}:
            keys = [k for k in quartiles if k[1] == mode]
            leader = min(keys, key=lambda k: quartiles[k][2])
            behind |= {k for k in keys if quartiles[k][0] > quartiles[leader][2] * (1 + self.budget.race_margin)}
        return behind

    def _interleaved(self, samplers: dict) -> tuple[dict, dict]:
        samples = {key: [] for key in samplers}
        spent = dict.fromkeys(samplers, 0.0)
        errors: dict = {}
        active = list(samplers)
        while active:
            for key in active:
                start = time.perf_counter()
                try:
                    samples[key].append(samplers[key]())
                except Exception as e:
                    self.sync()  # a broken CUDA context raises here and ends the whole task
                    errors[key] = e
                spent[key] += time.perf_counter() - start
            behind = self._behind(samples, errors) if len(samples) > 1 else set()
            active = [k for k in active if k not in errors and k not in behind and not self._done(samples[k], spent[k])]
            active = active[1:] + active[:1]  # rotate, so no candidate always runs first
        return {k: summarize(v) for k, v in samples.items() if v and k not in errors}, errors

    def measure(self, candidates, modes: tuple[str, ...] = MODES):
        """Timing of every candidate in `modes` (graph on CUDA only); an Exception for one that raised."""
        results: dict[str, Measurement | Exception] = {}
        samplers, graph_errors, keep = {}, {}, []
        sets, hosts = {}, {}
        warm = self.shared_warmup and time.perf_counter() < self._warm_until
        for n, (name, calls) in enumerate(candidates.items()):
            try:
                calls = self._warmup(calls, self.budget.warmup_s if (n == 0 and not warm) or not self.shared_warmup
                                     else min(WARM_EACH_S, self.budget.warmup_s))
            except Exception as e:
                self.sync()
                results[name] = e
                continue
            sets[name] = len(calls)
            if "eager" in modes:
                samplers[(name, "eager")] = self._eager_sampler(calls, hosts.setdefault(name, []))
            graph, graph_errors[name] = self._graph_sampler(calls, keep) if "graph" in modes else (None, None)
            if graph is not None:
                samplers[(name, "graph")] = graph
        try:
            with garbage_collection_paused():
                timings, errors = self._interleaved(samplers)
        finally:
            keep.clear()  # release the captured graphs
            self._warm_until = time.perf_counter() + STILL_WARM_S
        for name in graph_errors:
            eager_failed, graph_failed = errors.get((name, "eager")), errors.get((name, "graph"))
            if eager_failed is not None or (graph_failed is not None and "eager" not in modes):
                results[name] = eager_failed or graph_failed  # no timing left to report
                continue
            graph_error = graph_errors[name] or (describe(errors[(name, "graph")]) if (name, "graph") in errors else None)
            host = hosts.get(name)
            results[name] = Measurement(timings.get((name, "eager")), timings.get((name, "graph")), graph_error,
                                        sets[name], "graph" in modes, statistics.median(host) if host else None)
        return results


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory on the heap, for allocations and for the heap's top, up to
    KEEP_FREED_BYTES. By default it serves an allocation over its mmap threshold (128 KiB, raised
    only by some frees) with fresh pages and unmaps them on free, so an eager op with a few MB of
    fp32 temporaries pays a page fault per 4 KiB on every call, and what a call costs depends on
    the allocator's history: eager RMSNorm + add at 80 x 8192 on a 2-core VM ran 2.0 ms with
    1600 faults a call, 0.24 ms with none (docs/benchmark-log.md §10.13): a tune timed one, its evaluation
    the other, and they disagreed on the choice. Kernels are timed in the steady state of a server
    whose heap is warm. False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


class CpuHarness(_Base):
    name = "cpu_perf_counter"
    cache_bytes = 32 << 20  # a typical last-level cache; sizes the rotation only

    def __init__(self, budget: Budget = Budget(), placements: int = 1):
        super().__init__(budget.shared_by(placements))
        self.placements = placements
        keep_freed_memory()

    def _eager_sampler(self, calls, host: list[float]):
        def sample() -> float:
            start = time.perf_counter()
            for call in calls:
                call()
            host.append((time.perf_counter() - start) * 1e3 / len(calls))  # on a CPU the host's time is all of it
            return host[-1]
        return sample


class CudaHarness(_Base):
    """On a GPU the warm-up brings up the device's clocks and power state, which the candidates
    of one measurement share: the first warms for warmup_s (for WARM_EACH_S as the others, where
    the last measurement ended within STILL_WARM_S), each other one for its first two
    calls (its own setup and a steady call) and WARM_EACH_S, then they are sampled in turns.
    Warming every candidate for warmup_s was 50 ms a measurement, about 40% of the probe phase
    of a default tune on the H100 (benchmarks/device.sh decisions)."""
    name = "cuda_events"
    shared_warmup = True

    def __init__(self, budget: Budget = Budget(), device: torch.device | None = None):
        super().__init__(budget)
        self.device = device or torch.device("cuda")
        self.cache_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size
        # Writing twice the L2 evicts whatever the previous sample left there.
        self._flush_buffer = torch.empty(2 * self.cache_bytes // 4, dtype=torch.int32, device=self.device)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def _events_ms(self, run: Callable[[], None], calls_per_run: int, idle_start: bool = False) -> float:
        """idle_start: wait for the flush before starting the clock, so the calls' host work
        cannot hide behind it (an eager pass of a few cheap calls launched from Python while
        the GPU still flushed looked as fast as their GPU time, whatever they cost the host)."""
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._flush_buffer.zero_()
        if idle_start:
            self.sync()
        begin.record()
        run()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / calls_per_run

    def _eager_sampler(self, calls, host: list[float]):
        def eager_pass() -> None:  # from an idle GPU, a few calls: no launch waits for the queue
            start = time.perf_counter()
            for call in calls:
                call()
            host.append((time.perf_counter() - start) * 1e3 / len(calls))
        return lambda: self._events_ms(eager_pass, len(calls), idle_start=True)

    def _graph_sampler(self, calls, keep):
        try:
            graph = self._capture(calls)
        except Exception as e:  # capture refused: the kernel is not graph-safe
            self.sync()  # surfaces a sticky CUDA error to the caller
            return None, describe(e)
        keep.append(graph)
        return (lambda: self._events_ms(graph.replay, len(calls))), None

    def _capture(self, calls) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # libraries set up workspaces outside capture
            for call in calls:
                call()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Each graph keeps its own memory pool (the default) while the graphs of a
        # workload stay alive together for the interleaved samples.
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        graph.replay()
        self.sync()
        return graph


def timer_name(device: torch.device) -> str:
    return CudaHarness.name if device.type == "cuda" else CpuHarness.name


# A kernel's CPU time can depend on where its buffers happen to lie: Inductor's fused RMSNorm + add
# at 49 x 8192 ran near 120 or near 175 us from one timing task to the next, each with newly
# allocated inputs, while torch's stayed at 150-165 (docs/benchmark-log.md §10.13); a tune that saw the fast
# mode chose it, and a server could get the slow one. So on CPU a workload is timed in this many
# rounds, each on inputs placed anew, and a kernel counts at its slowest (measure.run_timing).
CPU_PLACEMENTS = 2


def make_harness(device: torch.device, budget: Budget | None = None) -> Harness:
    budget = budget or Budget()
    return CudaHarness(budget, device) if device.type == "cuda" else CpuHarness(budget, CPU_PLACEMENTS)
