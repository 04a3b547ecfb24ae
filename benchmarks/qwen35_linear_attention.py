"""A Qwen3.5-0.8B linear-attention (Gated DeltaNet) layer through the table, against transformers.

One Qwen3_5GatedDeltaNet layer of Qwen3.5-0.8B's shape (hidden 1024, 16 key and 16 value heads of
128, conv kernel 4), random weights, bf16, run eagerly as transformers runs it, three ways:
- reference: patch(model, d) with d's ops locked to their eager kernels: transformers' own torch
  code (the chunked rule for a prompt, the token step for decode, F.conv1d), whatever is installed;
- transformers: the module as transformers runs it here (with flash-linear-attention installed
  its hub/FLA kernels where transformers picks them; the torch code otherwise: see `paths`);
- lzsolve: patch(model, load(artifact)) with a table tuned for these calls (--artifact).
Each variant's layer output is first checked against the same layer in fp32 on the torch code.
Shapes: prefill b1 s2048 and b8 s512 from no state; decode steps at batch 1-128 on a state
(after a 64-token prompt). Timed interleaved by lzsolve's harness (eager launches, median us).

    python benchmarks/qwen35_linear_attention.py --record w.json     # what the patched layer calls
    lzsolve tune --workload w.json --mode eager ... --out art          # (benchmarks/device.sh qwen35)
    python benchmarks/qwen35_linear_attention.py --artifact art --json out.json
    python benchmarks/qwen35_linear_attention.py --device cpu --tiny   # a smoke test of the script
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import torch
from checked_timing import write_figures
from torch.profiler import ProfilerActivity

import runtime_loader
from lzsolve.measure.harness import Budget, make_harness
from runtime_loader import Dispatcher
from runtime_loader.policies import Policy

PREFILL = ({"batch": 1, "seq": 2048}, {"batch": 8, "seq": 512})
REFERENCE = {"recurrent.gated_deltanet": "eager.gated_deltanet", "conv.causal_depthwise": "eager.causal_conv1d"}
DECODE_BATCHES = (1, 8, 32, 128)
TINY = dict(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16)


def model_of(tiny: bool, dtype, device):
    import transformers
    dims = TINY if tiny else dict(hidden_size=1024, linear_num_key_heads=16, linear_num_value_heads=16,
                                  linear_key_head_dim=128, linear_value_head_dim=128)
    # a full-attention layer after it: transformers cannot make a cache of linear-attention layers alone
    config = transformers.Qwen3_5TextConfig(vocab_size=256, num_hidden_layers=2,
                                            layer_types=["linear_attention", "full_attention"],
                                            intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16, linear_conv_kernel_dim=4, **dims)
    torch.manual_seed(0)
    return transformers.Qwen3_5ForCausalLM(config).to(device=device, dtype=dtype).eval()


def shapes(tiny: bool):
    if tiny:
        return [("prefill", {"batch": 2, "seq": 70})], [1, 3]
    return [("prefill", dims) for dims in PREFILL], list(DECODE_BATCHES)


def decode_state(model, batch: int, device):
    """A cache after a 64-token prompt, and the layer's input for the next token."""
    ids = torch.randint(0, 256, (batch, 64), device=device, generator=torch.Generator(device).manual_seed(batch))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return cache


def layer_call(model, x, cache=None):
    layer = model.model.layers[0].linear_attn
    return lambda: layer(x, cache=cache)


def serve(model, variant: str, artifact, locks=None):
    """Patch the model for a variant (none for transformers' own path); the dispatcher or None."""
    from runtime_loader.integrations.transformers import patch
    if variant == "transformers":
        return None
    # the reference: locked to the eager kernels (calls outside a table go to the function patch() replaced,
    # which is FLA's where transformers picks it)
    if variant == "reference":
        d = Dispatcher(None, policy=Policy(lock=REFERENCE))
    else:  # a missing table, or one whose kernels are stale here, is an error, not fallbacks timed as "lzsolve"
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            d = runtime_loader.load(artifact, strict=True, lock=locks if variant == "lzsolve+lock" else None)
    patch(model, d)
    return d


class Switch:
    """patch() replaces functions of the modelling module (the conv1d and delta rules) and serves
    every patched model from the active Dispatcher: before each call, a variant puts back its own
    functions (transformers' for the unpatched model) and activates its dispatcher."""

    def __init__(self, dispatchers: dict):
        from runtime_loader.integrations.transformers import _patched_functions
        self.dispatchers = dispatchers
        self.patched = [(m, n, getattr(m, n)) for m, n, _ in _patched_functions]
        self.originals = list(_patched_functions)

    def __call__(self, variant: str, fn):
        functions = self.originals if variant == "transformers" else self.patched
        d = self.dispatchers.get(variant)

        def call():
            for module, name, function in functions:
                setattr(module, name, function)
            if d is not None:
                runtime_loader.custom_ops.activate(d)
            return fn()
        return call


