"""Measurement tasks, run inside the worker process.

A ParityTask runs one kernel once on fresh random inputs against the fp32
reference (its first call is the jit time). A FirstCallTask makes that first call
alone, unchecked: a compile made ahead (lzsolve/measure/ahead.py). A TimingTask times every
parity-admitted kernel of one workload together, interleaved on shared input
sets. Both return plain data (the tuner adds provenance) and mark the result
`fatal` when the CUDA context is broken afterwards (an illegal memory access
poisons the whole process), or `restart` after a failed CUDA-graph capture
(which can leave the process's default CUDA generator unusable), so the worker
is replaced before the next task.
"""
from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lzsolve.measure.env import Sensor, combine, contention
from lzsolve.measure.gates import parity_gate, reason_for
from lzsolve.measure.harness import MODES, Harness, Measurement, describe, rotation_sets, slowest
from lzsolve.ops import CONTRACTS, to_fp32
from lzsolve.store.perfdb import PLAIN_MODE
from runtime_loader import jit, registry
from runtime_loader.dtypes import DTYPES
from runtime_loader.ops import Signature
from runtime_loader.specs import CRASHED

MAX_THROTTLED_RETRIES = 1


@dataclass(frozen=True)
class ParityTask:
    signature: Signature
    kernel_id: str
    dims: dict
    seed: int  # inputs are drawn from this seed: fresh per task, reproducible from the record


@dataclass(frozen=True)
class FirstCallTask:
    """The kernel's first call on the workload's inputs, and no reference: what warms a cache
    ahead at every workload of a kernel that compiles per shape, where a reference of the larger
    ones would take the GPU from the timing beside it. Never a verdict: the measuring worker still
    checks the kernel there."""
    signature: Signature
    kernel_id: str
    dims: dict
    seed: int


@dataclass(frozen=True)
class TimingTask:
    signature: Signature
    kernel_ids: tuple[str, ...]
    dims: dict
    seed: int
    modes: tuple[str, ...] = MODES  # probes and validation time the table's mode alone


@dataclass(frozen=True)
class CeilingTask:
    """Measure what the device achieves on a dense matmul and a large copy in `dtype`."""
    dtype: str


Task = ParityTask | FirstCallTask | TimingTask | CeilingTask  # what a worker runs (run_task)


# The compute probe: an n x n x n matmul on random data (power draw and so the clocks depend on the
# data: zeros would flatter it), past the plateau on an H100 (8192^3 bf16 runs ~1.5 ms); on a CPU past
# the per-call overhead (2 cores: ~120 GFLOP/s fp32, ~15 bf16) while the probe stays around a second.
MATMUL_N = {"cuda": 8192, "cpu": 512}
# The memory probe copies one buffer into another, each this many times the last-level cache (the
# harness's cache_bytes: the L2 on CUDA) and at least COPY_MIN_BYTES, so that neither fits in the
# cache, nor do the L2 lines the harness's flush leaves dirty weigh on it (at most 1/8 of a copy's
# reads), and one call is long enough that its launch is noise in eager mode (1 GiB: ~0.5 ms of
# read + write on an H200). COPY_FREE_SHARE of the device's free memory bounds the two buffers.
COPY_CACHES = {"cuda": 8, "cpu": 1}
COPY_MIN_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
COPY_WANTED_BYTES = {"cuda": 1 << 30, "cpu": 32 << 20}
COPY_FREE_SHARE = 0.25
COPY_PROBE_LIKE = "copy % by %"  # (SQL LIKE) the memory probe's name since it names its copy: older ones are measured again


def ceiling_sizes(device_type: str, cache_bytes: int, free_bytes: int | None) -> tuple[int, int | None]:
    """(n of the matmul probe, bytes of each of the copy probe's two buffers): the larger of
    COPY_WANTED_BYTES and COPY_CACHES x the cache, bounded by COPY_FREE_SHARE of the free memory
    (None: unknown, unbounded), in whole MiB; None where that is under COPY_MIN_BYTES or under
    COPY_CACHES x the cache (no copy past the cache fits: no memory ceiling, rather than one the
    cache inflates)."""
    floor = max(COPY_MIN_BYTES[device_type], COPY_CACHES[device_type] * cache_bytes)
    wanted = max(COPY_WANTED_BYTES[device_type], floor)
    if free_bytes is not None:
        wanted = min(wanted, int(COPY_FREE_SHARE * free_bytes))
    wanted = wanted >> 20 << 20
    return MATMUL_N[device_type], (wanted if wanted >= floor else None)


