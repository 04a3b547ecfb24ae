"""A Hugging Face causal LM end to end: SDPA, Liger, torch.compile and lzsolve's dispatch table.

Random-weight models of --layers layers. Columns: sdpa; liger (apply_liger_kernel_to_<family>
on a copy); compile (torch.compile of the sdpa model); liger_compile (the Liger copy compiled);
lzsolve (runtime_loader.load of ARTIFACTS/<model>, register(d), attn_implementation="lzsolve",
patch(model, d) where it exists); lzsolve_compile (torch.compile of that patched model, its table
from GRAPH_ARTIFACTS/<model> when given: the table's kernels are opaque custom ops, Inductor fuses
what lies between them); lzsolve_traced (the same, patched with traced=True: the
table's choice is made while tracing and its kernels' ops are in Inductor's graph; ops whose torch
form Inductor fuses (norms, activations, RoPE) keep that form, the table serves attention, the
GEMMs (q/k/v and gate/up fused) and the experts); lzsolve_traced_nofuse (traced, fuse=False: the
table's kernels for those ops too).
Table states (issue 54: never slower than the model the user had): lzsolve@STATE and
lzsolve_traced@STATE patch the model with another table than its own: @none (no table: the load
failed closed), @other (another model's table, OTHER_TABLE), @torch (its own table as a tune under
another torch wrote it: torch's kernels' entries dropped by partial revalidation), @partial (its own
table with every other signature removed), @unfused (its own table without the entries that choose
only the op's fallback: patch leaves the same modules, but no longer fuses q/k/v or gate/up into one
GEMM by the fallback, as it does wherever the table has the fused signature; docs/benchmark-log.md
§22), lzsolve@only=OP+OP... (its own table with the entries of those ops alone, e.g. @only=norm.qk+act.geglu:
which served op a state loses on); `x` columns compare each with sdpa (the unpatched model).
Rows: prefill forwards (use_cache=False, last position's logits) and greedy generation (prefill,
then decode steps, one explicit loop for every variant: over a DynamicCache eagerly, over a
StaticCache for the compiled variants, as a compiled client serves: fixed shapes, no recompile
per step; --compile-mode reduce-overhead adds CUDA graphs). Each variant is
checked first, against an fp32 copy of the model: a prefill row further from it than --tol
times sdpa's own distance is FAILED and not timed.

    python benchmarks/hf_end_to_end.py --write-configs cfg  # then lzsolve tune --config cfg/<model> --out art/<model>
    python benchmarks/hf_end_to_end.py --record wl          # or lzsolve tune --workload wl/<model>.json ...
    python benchmarks/hf_end_to_end.py --artifacts art --out e2e.json [--profile [--trace]]
    python benchmarks/hf_end_to_end.py --artifacts art --variants sdpa,lzsolve,lzsolve@none,lzsolve@other,\
        lzsolve@torch,lzsolve@partial --out states.json      # every table state a user can be in
    python benchmarks/hf_end_to_end.py --tiny --device cpu --reps 2 --warmup 1   # smoke test
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import inspect
import json
import pstats
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import transformers
from checked_timing import interleaved
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from transformers import AutoModelForCausalLM, DynamicCache, StaticCache

import runtime_loader
from runtime_loader import custom_ops
from runtime_loader.integrations import transformers as lz_hf
from runtime_loader.ops import OPS

GQA = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
MODELS = {  # name -> (config class, shape, Liger family); sdpa is the unpatched model's attention, but for
    # Gemma 2, which transformers runs with its eager attention (SDPA cannot cap the logits)
    "llama3-8b": ("LlamaConfig", dict(GQA, hidden_size=4096, intermediate_size=14336, vocab_size=128256,
                                      rope_theta=500000.0), "llama"),
    "qwen3-8b": ("Qwen3Config", dict(GQA, hidden_size=4096, intermediate_size=12288, vocab_size=151936), "qwen3"),
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=2560, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                        intermediate_size=10240, vocab_size=262144, sliding_window=1024),
               "gemma3_text"),
    "mistral": ("MistralConfig", dict(GQA, hidden_size=4096, intermediate_size=14336, vocab_size=32000,
                                      sliding_window=4096), "mistral"),
    "gemma2": ("Gemma2Config", dict(hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                    intermediate_size=9216, vocab_size=256000, sliding_window=4096,
                                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                    query_pre_attn_scalar=256), "gemma2"),
    # DeepSeek-V2-Lite: multi-head latent attention without a q latent, 64 routed experts (6 a token) beside
    # 2 shared ones, the first layer dense; YaRN as its config.json has it (Liger has no DeepSeek patch)
    "deepseek-v2-lite": ("DeepseekV2Config", dict(
        hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1,
        topk_method="greedy", norm_topk_prob=False, vocab_size=102400, rope_scaling={
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 0.707,
            "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}), "deepseek_v2"),
}
OWN_ATTENTION = {"gemma2": "eager"}  # the unpatched model's attention where it is not sdpa
OTHER_TABLE = {"llama3-8b": "mistral", "mistral": "llama3-8b", "qwen3-8b": "llama3-8b", "gemma3": "gemma2",
               "gemma2": "gemma3", "deepseek-v2-lite": "llama3-8b"}  # lzsolve@other: whose table each model is patched with
STATES = ("none", "other", "torch", "partial", "unfused")
# initializer_range 0.02 * sqrt(4096 / 64): attention scores as spread as the full-size models' (at 0.02
# they are near uniform, and the check against sdpa would pass a wrong attention)
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            vocab_size=256, initializer_range=0.16)
TINY_MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)  # over TINY, for MLA models
SCENARIOS = {"b1s2048": (1, 2048, 0), "b4s512": (4, 512, 0), "b1s1000": (1, 1000, 0), "b3s777": (3, 777, 0),
             "b1s777": (1, 777, 0), "gen_b1": (1, 512, 128), "gen_b16": (16, 512, 128),
             "gen_b1_500": (1, 500, 64), "gen_b8_300": (8, 300, 64)}  # name -> (batch, prompt tokens, decode steps)
TINY_SCENARIOS = {"b1s2048": (1, 64, 0), "b4s512": (4, 16, 0), "b1s1000": (1, 31, 0), "b3s777": (3, 25, 0),
                  "b1s777": (1, 25, 0), "gen_b1": (1, 16, 4), "gen_b16": (16, 16, 4), "gen_b1_500": (1, 15, 4),
                  "gen_b8_300": (8, 9, 4)}
VARIANTS = ("sdpa", "liger", "compile", "liger_compile", "lzsolve", "lzsolve_compile", "lzsolve_traced",
            "lzsolve_traced_nofuse", "lzsolve_jit_launch",
            *(f"{v}@{state}" for v in ("lzsolve", "lzsolve_traced") for state in STATES))
COMPILED = ("compile", "liger_compile", "lzsolve_compile", "lzsolve_traced", "lzsolve_traced_nofuse",
            *(f"lzsolve_traced@{state}" for state in STATES))
# lzsolve_jit_launch: lzsolve with our Triton kernels launched through Triton's JIT function on every
# call (LZSOLVE_TRITON_LAUNCH=jit's path), against the launcher's direct launches (benchmark log §11.7)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CACHE_POSITION = "cache_position" in inspect.signature(transformers.LlamaModel.forward).parameters
CHECKED_STEPS = 8  # generation: the first steps whose tokens are compared with sdpa's


def build(name: str, args, device, dtype):
    cls, shape, _ = MODELS[name]
    if args.tiny:
        shape = {**shape, **TINY, **({"sliding_window": 8} if "sliding_window" in shape else {}),
                 **(TINY_MLA if "kv_lora_rank" in shape else {})}
    config = getattr(transformers, cls)(**shape, num_hidden_layers=args.layers, max_position_embeddings=8192)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                attn_implementation=OWN_ATTENTION.get(name, "sdpa")).eval()


def prefill(model, ids, keep):
    return model(input_ids=ids, use_cache=False, **keep).logits[:, -1].float()


def fp32_logits(model, inputs, scenarios, shapes, keep) -> dict:
    """The prefill rows' logits from an fp32 copy of `model` (sdpa): what each variant is checked against."""
    prefills = [s for s in scenarios if not shapes[s][2]]
    if not prefills:
        return {}
    reference = copy.deepcopy(model).float()
    anchor = {s: prefill(reference, inputs[s], keep) for s in prefills}
    del reference
    return anchor


