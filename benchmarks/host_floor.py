"""What a replayed call costs in pure Python on this host, piece by piece (issue 17).

The Dispatcher's hot path per call: bind the method's arguments, build the key from tensor
attributes, one dict read, one count, the kernel's call. Each piece is timed alone with timeit
(best of 7 repeats, ns per operation), on tensors of the device given, so a host's floor for
a pure-Python dispatcher can be read off: the sum of the pieces a call needs.

    python benchmarks/host_floor.py --device cuda
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import timeit

import torch

from runtime_loader.ops import OPS, Signature, example_args


def ns(stmt: str, env: dict, number: int = 200_000) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=7)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    sig = Signature.make("norm.rms", {"hidden": 8192}, (), "bf16")
    x, weight, *_ = example_args(sig, {"tokens": 1}, device)
    key = (x.shape, x.dtype, x.is_cuda, False)
    env = {"x": x, "weight": weight, "key": key, "cache": {key: 1}, "count": itertools.count(),
           "front": OPS["norm.rms"].front, "noop": lambda *a: None, "kwargs_noop": lambda x, weight, eps=1e-6, unit_offset=False: None}
    env["get"] = env["cache"].get
    pieces = {
        "x.shape": "x.shape",
        "x.dtype": "x.dtype",
        "x.is_cuda": "x.is_cuda",
        "key tuple (shape, dtype, is_cuda, flag)": "(x.shape, x.dtype, x.is_cuda, False)",
        "dict get of a built key": "get(key)",
        "next(count)": "next(count)",
        "call of a 4-parameter function (2 passed)": "kwargs_noop(x, weight)",
        "call of f(*args) with a 3-tuple": "noop(*(x, weight, 1e-6))",
        "front (key and kernel args)": "front(x, weight)",
        "build key + get + count (inlined hot path)": "get((x.shape, x.dtype, x.is_cuda, False)); next(count)",
    }
    rows = {name: ns(stmt, env) for name, stmt in pieces.items()}
    width = max(map(len, rows))
    for name, value in rows.items():
        print(f"{name:{width}}  {value:7.1f} ns")
    info = {"python": sys.version.split()[0], "machine": platform.processor() or platform.machine(), "device": str(device)}
    print(info)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**info, "ns": rows}, f, indent=1)


if __name__ == "__main__":
    main()
