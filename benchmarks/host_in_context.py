"""A served call's host time where a model makes it, against back to back (issue 54).

An eager table keeps the fallback where a kernel costs the host more than it (lzsolve/decide/solve.py,
HOST_LOSS), from the host time per call of the tune's eager passes: the same call back to back, its
path warm in the CPU's caches. In a model a served call comes after hundreds of µs of other host
work. Gemma 2's half table, whose one served op is the fused residual-add RMSNorm (a Triton kernel
in place of about ten ATen ops), ran 0.97-1.00x of the unpatched model, while its plain RMSNorm
alone, the same kernel through the same launcher, ran 1.15-1.17x; in that trace the fused call's
path from its allocation to its launch took 73 µs, the plain norm's back-to-back calls 23 µs
(docs/benchmark-log.md §29). This times each candidate of each op two ways:

- `warm`: CALLS calls back to back, host µs per call (what the tune's eager passes see);
- `after`: each call after model-like host work (--context ops: ATen ops on small tensors of the
  device with a decoder layer's mix, and Python between them; --context model: a one-layer Gemma 2's
  prefill; --context others: one call of each other candidate and a device sync, what the first
  call of each of the tune's interleaved eager passes comes after), the call alone timed.

After a layer (docs/benchmark-log.md §30) every call cost more, and Liger's norms, under their
fallback back to back, cost more than it: the host guard admits them where a host-bound model pays
more. If `others`, which a tune could read at no cost, orders the kernels as `model` does, the
guard should read that.
Medians over ROUNDS interleaved rounds; each candidate checked first against the op's fp32 reference
(checked_timing.agreeing), those that disagree reported and not timed.

    python benchmarks/host_in_context.py --device cuda --json out.json
"""
from __future__ import annotations

import argparse
import fnmatch
import statistics
import time

import torch
from checked_timing import agreeing, interleaved, write_figures

from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature

# Gemma 2's shapes (hidden 2304, GeGLU width 9216): the model whose half table lost
SIGNATURES = [
    Signature.make("norm.rms", {"hidden": 2304}, ["unit_offset"]),
    Signature.make("norm.rms_add", {"hidden": 2304}, ["unit_offset", "keep_inputs"]),
    Signature.make("act.geglu", {"width": 9216}),
]


def context(device, ops: int):
    """A callable doing `ops` ATen ops on small tensors of the device, the mix of a decoder layer's
    host work (views, casts, elementwise, a matmul every few), with Python calls between."""
    x = torch.randn(8, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, 256, device=device, dtype=torch.bfloat16)
    steps = [lambda t: t.float(), lambda t: t * 0.5, lambda t: t.to(torch.bfloat16), lambda t: t.reshape(8, 4, 64),
             lambda t: t.transpose(0, 1).reshape(8, 256), lambda t: t + 1.0, lambda t: t @ w, lambda t: torch.tanh(t)]

    def run() -> None:
        t = x
        for i in range(ops):
            t = steps[i % len(steps)](t)
            if t.dtype != torch.bfloat16 or t.shape != x.shape:
                t = x
    return run


def model_context(device):
    """A callable running one prefill of a one-layer Gemma 2 (its hidden size, a small vocabulary,
    random bf16 weights, unpatched): the host work a served call of that model comes after."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=256, num_hidden_layers=1, vocab_size=1024)
    model = Gemma2ForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16), device=device)

    def run() -> None:
        with torch.no_grad():
            model(ids, use_cache=False, logits_to_keep=1)
    return run


def timed(call, sync, contexts, calls: int) -> tuple[float, float]:
    """(warm, after): host µs per call, back to back and each after `contexts()`."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    warm = (time.perf_counter() - start) / calls * 1e6
    sync()
    after = []
    for _ in range(calls):
        contexts()
        start = time.perf_counter()
        call()
        after.append(time.perf_counter() - start)
    sync()
    return warm, statistics.median(after) * 1e6


def candidates(sig: Signature, device, patterns: list[str]) -> list:
    info = device_info(device)
    found = []
    for spec in registry.candidates(sig.op):
        if any(fnmatch.fnmatch(spec.kernel_id, p) for p in patterns) and spec.installed() is None \
                and not spec.check(sig, info):
            found.append(spec)
    fallback = registry.fallback_for(sig)
    return [fallback] + [s for s in found if s.kernel_id != fallback.kernel_id]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", default="1,777", help="comma list of token counts")
    parser.add_argument("--kernels", default="eager.*,torch.*,triton.*,liger.*", help="comma list of id patterns")
    parser.add_argument("--context", choices=("ops", "model", "others"), default="ops",
                        help="what comes before each `after` call: --context-ops ATen ops, a one-layer Gemma 2's "
                             "prefill (transformers), or one call of each other candidate of the op and a device "
                             "sync (what the first call of a tune's eager pass comes after)")
    parser.add_argument("--context-ops", type=int, default=60, help="ATen ops before each `after` call")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    contexts = model_context(device) if args.context == "model" else \
        context(device, args.context_ops) if args.context == "ops" else None  # others: made per kernel

    def others(calls: dict, kernel_id: str):
        def run() -> None:
            for other, call in calls.items():
                if other != kernel_id:
                    call()
            sync()
        return run
    rows = []
    for sig in SIGNATURES:
        specs = candidates(sig, device, args.kernels.split(","))
        for tokens in (int(t) for t in args.tokens.split(",")):
            gen = torch.Generator(device=device).manual_seed(0)
            inputs = CONTRACTS[sig.op].make_inputs(sig, {"tokens": tokens}, device, gen)
            agreed, errors = agreeing(sig.op, sig, specs, inputs)
            for kernel_id, why in errors.items():
                print(f"{str(sig):<52} {tokens:>5} {kernel_id:<32} not timed: {why}", flush=True)
            if specs[0] not in agreed:
                continue  # no fallback to compare with
            calls = {s.kernel_id: (lambda impl=s.impl: impl(*inputs)) for s in agreed}
            for call in calls.values():  # first calls (compiles) and the launchers' first key
                call(), call()
            samples = {k: [] for k in calls}
            for round_ in range(args.rounds):
                for k in interleaved(calls, round_):
                    before = others(calls, k) if args.context == "others" else contexts
                    samples[k].append(timed(calls[k], sync, before, args.calls))
            fallback = specs[0].kernel_id
            base = [statistics.median(s[i] for s in samples[fallback]) for i in (0, 1)]
            for k, s in samples.items():
                warm, after = (statistics.median(x[i] for x in s) for i in (0, 1))
                rows.append({"signature": str(sig), "tokens": tokens, "kernel": k, "fallback": k == fallback,
                             "context": args.context, "context_ops": args.context_ops, "warm_us": warm, "after_us": after,
                             "warm_vs_fallback": warm / base[0], "after_vs_fallback": after / base[1]})
                print(f"{str(sig):<52} {tokens:>5} {k:<32} warm {warm:7.1f} us ({warm / base[0]:4.2f})  "
                      f"after {after:7.1f} us ({after / base[1]:4.2f})", flush=True)
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
