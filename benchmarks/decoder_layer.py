"""A full llama3-70b TP8 decoder layer (one rank's shard) under the dispatch table, PyTorch's
defaults and torch.compile (default and max-autotune), timed side by side.

The layer is written once, over an `ops` object with the Dispatcher's methods: fused
residual-add RMSNorm, fused QKV projection, RoPE, causal attention (prefill) or attention
over a KV cache (decode), output projection, fused gate/up projection, SwiGLU, down
projection. Variants:

- table: runtime_loader.load(ARTIFACT, strict=True) (the Dispatcher replaying a tune);
- pytorch: the runtime's fallbacks called directly (SDPA, eager torch: what a plain
  PyTorch model runs);
- compile / max-autotune: torch.compile of the pytorch layer, dynamic=False, modes
  "default" and "max-autotune-no-cudagraphs" (max-autotune's kernel choices; CUDA graphs
  are left to the harness so that every variant is captured the same way).

Before timing, each variant's output is checked against the pytorch variant computed in
fp32 on the same inputs; one that disagrees is reported and not timed. Then all variants
of a scenario are timed interleaved by lzsolve's harness (L2 flushed per sample): graph =
CUDA-graph replay of the layer (GPU time), eager = launches from Python (host overhead
included).

The roofline (issue 58): the device's ceilings measured in this run as the tune measures them
(lzsolve.measure.tasks.run_ceilings), each op call of the table's layer counted by its op's
contract (FLOPs, bytes) into its time at the roofline, and each call timed alone under the table:
the layer's time against the sum of its calls' roofline times, and per call what its kernel
reaches, so what holds the layer back is named per op (the rest of the layer's time is the glue
between the calls: views, the KV cache's copy, launches).

First-call times are the compile / JIT each variant pays per shape, in one process and in this
order: table (its kernels' JIT unless --restore-jit), pytorch, compile, max-autotune (which may
find some Triton kernels compile already built).

    python benchmarks/decoder_layer.py ARTIFACT --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import time
from dataclasses import dataclass

import torch

import runtime_loader
from lzsolve.decide.roofline import Peak, roof_ms
from lzsolve.measure.harness import MODES, Budget, CudaHarness
from lzsolve.measure.tasks import CeilingTask, run_ceilings
from lzsolve.models import CATALOGUE, capture
from lzsolve.ops import CONTRACTS, compare
from lzsolve.ops.base import Tolerance
from runtime_loader import registry
from runtime_loader.dispatcher import METHOD_OPS
from runtime_loader.hardware import hardware_signature
from runtime_loader.ops import OPS

CONFIG = CATALOGUE["llama3-70b"]
SIZES = capture.load("llama3-70b", None, tp=8).sizes()  # one rank's shard, as capture sees it
(HQ,), (HKV,), (D,), (HIDDEN,), (INTERMEDIATE,) = (SIZES[k] for k in ("hq", "hkv", "d", "hidden", "mlp"))
EPS, ROPE_THETA = CONFIG["rms_norm_eps"], CONFIG["rope_theta"]
# (name, batch, tokens per sequence, kv_len); kv_len 0 = prefill
SCENARIOS = [("prefill b1 s2048", 1, 2048, 0), ("decode b8 kv4096", 8, 1, 4096), ("decode b64 kv1024", 64, 1, 1024),
             ("decode b64 kv4096", 64, 1, 4096)]
# A bf16 layer against the same layer in fp32: eight ops' rounding, so looser than one op's bf16 bound.
LAYER_TOLERANCE = Tolerance(rel_l2=3e-2, max_rel=6e-2)


class Defaults:
    """PyTorch's own path for each op: the runtime's fallback kernels, called directly."""

    def __init__(self):
        self._impl = {op: registry.get(OPS[op].fallback).impl for op in
                      ("attention.prefill", "attention.decode", "norm.rms_add", "posenc.rope", "act.swiglu", "linear")}

    def attention(self, q, k, v, causal=True):
        return self._impl["attention.prefill" if causal else "attention.decode"](q, k, v, causal, None)

    def rms_norm_add(self, x, residual, weight, eps):
        return self._impl["norm.rms_add"](x, residual, weight, eps)

    def rope(self, q, k, cos, sin):
        return self._impl["posenc.rope"](q, k, cos, sin, False)

    def swiglu(self, gate, up):
        return self._impl["act.swiglu"](gate, up)

    def linear(self, x, weight):
        return self._impl["linear"](x, weight, None)


@dataclass
class Call:
    method: str
    args: tuple
    kwargs: dict
    kernel: str
    signature: object  # runtime_loader.ops.Signature
    dims: dict


class Calls:
    """The Dispatcher's methods, noting each call: its arguments, the kernel it goes to, its op
    signature and dims (not timed)."""

    def __init__(self, dispatcher):
        self.dispatcher, self.calls = dispatcher, []

    def __getattr__(self, method):
        def call(*args, **kwargs):
            signature, dims = METHOD_OPS[method].call(*args, **kwargs)
            self.calls.append(Call(method, args, kwargs, self.dispatcher.kernel_for(method, *args, **kwargs),
                                   signature, dims))
            return getattr(self.dispatcher, method)(*args, **kwargs)
        return call

    def kernels(self) -> dict[str, list[str]]:
        return {m: sorted({c.kernel for c in self.calls if c.method == m}) for m in dict.fromkeys(c.method for c in self.calls)}


def ceilings(device, harness) -> dict[str, Peak]:
    """Per timing mode, the device's bf16 compute and memory ceilings, measured as a tune measures them."""
    rows = run_ceilings(CeilingTask("bf16"), device, harness).get("ceilings", [])
    rates = {(r["kind"], r["mode"]): r["per_s"] for r in rows}
    return {mode: Peak(rates["compute", mode], rates["memory", mode]) for mode in MODES
            if ("compute", mode) in rates and ("memory", mode) in rates}