def generate(model, ids, steps, keep, static: bool = False):
    """Greedy tokens of a prefill then `steps` decode steps. static: over a StaticCache of the run's
    length, each call told its positions (a compiled model then sees two shapes, prefill and decode,
    and reads no cache length from the tensors)."""
    config = model.config  # a compiled model's too (OptimizedModule passes attributes through)
    cache = StaticCache(config=config, max_cache_len=ids.shape[1] + steps + 1) if static else DynamicCache(config=config)
    tokens, done = [ids], 0
    for _ in range(steps + 1):  # the prefill's token, then one per decode step
        positions = torch.arange(done, done + tokens[-1].shape[1], device=ids.device)
        where = {"position_ids": positions.unsqueeze(0).expand(ids.shape[0], -1)} if static else {}
        if static and CACHE_POSITION:  # transformers before 5.24 place the cache's writes by cache_position
            where["cache_position"] = positions
        logits = model(input_ids=tokens[-1], past_key_values=cache, use_cache=True, **where, **keep).logits
        done += tokens[-1].shape[1]
        tokens.append(logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens[1:], dim=1)


def timed_ms(fns: dict, warmup: int, reps: int, device, before=lambda variant: None) -> dict:
    """Per variant, one sample per run of the whole scenario (CUDA events on CUDA, perf_counter on
    CPU), the variants interleaved rep by rep, each rep in its own seeded shuffle (checked_timing.interleaved:
    a drifting host shifts every variant alike, and none always runs after the same one)."""
    for _ in range(warmup):
        for variant, fn in fns.items():
            before(variant)
            fn()
    samples = {v: [] for v in fns}
    for rep in range(reps):
        for variant in interleaved(fns, rep):
            before(variant)  # the variant's setup (module state) stays out of the timed region
            fn = fns[variant]
            if device.type == "cuda":
                torch.cuda.synchronize()
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                samples[variant].append(begin.elapsed_time(end))
            else:
                start = time.perf_counter()
                fn()
                samples[variant].append((time.perf_counter() - start) * 1e3)
    return {v: summary(samples[v]) for v in fns}


