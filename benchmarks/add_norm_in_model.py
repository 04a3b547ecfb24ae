"""Where a served fused residual-add RMSNorm loses in an eager model (issue 54's half tables).

Gemma 2's and Gemma 3's half tables, whose one served op is norm.rms_add (a Triton kernel in place of
the add and about ten ATen ops of the model's own norm), ran 0.96-0.98x of the unpatched model
(benchmarks/runs/2026-12-06-f.txt), although back to back that kernel costs the host a third of
its fallback and after a model's host work 0.78 of it (benchmarks/runs/2026-12-06-g.txt,
host_in_context.py). This separates what patch() changes there, on the model itself, with no
table (each a copy of the model, timed interleaved rep by rep as hf_end_to_end.py times them):

- `unpatched`: the model as transformers builds it;
- `rewrite`: the decoder layers run patch()'s recompiled forward (the add, the residual's rebinding
  and the norm as one _add_norm call), whose add and norm are the layer's own code (what a table
  that does not serve the call runs);
- `kernel`: the same forward, its _add_norm the Triton kernel called directly (the registry's
  implementation, as the dispatcher calls it; keep_inputs: new tensors);
- `kernel_inplace`: the kernel writing over its inputs, as serving engines let it;
- `norms`: the unpatched layers with every RMSNorm the Triton rms_norm, called directly (the plain
  norm's half of a table, which ran 1.15-1.17x);
- `norm_at_site`: the unpatched layers with the fused site's norm alone the Triton rms_norm (the add
  left to the layer): whether a launch there loses as the fused one does.

    python benchmarks/add_norm_in_model.py --models gemma2,llama3-8b --json out.json
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from checked_timing import write_figures
from hf_end_to_end import SCENARIOS, TINY_SCENARIOS, build, generate, prefill, timed_ms

from runtime_loader import registry
from runtime_loader.integrations import transformers as lz_hf
from runtime_loader.integrations.modules import classify, eps_of

VARIANTS = ("unpatched", "rewrite", "kernel", "kernel_inplace", "norms", "norm_at_site")


def rms_norms(model) -> dict:
    """Name -> (module, its unit_offset) of each RMSNorm of model, as patch() classifies them
    (modules.classify: Gemma's scale by 1 + weight)."""
    modules = dict(model.named_modules())
    return {name: (modules[name], kind.unit_offset) for name, kind in classify(model).items() if kind.op == "norm.rms"}


def with_fused_layers(model):
    """(a copy of model whose decoder layers run patch()'s recompiled forward, the norms it fuses);
    (None, ()) where it has none."""
    model = copy.deepcopy(model)
    layers, norms = model.model.layers, rms_norms(model)
    offsets = dict(norms.values())
    cls = type(layers[0])
    names = frozenset(n for n, m in layers[0].named_children() if m in offsets)
    forward, fused = lz_hf._fused_forward(cls, names)
    if forward is None:
        return None, ()
    serving = type(cls.__name__, (cls,), {"forward": forward})
    for layer in layers:
        layer.__class__ = serving
        for name in fused:
            norm = getattr(layer, name)
            norm._lzsolve_eps, norm._lzsolve_unit_offset = eps_of(norm), offsets[norm]
    return model, fused


def host_timed(add_norm, sink: list):
    """add_norm, appending (rows, host seconds) of each call to sink."""
    def timed(norm, x, residual, residual_first=True):
        start = time.perf_counter()
        out = add_norm(norm, x, residual, residual_first)
        sink.append((x.numel() // x.shape[-1], time.perf_counter() - start))
        return out
    return timed


def own_add_norm(norm, x, residual, residual_first=True):
    total = residual + x if residual_first else x + residual
    return norm(total), total


def kernel_add_norm(keep_inputs: bool):
    impl = registry.REGISTRY["triton.rms_norm_add"].impl

    def add_norm(norm, x, residual, residual_first=True):
        if x.is_contiguous() and residual.is_contiguous():
            return impl(x, residual, norm.weight, norm._lzsolve_eps, norm._lzsolve_unit_offset, keep_inputs)
        return own_add_norm(norm, x, residual, residual_first)
    return add_norm


def with_kernel_norms(model, names: frozenset | None = None):
    """A copy of model whose RMSNorms (of the decoder layers' attributes `names` alone, if given) are the
    Triton rms_norm, called directly."""
    model = copy.deepcopy(model)
    impl = registry.REGISTRY["triton.rms_norm"].impl
    for name, (norm, offset) in rms_norms(model).items():
        if names is not None and name.rpartition(".")[2] not in names:
            continue
        eps = eps_of(norm)
        norm.forward = lambda x, norm=norm, eps=eps, offset=offset: impl(x, norm.weight, eps, offset)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma2,llama3-8b")
    parser.add_argument("--scenarios", default="b1s777,gen_b1_500")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cpu: the unpatched and rewrite variants alone (no Triton)")
    parser.add_argument("--tiny", action="store_true", help="hf_end_to_end.py's tiny shapes (a smoke test)")
    parser.add_argument("--call-times", type=int, default=0, metavar="N",
                        help="also N runs of each scenario per fused variant with each add + norm call's host time "
                             "taken in the model (perf_counter around it)")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    variants = VARIANTS if device.type == "cuda" else VARIANTS[:2]
    rows = []
    for name in args.models.split(","):
        model = build(name, args, device, torch.bfloat16)
        fused, fused_norms = with_fused_layers(model)
        if fused is None:
            print(f"{name}: patch() finds no residual add + norm to fuse", file=sys.stderr)
            continue
        module = sys.modules[type(model.model.layers[0]).__module__]
        add_norms = {"rewrite": own_add_norm, "kernel": kernel_add_norm(True), "kernel_inplace": kernel_add_norm(False)}
        models = {"unpatched": model, "rewrite": fused, "kernel": fused, "kernel_inplace": fused}
        if "norms" in variants:
            models["norms"] = with_kernel_norms(model)
            models["norm_at_site"] = with_kernel_norms(model, frozenset(fused_norms))

        def before(variant: str, sink: list | None = None) -> None:
            # the recompiled forward reads _add_norm from its module's globals
            add_norm = add_norms.get(variant, lz_hf._add_norm)
            setattr(module, lz_hf.ADD_NORM, add_norm if sink is None else host_timed(add_norm, sink))

        for scenario in args.scenarios.split(","):
            batch, tokens, steps = (TINY_SCENARIOS if args.tiny else SCENARIOS)[scenario]
            ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=device)
            with torch.no_grad():
                fns = {v: (lambda m=models[v]: generate(m, ids, steps, {})) if steps else
                       (lambda m=models[v]: prefill(m, ids, {})) for v in variants}
                expected = fns["unpatched"]().float()
                for v in variants:  # each variant computes what the model does (the kernels within bf16's reach)
                    before(v)
                    out = fns[v]().float()
                    error = ((out - expected).norm() / expected.norm()).item() if not steps else \
                        (out != expected).float().mean().item()
                    print(f"{name:<10} {scenario:<11} {v:<15} {'tokens differing' if steps else 'rel err'} {error:.2e}")
                times = timed_ms(fns, args.warmup, args.reps, device, before)
            if args.call_times:  # outside the timed reps: the timer's own cost is in every call alike
                for v in [v for v in ("rewrite", "kernel", "kernel_inplace") if v in fns]:
                    sink = []
                    before(v, sink)
                    with torch.no_grad():
                        for _ in range(args.call_times):
                            fns[v]()
                    for label, rows_of in (("1 token", lambda n: n == 1), ("prompt", lambda n: n > 1)):
                        us = [t * 1e6 for n, t in sink if rows_of(n)]
                        if us:
                            rows.append({"model": name, "scenario": scenario, "variant": v, "calls_of": label,
                                         "call_host_us": statistics.median(us), "calls": len(us)})
                            print(f"{name:<10} {scenario:<11} {v:<15} its add + norm call, {label}: "
                                  f"{statistics.median(us):6.1f} us of host (median of {len(us)})", flush=True)
            base = times["unpatched"]
            for v, t in times.items():
                paired = statistics.median(b / s for b, s in zip(base["samples"], t["samples"]))
                rows.append({"model": name, "scenario": scenario, "variant": v, "median_ms": t["median_ms"],
                             "spread": t["spread"], "x_unpatched": base["median_ms"] / t["median_ms"],
                             "x_paired": paired})
                print(f"{name:<10} {scenario:<11} {v:<15} {t['median_ms']:8.2f} ms ({t['spread']:.0%})  "
                      f"x {base['median_ms'] / t['median_ms']:.3f} ({paired:.3f})", flush=True)
        del model, fused, models
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
