"""One line per row of `fp8.py --json` (linears alone): bf16 cuBLAS, the best checked FP8 kernel,
and cuBLASLt's GEMM on a pre-quantised input (row-wise and per-tensor scales: unchecked
ceilings), each as bf16 time / its time.

    python benchmarks/fp8_summary.py fp8.json
"""
import json
import sys

BF16, UNCHECKED = "torch.linear (bf16)", ("quantise alone", "scaled_mm, pre", "scaled_mm per-tensor")


def main() -> None:
    rows = [r for r in json.loads(open(sys.argv[1]).read())["rows"] if "shape" in r]
    print(f"{'projection':12} {'tokens':>6} {'bf16 us':>8}  best FP8 (x)  row-wise / per-tensor GEMM alone (x)")
    for r in rows:
        us = {k: v for k, v in r["us"].items() if v}
        bf16 = us.get(BF16)
        kernels = {k: v for k, v in us.items() if k != BF16 and not k.startswith(UNCHECKED)}
        best = min(kernels, key=kernels.get) if kernels else None
        ratio = lambda t: f"{bf16 / t:.2f}" if bf16 and t else "-"  # noqa: E731
        print(f"{r['shape']:12} {r['tokens']:>6} {bf16 or 0:8.1f}  {ratio(kernels.get(best))} {best}  "
              f"{ratio(us.get('scaled_mm, pre-quantised'))} / {ratio(us.get('scaled_mm per-tensor, pre-quantised'))}")
        for kernel_id, message in r.get("errors", {}).items():
            print(f"    {kernel_id}: {message[:160]}")


if __name__ == "__main__":
    main()
