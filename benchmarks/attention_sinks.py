"""GPT-OSS's attention with sinks on a GPU: every kernel declaring sinks against the eager form.

GPT-OSS-20B's full-attention layer shapes (64 q heads, 8 kv heads, head dim 64), prefill and
decode. Each kernel that declares `sinks` for this platform is checked against the fp32
reference first, then all are timed interleaved by lzsolve's harness (graph replay on CUDA,
median us). eager.attention is the computation of GPT-OSS's own eager_attention_forward, which
transformers runs for it (SDPA cannot take sinks).

    python benchmarks/attention_sinks.py [--json out.json]
    python benchmarks/attention_sinks.py --device cpu --tiny   # a smoke test of the script
"""
from __future__ import annotations

import argparse

import torch
from checked_timing import checked, write_figures

from lzsolve.measure.harness import Budget, make_harness
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature

CALLS = (("attention.prefill", ("causal", "sinks"), {"batch": 1, "seq": 1000}),
         ("attention.prefill", ("causal", "sinks"), {"batch": 4, "seq": 2048}),
         ("attention.decode", ("sinks",), {"batch": 16, "kv_len": 2048}))
TINY = {"seq": 40, "kv_len": 40, "batch": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small heads and lengths (a smoke test)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    device = torch.device(args.device)
    harness = make_harness(device, Budget(min_samples=10, max_samples=40))
    gen = torch.Generator(device=device).manual_seed(0)
    static = {"hq": 4, "hkv": 2, "d": 16} if args.tiny else {"hq": 64, "hkv": 8, "d": 64}
    dtype = "fp32" if device.type == "cpu" else "bf16"
    here = device_info(device)
    rows = []
    for op, flags, dims in CALLS:
        dims = {k: TINY[k] for k in dims} if args.tiny else dims
        sig = Signature.make(op, static, flags, dtype)
        kernels = [spec for spec in registry.candidates(op) if not spec.check(sig, here)]  # the capability gate
        row = checked(op, sig, dims, kernels, device, gen, harness)
        us, errors = row["us"], row["errors"]
        rows.append({"signature": str(sig), "dims": dims, "us": us, "errors": errors})
        eager = us.get("eager.attention")
        print(f"{sig} {dims}: " + "  ".join(
            f"{k}={t:.0f}" + (f" ({eager / t:.1f}x)" if eager else "")
            for k, t in sorted(((k, t) for k, t in us.items() if t), key=lambda kv: kv[1])))
        for kernel_id, message in errors.items():
            print(f"    {kernel_id}: {message}")
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
