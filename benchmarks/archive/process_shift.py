"""Do kernels of a few µs time alike in fresh processes? (issue 16, benchmark log §15.6-15.7)

Two tunes of the same model on the same GPU and clocks disagree at 6% of their decisive buckets,
all of them kernels of about 2 µs (SwiGLU, RMSNorm, RoPE...): in one run every Triton SwiGLU
configuration took 1.87-2.04 µs at 1-9 tokens, in the other 1.56-1.69 µs. This script times such
kernels in PROCESSES fresh processes one after the other on one device, each kernel checked
against its op's reference first, then timed interleaved by lzsolve's harness (graph replay on
CUDA, as a tune), ROUNDS times per process. Per (kernel, shape) it prints each process's median
and the spread across processes against the spread within one; a shift shared by a family in
one process (every Triton kernel slower in process 2, say) is the tunes' disagreement reproduced.

`--variants` times instead a few of those kernels in each process by hand-built graphs, to tell
where a slow process's extra time goes (benchmark log §15.9: +5-9 µs per sample, Triton, Liger,
FlashInfer and Inductor kernels alike, torch's own not):
- first 1: the harness's sample (the L2 flushed, then a graph of one call replayed);
- second 1: the same graph replayed again right after (its code now cached, its data too);
- first 32 / second 32: the same with a graph of 32 calls, per call.
If "first" shifts by process and "second" does not, the shift is what a kernel's first run after
the flush pays, once per sample.

    python benchmarks/archive/process_shift.py [--processes 4] [--rounds 3] [--variants] [--device cuda] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for checked_timing (this script is in archive/)
from checked_timing import agreeing, write_figures

from lzsolve.measure.harness import Budget, make_harness
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature
from runtime_loader.specs import config_id

# the signatures whose buckets differed between §15.6's and §15.7's tunes, at their small sizes;
# every admitted kernel of the op, and the Triton configurations those tunes chose
CASES = [("act.swiglu", {"width": 3584}, (1, 4, 16), [config_id("triton.swiglu", {"block": b, "warps": 8})
                                                      for b in (512, 2048)]),
         ("norm.rms", {"hidden": 8192}, (1, 16, 64), [config_id("triton.rms_norm", {"block": 8192, "warps": 16})]),
         ("norm.rms_add", {"hidden": 8192}, (1, 16), [])]


def one_process(device: torch.device, rounds: int) -> dict[str, list[float]]:
    """{"kernel @ op tokens [mode]": [median µs per round]} in this process, graph replay and
    eager; kernels that disagree with the reference or fail are left out (their errors printed)."""
    harness = make_harness(device, Budget(min_samples=10, max_samples=40))
    gen, here, out = torch.Generator(device=device).manual_seed(0), device_info(device), {}
    for op, static, token_counts, configs in CASES:
        sig = Signature.make(op, static, (), "bf16")
        specs = [s for s in registry.candidates(op) + [registry.get(c) for c in configs] if not s.check(sig, here)]
        specs = list({s.kernel_id: s for s in specs}.values())
        for tokens in token_counts:
            inputs = CONTRACTS[op].make_inputs(sig, {"tokens": tokens}, device, gen)
            agreed, errors = agreeing(op, sig, specs, inputs)
            for kernel_id, message in errors.items():
                print(f"  {kernel_id} at {op} {tokens}: {message}", file=sys.stderr)
            calls = {s.kernel_id: [lambda impl=s.impl: impl(*inputs)] for s in agreed}
            for _ in range(rounds):  # both modes: a shift in graph replay is the GPU's, in eager the host's too
                for kernel_id, m in harness.measure(calls).items():
                    for mode in ("graph", "eager"):
                        timing = None if isinstance(m, Exception) else getattr(m, mode)
                        if timing:
                            out.setdefault(f"{kernel_id} @ {op} {tokens} [{mode}]", []).append(timing.median_ms * 1e3)
    return out


# (op, static dims, tokens, kernel ids): Triton, torch's own and FlashInfer kernels of a few µs
VARIANT_CASES = [("norm.rms", {"hidden": 8192}, 1, ["triton.rms_norm", "torch.rms_norm"]),
                 ("act.swiglu", {"width": 3584}, 16, ["triton.swiglu", "eager.swiglu", "flashinfer.swiglu"])]


def replays_us(graph, samples: int = 300) -> tuple[float, float]:
    """Median µs of the first and of the second replay of `graph` after an L2 flush."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, dtype=torch.int32,
                        device="cuda")
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    first, second = [], []
    for _ in range(samples):
        flush.zero_()  # the host queues what follows while the GPU flushes: no launch latency in the times
        events[0].record()
        graph.replay()
        events[1].record()
        graph.replay()
        events[2].record()
        events[2].synchronize()
        first.append(events[0].elapsed_time(events[1]) * 1e3)
        second.append(events[1].elapsed_time(events[2]) * 1e3)
    return statistics.median(first), statistics.median(second)


def captured(calls: list) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # workspaces set up outside capture, as the harness does
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()
    return graph


def variants(device: torch.device) -> dict[str, list[float]]:
    """{"kernel @ op tokens [variant]": [µs]} for VARIANT_CASES (see the module's docstring)."""
    gen, here, out = torch.Generator(device=device).manual_seed(0), device_info(device), {}
    for op, static, tokens, kernel_ids in VARIANT_CASES:
        sig = Signature.make(op, static, (), "bf16")
        specs = [s for s in map(registry.get, kernel_ids) if not s.check(sig, here)]
        inputs = CONTRACTS[op].make_inputs(sig, {"tokens": tokens}, device, gen)
        agreed, errors = agreeing(op, sig, specs, inputs)
        for kernel_id, message in errors.items():
            print(f"  {kernel_id}: {message}", file=sys.stderr)
        for spec in agreed:
            for calls in (1, 32):
                first, second = replays_us(captured([lambda impl=spec.impl: impl(*inputs)] * calls))
                out[f"{spec.kernel_id} @ {op} {tokens} [first {calls}]"] = [first / calls]
                out[f"{spec.kernel_id} @ {op} {tokens} [second {calls}]"] = [second / calls]
    return out


def summary(processes: list[dict[str, list[float]]]) -> list[dict]:
    """Per (kernel, shape): each process's median, and the spread across processes (max / min of
    the medians) beside the largest spread within one process (max / min of its rounds)."""
    rows = []
    for key in sorted(set().union(*processes)):
        runs = [p[key] for p in processes if key in p]
        medians = [statistics.median(r) for r in runs]
        rows.append({"kernel": key, "medians_us": medians, "across": max(medians) / min(medians),
                     "within": max(max(r) / min(r) for r in runs)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", action="store_true", help="where a slow process's time goes (see above)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a process's figures go to this file
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.variants and device.type != "cuda":
        parser.error("--variants times CUDA graphs: give a CUDA --device")
    if args.child:
        figures = variants(device) if args.variants else one_process(device, args.rounds)
        Path(args.child).write_text(json.dumps(figures))
        return
    processes = []
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.processes):
            figures = Path(folder) / f"{n}.json"
            subprocess.run([sys.executable, __file__, "--device", args.device, "--rounds", str(args.rounds),
                            "--child", str(figures)] + ["--variants"] * args.variants, check=True)
            processes.append(json.loads(figures.read_text()))
    rows = summary(processes)
    for row in rows:
        print(f"{row['kernel']:64} " + " ".join(f"{m:7.2f}" for m in row["medians_us"])
              + f"   across {row['across']:.3f}  within {row['within']:.3f}")
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