def summary(samples: list[float]) -> dict:
    p10, *_, p90 = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 2
    median = statistics.median(samples)
    return {"median_ms": median, "min_ms": min(samples), "spread": (p90 - p10) / median, "samples": samples}


def profile(fn, device, label: str, trace: str | None) -> dict:
    """torch.profiler's tables of 2 reps of fn and, on a GPU, cProfile's of 5; trace: a path stem for
    the chrome trace (.json.gz) and the cProfile stats (.prof)."""
    cuda = device.type == "cuda"
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(2):
            fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    print(f"\n--- {label}: 2 reps ---\n"
          f"{events.table(sort_by='self_device_time_total' if cuda else 'self_cpu_time_total', row_limit=15)}")
    if cuda:  # eager models are often host-bound: where the host's time goes, by op and by Python function
        print(events.table(sort_by="self_cpu_time_total", row_limit=12))
        host = cProfile.Profile()
        host.runcall(lambda: [fn() for _ in range(5)])
        pstats.Stats(host).sort_stats("tottime").print_stats(20)
        pstats.Stats(host).sort_stats("ncalls").print_stats(25)  # Python's share of host time is its calls
        if trace:
            host.dump_stats(f"{trace}.prof")
    cpu_ms = sum(e.self_cpu_time_total for e in events) / 1e3
    # the kernels' own events, as the profiler's table totals them (a CPU op's self device time is its
    # kernels' time once more: summing every event counted each kernel twice)
    device_ms = sum(e.self_device_time_total for e in events
                    if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / 1e3
    print(f"total self CPU {cpu_ms:.2f} ms, self device {device_ms:.2f} ms\n")
    if trace:  # gzipped: a 4-layer model's trace is megabytes of JSON
        prof.export_chrome_trace(f"{trace}.json.gz")
    return {"cpu_ms": cpu_ms, "device_ms": device_ms}


def served(fn) -> tuple:
    """fn's result, and the calls the active Dispatcher took meanwhile: {"op:kernel": calls}, where a kernel
    the table did not choose is marked (fallback). None without Dispatcher.stats."""
    d = custom_ops.active()
    if not hasattr(d, "stats"):
        return fn(), None
    before, out, calls = d.stats(), fn(), {}
    for op, kernels in d.stats().items():
        for kernel, n in kernels.items():
            n -= before.get(op, {}).get(kernel, 0)
            if n:
                calls[f"{op}:{kernel}"] = n
    return out, calls


def compiled(model, args):
    return torch.compile(model, backend=args.compile_backend,
                         **({"mode": args.compile_mode} if args.compile_mode != "default" else {}))


def setup(variant: str, model, name: str, args, artifacts: str | None = None, **patch_args):
    """(runner, None) for a variant of the sdpa `model`, or (None, why it is skipped); artifacts:
    the tables' folder (default --artifacts); patch_args: patch()'s (traced, fuse)."""
    if variant == "sdpa":
        return model, None
    if variant in ("compile", "liger_compile"):
        base, why = setup({"compile": "sdpa", "liger_compile": "liger"}[variant], model, name, args)
        return (None, why) if base is None else (compiled(base, args), None)
    if variant == "lzsolve_jit_launch":
        return setup("lzsolve", model, name, args)
    kind, _, state = variant.partition("@")
    if kind in ("lzsolve_compile", "lzsolve_traced", "lzsolve_traced_nofuse"):  # the patched model compiled
        # lzsolve_compile: the table's kernels as opaque custom ops, Inductor between them; lzsolve_traced:
        # the table's choice made while tracing, its kernels' ops in Inductor's graph (patch(traced=True))
        patched, why = setup("lzsolve" + (f"@{state}" if state else ""), model, name, args,
                             args.graph_artifacts or args.artifacts, traced=kind != "lzsolve_compile",
                             fuse=kind != "lzsolve_traced_nofuse")
        return (None, why) if patched is None else (compiled(patched, args), None)
    if variant == "liger":
        try:
            import liger_kernel.transformers as liger
        except Exception as e:  # noqa: BLE001 - a missing or broken install is a skipped column
            return None, f"liger_kernel not importable ({type(e).__name__}: {e})"
        apply = getattr(liger, f"apply_liger_kernel_to_{MODELS[name][2]}", None)
        if apply is None:
            return None, f"liger_kernel has no apply_liger_kernel_to_{MODELS[name][2]}"
        # no loss in inference: keep the CausalLM forward (and its logits) as transformers has it
        params = inspect.signature(apply).parameters
        off = {k: False for k in ("cross_entropy", "fused_linear_cross_entropy") if k in params}
        patched = copy.deepcopy(model)
        try:
            apply(model=patched, **off)
        except Exception as e:  # noqa: BLE001
            return None, f"{apply.__name__} failed ({type(e).__name__}: {e})"
        return patched, None
    artifacts = artifacts or args.artifacts
    if not artifacts:
        return None, "no --artifacts"
    folder = table_of(state, name, Path(artifacts))
    if not state and not (folder / "dispatch.json").exists():
        return None, f"no {folder / 'dispatch.json'}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            d = runtime_loader.load(folder, strict=not state)  # a state's table may fail closed: that is the state
        except runtime_loader.TableError as e:
            return None, f"table refused: {e}"
    for w in caught:
        print(f"[{name}] {variant} warning: {w.message}")
    if d.table is not None:
        tuned, entries = d.table.raw["model"], d.explain()["entries"]
        print(f"[{name}] {variant} table {folder} ({d.table.raw.get('timing_mode')} mode): {tuned['id']} tp "
              f"{tuned['tp']} {tuned['dtype']}, {len(entries)} op signatures, "
              f"{sum(e['served'] for e in entries.values())} of them usable here")
    patched = copy.deepcopy(model)
    print(f"[{name}] {variant} patch(model, d) ->\n{lz_hf.patch(patched, d, **patch_args)}")
    return patched, None


_derived: dict[tuple, Path] = {}  # (state, model, tables' folder) -> the folder of its table, made once per run


def table_of(state: str, name: str, artifacts: Path) -> Path:
    """The folder of the table a variant in table state `state` (STATES, "" for the model's own) loads."""
    own = artifacts / name
    if state == "other":  # OTHER_TABLE's choice where it was tuned, else another model's that was
        tuned = sorted(p.parent.name for p in artifacts.glob("*/dispatch.json") if p.parent.name != name)
        return artifacts / (OTHER_TABLE[name] if OTHER_TABLE[name] in tuned or not tuned else tuned[0])
    if not state:
        return own
    if (state, name, artifacts) not in _derived:  # the eager tables' and the graph tables' (--graph-artifacts) apart
        scratch = Path(tempfile.mkdtemp(prefix=f"lzsolve-{state.partition('=')[0]}-"))
        change = only(state.partition("=")[2].split("+")) if state.startswith("only=") else {
            "torch": under_another_torch, "partial": every_other_signature, "unfused": beyond_the_fallback}.get(state)
        _derived[state, name, artifacts] = scratch / "no-table" if state == "none" else derived(own, scratch / name, change)
    return _derived[state, name, artifacts]


def derived(source: Path, folder: Path, change) -> Path:
    """A copy of the artifact at `source` (its table and JIT caches, not its PerfDB) whose
    dispatch.json `change` rewrote, with a manifest of its own."""
    from lzsolve.store.artifact import refresh_manifest

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("perfdb", ".*"))
    raw = json.loads((folder / "dispatch.json").read_text())
    change(raw)
    (folder / "dispatch.json").write_text(json.dumps(raw, indent=1))
    refresh_manifest(folder)
    return folder


