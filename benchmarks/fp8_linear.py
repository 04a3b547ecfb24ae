"""FP8 linears (issue 18): every linear.fp8 kernel against bf16 cuBLAS on llama3-70b TP8's projections.

The four projections of llama3-70b at TP8 (q/k/v as one GEMM, o_proj, gate/up as one, down_proj)
and its lm_head, at 1 to 16384 tokens: each linear.fp8 kernel admitted here (per-channel weight
scales, activations quantised per token inside the timed call, as a server pays it) is checked
against the op's fp32 reference first, then timed interleaved with torch.linear in bf16 on the
same shape by lzsolve's harness (graph replay on CUDA, median us). The ratio is bf16 / fp8.

    python benchmarks/fp8_linear.py [--json out.json]
    python benchmarks/fp8_linear.py --device cpu --tiny   # a smoke test of the script
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from lzsolve.bench import Budget, make_harness
from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature

SHAPES = {"qkv_proj": (8192, 1280), "o_proj": (1024, 8192), "gate_up_proj": (8192, 7168), "down_proj": (3584, 8192),
          "lm_head": (8192, 16032)}  # (k, n) per rank
TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small shapes (a smoke test)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    device = torch.device(args.device)
    harness = make_harness(device, Budget(min_samples=10, max_samples=40))
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = {"proj": (64, 48)} if args.tiny else SHAPES
    tokens = (1, 33) if args.tiny else TOKENS
    here, rows = device_info(device), []
    for name, (k, n) in shapes.items():
        fp8 = Signature.make("linear.fp8", {"k": k, "n": n}, ("per_channel",), "bf16")
        dense = Signature.make("linear", {"k": k, "n": n}, (), "bf16")
        kernels = [s for s in registry.candidates("linear.fp8") if not s.check(fp8, here)]
        for t in tokens:
            dims = {"tokens": t}
            inputs = CONTRACTS["linear.fp8"].make_inputs(fp8, dims, device, gen)
            reference = CONTRACTS["linear.fp8"].reference(*to_fp32(inputs))
            calls, errors = {}, {}
            for spec in kernels:
                try:
                    ok, _, message = compare(spec.impl(*inputs), reference, CONTRACTS["linear.fp8"].tolerances["bf16"])
                except Exception as e:  # noqa: BLE001 - a kernel that cannot run here is reported, not timed
                    ok, message = False, f"{type(e).__name__}: {str(e)[:160]}"
                if ok:
                    calls[spec.kernel_id] = [lambda impl=spec.impl: impl(*inputs)]
                else:
                    errors[spec.kernel_id] = message
            del reference
            bf16 = CONTRACTS["linear"].make_inputs(dense, dims, device, gen)
            calls["torch.linear (bf16)"] = [lambda: registry.get("torch.linear").impl(*bf16)]
            us = {}
            for kernel_id, m in harness.measure(calls).items():
                timing = None if isinstance(m, Exception) else (m.graph or m.eager)
                us[kernel_id] = timing.median_ms * 1e3 if timing else None
            rows.append({"shape": name, "k": k, "n": n, "tokens": t, "us": us, "errors": errors})
            base = us.get("torch.linear (bf16)")
            print(f"{name:12} k={k:5} n={n:5} tokens={t:5}: " + "  ".join(
                f"{kid}={v:.1f}" + (f" ({base / v:.2f}x)" if base and kid != "torch.linear (bf16)" else "")
                for kid, v in sorted(((k_, v) for k_, v in us.items() if v), key=lambda kv: kv[1])))
            for kernel_id, message in errors.items():
                print(f"    {kernel_id}: {message}")
    if args.json:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        Path(args.json).write_text(json.dumps({"device": name, "torch": torch.__version__,
                                               "date": str(dt.date.today()), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
