"""Hand-built artifacts for runtime tests (the solver's own output is tested end to end), the
replay check every tuned artifact of the tests goes through, and the tune of what patched models call."""
import json
from collections import Counter
from pathlib import Path

import torch

import runtime_loader
from lzsolve.ops import CONTRACTS, compare, to_fp32
from lzsolve.pipeline import (
    GridConfig,
    MeasureConfig,
    ModelSource,
    OutputConfig,
    SearchConfig,
    Tune,
    TuneConfig,
    TuneResult,
    ValidateConfig,
)
from runtime_loader import Dispatcher, registry
from runtime_loader.hardware import hardware_signature
from runtime_loader.manifest import MANIFEST, build_manifest
from runtime_loader.ops import Signature, method_args
from runtime_loader.table import choose, tuned_range


def entry(sig: Signature, tree: dict) -> dict:
    return {"signature": str(sig), **sig.to_json(), "tree": tree}


RMS = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
ATTN = Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16}, ("causal",), "fp32")

# Tunes that check what is tuned, written and served, not which kernel wins, sample each candidate
# for a tenth of the default time (tune --sample-time): on 2 cores a tiny Llama's tune with probes
# and validation took 31 s where the default's took 99 s (2026-11-28).
QUICK = ("--sample-time", "0.05")
# The same for tunes in this process (lzsolve.pipeline.Tune), measured here too (no worker process)
QUICK_CPU = MeasureConfig(device="cpu", isolate=False, sample_time=0.05)
# torch.compile left out (seconds of Inductor per kernel on CPU)
NO_COMPILE = GridConfig(grid="tiny", exclude=("compile.*",))


def plugin_kernels() -> tuple[str, ...]:
    """The kernels test modules registered (tests.cliff_kernels, tests.tunable_kernels... on their
    import, at collection): no candidates for the shared tiny tune or a re-run of it. A table that
    chose one is refused by every process without that plugin, and a re-run that planned them
    measured them again, in workers that do not know them."""
    return tuple(kernel_id for kernel_id, spec in registry.REGISTRY.items()
                 if getattr(spec.impl, "__module__", "").startswith("tests."))
# no probes or validation: for the tests that check what is tuned and served, not the decisions
SERVING = ValidateConfig(probe=False, shapes=0)
NO_SEARCH_CHANGE = SearchConfig()  # the search's defaults


def tuned(model: ModelSource, out: Path, grid: GridConfig = NO_COMPILE, measure: MeasureConfig = QUICK_CPU,
          validate: ValidateConfig = SERVING, search: SearchConfig = NO_SEARCH_CHANGE) -> TuneResult:
    """A tune in this process (the tiny grid, quick sampling, no probes or validation unless told),
    its artifact in `out`; it must end ok."""
    result = Tune(TuneConfig(model, grid, measure, search, validate, OutputConfig(out=out))).run()
    assert result.status == "ok", result.summary
    return result


def leaf_ids(node):
    if "kernel_id" in node:
        return {node["kernel_id"], *(r.get("kernel_id") for r in node.get("ranked") or ())}
    return leaf_ids(node["le"]) | leaf_ids(node["gt"])


def provenance(kernel_ids) -> dict:
    out = {}
    for kernel_id in kernel_ids:
        spec = registry.get(kernel_id) if registry.known(kernel_id) else None
        out[kernel_id] = {"library": "torch", "version": spec.version() if spec else "0",
                          "capabilities": spec.capabilities_hash() if spec else "0" * 64, "jit_caches": []}
    return out


def table(ops=None, **overrides) -> dict:
    ops = ops if ops is not None else [
        entry(RMS, {"dim": "tokens", "threshold": 8.0, "le": {"kernel_id": "torch.rms_norm"},
                    "gt": {"kernel_id": "eager.rms_norm"}}),
        entry(ATTN, {"kernel_id": "sdpa.math"}),
    ]
    if "kernels" not in overrides:
        named = set().union(*(leaf_ids(e["tree"]) for e in ops if isinstance(e.get("tree"), dict))) if ops else set()
        overrides["kernels"] = provenance(named)
    return {
        "schema_version": 1,
        "model": {"id": "test", "tp": 1, "dtype": "fp32"},
        "hardware": hardware_signature("cpu"),
        "capabilities_hash": registry.capabilities_hash(),
        "timing_mode": "eager",
        "buckets": {"norm.rms": {"tokens": [1, 16]}, "attention.prefill": {"batch": [1], "seq": [8]}},
        "fallback_policy": {"outside_table": "fallback", "fallbacks": {}},
        "jit": None,
        "ops": ops,
        **overrides,
    }


