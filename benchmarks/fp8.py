"""FP8 on Hopper (issue 18): FP8 linears against bf16 cuBLAS, decode over an FP8 KV cache against bf16.

The four projections of llama3-70b at TP8 (q/k/v as one GEMM, o_proj, gate/up as one, down_proj)
and its lm_head, at 1 to 16384 tokens: each linear.fp8 kernel admitted here (per-channel weight
scales, activations quantised per token inside the timed call, as a server pays it) is checked
against the op's fp32 reference first, then timed interleaved with torch.linear in bf16 on the
same shape by lzsolve's harness (graph replay on CUDA, median us). The ratio is bf16 / fp8.
Then llama3-70b TP8's decode attention (8 q heads, 1 kv head, d 128) at batch 8-128 and 2048-8192
keys: each attention.decode_fp8kv kernel, checked first, against SDPA's default and FlashInfer's
decode over a bf16 cache.

    python benchmarks/fp8.py [--json out.json] [--no-decode] [--no-linears] [--pairs] [--table ARTIFACT]
                             [--tokens 1,1024] [--shapes qkv_proj,o_proj]
    python benchmarks/fp8.py --device cpu --tiny   # a smoke test of the script
"""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
from checked_timing import agreeing, checked, timed, write_figures

from lzsolve.measure.harness import Budget, make_harness
from lzsolve.ops import CONTRACTS
from lzsolve.store.artifact import leaf_ids
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature
from runtime_loader.specs import config_id

SHAPES = {"qkv_proj": (8192, 1280), "o_proj": (1024, 8192), "gate_up_proj": (8192, 7168), "down_proj": (3584, 8192),
          "lm_head": (8192, 16032)}  # (k, n) per rank
TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
DECODES = [{"batch": b, "kv_len": n} for b in (8, 32, 128) for n in (2048, 8192)]
BF16_DECODE = ("sdpa.default", "flashinfer.decode", "flashinfer.decode_tc")
# triton.linear_fp8 beside its default (128 x 128 x 128): tiles for decode-sized M, with K split
# 4 and 8 ways, a middle one and a wide one for prompts (an untuned look: a tune searches
# search_spaces/triton.linear_fp8.yaml)
TRITON_FP8_CONFIGS = ({"block_m": 16, "block_n": 64, "block_k": 256, "warps": 4, "stages": 4, "split_k": 1},
                      {"block_m": 16, "block_n": 64, "block_k": 256, "warps": 4, "stages": 4, "split_k": 4},
                      {"block_m": 16, "block_n": 128, "block_k": 128, "warps": 4, "stages": 4, "split_k": 8},
                      {"block_m": 64, "block_n": 128, "block_k": 128, "warps": 4, "stages": 4, "split_k": 1},
                      {"block_m": 128, "block_n": 256, "block_k": 128, "warps": 8, "stages": 3, "split_k": 1})
# the TMA family's (triton.linear_fp8_tma, and its GEMM alone): the best tiles of benchmarks/fp8_tma_probe.py (§16.6)
TMA_CONFIGS = ({"block_m": 64, "block_n": 64, "block_k": 256, "warps": 4, "stages": 4},
               {"block_m": 128, "block_n": 128, "block_k": 128, "warps": 4, "stages": 4},
               {"block_m": 128, "block_n": 256, "block_k": 128, "warps": 8, "stages": 3})


def table_kernels(artifact: Path) -> dict[str, list[str]]:
    """signature -> the kernels its tree chooses in the artifact's dispatch.json."""
    raw = json.loads((artifact / "dispatch.json").read_text())
    return {entry["signature"]: sorted(set(leaf_ids(entry["tree"]))) for entry in raw["ops"]}