def roofline(calls: Calls, dispatcher, peaks: dict[str, Peak], layer: dict, harness) -> dict:
    """Per mode: the layer's time under the table against the sum of its calls' roofline times,
    and each call alone (timed under the table) against its own."""
    timed = harness.measure({f"{i} {c.method}": [functools.partial(getattr(dispatcher, c.method), *c.args, **c.kwargs)]
                             for i, c in enumerate(calls.calls)})
    out = {}
    for mode, peak in peaks.items():
        ops = []
        for i, c in enumerate(calls.calls):
            contract = CONTRACTS[c.signature.op]
            roof = roof_ms(contract.flops(c.signature, c.dims), contract.bytes_moved(c.signature, c.dims), peak)
            m = timed[f"{i} {c.method}"]
            t = None if isinstance(m, Exception) or getattr(m, mode) is None else getattr(m, mode).median_ms
            ops.append({"method": c.method, "signature": str(c.signature), "dims": c.dims, "kernel": c.kernel,
                        "ms": t, "roof_ms": roof, "fraction": roof / t if t else None})
        roof = sum(o["roof_ms"] for o in ops)
        layer_ms = layer.get(f"{mode}_ms")
        out[mode] = {"peak": {"compute": peak.compute, "memory": peak.memory}, "roof_ms": roof, "layer_ms": layer_ms,
                     "fraction": roof / layer_ms if layer_ms else None,
                     "ops_ms": sum(o["ms"] for o in ops) if all(o["ms"] for o in ops) else None, "ops": ops}
    return out


@dataclass
class Weights:
    norm1: torch.Tensor
    norm2: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def random(cls, device, dtype, gen):
        def w(*shape, scale):
            return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)
        return cls(norm1=1 + w(HIDDEN, scale=0.1), norm2=1 + w(HIDDEN, scale=0.1),
                   qkv=w((HQ + 2 * HKV) * D, HIDDEN, scale=HIDDEN ** -0.5), o=w(HIDDEN, HQ * D, scale=(HQ * D) ** -0.5),
                   gate_up=w(2 * INTERMEDIATE, HIDDEN, scale=HIDDEN ** -0.5),
                   down=w(HIDDEN, INTERMEDIATE, scale=INTERMEDIATE ** -0.5))

    def to(self, dtype):
        return Weights(*(t.to(dtype) for t in vars(self).values()))


