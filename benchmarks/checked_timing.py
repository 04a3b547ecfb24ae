"""What the kernel benchmarks share: every kernel checked against its op's fp32 reference on the
inputs it is then timed on, the ones that agree timed interleaved by lzsolve's harness (graph
replay on CUDA), the others reported with why; and the JSON their figures are written to. Imported by the scripts beside it (run as
`python benchmarks/<script>.py`, which puts this folder on the path)."""
from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import torch

from lzsolve.ops import CONTRACTS, compare, to_fp32


def interleaved(names, round_: int) -> list:
    """`names` in round `round_`'s own seeded shuffle, the order a benchmark times its variants in, round
    after round: a host that drifts shifts every one alike, and none always runs after the same one
    (in a rotating order the unpatched model always ran after the compiled variants, 7-10% slower than
    itself in another place: Gemma 2's prefill in benchmarks/runs/2026-12-06-i.txt)."""
    names = list(names)
    return random.Random(round_).sample(names, len(names))


def agreeing(op: str, sig, kernels, inputs: tuple) -> tuple[list, dict]:
    """The kernels of `kernels` (specs) whose output on `inputs` agrees with the op's fp32 reference,
    and {kernel id: why} for the others."""
    contract = CONTRACTS[op]
    reference = contract.reference(*to_fp32(inputs))
    consumed = contract.schema.consumed(inputs)
    agreed, errors = [], {}
    for spec in kernels:
        # a kernel that may overwrite its inputs (FlashInfer's in-place add + RMSNorm) gets its own copy
        # of them, so that the kernels after it are checked on the inputs the reference saw
        args = tuple(a.clone() if i in consumed and isinstance(a, torch.Tensor) else a for i, a in enumerate(inputs))
        try:
            ok, _, message = compare(spec.impl(*args), reference, contract.tolerances[sig.dtype])
        except Exception as e:  # noqa: BLE001 - a kernel that cannot run here is reported, not timed
            ok, message = False, f"{type(e).__name__}: {str(e)[:120]}"
        if ok:
            agreed.append(spec)
        else:
            errors[spec.kernel_id] = message
    return agreed, errors


def timed(harness, calls: dict) -> dict:
    """{name: median us of the call, None where it failed}, the calls timed interleaved."""
    us = {}
    for name, m in harness.measure(calls).items():
        timing = None if isinstance(m, Exception) else (m.graph or m.eager)
        us[name] = timing.median_ms * 1e3 if timing else None
    return us


def checked(op: str, sig, dims, kernels, device, gen, harness, extra: dict | None = None) -> dict:
    """Each kernel of `kernels` (specs) checked on fresh inputs of `sig` at `dims`, then every one that
    agrees (and `extra`, calls of another op to compare with) timed interleaved:
    {"us": {name: median us, None where it failed}, "errors": {kernel id: why it was not timed}}."""
    inputs = CONTRACTS[op].make_inputs(sig, dims, device, gen)
    agreed, errors = agreeing(op, sig, kernels, inputs)
    calls = {**(extra or {}), **{spec.kernel_id: [lambda impl=spec.impl: impl(*inputs)] for spec in agreed}}
    return {"us": timed(harness, calls), "errors": errors}


def write_figures(path: str, device, rows: list) -> None:
    """The figures as JSON with the device, torch version and date they were measured on."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    Path(path).write_text(json.dumps({"device": name, "torch": torch.__version__, "date": str(dt.date.today()),
                                      "rows": rows}, indent=1))