def quantisation_apart(sig: Signature, dims: dict, device, gen, here) -> dict[str, list]:
    """Where a W8A8 linear's time goes, timed unchecked beside the kernels (whose parity covers
    these calls): the Triton per-token quantisation alone, and cuBLASLt's FP8 GEMM on an input
    quantised beforehand, the ceiling of a server that fuses the quantisation into the op before
    (an RMSNorm's epilogue): with the format's row and column scales, and with one scale per
    tensor (cuBLASLt's GEMM alone, with no scaling work).
    CUDA with FP8 GEMMs (sm 89+) only."""
    if device.type != "cuda" or (here.sm or 0) < 89:
        return {}
    from runtime_loader.kernels.triton_ops.fp8 import quantize_per_token
    x, weight, weight_scale, _ = CONTRACTS[sig.op].make_inputs(sig, dims, device, gen)
    rows = x.reshape(-1, x.shape[-1])
    q, x_scale = quantize_per_token(rows, 8)
    w_scale = weight_scale.float().reshape(1, -1).contiguous()
    one = torch.ones((), device=device)  # per-tensor scales: cuBLASLt's own FP8 path, no row scaling
    return {"quantise alone (Triton)": [lambda: quantize_per_token(rows, 8)],
            "scaled_mm, pre-quantised": [lambda: torch._scaled_mm(q, weight.t(), scale_a=x_scale, scale_b=w_scale,
                                                                   out_dtype=x.dtype)],
            "scaled_mm per-tensor, pre-quantised": [lambda: torch._scaled_mm(q, weight.t(), scale_a=one, scale_b=one,
                                                                              out_dtype=x.dtype)]}


# what runs before each projection in llama3-70b's blocks, in bf16 and quantising for it: (the bf16
# op, the quantising op, its Triton family, the configurations timed). The norm before q/k/v and
# gate/up is the fused residual add + RMSNorm (159 of the 160 norms a TP8 plan captures).
ROW_CONFIGS = ({"block": 4096, "warps": 8}, {"block": 8192, "warps": 16})
BEFORE = {"qkv_proj": ("norm.rms_add", "norm.rms_add_fp8", "triton.rms_norm_add_fp8", ROW_CONFIGS),
          "gate_up_proj": ("norm.rms_add", "norm.rms_add_fp8", "triton.rms_norm_add_fp8", ROW_CONFIGS),
          "down_proj": ("act.swiglu", "act.swiglu_fp8", "triton.swiglu_fp8", ROW_CONFIGS)}


def first(out):
    """What the projection reads of an op's output: the tensor itself, or the first of a tuple
    (a norm's output beside its residual total; FP8's q beside its scales)."""
    return out[0] if isinstance(out, tuple) else out


def passes(op: str, kernel_ids, args: tuple, device) -> tuple[list, dict]:
    """agreeing() over the kernels of `kernel_ids` this device admits for the call's signature."""
    sig = CONTRACTS[op].schema.call(*args)[0]
    return agreeing(op, sig, [s for k in kernel_ids if not (s := registry.get(k)).check(sig, device_info(device))], args)


