"""FlexAttention compiled per shape (the registered flex.attention) against one graph compiled with
dynamic shapes: what each new shape costs in compile time, and what the kernel costs per call
(issue 16: flex's compile per shape is about half of a device's first calls in a two-GPU tune,
benchmark log §15.7; and a table that chose flex compiles again at every shape a server brings).

Per shape, in one process: the static kernel's first call, the dynamic one's (a recompile shows as
a slow first call and in Dynamo's graph count), then both checked against the op's fp32 reference
and timed interleaved with SDPA's default by lzsolve's harness (graph replay, median µs).

    python benchmarks/archive/flex_shapes.py [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for checked_timing (this script is in archive/)
from checked_timing import checked, write_figures

from lzsolve.measure.harness import make_harness
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.kernels import flex
from runtime_loader.ops import Signature

STATIC = {"hq": 8, "hkv": 1, "d": 128}  # llama3-70b at TP8
# the default grid's points, then shapes off it (§15.7's probes and validation drew such)
PREFILL = [(1, 128), (1, 512), (1, 2048), (2, 512), (8, 2048), (1, 8192),
           (3, 141), (4, 204), (13, 217), (1, 1000), (2, 3000), (5, 777)]
DECODE = [(1, 512), (8, 2048), (32, 8192), (128, 512), (7, 1500), (50, 3333)]

_dynamic_attend = torch.compile(flex.with_own_code(flex._attend), dynamic=True, fullgraph=True)


def dynamic_attention(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    """flex.attention with one compiled graph for every shape (no sinks: llama's attention has none)."""
    scores, visible = flex.mods(causal, window, softcap, q.shape[2], k.shape[2])
    mask = flex.block_mask(visible, q.shape[2], k.shape[2], q.device) if visible else None
    return _dynamic_attend(q, k, v, scores, mask, scale, q.shape[1] != k.shape[1])


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def first_call_s(call) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    device = torch.device("cuda")
    harness, gen = make_harness(device), torch.Generator(device=device).manual_seed(0)
    static = registry.get("flex.attention")
    dynamic = dataclasses.replace(static, kernel_id="flex.attention (dynamic)", impl=dynamic_attention)
    rows = []
    print(f"{'op':8} {'shape':>12} {'static s':>9} {'dynamic s':>9} {'graphs':>6}  µs: sdpa / static / dynamic")
    for op, dim, shapes, flags in (("attention.prefill", "seq", PREFILL, ("causal",)),
                                   ("attention.decode", "kv_len", DECODE, ())):
        sig = Signature.make(op, STATIC, flags, "bf16")
        for batch, length in shapes:
            dims = {"batch": batch, dim: length}
            inputs = CONTRACTS[op].make_inputs(sig, dims, device, gen)
            compile_s = {spec.kernel_id: first_call_s(lambda impl=spec.impl: impl(*inputs)) for spec in (static, dynamic)}
            result = checked(op, sig, dims, [registry.get("sdpa.default"), static, dynamic], device, gen, harness)
            us = result["us"]
            row = {"op": op, "dims": dims, "first_call_s": compile_s, "graphs": graphs(), **result}
            rows.append(row)
            fmt = lambda kernel_id: f"{us[kernel_id]:.1f}" if us.get(kernel_id) else "-"  # noqa: E731
            print(f"{op.split('.')[1]:8} {batch:>4} x {length:<6} {compile_s[static.kernel_id]:9.2f} "
                  f"{compile_s[dynamic.kernel_id]:9.2f} {row['graphs']:6}  "
                  f"{fmt('sdpa.default')} / {fmt(static.kernel_id)} / {fmt(dynamic.kernel_id)}"
                  + (f"  errors: {result['errors']}" if result["errors"] else ""))
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
