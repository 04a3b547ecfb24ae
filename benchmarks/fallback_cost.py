"""Host cost of a patched module whose call the table does not serve: patched vs unpatched.

A patched module hands a call the table does not serve (past the tuned range, another dtype) to
its own forward (runtime_loader.dispatcher.NOT_SERVED); what that adds is the table lookup and the
hand-back. This builds a table holding every signature a small Llama calls (from patch's own
observation of the model), each served by a kernel other than the op's fallback (a table whose
choice is the fallback leaves the module as it is), tuned at one token only, patches a copy of the model with it, and
times each module kind, and the whole forward, on calls past that range, against the unpatched
model's: interleaved rounds, the median per call. Small shapes, so the host sets the pace.

    python benchmarks/fallback_cost.py [--device cuda] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import statistics
import time
import warnings

import torch
import transformers

from lzsolve.store.artifact import kernel_provenance
from runtime_loader import Dispatcher, registry
from runtime_loader.hardware import device_info, hardware_signature
from runtime_loader.integrations.transformers import observe, patch, restore_functions
from runtime_loader.table import parse_table

CONFIG = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)
MODULES = {"RMSNorm": "model.layers.0.input_layernorm", "Linear (o_proj)": "model.layers.0.self_attn.o_proj",
           "MLP (gate/up one GEMM, SwiGLU)": "model.layers.0.mlp", "decoder layer": "model.layers.0"}


def kernel_other_than_fallback(sig, device: torch.device) -> str:
    """A kernel of sig's op that runs here and is not its fallback (so that patch replaces the module:
    a table whose choice is the fallback leaves it), else the fallback."""
    info, fallback = device_info(device), registry.fallback_for(sig).kernel_id
    usable = [spec.kernel_id for spec in registry.candidates(sig.op)
              if spec.kernel_id != fallback and not spec.check(sig, info) and not spec.jit]
    return usable[0] if usable else fallback


def table_of_everything(model, device: torch.device) -> dict:
    """Every signature the model calls, each served by a kernel other than its fallback, tuned at one
    token / one row: every module is replaced, every call of more tokens is handed back."""
    calls, _ = observe(model)
    sigs = sorted({sig for found in calls.values() for sig in found}, key=str)
    ops = [{"signature": str(s), **s.to_json(), "tree": {"kernel_id": kernel_other_than_fallback(s, device)}}
           for s in sigs]
    buckets = {s.op: {dim: [1] for dim in s.schema.dynamic} for s in sigs}
    return {"schema_version": 1, "model": {"id": "fallback-cost", "tp": 1, "dtype": sigs[0].dtype},
            "hardware": hardware_signature(device), "capabilities_hash": registry.capabilities_hash(),
            "kernels": kernel_provenance({o["tree"]["kernel_id"] for o in ops}), "timing_mode": "eager",
            "buckets": buckets, "fallback_policy": {"outside_table": "fallback", "fallbacks": {}}, "jit": None,
            "ops": ops}


def per_call_us(fn, n: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per call (past the table's range of 1)")
    parser.add_argument("--calls", type=int, default=500, help="calls per round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(device):
        plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(dtype).eval()
    patched = copy.deepcopy(plain)
    d = Dispatcher(parse_table(table_of_everything(plain, device)))
    report = patch(patched, d)
    print(report)
    x = torch.randn(1, args.tokens, CONFIG["hidden_size"], device=device, dtype=dtype)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, args.tokens), device=device)
    rotary = plain.model.rotary_emb(x, torch.arange(args.tokens, device=device)[None])
    layer_kwargs = {"position_embeddings": rotary, "attention_mask": None}
    cases = {kind: (lambda m, name=name: (m.get_submodule(name), x)) for kind, name in MODULES.items()}
    rows = []
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the calls past the tuned range, warned about once each
        for kind, pick in [*cases.items(), ("whole forward (logits of the last token)", None)]:
            if pick is None:
                fns = {name: (lambda m=m: m(ids, use_cache=False, logits_to_keep=1)) for name, m in
                       (("unpatched", plain), ("patched", patched))}
            else:
                fns = {}
                for name, m in (("unpatched", plain), ("patched", patched)):
                    module, arg = pick(m)
                    kwargs = layer_kwargs if kind == "decoder layer" else {}
                    fns[name] = lambda module=module, arg=arg, kwargs=kwargs: module(arg, **kwargs)
            timings = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    timings[name].append(per_call_us(fn, args.calls, sync))
            added = [b - a for a, b in zip(timings["unpatched"], timings["patched"])]
            rows.append({"module": kind, "unpatched_us": statistics.median(timings["unpatched"]),
                         "patched_us": statistics.median(timings["patched"]), "added_us": statistics.median(added)})
    served = d.coverage()
    print(f"\n{'module':44} {'unpatched us':>13} {'patched us':>11} {'added us':>9}")
    for r in rows:
        print(f"{r['module']:44} {r['unpatched_us']:13.2f} {r['patched_us']:11.2f} {r['added_us']:9.2f}")
    print(f"device {device}, {args.tokens} tokens a call, {args.rounds} rounds x {args.calls} calls; table served "
          f"{served['served']} of {served['calls']} calls (every one past its range: the modules' own code)")
    restore_functions()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": dt.date.today().isoformat(), "device": str(device), "tokens": args.tokens,
                       "hardware": hardware_signature(device), "rows": rows, "coverage": served}, f, indent=1)


if __name__ == "__main__":
    main()