def with_op_before(name: str, k: int, n: int, tokens: int, device, gen, harness, chosen: dict) -> dict:
    """A projection as a server runs it, the op before it included (the residual add + RMSNorm
    before q/k/v and gate/up, the SwiGLU before down_proj): bf16 (the op's fastest kernel here, then
    cuBLAS on the dequantised weight); FP8 with the linear quantising its input (that op kernel,
    then linear.fp8's kernels); FP8 with the op quantising (norm.rms_add_fp8 or act.swiglu_fp8,
    then linear.fp8_prequantised's), with the table's choices for both signatures where `chosen`
    (signature -> kernel ids) has them. Every kernel is checked against its op's reference on these
    inputs first. The op's bf16 kernels are timed alone, interleaved, to pick the fastest; then the
    pairs, interleaved. {"us": {pair: median us}, "before_us": {bf16 kernel: median us}, "errors":
    {kernel id: why}}."""
    op, quantising_op, family, configs = BEFORE[name]
    sig = Signature.make(op, {CONTRACTS[op].schema.static[0]: k}, (), "bf16")
    inputs = CONTRACTS[op].make_inputs(sig, {"tokens": tokens}, device, gen)
    fp8 = Signature.make("linear.fp8", {"k": k, "n": n}, ("per_channel",), "bf16")
    _, weight, weight_scale, _ = CONTRACTS["linear.fp8"].make_inputs(fp8, {"tokens": 1}, device, gen)
    dequantised = (weight.float() * weight_scale[:, None]).to(inputs[0].dtype)
    bf16_kernels, errors = passes(op, [s.kernel_id for s in registry.candidates(op)], inputs, device)
    before_us = timed(harness, {s.kernel_id: [lambda impl=s.impl: impl(*inputs)] for s in bf16_kernels})
    best = registry.get(min((kernel_id for kernel_id, us in before_us.items() if us), key=before_us.get))
    x = first(best.impl(*inputs))
    quant_sig = CONTRACTS[quantising_op].schema.call(*inputs)[0]
    quantising, more = passes(quantising_op, [config_id(family, c) for c in configs] + chosen.get(str(quant_sig), []),
                              inputs, device)
    errors.update(more)
    unfused, more = passes("linear.fp8", ["triton.scaled_mm_fp8", "torch.scaled_mm_fp8"]
                           + [config_id("triton.linear_fp8", c) for c in TRITON_FP8_CONFIGS]
                           + [config_id("triton.linear_fp8_tma", c) for c in TMA_CONFIGS]
                           + chosen.get(str(fp8), []), (x, weight, weight_scale, None), device)
    errors.update(more)
    fused = []
    if quantising:
        q, x_scale = quantising[0].impl(*inputs)[:2]
        args = (q, x_scale, weight, weight_scale, None, inputs[0].dtype)
        pre_sig = CONTRACTS["linear.fp8_prequantised"].schema.call(*args)[0]
        fused, more = passes("linear.fp8_prequantised", ["torch.scaled_mm"] + [
            config_id("triton.linear_fp8_prequantised", c) for c in TRITON_FP8_CONFIGS] + [
            config_id("triton.linear_fp8_prequantised_tma", c) for c in TMA_CONFIGS] + chosen.get(str(pre_sig), []),
            args, device)
        errors.update(more)
    calls = {f"bf16: {best.kernel_id} + torch.linear": [
        lambda: torch.nn.functional.linear(first(best.impl(*inputs)), dequantised)]}
    for lin in unfused:
        calls[f"{best.kernel_id} + {lin.kernel_id}"] = [
            lambda lin=lin: lin.impl(first(best.impl(*inputs)), weight, weight_scale, None)]
    for before in quantising:
        for lin in fused:
            calls[f"{before.kernel_id} + {lin.kernel_id}"] = [
                lambda before=before, lin=lin: lin.impl(*before.impl(*inputs)[:2], weight, weight_scale, None,
                                                        inputs[0].dtype)]
    return {"us": timed(harness, calls), "before_us": before_us, "errors": errors}


