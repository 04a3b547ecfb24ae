"""One mixture-of-experts layer's routed experts (moe.experts) on a GPU: the tuned table against
every fixed choice, each checked against the fp32 reference before it is timed.

Shapes (one rank's): Mixtral-8x7B at TP 2 (8 experts, top 2, hidden 4096, expert width 14336 / 2),
Qwen3-30B-A3B at TP 1 (128 experts, top 8, hidden 2048, width 768) and GPT-OSS-20B at TP 1 (32
experts, top 4, hidden and width 2880; biases, gate and up rows in turn, clamped SwiGLU, weights
stored (experts, in, out); bf16 here, not its MXFP4 checkpoint), at token counts from 1
to 16384 (the grid's buckets and points between them), with the routing runtime_loader.inputs
draws (seeded, a Zipf-like expert load; --skew 0: uniform). Variants:

- hf_loop: transformers' eager loop over the experts (eager.moe_experts);
- grouped_mm: transformers' default experts implementation (torch.grouped_mm);
- triton_default: lzsolve's fused Triton kernel at its default configuration;
- triton_vllm: the same kernel at the configuration vLLM ships for this (E, N) on the H100 (none
  for GPT-OSS, which vLLM serves with other kernels)
  (vllm/model_executor/layers/fused_moe/configs/E=..,N=..,device_name=NVIDIA_H100_80GB_HBM3.json,
  the entry nearest the token count, as vLLM picks it: its BLOCK_SIZE_M/N/K, GROUP_SIZE_M, warps
  and stages mean the same tiles in this kernel);
- table: runtime_loader.load(ARTIFACT), the kernel its tree picks for the call.

Timed interleaved by lzsolve's harness (L2 flushed between samples): graph = CUDA-graph replay
(GPU time), eager = launches from Python (host work included). hf_loop waits on the host for its
expert list, so it has no graph time.

    python benchmarks/moe_layer.py --write-workload wl.json   # then: lzsolve tune --workload wl.json
    python benchmarks/moe_layer.py --artifact ART --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
from pathlib import Path

import torch

import runtime_loader
from lzsolve.measure.harness import Budget, make_harness
from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.inputs import ROUTING_SKEW
from runtime_loader.ops import Signature
from runtime_loader.ops.moe import routing
from runtime_loader.recording import FORMAT, VERSION, Recording
from runtime_loader.specs import config_id

MODELS = {  # name -> moe.experts static dims of one rank
    "mixtral-8x7b-tp2": {"experts": 8, "top_k": 2, "hidden": 4096, "inter": 7168},
    "qwen3-30b-a3b": {"experts": 128, "top_k": 8, "hidden": 2048, "inter": 768},
    "gpt-oss-20b": {"experts": 32, "top_k": 4, "hidden": 2880, "inter": 2880, "alpha": 1.702, "limit": 7.0},
}
FLAGS = {"gpt-oss-20b": ("interleaved", "bias", "transposed")}
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
BETWEEN = (3, 24, 200, 700, 2500, 10000)  # off the grid: where a table's thresholds are guesses
# vLLM's shipped H100 configs for these (E, N) (read from vLLM's repository): token count ->
# (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages)
VLLM = {
    "mixtral-8x7b-tp2": {1: (16, 64, 128, 64, 4, 4), 2: (16, 128, 128, 32, 8, 4), 4: (16, 32, 256, 16, 4, 4),
                         8: (16, 128, 128, 32, 8, 4), 16: (16, 128, 128, 1, 4, 4), 24: (16, 128, 128, 1, 4, 4),
                         32: (16, 128, 128, 1, 4, 4), 48: (32, 128, 128, 1, 4, 4), 64: (32, 128, 128, 1, 4, 4),
                         96: (32, 128, 128, 64, 4, 4), 128: (64, 128, 128, 1, 4, 4), 256: (64, 128, 128, 64, 4, 4),
                         512: (64, 256, 64, 32, 4, 4), 1024: (128, 256, 64, 16, 8, 4), 1536: (128, 256, 64, 64, 8, 4),
                         2048: (128, 256, 64, 32, 8, 4), 3072: (128, 256, 64, 64, 8, 4), 4096: (128, 256, 64, 16, 8, 4)},
    "qwen3-30b-a3b": {1: (16, 32, 64, 1, 4, 4), 2: (16, 64, 64, 32, 4, 3), 4: (16, 128, 64, 1, 4, 4),
                      8: (16, 64, 64, 64, 4, 5), 16: (16, 32, 256, 64, 4, 2), 24: (16, 64, 128, 16, 4, 3),
                      32: (16, 32, 128, 1, 4, 5), 48: (16, 64, 128, 1, 4, 3), 64: (16, 256, 128, 1, 8, 3),
                      96: (16, 128, 128, 1, 4, 2), 128: (16, 256, 128, 1, 8, 2), 256: (32, 256, 128, 1, 8, 3),
                      512: (64, 128, 64, 1, 4, 3), 1024: (64, 256, 64, 1, 8, 5), 1536: (128, 256, 64, 1, 8, 4),
                      2048: (128, 256, 64, 1, 8, 4), 3072: (128, 256, 64, 1, 8, 4), 4096: (128, 256, 64, 1, 8, 4)},
}
FIXED = ("hf_loop", "grouped_mm", "triton_default", "triton_vllm")


def signature(model: str, dtype: str) -> Signature:
    return Signature.make("moe.experts", MODELS[model], FLAGS.get(model, ()), dtype)


def vllm_kernel(model: str, tokens: int) -> str:
    nearest = min(VLLM[model], key=lambda m: abs(m - tokens))
    block_m, block_n, block_k, group_m, warps, stages = VLLM[model][nearest]
    return config_id("triton.moe_experts", {"block_m": block_m, "block_n": block_n, "block_k": block_k,
                                             "group_m": group_m, "warps": warps, "stages": stages})


def write_workload(path: Path, models: list[str], dtype: str) -> None:
    """The calls a table for this benchmark is tuned on: these models at every grid token count."""
    recording = Recording("moe-layer")
    fallback = registry.get("torch.grouped_mm")
    for model in models:
        for tokens in TOKENS:
            recording.count((signature(model, dtype), {"tokens": tokens}), fallback, False)
    data = {"format": FORMAT, "version": VERSION, **recording.to_json()}
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", help="a table tuned for these signatures (adds the table column)")
    parser.add_argument("--write-workload", metavar="PATH", help="write the workload to tune, and exit")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tokens", default=",".join(map(str, sorted(TOKENS + BETWEEN))))
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--max-loop-tokens", type=int, default=4096,
                        help="hf_loop is timed up to this many tokens (it is the slowest by far)")
    parser.add_argument("--skew", type=float, default=ROUTING_SKEW,
                        help="expert popularity -skew * log(rank) on the router logits (0: uniform routing)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny experts (a smoke test)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown --models {', '.join(sorted(unknown))}; known: {', '.join(MODELS)}")
    if args.write_workload:
        write_workload(Path(args.write_workload), args.models.split(","), args.dtype)
        return
    device = torch.device(args.device)
    if args.tiny:
        MODELS.update({name: {**dims, "experts": 8, "top_k": 2, "hidden": 64, "inter": 32}
                       for name, dims in MODELS.items()})
    d = runtime_loader.load(args.artifact, strict=True) if args.artifact else None
    harness = make_harness(device, Budget(min_samples=10, max_samples=60))
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{device_name}, torch {torch.__version__}, {dt.date.today()}; median us "
          f"(graph, eager); ratios of graph times")
    for model in args.models.split(","):
        sig = signature(model, args.dtype)
        contract = CONTRACTS[sig.op]
        for tokens in map(int, args.tokens.split(",")):
            dims = {"tokens": tokens}
            x, _, _, *experts = contract.make_inputs(sig, dims, device, gen)
            ids, weights = routing(tokens, sig.dim("experts"), sig.dim("top_k"), x.dtype, device, gen, args.skew)
            inputs = (x, ids, weights, *experts)
            reference = contract.reference(*to_fp32(inputs))
            kernels = {"hf_loop": "eager.moe_experts", "grouped_mm": "torch.grouped_mm"}
            if device.type == "cuda":
                kernels["triton_default"] = "triton.moe_experts"
                if model in VLLM:
                    kernels["triton_vllm"] = vllm_kernel(model, tokens)
            if tokens > args.max_loop_tokens:
                del kernels["hf_loop"]
            calls = {name: functools.partial(registry.get(k).impl, *inputs) for name, k in kernels.items()}
            if d is not None:
                kernels["table"] = d.kernel_for("moe_experts", *inputs)
                calls["table"] = lambda: d.moe_experts(*inputs)
            row = {"model": model, "tokens": tokens, "kernels": kernels, "errors": {}, "graph_us": {},
                   "eager_us": {}}
            timed = {}
            for name, call in calls.items():
                try:  # a configuration may not fit this GPU (shared memory): refused, as the tuner refuses it
                    ok, errors, message = compare(call(), reference, contract.tolerances[sig.dtype])
                except Exception as e:  # noqa: BLE001
                    ok, message = False, f"{type(e).__name__}: {str(e)[:200]}"
                if ok:
                    timed[name] = [call]
                else:
                    row["errors"][name] = message
            del reference
            for name, m in harness.measure(timed).items():
                if isinstance(m, Exception):
                    row["errors"][name] = f"{type(m).__name__}: {m}"
                    continue
                row["eager_us"][name] = m.eager.median_ms * 1e3 if m.eager else None
                row["graph_us"][name] = m.graph.median_ms * 1e3 if m.graph else None
            row["skew"] = args.skew
            rows.append(row)
            report(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name,
                                               "torch": torch.__version__, "date": str(dt.date.today()),
                                               "rows": rows}, indent=1))


def report(row: dict) -> None:
    def cell(name):
        g, e = row["graph_us"].get(name), row["eager_us"].get(name)
        if name in row["errors"]:
            return "FAILED"
        return "-" if e is None else f"{g:.0f},{e:.0f}" if g else f"-,{e:.0f}"
    names = list(FIXED) + (["table"] if "table" in row["kernels"] else [])
    line = f"{row['model']:17} {row['tokens']:>6} " + " ".join(f"{n}={cell(n)}" for n in names)
    # the best fixed choice (one kernel for every shape) and vLLM's per-token-count configs, each / table
    best = [row["graph_us"].get(n) for n in FIXED[:3] if row["graph_us"].get(n)]
    table, vllm = row["graph_us"].get("table"), row["graph_us"].get("triton_vllm")
    if best and table:
        line += f"  fixed/table {min(best) / table:.2f}" + (f" vllm/table {vllm / table:.2f}" if vllm else "") + \
            f" ({row['kernels']['table']})"
    print(line, flush=True)
    for name, message in row["errors"].items():
        print(f"    {name}: {message}")


if __name__ == "__main__":
    main()