def under_another_torch(raw: dict) -> None:
    """As a tune under another torch would have written it: the hardware's torch and torch's kernels'
    versions (runtime_loader keeps the other libraries' entries: partial revalidation)."""
    here = raw["hardware"]["torch"]
    other = "2.10.0" if here != "2.10.0" else "2.9.1"
    raw["hardware"]["torch"] = other
    for kernel in raw["kernels"].values():
        if kernel["library"] == "torch" and kernel["version"]:
            kernel["version"] = kernel["version"].replace(here, other, 1)


def every_other_signature(raw: dict) -> None:
    raw["ops"] = raw["ops"][::2]


def only(ops: list[str]):
    def keep(raw: dict) -> None:
        raw["ops"] = [e for e in raw["ops"] if e["op"] in ops]
    return keep


def beyond_the_fallback(raw: dict) -> None:
    """The entries that choose some kernel other than their op's fallback."""
    from lzsolve.decide.solve import leaves

    raw["ops"] = [e for e in raw["ops"] if {leaf["kernel_id"] for leaf in leaves(e["tree"])}
                  - {OPS[e["signature"].partition("[")[0]].fallback}]


def relative_error(out, reference) -> float:
    return float((out - reference).abs().max() / reference.abs().max())


def record_workload(name: str, args, device, dtype, shapes, scenarios) -> None:
    """What the patched model calls in these scenarios, as a workload file: the table that fits this client."""
    model = build(name, args, device, dtype)
    lz_hf.patch(model, runtime_loader.Dispatcher(None), all_ops=True)  # every module: record sees every call
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(type(model).forward).parameters else {}
    gen = torch.Generator().manual_seed(2)  # other tokens than the timed runs'; the same shapes
    path = Path(args.record) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(), runtime_loader.record(path, name=name):
        for s in scenarios:
            batch, seq, steps = shapes[s]
            ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen).to(device)
            generate(model, ids, steps, keep) if steps else prefill(model, ids, keep)
    lz_hf.restore_functions()
    print(f"wrote {path}")


