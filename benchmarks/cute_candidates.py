"""FlashAttention-4, QuACK and a newer FlashInfer beside the candidates of today (issue 58), on a GPU.

Each workload (an op signature at one shape) goes through what a tune does with it, in this process:
every registered kernel of the op (those matching --kernels) is gated by its capabilities on this
device, then checked against the fp32 reference on random inputs (lzsolve.measure.tasks.run_parity: a
kernel that disagrees is reported with its Reason and never timed), then the admitted ones are timed
interleaved by the tuner's harness (run_timing: both modes, L2 flushed per sample). Ratios are the
op's fallback (PyTorch's default) over each kernel, per mode. The workloads: llama3-70b TP8's
attention at prefill 1x2048 and decode 64x4096, DeepSeek-V2-Lite's MLA attention (q/k 192, v 128) at
prefill 1x2048 and decode 8x4096, and RMSNorm with and without the residual add at hidden 8192 from
1 to 16384 tokens. --kernels also takes a tunable family's configurations by their ids, to time them
beside its default. Needs no PerfDB (nor DuckDB): `device.sh cute run` carries only the CuTe DSL.

    python benchmarks/cute_candidates.py --json cute.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import re

import torch

from lzsolve.measure.env import Sensor
from lzsolve.measure.harness import make_harness
from lzsolve.measure.tasks import ParityTask, TimingTask, run_parity, run_timing
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import OPS, Signature

TP8 = {"hq": 8, "hkv": 1, "d": 128}  # llama3-70b's attention on one of 8 ranks
MLA = {"hq": 16, "hkv": 16, "d": 192, "dv": 128}  # DeepSeek-V2-Lite's, as its patched model calls it
WORKLOADS = [  # (op, static, flags, dims)
    ("attention.prefill", TP8, ("causal",), {"batch": 1, "seq": 2048}),
    ("attention.decode", TP8, (), {"batch": 64, "kv_len": 4096}),
    ("attention.prefill", MLA, ("causal",), {"batch": 1, "seq": 2048}),
    ("attention.decode", MLA, (), {"batch": 8, "kv_len": 4096}),
    *(("norm.rms", {"hidden": 8192}, (), {"tokens": t}) for t in (1, 64, 2048, 16384)),
    *(("norm.rms_add", {"hidden": 8192}, ("keep_inputs",), {"tokens": t}) for t in (1, 64, 2048, 16384)),
]
DEFAULT_KERNELS = "fa4.*,quack.*,fa3.*,sdpa.*,flex.*,flashinfer.*,eager.*,torch.*,triton.rms_norm,triton.rms_norm_add,liger.*"


def kernel_patterns(text: str) -> list[str]:
    """--kernels' items: split at the commas outside a configuration's brackets."""
    return re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)


def candidates(op: str, patterns: list[str]) -> list[str]:
    """The registered kernels of `op` matching the patterns, and the configurations of its tunable
    families named exactly ('triton.rms_norm[block=4096,warps=8]'), its fallback always among them."""
    ids = [k for k, spec in registry.REGISTRY.items() if op in spec.ops and any(fnmatch.fnmatch(k, p) for p in patterns)]
    configs = [p for p in patterns if "[" in p and registry.known(p) and op in registry.get(p).ops]
    return sorted(set(ids) | {registry.plain_id(c) for c in configs} | {OPS[op].fallback})


def workload(op, static, flags, dims, patterns, device, harness, sensor, seed) -> dict:
    sig = Signature.make(op, static, flags, "bf16")
    here = device_info(device)
    row = {"signature": str(sig), "dims": dims, "refused": {}, "rejected": {}, "timed": {}}
    admitted = []
    for kernel_id in candidates(op, patterns):
        reasons = registry.get(kernel_id).check(sig, here)
        if reasons:
            row["refused"][kernel_id] = ", ".join(r.code for r in reasons)
            continue
        parity = run_parity(ParityTask(sig, kernel_id, dims, seed), device, harness)
        if parity.get("reason_code"):
            row["rejected"][kernel_id] = f"{parity['reason_code']}: {parity.get('reason_message', '')}"[:300]
        else:
            admitted.append(kernel_id)
    timing = run_timing(TimingTask(sig, tuple(admitted), dims, seed + 1), device, harness, sensor) if admitted else {}
    for kernel_id, fields in timing.get("per_kernel", {}).items():
        if fields.get("reason_code"):
            row["rejected"][kernel_id] = f"{fields['reason_code']}: {fields.get('reason_message', '')}"[:300]
        else:
            row["timed"][kernel_id] = {mode: fields.get(f"{mode}_ms") for mode in ("graph", "eager")}
    fallback = row["timed"].get(OPS[op].fallback, {})
    for times in row["timed"].values():
        times["vs_fallback"] = {mode: fallback[mode] / times[mode] if fallback.get(mode) and times[mode] else None
                                for mode in ("graph", "eager")}
    return row


def print_row(row: dict) -> None:
    print(f"{row['signature']} {row['dims']}")
    for kernel_id, t in sorted(row["timed"].items(), key=lambda kv: kv[1]["graph"] or float("inf")):
        ratios = "  ".join(f"{m} {t[m] * 1e3:9.1f} us ({t['vs_fallback'][m]:.2f}x)" if t[m] and t["vs_fallback"][m]
                           else f"{m} -" for m in ("graph", "eager"))
        print(f"  {kernel_id:<40} {ratios}")
    for kernel_id, why in sorted(row["rejected"].items()):
        print(f"  {kernel_id:<40} rejected: {why}")
    for kernel_id, why in row["refused"].items():  # a library that is missing or fails to import
        if "NOT_INSTALLED" in why or "BACKEND_IMPORT_FAILED" in why:
            print(f"  {kernel_id:<40} refused: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=DEFAULT_KERNELS, help="kernel id globs, comma separated")
    parser.add_argument("--ops", help="only the workloads of these ops, comma separated (default: all)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (the CuTe kernels are refused)")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    harness, sensor = make_harness(device), Sensor.for_device(device)
    patterns = kernel_patterns(args.kernels)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}")
    libraries = ("fa4.attention", "quack.rms_norm", "flashinfer.prefill")
    versions = {k: registry.get(k).version() for k in libraries if not registry.get(k).installed()}
    print(f"installed: {', '.join(f'{k} {v}' for k, v in versions.items()) or 'none of ' + ', '.join(libraries)}")
    rows = []
    for n, (op, static, flags, dims) in enumerate(WORKLOADS):
        if args.ops and op not in args.ops.split(","):
            continue
        rows.append(workload(op, static, flags, dims, patterns, device, harness, sensor, seed=1000 + 10 * n))
        print_row(rows[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": dt.datetime.now(dt.timezone.utc).isoformat(), "device": name,
                       "torch": torch.__version__, "versions": versions, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