def tensor_bytes(args: tuple) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def cuda_error(device: torch.device) -> str | None:
    """The sticky CUDA error left in this process, if any."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        return None
    except Exception as e:
        return describe(e)


def rejected(stage: str, code: str, message: str, **fields) -> dict:
    return {"stage": stage, "reason_code": code, "reason_message": message, **fields}


def needs_restart(result: dict) -> bool:
    return bool(result.get("fatal") or result.get("restart"))


def _failure(stage: str, e: BaseException, device: torch.device, **fields) -> dict:
    broken = cuda_error(device)
    if broken:
        return rejected(stage, CRASHED, f"{describe(e)}; CUDA context lost: {broken}", fatal=True, **fields)
    reason = reason_for(e)
    return rejected(stage, reason.code, reason.message, **fields)


# The last workload's fp32 reference: the kernels of one workload are gated on the same inputs
# (one seed), so the reference is computed once per workload, not once per kernel.
_last_reference: dict[tuple, object] = {}


def _reference(task: ParityTask, contract, args: tuple):
    key = (task.signature, tuple(sorted(task.dims.items())), task.seed)
    if key not in _last_reference:
        _last_reference.clear()  # first: never hold two references at once
        _last_reference[key] = contract.reference(*to_fp32(args))
    return _last_reference[key]


# A first call faster than this compiled nothing (a cache hit, or no JIT): the caches are not walked.
JIT_FLOOR_MS = 20.0
# File times come from a coarse kernel clock: look this far back from the first call's start.
MTIME_SLACK_S = 0.05


def run_parity(task: ParityTask, device: torch.device, harness: Harness) -> dict:
    """The kernel's first call on the workload, checked against the reference. For a kernel that
    keeps a JIT cache, the cache files that first call wrote (jit_files, JSON), so the artifact
    packs the entries of the kernels its table chose."""
    sig = task.signature
    contract = CONTRACTS[sig.op]
    spec = registry.get(task.kernel_id)
    try:
        args = contract.make_inputs(sig, task.dims, device, torch.Generator(device=device).manual_seed(task.seed))
        reference = _reference(task, contract, args)
    except Exception as e:  # the inputs or the reference do not fit at this shape: no kernel can be judged
        return _failure("parity", e, device)
    started = time.time() - MTIME_SLACK_S
    parity = parity_gate(contract, spec, sig, args, harness, reference)
    result = {**first_call_fields(spec, parity.first_call_ms, started), **parity.errors}
    if spec.setup_ms is not None and parity.first_call_ms is not None:
        result["setup_ms"] = spec.setup_ms(*args)
    if parity.reason is None:
        return {"stage": "parity", **result}
    broken = cuda_error(device)
    if broken:
        return rejected("parity", CRASHED, f"{parity.reason.message}; CUDA context lost: {broken}",
                        fatal=True, **result)
    return rejected("parity", parity.reason.code, parity.reason.message, **result)


# The cache files each kernel's first calls in this process wrote, per folder the caches point at. A
# kernel compiled here before (a searched configuration, by its trial; a family's kernel, by its
# default configuration's trial: registry.plain_id) makes its next first calls at once, which write
# nothing: they name these, so that the grid's records say what the kernel needs as the trial's would have.
_COMPILED: dict[tuple, set[str]] = {}


def first_call_fields(spec, first_ms: float | None, started: float) -> dict:
    """jit_ms, and for a kernel that keeps a JIT cache, the cache files its first calls in this
    process (this one begun at `started`) wrote (jit_files, JSON; an empty list where a slow first call
    found none of them: it loaded what another kernel compiled): the artifact packs the entries of
    the kernels its table chose."""
    fields = {"jit_ms": first_ms}
    if spec.jit_caches:
        slow = (first_ms or 0) >= JIT_FLOOR_MS
        roots = tuple(os.environ.get(jit.JIT_CACHES[kind], "") for kind in spec.jit_caches)
        compiled = _COMPILED.setdefault((registry.plain_id(spec.kernel_id), roots), set())
        compiled.update(jit.written_since(spec.jit_caches, started) if slow else ())
        if slow or compiled:
            fields["jit_files"] = json.dumps(sorted(compiled))
    return fields


def run_first_call(task: FirstCallTask, device: torch.device, harness: Harness) -> dict:
    """The first call's time and the cache files it wrote, as run_parity records them."""
    spec = registry.get(task.kernel_id)
    try:
        args = CONTRACTS[task.signature.op].make_inputs(task.signature, task.dims, device,
                                                        torch.Generator(device=device).manual_seed(task.seed))
        started = time.time() - MTIME_SLACK_S
        _, first_ms = harness.first_call(lambda: spec.impl(*args))
    except Exception as e:  # the measuring worker meets the same failure and records its Reason
        return _failure("compile", e, device)
    return {"stage": "compile", **first_call_fields(spec, first_ms, started)}