def check(out, expected, anchor, steps: int, tol: float) -> dict:
    """Prefill: the last position's logits against an fp32 copy of the model (`anchor`); a
    variant passes when it is at most `tol` times as far from it as sdpa in the run's dtype is
    (in bf16 two right implementations differ by rounding, so a fixed bound against sdpa would
    fail right ones or pass wrong ones). Generation: the greedy tokens against sdpa's (reported,
    never failed)."""
    if steps:
        same = out == expected
        return {"equal_first": int(same[:, :CHECKED_STEPS].sum()), "first": same[:, :CHECKED_STEPS].numel(),
                "equal_tokens": int(same.sum()), "tokens": same.numel()}
    err, sdpa_err = relative_error(out, anchor), relative_error(expected, anchor)
    return {"rel_err": err, "sdpa_rel_err": sdpa_err, "ok": err <= tol * max(sdpa_err, 1e-4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and lengths (a CPU smoke test)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--artifacts", help="folder of artifacts: ARTIFACTS/<model>/dispatch.json")
    parser.add_argument("--write-configs", metavar="DIR", help="write DIR/<model>/config.json and exit")
    parser.add_argument("--record", metavar="DIR", help="run the scenarios once, patched with no table, recording "
                        "DIR/<model>.json (for lzsolve tune --workload), and exit")
    parser.add_argument("--graph-artifacts", metavar="DIR", help="the compiled lzsolve variants' tables "
                        "(graph mode: a compiled client's), DIR/<model>/dispatch.json; default --artifacts")
    parser.add_argument("--compile-backend", help="default inductor (aot_eager with --tiny: no codegen wait)")
    parser.add_argument("--compile-mode", default="default", choices=("default", "reduce-overhead", "max-autotune"),
                        help="torch.compile's mode for every compiled variant (reduce-overhead: CUDA graphs)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--tol", type=float, default=2.0,
                        help="a prefill row passes when max |logits - fp32's| / max |fp32's| is at most TOL times sdpa's")
    parser.add_argument("--profile", action="store_true", help="torch.profiler over 2 reps of each timed cell, cProfile over 5")
    parser.add_argument("--trace", action="store_true",
                        help="with --profile and --out: chrome traces and cProfile stats (.prof) next to --out")
    parser.add_argument("--out", help="JSON file for every figure")
    args = parser.parse_args()
    names, variants, scenarios = (s.split(",") for s in (args.models, args.variants, args.scenarios))
    subsets = {v for v in variants if v.startswith("lzsolve@only=")}  # the own table, some ops' entries alone
    for given, known in ((names, MODELS), (set(variants) - subsets, VARIANTS), (scenarios, SCENARIOS),
                         ({op for v in subsets for op in v.partition("=")[2].split("+")}, OPS)):
        if set(given) - set(known):
            parser.error(f"unknown {sorted(set(given) - set(known))}; known: {', '.join(known)}")
    args.compile_backend = args.compile_backend or ("aot_eager" if args.tiny else "inductor")
    # compile and lzsolve_compile trace the same modelling code: Dynamo's per-code recompile limit (8)
    # is shared between them, and the one compiled second would run partly uncompiled
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.write_configs:
        for name in names:
            path = Path(args.write_configs) / name / "config.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            build(name, args, "meta", dtype).config.to_json_file(path, use_diff=False)
            print(f"wrote {path}")
        return

    shapes = TINY_SCENARIOS if args.tiny else SCENARIOS
    if args.record:
        for name in names:
            record_workload(name, args, device, dtype, shapes, scenarios)
        return
    rows, skipped = [], {}
    for name in names:
        model = build(name, args, device, dtype)
        # the last position's logits only, where the model takes logits_to_keep (so for every variant alike)
        keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(type(model).forward).parameters else {}
        gen = torch.Generator().manual_seed(1)
        inputs = {s: torch.randint(0, model.config.vocab_size, shapes[s][:2], generator=gen).to(device)
                  for s in scenarios}

        def scenario(m, s, static=False):
            steps = shapes[s][2]
            return ((lambda: generate(m, inputs[s], steps, keep, static)) if steps
                    else (lambda: prefill(m, inputs[s], keep)))

        with torch.inference_mode():
            expected = {s: scenario(model, s)() for s in scenarios}
            anchor = fp32_logits(model, inputs, scenarios, shapes, keep)
            # Liger and lzsolve's patch swap functions in the modelling module (rope): each variant's
            # module state is kept, and put in place before each of its calls
            module = sys.modules[type(model).__module__]
            baseline, runners, states, dispatchers = dict(vars(module)), {}, {}, {}
            for variant in variants:
                runner, why = setup(variant, model, name, args)
                if runner is None:
                    print(f"[{name}] {variant} skipped: {why}")
                    skipped.setdefault(name, {})[variant] = why
                else:
                    runners[variant], states[variant] = runner, dict(vars(module))
                    dispatchers[variant] = custom_ops.active()  # each lzsolve variant loaded its own
                vars(module).update(baseline)

            def use(variant):
                vars(module).update(states[variant])
                custom_ops.activate(dispatchers[variant])
                if "lzsolve_jit_launch" in runners:  # asked for: this machine runs our Triton kernels
                    from runtime_loader.kernels.triton_ops import launch
                    launch.DIRECT = variant != "lzsolve_jit_launch"
                return runners[variant]

            for s in scenarios:
                batch, seq, steps = shapes[s]
                timed = {}
                for variant in runners:
                    fn = scenario(use(variant), s, static=variant in COMPILED)
                    row = {"model": name, "scenario": s, "variant": variant, "batch": batch, "seq": seq, "steps": steps}
                    try:
                        counted = variant.startswith("lzsolve") and variant not in COMPILED  # (compiled: uncounted)
                        out, calls = served(fn) if counted else (fn(), None)
                    except Exception as e:  # noqa: BLE001 - a variant that raises fails its row, not the run
                        rows.append(row | {"ok": False, "error": f"{type(e).__name__}: {e}"})
                        print(f"[{name} {s}] {variant}: FAILED, {rows[-1]['error']}")
                        continue
                    figures = check(out, expected[s], anchor.get(s), steps, args.tol)
                    if calls is not None:  # attention calls the table served, of one per layer and forward
                        table = sum(n for k, n in calls.items() if k.startswith("attention") and "(fallback)" not in k)
                        figures |= {"table_attention": f"{table}/{args.layers * (1 + steps)}", "calls": calls}
                    print(f"[{name} {s}] {variant}: " + ", ".join(
                        f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
                    rows.append(row | figures)
                    if figures.get("ok", True):
                        timed[variant] = (rows[-1], fn)
                figures = timed_ms({v: fn for v, (_, fn) in timed.items()}, args.warmup, args.reps, device, before=use)
                for variant, (row, fn) in timed.items():
                    row |= figures[variant]
                    print(f"[{name} {s}] {variant}: {row['median_ms']:.2f} ms ({row['spread']:.0%})")
                    if args.profile:
                        label = f"{name}-{s}-{variant}"
                        safe = re.sub(r"[^\w.-]", "_", label)  # @only=a+b: plain file names
                        trace = args.trace and args.out and f"{Path(args.out).with_suffix('')}-{safe}"
                        use(variant)
                        row["profile"] = profile(fn, device, label, trace or None)
                write(args, device, rows, skipped)  # each scenario as it comes: a run cut short keeps its figures
            vars(module).update(baseline)
            torch._dynamo.reset()
            runners.clear()  # the variants hold copies of the model
        del model, expected, anchor
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print_table(rows, names, scenarios, variants, shapes, args, device)
    write(args, device, rows, skipped)


def write(args, device, rows, skipped) -> None:
    if args.out:
        meta = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(device),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                **{k: getattr(args, k) for k in ("dtype", "layers", "tiny", "warmup", "reps", "artifacts",
                                                  "graph_artifacts", "compile_backend", "compile_mode")}}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=1))


def paired_ratio(base: dict, other: dict) -> float:
    """The median over reps of base's sample / other's: the reps interleave the variants, so a host
    that drifts between reps moves both samples of a pair alike."""
    return statistics.median(b / o for b, o in zip(base["samples"], other["samples"]))


def fastest_ratio(base: dict, other: dict) -> float:
    """base's fastest rep / other's: a busy host only adds time, so where the reps of two variants
    that run the same code spread 20-60% (a generation's 64 host-bound steps on a loaded host), their
    fastest reps still agree (benchmarks/runs/2026-12-06-i.txt: the no-table rows' medians 0.82-1.02,
    their fastest 1.00-1.03)."""
    return min(base["samples"]) / min(other["samples"])


def print_table(rows, names, scenarios, variants, shapes, args, device) -> None:
    cell = {(r["model"], r["scenario"], r["variant"]): r for r in rows}
    others = [v for v in variants if v != "sdpa"]
    print(f"\n{args.layers} layers, {args.dtype}, {device}: median ms of {args.reps} reps ((p90-p10)/median); x = sdpa "
          f"ms / variant ms (>1: faster than sdpa), in brackets the median of the reps' own ratios (each rep times "
          f"every variant in turn: drift between reps cancels) and the fastest reps' ratio; * tokens differ from sdpa's in the first "
          f"{CHECKED_STEPS} steps")
    width = max(16, *(len(v) + 1 for v in variants))
    print(f"{'model':10} {'scenario':8} {'shape':>12} " + "".join(f"{v:>{width}}" for v in variants)
          + "".join(f"{'x ' + v:>{width + 8}}" for v in others))
    for name in names:
        for s in scenarios:
            batch, seq, steps = shapes[s]
            found = {v: cell.get((name, s, v)) for v in variants}
            ms = {v: r.get("median_ms") if r else None for v, r in found.items()}
            texts = ["skip" if r is None else "FAILED" if ms[v] is None else f"{ms[v]:.2f} ({r['spread']:.0%})"
                     + "*" * (r.get("equal_first", 0) < r.get("first", 0)) for v, r in found.items()]
            ratios = [f"{ms['sdpa'] / ms[v]:.2f} ({paired_ratio(found['sdpa'], found[v]):.2f}, "
                      f"{fastest_ratio(found['sdpa'], found[v]):.2f})" if ms.get("sdpa") and ms[v] else "-" for v in others]
            shape = f"b{batch} s{seq}" + (f" +{steps}" if steps else "")
            print(f"{name:10} {s:8} {shape:>12} " + "".join(f"{t:>{width}}" for t in texts)
                  + "".join(f"{x:>{width + 8}}" for x in ratios))


if __name__ == "__main__":
    main()