def profile(folder: str, case: str, calls: dict, repeats: int = 5) -> None:
    """Each variant's calls under torch.profiler: its busy GPU time per call against the wall, the
    top kernels to DIR/<case>.txt (why one variant is slower: its kernels, or the host between them)."""
    os.makedirs(folder, exist_ok=True)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    with open(os.path.join(folder, f"{case}.txt"), "w") as out:
        for variant, (call,) in calls.items():
            host_us = []
            for _ in range(10):  # the host's time to issue one call from an idle GPU
                sync()
                start = time.perf_counter()
                call()
                host_us.append((time.perf_counter() - start) * 1e6)
            sync()
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                for _ in range(repeats):
                    call()
                sync()
                wall_us = (time.perf_counter() - start) / repeats * 1e6
            events = prof.key_averages()
            gpu_us = sum(e.self_device_time_total for e in events) / repeats
            line = (f"{case} {variant}: host {sorted(host_us)[5]:.0f} us/call, wall {wall_us:.0f} us/call (profiled), "
                    f"GPU busy {gpu_us:.0f} us/call")
            print(line)
            out.write(f"## {line}\n{events.table(sort_by='self_device_time_total', row_limit=25)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small heads and lengths (a smoke test)")
    parser.add_argument("--record", help="record what the patched layer calls into this workload file, and stop")
    parser.add_argument("--artifact", help="the table for the lzsolve variant")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--lock", action="append", default=[], metavar="OP=KERNEL",
                        help="add a variant 'lzsolve+lock': the table with these ops locked (which choice costs)")
    parser.add_argument("--profile", metavar="DIR", help="also profile each variant at each shape: where its time goes "
                        "(top kernels, GPU busy time against wall) into DIR/<case>.txt")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    prefills, batches = shapes(args.tiny)
    hidden = (TINY if args.tiny else {"hidden_size": 1024})["hidden_size"]
    gen = torch.Generator(device).manual_seed(1)

    def inputs(batch, seq):
        return torch.randn(batch, seq, hidden, device=device, dtype=dtype, generator=gen)

    if args.record:  # the calls a server makes: prompts and decode steps, through the patched layer
        model = model_of(args.tiny, dtype, device)
        serve(model, "reference", None)
        caches = {batch: decode_state(model, batch, device) for batch in batches}  # prompts not recorded
        with runtime_loader.record(args.record, name="qwen3.5-0.8b-gdn"), torch.no_grad():
            for _, dims in prefills:
                layer_call(model, inputs(dims["batch"], dims["seq"]))()
            for batch in batches:
                layer_call(model, inputs(batch, 1), caches[batch])()
        return

    variants = ["reference", "transformers"] + (["lzsolve"] if args.artifact else [])
    variants += ["lzsolve+lock"] if args.artifact and args.lock else []
    locks = dict(item.split("=", 1) for item in args.lock)
    models = {v: model_of(args.tiny, dtype, device) for v in variants}  # the same weights (seed 0)
    golden = model_of(args.tiny, torch.float32, device)
    dispatchers = {v: serve(models[v], v, args.artifact, locks) for v in variants}
    serve(golden, "reference", None)
    switch = Switch(dispatchers)
    harness = make_harness(device, Budget(min_samples=10, max_samples=40))
    rows = []
    cases = [(name, dims) for name, dims in prefills] + [("decode", {"batch": b, "seq": 1}) for b in batches]
    for name, dims in cases:
        x = inputs(dims["batch"], dims["seq"])
        with torch.no_grad():
            caches = {v: switch(v, lambda v=v: decode_state(models[v], dims["batch"], device))()
                      for v in variants} if name == "decode" else {}
            gold_cache = switch("reference", lambda: decode_state(golden, dims["batch"], device))() \
                if name == "decode" else None
            expected = switch("reference", layer_call(golden, x.float(), gold_cache))().float()
            errors = {}
            for v in variants:
                got = switch(v, layer_call(models[v], x, caches.get(v)))().float()
                errors[v] = ((got - expected).norm() / expected.norm()).item()
            calls = {v: [switch(v, layer_call(models[v], x, caches.get(v)))] for v in variants}
            us = {}
            for v, m in harness.measure(calls, modes=("eager",)).items():
                us[v] = None if isinstance(m, Exception) else m.eager.median_ms * 1e3
        rows.append({"case": name, "dims": dims, "us": us, "rel_l2_vs_fp32": errors})
        if args.profile:
            with torch.no_grad():
                profile(args.profile, f"{name}-b{dims['batch']}-s{dims['seq']}", calls)
        base = us.get("transformers")
        print(f"{name} {dims}: " + "  ".join(
            f"{v}={t:.0f}us" + (f" ({base / t:.2f}x)" if base and t else "") for v, t in us.items() if t)
              + "  err " + " ".join(f"{v}={e:.1e}" for v, e in errors.items()))
    if "lzsolve" in dispatchers:
        print("lzsolve kernels:", {op: sorted(k) for op, k in dispatchers["lzsolve"].stats().items()})
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