def show(label: str, row: dict, base: str) -> None:
    us = row["us"]
    print(f"{label}: " + "  ".join(f"{k}={v:.1f}" + (f" ({us[base] / v:.2f}x)" if us.get(base) and k != base else "")
                                   for k, v in sorted(((k, v) for k, v in us.items() if v), key=lambda kv: kv[1])))
    for kernel_id, message in row["errors"].items():
        print(f"    {kernel_id}: {message}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small shapes (a smoke test)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--no-decode", action="store_true", help="no decode attention")
    parser.add_argument("--no-linears", action="store_true", help="no linears alone (with --pairs: the pairs alone)")
    parser.add_argument("--pairs", action="store_true",
                        help="also q/k/v, gate/up and down_proj with the op before them (residual add + RMSNorm, "
                             "SwiGLU): bf16 (that op's fastest kernel here), FP8 quantised by the linear, FP8 "
                             "quantised by that op (norm.rms_add_fp8 or act.swiglu_fp8, then "
                             "linear.fp8_prequantised)")
    parser.add_argument("--tokens", help="the token counts, comma-separated (default: {})".format(",".join(map(str, TOKENS))))
    parser.add_argument("--shapes", help="the projections, comma-separated (default: all of {})".format(",".join(SHAPES)))
    parser.add_argument("--table", type=Path,
                        help="an artifact (lzsolve tune --dtype fp8): the kernels its leaves choose for these "
                             "signatures join the candidates")
    args = parser.parse_args()
    device = torch.device(args.device)
    harness = make_harness(device, Budget(min_samples=10, max_samples=40))
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = {"proj": (64, 48)} if args.tiny else SHAPES
    if args.shapes:
        unknown = set(args.shapes.split(",")) - set(SHAPES)
        if unknown:
            parser.error(f"--shapes: no projection {sorted(unknown)}; known: {', '.join(SHAPES)}")
        shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
    tokens = (1, 33) if args.tiny else tuple(int(t) for t in args.tokens.split(",")) if args.tokens else TOKENS
    here, rows = device_info(device), []
    chosen = table_kernels(args.table) if args.table else {}
    for name, (k, n) in {} if args.no_linears else shapes.items():
        fp8 = Signature.make("linear.fp8", {"k": k, "n": n}, ("per_channel",), "bf16")
        dense = Signature.make("linear", {"k": k, "n": n}, (), "bf16")
        configs = [registry.get(config_id("triton.linear_fp8", c)) for c in TRITON_FP8_CONFIGS] + [
            registry.get(config_id("triton.linear_fp8_tma", c)) for c in TMA_CONFIGS]
        tuned = [registry.get(k) for k in chosen.get(str(fp8), ())]
        kernels = list({s.kernel_id: s for s in registry.candidates("linear.fp8") + configs + tuned
                        if not s.check(fp8, here)}.values())
        for t in tokens:
            dims = {"tokens": t}
            bf16 = CONTRACTS["linear"].make_inputs(dense, dims, device, gen)
            row = checked("linear.fp8", fp8, dims, kernels, device, gen, harness,
                          {"torch.linear (bf16)": [lambda: registry.get("torch.linear").impl(*bf16)],
                           **quantisation_apart(fp8, dims, device, gen, here)})
            rows.append({"shape": name, "k": k, "n": n, "tokens": t, **row})
            show(f"{name:12} k={k:5} n={n:5} tokens={t:5}", row, "torch.linear (bf16)")
    for name, (k, n) in [] if not args.pairs else {"qkv_proj": (64, 48), "down_proj": (64, 48)}.items() \
            if args.tiny else [(name, SHAPES[name]) for name in BEFORE]:
        for t in tokens:
            row = with_op_before(name, k, n, t, device, gen, harness, chosen)
            rows.append({"pair": name, "k": k, "n": n, "tokens": t, **row})
            show(f"with the op before {name:12} k={k:5} n={n:5} tokens={t:5}", row,
                 next(label for label in row["us"] if label.startswith("bf16: ")))
    static = {"hq": 2, "hkv": 1, "d": 64} if args.tiny else {"hq": 8, "hkv": 1, "d": 128}
    fp8kv = Signature.make("attention.decode_fp8kv", static, (), "bf16")
    plain = Signature.make("attention.decode", static, (), "bf16")
    for dims in [] if args.no_decode else [{"batch": 2, "kv_len": 70}] if args.tiny else DECODES:
        kernels = [s for s in registry.candidates(fp8kv.op) if not s.check(fp8kv, here)]
        inputs = CONTRACTS[plain.op].make_inputs(plain, dims, device, gen)
        extra = {f"{k} (bf16 cache)": [functools.partial(registry.get(k).impl, *inputs)] for k in BF16_DECODE
                 if not registry.get(k).check(plain, here)}
        row = checked(fp8kv.op, fp8kv, dims, kernels, device, gen, harness, extra)
        rows.append({"decode": dims, **row})
        show(f"decode batch={dims['batch']:4} kv_len={dims['kv_len']:5}", row, "sdpa.default (bf16 cache)")
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