def decoder_layer(ops, w: Weights, x, residual, cos, sin, k_cache=None, v_cache=None):
    """One pre-norm Llama block: returns (mlp output, residual). x and residual are consumed."""
    seq = 1 if k_cache is not None else cos.shape[1]
    batch = x.shape[0] // seq
    h, residual = ops.rms_norm_add(x, residual, w.norm1, EPS)
    q, k, v = ops.linear(h, w.qkv).split([HQ * D, HKV * D, HKV * D], dim=-1)
    q = q.view(batch, seq, HQ, D).transpose(1, 2)
    k = k.view(batch, seq, HKV, D).transpose(1, 2)
    v = v.view(batch, seq, HKV, D).transpose(1, 2)
    q, k = ops.rope(q, k, cos, sin)
    if k_cache is not None:  # decode: the new token's k, v take the cache's last slot; attend over all of it
        k_cache[:, :, -1:].copy_(k)
        v_cache[:, :, -1:].copy_(v)
        k, v = k_cache, v_cache
    o = ops.attention(q, k, v, causal=k_cache is None)
    o = ops.linear(o.transpose(1, 2).reshape(batch * seq, HQ * D), w.o)
    h, residual = ops.rms_norm_add(o, residual, w.norm2, EPS)
    gate, up = ops.linear(h, w.gate_up).chunk(2, dim=-1)
    return ops.linear(ops.swiglu(gate, up), w.down), residual


def make_inputs(batch, seq, kv_len, device, dtype, gen):
    """x, residual (tokens, hidden); cos, sin as Hugging Face builds them; the KV cache for decode."""
    tokens = batch * seq
    x, residual = (torch.randn(tokens, HIDDEN, generator=gen, device=device).to(dtype) for _ in range(2))
    positions = torch.arange(kv_len - 1, kv_len, device=device) if kv_len else torch.arange(seq, device=device)
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, D, 2, device=device).float() / D))
    angles = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)
    rows = batch if kv_len else 1
    cos, sin = (f(angles)[None].expand(rows, -1, -1).contiguous().to(dtype) for f in (torch.cos, torch.sin))
    inputs = {"x": x, "residual": residual, "cos": cos, "sin": sin}
    if kv_len:
        for name in ("k_cache", "v_cache"):
            inputs[name] = torch.randn(batch, HKV, kv_len, D, generator=gen, device=device).to(dtype)
    return inputs


def fresh(inputs: dict, dtype=None) -> dict:
    """A private copy (the layer consumes x and residual and writes the cache)."""
    return {k: v.clone() if dtype is None else v.to(dtype) for k, v in inputs.items()}


