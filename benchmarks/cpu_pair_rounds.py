"""How far one pair of CPU kernels moves from round to round (benchmark log §10.17): torch's fused
RMSNorm + add against the eager fallback at one shape, in one fresh process, without lzsolve's
harness: ROUNDS rounds of CALLS back-to-back calls over 8 newly allocated input sets each, the two
kernels alternating which goes first; prints each round's medians and their ratio.

    python benchmarks/cpu_pair_rounds.py --threads 2 --tokens 82   # run it in several processes
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from runtime_loader.kernels.torch_ops import rms_norm_add as fused
from runtime_loader.ops.norm import rms_norm_add as eager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--tokens", type=int, default=82)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weight = torch.randn(args.hidden, dtype=torch.bfloat16)
    medians: dict[str, list[float]] = {"eager": [], "torch": []}
    for round_ in range(args.rounds):
        pair = [("eager", eager), ("torch", fused)]
        for name, kernel in pair if round_ % 2 == 0 else pair[::-1]:
            sets = [(torch.randn(args.tokens, args.hidden, dtype=torch.bfloat16),
                     torch.randn(args.tokens, args.hidden, dtype=torch.bfloat16)) for _ in range(8)]
            for x, residual in sets[:2]:
                kernel(x, residual, weight, 1e-5)
            times = []
            for i in range(args.calls):
                x, residual = sets[i % len(sets)]
                start = time.perf_counter()
                kernel(x, residual, weight, 1e-5)
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times) * 1e6)
    print(f"threads {args.threads}, {args.tokens} x {args.hidden} bf16, median us per round")
    print("eager  ", " ".join(f"{v:7.0f}" for v in medians["eager"]))
    print("torch  ", " ".join(f"{v:7.0f}" for v in medians["torch"]))
    print("torch / eager", " ".join(f"{a / b:5.2f}" for a, b in zip(medians["torch"], medians["eager"])))


if __name__ == "__main__":
    main()