def timing_fields(m: Measurement, device: torch.device) -> dict:
    fields = {"stage": "bench"}
    for prefix, t in (("eager", m.eager), ("graph", m.graph)):
        if t is not None:
            fields |= {f"{prefix}_ms": t.median_ms, f"{prefix}_p95_ms": t.p95_ms, f"{prefix}_min_ms": t.min_ms,
                       f"{prefix}_samples": t.samples, f"{prefix}_spread": t.spread}
    if m.host_ms is not None:
        fields["host_ms"] = m.host_ms
    if device.type == "cuda" and m.graph_tried:
        fields |= {"graph_safe": m.graph is not None, "graph_error": m.graph_error}
    return fields


def run_timing(task: TimingTask, device: torch.device, harness: Harness, sensor: Sensor) -> dict:
    """{'per_kernel': {kernel_id: fields}}, or one rejection when the whole task failed."""
    sig = task.signature
    contract = CONTRACTS[sig.op]
    gen = torch.Generator(device=device).manual_seed(task.seed)
    rounds, held = [], []  # the inputs of earlier rounds stay allocated, so each round's lie elsewhere
    try:
        for placement in range(harness.placements):
            first = contract.make_inputs(sig, task.dims, device, gen)
            sets = rotation_sets(tensor_bytes(first), harness.cache_bytes, harness.budget)
            inputs = [first] + [contract.make_inputs(sig, task.dims, device, gen) for _ in range(sets - 1)]
            held.append(inputs)
            order = task.kernel_ids if placement % 2 == 0 else task.kernel_ids[::-1]
            candidates = {k: [functools.partial(registry.get(k).impl, *a) for a in inputs] for k in order}
            for _ in range(1 + MAX_THROTTLED_RETRIES):  # re-measure (bounded) when clocks were held down
                before = sensor.read()
                results = harness.measure(candidates, task.modes)
                env = combine(before, sensor.read())
                if not env["throttled"]:
                    break
            rounds.append(results)
        env |= contention(sensor)
    except Exception as e:
        return _failure("bench", e, device)
    del held
    per_kernel = {}
    for kernel_id in task.kernel_ids:
        failed = [r[kernel_id] for r in rounds if isinstance(r[kernel_id], Exception)]
        m = failed[0] if failed else slowest([r[kernel_id] for r in rounds])
        if isinstance(m, Exception):
            reason = reason_for(m)
            per_kernel[kernel_id] = rejected("bench", reason.code, reason.message)
        else:
            per_kernel[kernel_id] = {**timing_fields(m, device), "rotation_sets": m.sets, **env}
    failed_capture = any(f.get("graph_safe") is False for f in per_kernel.values())
    return {"per_kernel": per_kernel, "restart": failed_capture}