def first_call_s(fn, inputs) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(**fresh(inputs))
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", help="a llama3-70b tp8 bf16 artifact tuned on this GPU")
    parser.add_argument("--restore-jit", action="store_true", help="load the artifact's JIT caches first")
    parser.add_argument("--json")
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    weights = Weights.random(device, dtype, gen)

    started = time.perf_counter()
    table = runtime_loader.load(args.artifact, strict=True, restore_jit=args.restore_jit)
    load_s = time.perf_counter() - started
    assert table.table.raw["model"]["id"] == "llama3-70b" and table.table.raw["model"]["tp"] == 8
    pytorch_layer = functools.partial(decoder_layer, Defaults(), weights)
    variants = {
        "table": functools.partial(decoder_layer, table, weights),
        "pytorch": pytorch_layer,
        "compile": torch.compile(pytorch_layer, dynamic=False),
        "max-autotune": torch.compile(pytorch_layer, dynamic=False, mode="max-autotune-no-cudagraphs"),
    }
    reference_layer = functools.partial(decoder_layer, Defaults(), weights.to(torch.float32))
    harness = CudaHarness(Budget(time_cap_s=3.0, max_samples=400, target_spread=0.01), device)
    peaks = ceilings(device, harness)
    rows = []
    for name, batch, seq, kv_len in SCENARIOS:
        inputs = make_inputs(batch, seq, kv_len, device, dtype, gen)
        expected = reference_layer(**fresh(inputs, torch.float32))[0]
        row = {"scenario": name, "batch": batch, "seq": seq, "kv_len": kv_len, "first_call_s": {}, "errors": {}}
        timed = {}
        for variant, fn in variants.items():
            row["first_call_s"][variant] = first_call_s(fn, inputs)
            ok, errors, message = compare(fn(**fresh(inputs))[0], expected, LAYER_TOLERANCE)
            row["errors"][variant] = errors
            if not ok:
                print(f"{name}: {variant} disagrees with the fp32 layer ({message}); not timed")
                continue
            call_inputs = fresh(inputs)
            timed[variant] = [functools.partial(fn, **call_inputs)]
        calls = Calls(table)
        decoder_layer(calls, weights, **fresh(inputs))
        row["kernels"] = calls.kernels()
        results = harness.measure(timed)
        for variant, m in results.items():
            if isinstance(m, Exception):
                row[variant] = {"error": f"{type(m).__name__}: {m}"}
                continue
            row[variant] = {"eager_ms": m.eager.median_ms, "eager_spread": m.eager.spread,
                            "graph_ms": m.graph.median_ms if m.graph else None,
                            "graph_spread": m.graph.spread if m.graph else None, "graph_error": m.graph_error}
        row["roofline"] = roofline(calls, table, peaks, row.get("table", {}), harness)
        rows.append(row)
        print_row(row)
    print(f"table load {load_s * 1e3:.0f} ms; first-call seconds per scenario are compile / JIT time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": dt.date.today().isoformat(), "torch": torch.__version__,
                       "ceilings": {mode: vars(peak) for mode, peak in peaks.items()},
                       "hardware": hardware_signature(device), "artifact": args.artifact, "table_load_s": load_s,
                       "restore_jit": args.restore_jit, "model": "llama3-70b tp8 (one rank)", "rows": rows}, f,
                      indent=1)


def print_row(row: dict) -> None:
    for mode in ("graph", "eager"):
        times = {v: row.get(v, {}).get(f"{mode}_ms") for v in ("pytorch", "table", "compile", "max-autotune")}
        base = times["table"]
        cells = "  ".join(f"{v} {t:.3f} ms ({t / base:.2f}x)" if t and base else f"{v} -" for v, t in times.items())
        print(f"{row['scenario']:<18} {mode:<5} {cells}")
    print(f"{'':<18} first call s: " + "  ".join(f"{v} {s:.1f}" for v, s in row["first_call_s"].items()))
    print(f"{'':<18} table kernels: " + ", ".join(f"{m} {'/'.join(ids)}" for m, ids in row["kernels"].items()))
    for mode, r in row.get("roofline", {}).items():
        share = f"{r['fraction']:.2f}" if r["fraction"] else "-"
        ops_ms = f"{r['ops_ms']:.3f}" if r["ops_ms"] else "-"
        print(f"{'':<18} roofline ({mode}): layer {r['layer_ms'] or 0:.3f} ms, its calls alone {ops_ms} ms, at the "
              f"roofline {r['roof_ms']:.3f} ms: {share} of it")
        for o in r["ops"]:
            fraction = f"{o['fraction']:.2f}" if o["fraction"] else "-"
            print(f"{'':<20} {o['method']:<13} {o['kernel']:<36} {o['ms'] or 0:8.4f} ms  roof {o['roof_ms']:8.4f} ms  "
                  f"{fraction}")


if __name__ == "__main__":
    main()
