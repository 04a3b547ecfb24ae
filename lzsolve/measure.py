"""One measurement task: parity gate, then timing, for one kernel on one workload.

This is what runs inside the worker process. It returns plain data (no
provenance; the tuner adds that), and marks the result `fatal` when the CUDA
context is broken afterwards (an illegal memory access poisons the whole
process), so the worker is replaced before the next task.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from runtime_loader import registry
from runtime_loader.ops import Signature
from runtime_loader.specs import CRASHED

from .bench import Harness, rotation_sets
from .env import Sensor, combine
from .gates import describe, parity_gate, reason_for
from .ops import CONTRACTS

MAX_THROTTLED_RETRIES = 1


@dataclass(frozen=True)
class Task:
    signature: Signature
    kernel_id: str
    dims: dict
    seed: int  # inputs are drawn from this seed: fresh per task, reproducible from the record


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


def timings(prefix: str, t) -> dict:
    if t is None:
        return {}
    return {f"{prefix}_ms": t.median_ms, f"{prefix}_p95_ms": t.p95_ms, f"{prefix}_min_ms": t.min_ms,
            f"{prefix}_samples": t.samples, f"{prefix}_spread": t.spread}


def run_task(task: Task, device: torch.device, harness: Harness, sensor: Sensor) -> dict:
    sig = task.signature
    contract, spec = CONTRACTS[sig.op], registry.get(task.kernel_id)
    gen = torch.Generator(device=device).manual_seed(task.seed)
    args = contract.make_inputs(sig, task.dims, device, gen)
    parity = parity_gate(contract, spec, sig, args, harness)
    result = {"jit_ms": parity.first_call_ms, **parity.errors}
    if parity.reason:
        broken = cuda_error(device)
        if broken:
            return rejected("parity", CRASHED, f"{parity.reason.message}; CUDA context lost: {broken}",
                            fatal=True, **result)
        return rejected("parity", parity.reason.code, parity.reason.message, **result)
    try:
        sets = rotation_sets(tensor_bytes(args), harness.cache_bytes, harness.budget)
        inputs = [args] + [contract.make_inputs(sig, task.dims, device, gen) for _ in range(sets - 1)]
        calls = [functools.partial(spec.impl, *a) for a in inputs]
        for _ in range(1 + MAX_THROTTLED_RETRIES):  # re-measure (bounded) when clocks were held down
            before = sensor.read()
            m = harness.measure(calls)
            env = combine(before, sensor.read())
            if not env["throttled"]:
                break
    except Exception as e:
        broken = cuda_error(device)
        if broken:
            return rejected("bench", CRASHED, f"{describe(e)}; CUDA context lost: {broken}", fatal=True, **result)
        reason = reason_for(e)
        return rejected("bench", reason.code, reason.message, **result)
    return {
        **result,
        "stage": "bench",
        **timings("eager", m.eager),
        **timings("graph", m.graph),
        "graph_safe": None if device.type != "cuda" else m.graph is not None,
        "graph_error": m.graph_error if device.type == "cuda" else None,
        "rotation_sets": sets,
        **env,
    }