def free_memory(device: torch.device) -> int | None:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def run_ceilings(task: CeilingTask, device: torch.device, harness: Harness) -> dict:
    """{'ceilings': [{kind, mode, per_s, probe, spread}, ...]}: rates from the median times, timed by
    the harness as the kernels are (interleaved, in both modes, the cache flushed before each sample).
    compute: F.linear of two random n x n matrices (the (n, k) weight layout of the model's own
    linears; bf16 torch.mm on CPU takes a slow path), 2 n^3 FLOPs. memory: a buffer copied into
    another (ceiling_sizes), bytes read + bytes written, by the faster of two copies per mode: the
    runtime's memcpy (copy_), which a CUDA graph replays as a memcpy node that may run on a copy
    engine slower than the SMs, and an elementwise kernel (neg) reading and writing as much: a
    ceiling below what a plain copy reaches would put kernels past 1.0 of the roofline. On a GPU, then
    the rows torch's own forms of the same tensors give, timed apart (plain_ceilings)."""
    n, copy_bytes = ceiling_sizes(device.type, harness.cache_bytes, free_memory(device))
    dtype = DTYPES[task.dtype]
    src = dst = None
    try:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        candidates = {"compute": [lambda: F.linear(a, b)]}
        if copy_bytes:
            src = torch.randn(copy_bytes // a.element_size(), device=device, dtype=dtype)
            dst = torch.empty_like(src)
            candidates |= {"memcpy": [lambda: dst.copy_(src)], "elementwise": [lambda: torch.neg(src, out=dst)]}
        results = harness.measure(candidates)
    except Exception as e:
        return _failure("bench", e, device)
    rates = []
    for name, m in results.items():
        if isinstance(m, Exception):
            continue
        kind, amount, probe = (("compute", 2.0 * n ** 3, f"matmul {n}x{n}x{n} {task.dtype}") if name == "compute" else
                               ("memory", 2.0 * copy_bytes,
                                f"copy {copy_bytes >> 20} MiB {task.dtype} by {name} (read + write)"))
        for mode, t in (("eager", m.eager), ("graph", m.graph)):
            if t is not None and t.median_ms > 0:
                rates.append({"kind": kind, "mode": mode, "per_s": amount / (t.median_ms * 1e-3), "probe": probe,
                              "spread": t.spread})
    fastest = {}
    for row in rates:  # per kind and mode, the fastest probe
        key = (row["kind"], row["mode"])
        if key not in fastest or row["per_s"] > fastest[key]["per_s"]:
            fastest[key] = row
    return {"ceilings": list(fastest.values()) + plain_ceilings(a, b, src, dst)}


PLAIN_BURST_MS = 5  # do_bench's run: the tune samples every candidate, the probe too, in bursts this short
# The check keeps each form's best of this many bursts: do_bench launches one call between two events, so a
# host stall in a burst of three 1.4 ms matmuls reads as a slower GPU (an H100 read 732 TFLOP/s while other
# work landed on its host, 797 in the same machine's two tunes after it; benchmarks/runs/2026-12-07-f.txt)
PLAIN_BURSTS = 3
PLAIN_FORMS = {"compute": ("mm", "linear"), "memory": ("copy",)}  # a ceiling's plain forms: the fastest counts


def plain_rates(a: torch.Tensor, b: torch.Tensor, src: torch.Tensor | None, dst: torch.Tensor | None,
                runs_ms: tuple[int, ...] = (PLAIN_BURST_MS,)) -> dict[int, dict[str, float]]:
    """{run ms: {form: per second}} of torch's own forms of the probes, timed by Triton's do_bench
    (median, its cache flush before each call), not by the tuner's harness: `mm` (a @ b), `linear`
    (a @ b.T, the probe's layout, which cuBLAS may run faster) of the n x n matrices a and b (2 n^3
    FLOPs) and `copy` (dst.copy_(src): read + written). A matmul's rate falls with the length of the
    run (power limits: an H100 read 780 TFLOP/s over 5 ms and 679 over 1 s), so each is timed over
    every length of `runs_ms`."""
    from triton.testing import do_bench

    n = a.shape[0]
    work = {"mm": (2.0 * n ** 3, lambda: torch.mm(a, b)), "linear": (2.0 * n ** 3, lambda: F.linear(a, b))}
    if src is not None:
        work["copy"] = (2.0 * src.numel() * src.element_size(), lambda: dst.copy_(src))
    return {ms: {form: amount / (do_bench(fn, warmup=25, rep=ms, return_mode="median") * 1e-3)
                 for form, (amount, fn) in work.items()} for ms in runs_ms}


def plain_ceilings(a: torch.Tensor, b: torch.Tensor, src: torch.Tensor | None, dst: torch.Tensor | None) -> list[dict]:
    """Ceilings rows of mode PLAIN_MODE on a GPU, of the probe's own tensors: torch's own forms, each
    at its best of PLAIN_BURSTS bursts of PLAIN_BURST_MS, so that a report can say how far the probe's
    ceilings are from them (issue 58's bar: 5%). None on a CPU (do_bench times CUDA events) or where
    timing them fails: the probe's rows stand alone."""
    if a.device.type != "cuda":
        return []
    try:
        bursts = [plain_rates(a, b, src, dst)[PLAIN_BURST_MS] for _ in range(PLAIN_BURSTS)]
    except Exception:  # noqa: BLE001 - a check of the ceilings, never a reason to lose them
        return []
    rates = {form: max(burst[form] for burst in bursts) for form in bursts[0]}
    return [{"kind": kind, "mode": PLAIN_MODE, "per_s": max(rates[f] for f in forms), "spread": None,
             "probe": f"torch {' / '.join(forms)} by triton.testing.do_bench, best of {PLAIN_BURSTS} x "
                      f"{PLAIN_BURST_MS} ms"}
            for kind, forms in PLAIN_FORMS.items() if all(f in rates for f in forms)]


def run_task(task: Task, device: torch.device, harness: Harness, sensor: Sensor) -> dict:
    if isinstance(task, ParityTask):
        return run_parity(task, device, harness)
    if isinstance(task, FirstCallTask):
        return run_first_call(task, device, harness)
    if isinstance(task, CeilingTask):
        return run_ceilings(task, device, harness)
    return run_timing(task, device, harness, sensor)