def write(folder, raw, manifest: bool = True) -> str:
    """An artifact folder with dispatch.json (and, unless told otherwise, a matching manifest)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dispatch.json").write_text(raw if isinstance(raw, str) else json.dumps(raw))
    if manifest:
        (folder / MANIFEST).write_text(json.dumps(build_manifest(folder)))
    return str(folder)


OFF_GRID = {"tokens": [3, 100], "batch": [3], "seq": [40], "kv_len": [50, 200]}


def _points(entry: dict, table: dict) -> list[dict]:
    grid = table["buckets"][entry["op"]]
    inside = [{d: v[-1] for d, v in grid.items()}, {d: v[0] for d, v in grid.items()}]
    outside = [{d: OFF_GRID[d][i % len(OFF_GRID[d])] for d in grid} for i in range(2)]
    return inside + outside


def assert_replays_references(artifact: Path) -> Dispatcher:
    """Load `artifact` strictly and call every entry of its table at its smallest and largest
    buckets and at two points off the grid: each call takes the tree's kernel (the fallback past the
    range the table was tuned over) and agrees with the op's fp32 reference. Returns the dispatcher."""
    d = runtime_loader.load(artifact, strict=True)
    table = json.loads((Path(artifact) / "dispatch.json").read_text())
    limits = tuned_range(table["buckets"])
    gen = torch.Generator().manual_seed(3)
    for entry in table["ops"]:
        sig = Signature.make(entry["op"], entry["static"], entry["flags"], entry["dtype"])
        contract, method = CONTRACTS[sig.op], Dispatcher.METHODS[sig.op]
        for dims in _points(entry, table):
            kernel_args = contract.make_inputs(sig, dims, torch.device("cpu"), gen)
            # the method's: flags the kernel's arguments leave out (qk_norm) still name the signature
            args = method_args(sig, kernel_args)
            past = any(dims[dim] > limit for dim, limit in limits.get(sig.op, {}).items())
            expected = registry.fallback_for(sig).kernel_id if past else choose(d.table.trees[sig], dims)
            assert d.kernel_for(method, *args) == expected, "replays the tree"
            reference = contract.reference(*to_fp32(kernel_args))  # first: norm.rms_add may overwrite its inputs
            ok, _, message = compare(getattr(d, method)(*args), reference, contract.tolerances[sig.dtype])
            assert ok, f"{sig} at {dims}: {message}"
    return d


def serving_fallbacks(**locks: str) -> Dispatcher:
    """A dispatcher with no table that serves every op as if a table had chosen the op's fallback
    (policy locks; `locks` names other kernels for some ops, e.g. attention_prefill="eager.attention"):
    a model patched with it runs each of the patch's serving forwards, where Dispatcher(None) serves
    nothing."""
    from runtime_loader.ops import OPS
    from runtime_loader.policies import Policy
    lock = {op: locks.get(op.replace(".", "_"), schema.fallback) for op, schema in OPS.items()}
    return Dispatcher(None, policy=Policy(lock=lock))


def assert_served_by_its_own_table(d: Dispatcher) -> None:
    """Every call a model made through `d`, patched with the table tuned for it, was the table's: served
    by one of its kernels, or handed to the module's own code where its choice is the op's fallback
    (the same computation; patch leaves a module whose every choice is). None outside the table, past
    its range or with no usable kernel."""
    from runtime_loader.dispatcher import CHOSE_FALLBACK
    outside = {sig: row for sig, row in d.coverage()["outside"].items() if set(row["why"]) != {CHOSE_FALLBACK}}
    assert not outside, outside


def table_serves(d: Dispatcher, calls: dict, name: str, op: str | None = None) -> bool:
    """Whether `d`'s table serves, beyond the op's fallback, some call (of `op`) the module `name`
    makes (`calls`: integrations.transformers.observe's, of the unpatched model): whether patch serves it."""
    return any(d.covers(sig) for sig in calls.get(name, ()) if op is None or sig.op == op)


def served_beyond_fallback(d: Dispatcher) -> set[str]:
    """The ops some call of which `d`'s table served with a kernel other than the op's fallback: the
    counterpart of table_serves at run time (a table may choose the fallback itself, e.g. SDPA where
    it timed fastest, and stats() then names it without " (fallback)")."""
    return {op for op, kernels in d.stats().items()
            if any(not k.endswith((" (fallback)", " (failed)")) and k != registry.fallback(op).kernel_id
                   for k in kernels)}


def fused_groups(d: Dispatcher, model, calls: dict, groups: list) -> dict[str, int]:
    """The sibling linears (observe's groups) whose one GEMM `d` serves beyond the op's fallback, counted
    as patch's report names them ("q_proj+k_proj+v_proj": layers): what patch fuses."""
    from runtime_loader.integrations.transformers import _fused_signature

    modules, fused = dict(model.named_modules()), Counter()
    for names in groups:
        dtype = next(iter(calls[names[0]])).dtype
        if d.covers(_fused_signature([modules[n] for n in names], dtype)):
            fused["+".join(n.rpartition(".")[2] for n in names)] += 1
    return dict(fused)


def tune_what_patched_models_call(root: Path, name: str, models) -> Path:
    """generate() of each model, patched whole with no table, recorded as one workload, then tuned on CPU
    in this process (tiny grid, no probes or validation: the tests that use it check serving, not
    decisions). Returns the artifact folder."""
    from runtime_loader.integrations.transformers import patch

    try:
        with runtime_loader.record(root / "workload.json", name=name), torch.no_grad():
            for model in models:
                patch(model, Dispatcher(None), all_ops=True)
                model.generate(torch.randint(1, 128, (2, 12)), max_new_tokens=4, do_sample=False)
    finally:
        unpatch()
    return tuned(ModelSource(workload=root / "workload.json"), root / "artifact").artifact


def unpatch() -> None:
    """After models were patched: the process-wide Dispatcher back to a table-less one, and the
    modelling modules' functions (RoPE) back to theirs, so other tests' models are left alone."""
    from runtime_loader.integrations.transformers import restore_functions

    runtime_loader.custom_ops.activate(Dispatcher(None))
    restore_functions()


def unfused(name: str) -> str:
    """A recorded fused residual add (norm.rms_add with keep_inputs) as the call the patched model
    makes instead where its table has no such signature: the norm alone. `tune --config` captures
    the norms (and serving engines' in-place norm.rms_add), not the keep_inputs form."""
    return name.replace("norm.rms_add", "norm.rms").replace(",keep_inputs", "") if "keep_inputs" in name else name
