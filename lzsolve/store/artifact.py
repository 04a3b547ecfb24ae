"""The artifact: dispatch.json (what the runtime replays) and report.md (what a human reads)."""
from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import statistics
from pathlib import Path

from lzsolve import __version__
from lzsolve.decide.roofline import (
    ceilings_check,
    format_ceilings,
    format_fraction,
    format_roofline,
    peaks,
    signature_roofline,
)
from lzsolve.decide.solve import MIN_NOISE, candidates_summary, leaves, solve_signature
from lzsolve.errors import LzError, WriteError
from lzsolve.measure.env import BUSY_LOAD, busy
from lzsolve.measure.grid import buckets
from lzsolve.measure.tuner import Plan, by_signature
from lzsolve.ops import CONTRACTS
from lzsolve.store.fsutil import atomic_write_text
from runtime_loader import jit, registry, safeio
from runtime_loader.hardware import slug
from runtime_loader.inputs import ROUTED_OPS, routing_skew
from runtime_loader.manifest import MANIFEST, build_manifest
from runtime_loader.ops import OPS
from runtime_loader.table import MAX_JSON_DEPTH, MAX_TABLE_BYTES, SCHEMA_VERSION, TableError, parse_table

ARTIFACTS_ROOT = Path("artifacts")


def default_out(plan: Plan) -> Path:
    """artifacts/<model>/<hardware-signature>[-tp<N>]-<dtype>/, the model's name one folder of
    ARTIFACTS_ROOT whatever it holds (a workload file names its model: "../x" or "/x" there must
    not choose where the artifact is written)."""
    tp = f"-tp{plan.model.tp}" if plan.model.tp > 1 else ""
    folder = re.sub(r"[^A-Za-z0-9._-]+", "-", plan.model.name).strip("-.") or "model"
    return ARTIFACTS_ROOT / folder / f"{slug(plan.hardware)}{tp}-{plan.dtype}"


def ensure_writable(out: Path) -> None:
    """Fail early, before any work, if `out` cannot hold an artifact."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".lzsolve-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise LzError(f"cannot write to --out {out}: {e.strerror or e}; choose a writable directory") from None


def ensure_same_model(out: Path, plan: Plan) -> None:
    """Refuse an `out` that holds the artifact of another model, tp or dtype: the tune would replace
    its dispatch.json and add this model's records to its PerfDB. A re-run of the same model into its
    folder continues it; a dispatch.json that cannot be read names no model, and is written again."""
    try:
        model = safeio.read_json(out / "dispatch.json", MAX_TABLE_BYTES, MAX_JSON_DEPTH, LzError)["model"]
        there = (model["id"], model["tp"], model["dtype"])
    except (LzError, TypeError, KeyError):
        return
    if there != (plan.model.name, plan.model.tp, plan.dtype):
        raise LzError(f"--out {out} holds the artifact of {safeio.shown(there[0])} (tp {safeio.shown(there[1])}, "
                      f"{safeio.shown(there[2])}), not of this tune's {plan.model.name} (tp {plan.model.tp}, "
                      f"{plan.dtype}); pass another --out, or remove {out} first")


JIT_WORK = ".jit-work"  # where the run's libraries compile to; hidden, so the manifest skips it
JIT_ARCHIVE = "jit/caches.tar"


def kernel_provenance(kernel_ids) -> dict:
    """What the runtime checks before trusting a kernel: same library version, same declarations."""
    out = {}
    for kernel_id in sorted(kernel_ids):
        spec = registry.get(kernel_id)
        out[kernel_id] = {"library": spec.library, "version": spec.version(),
                          "capabilities": spec.capabilities_hash(), "jit_caches": list(spec.jit_caches)}
    return out


def leaf_ids(node: dict, ranked: bool = False):
    """The kernels a tree chooses (with ranked=True, its leaves' ranked runner-ups too)."""
    if "kernel_id" in node:
        yield node["kernel_id"]
        if ranked:
            yield from (r["kernel_id"] for r in node.get("ranked") or ())
    else:
        yield from leaf_ids(node["le"], ranked)
        yield from leaf_ids(node["gt"], ranked)


def build_table(plan: Plan, records: list[dict], mode: str, run_id: str, validation: dict | None = None,
                ceilings: list[dict] | None = None) -> dict:
    """The dispatch table solved from every record (grid, probes, validation shapes); `validation`
    holds each signature's validation figures (validate.validate), carried into the table;
    `ceilings` (the PerfDB's) give each signature its roofline fractions (None without them)."""
    by_sig = by_signature(records)
    device_peaks = peaks(ceilings or [], mode)
    ops = []
    for sp in plan.signatures:
        sig = sp.instance.signature
        recs = by_sig.get(str(sig), [])
        solved = solve_signature(recs, OPS[sig.op].dynamic, sp.fallback, mode, sp.instance.calls_per_forward)
        peak = device_peaks.get((slug(plan.hardware), sig.dtype))
        ops.append({
            "signature": str(sig),
            **sig.to_json(),
            "roles": list(sp.instance.roles),
            "calls_per_forward": sp.instance.calls_per_forward,
            "fallback": sp.fallback,
            **solved,
            "validation": (validation or {}).get(str(sig)),
            "candidates": candidates_summary(recs, mode),
            "roofline": signature_roofline(solved["tree"], recs, peak, mode, functools.partial(counts, sig))
            if peak else None,
        })
    # the ranked runner-ups too: the runtime checks their provenance before re-routing to one
    chosen = {k for entry in ops for k in leaf_ids(entry["tree"], ranked=True)}
    table = {
        "schema_version": SCHEMA_VERSION,
        "lzsolve_version": __version__,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "run_id": run_id,
        "model": {"id": plan.model.name, "family": plan.model.family, "tp": plan.model.tp,
                  "dtype": plan.dtype, "config_hash": plan.model.config_hash,
                  **({"routing_skew": routing_skew()} if any(sp.instance.signature.op in ROUTED_OPS
                                                             for sp in plan.signatures) else {})},
        "hardware": plan.hardware,
        "hw_slug": slug(plan.hardware),
        "capabilities_hash": registry.capabilities_hash(),
        "kernels": kernel_provenance(chosen),
        "timing_mode": mode,
        "grid": str(plan.grid),
        "buckets": {sp.instance.signature.op: buckets(plan.grid, sp.instance.signature.op)
                    for sp in plan.signatures},
        "fallback_policy": {
            "outside_table": "fallback",
            "unavailable_kernel": "fallback",
            "fallbacks": {op: OPS[op].fallback for op in sorted({sp.instance.signature.op for sp in plan.signatures})},
        },
        "jit": None,
        "ops": ops,
        "noise": noise_summary(ops, records, mode),
    }
    parse_table(table)  # what we write must be what the runtime accepts (schema included)
    return table


def counts(sig, dims: dict) -> tuple[float, float]:
    """The op's FLOPs and bytes at these dims, by its contract."""
    contract = CONTRACTS[sig.op]
    return contract.flops(sig, dims), contract.bytes_moved(sig, dims)


SPREAD_COUNTED = (0.10, 1.0)  # report.md counts the timings whose spread exceeds these


def noise_summary(ops: list[dict], records: list[dict], mode: str) -> dict:
    """How far a busy host may have moved the table: its decisions (leaves that chose between two
    timed kernels) and how many rest on noisy data (solve.decision_noise), the spreads of the
    timings it was solved from, and who else used the machine then (the records' host_load, the
    host's load average per core, and gpu_others, other programs' processes on the GPU)."""
    decided = [(entry["signature"], leaf) for entry in ops for leaf in leaves(entry["tree"])
               if leaf.get("noisy") is not None]
    noisy = sorted({signature for signature, leaf in decided if leaf["noisy"]})
    timed = [r for r in records if r["status"] == "ok" and r.get(f"{mode}_ms") is not None]
    spreads = [r.get(f"{mode}_spread") or 0.0 for r in timed]
    loads = [r["host_load"] for r in timed if r.get("host_load") is not None]
    others = [r["gpu_others"] for r in timed if r.get("gpu_others") is not None]
    return {
        "decisions": len(decided),
        "noisy_decisions": sum(bool(leaf["noisy"]) for _, leaf in decided),
        "noisy_signatures": noisy,
        "timings": len(timed),
        "busy_timings": sum(map(busy, timed)),
        "spread_over": {f"{limit:g}": sum(s > limit for s in spreads) for limit in SPREAD_COUNTED},
        "worst_spread": round(max(spreads), 4) if spreads else None,
        "host_load": {"median": statistics.median(loads), "max": max(loads)} if loads else None,
        "gpu_others_max": max(others) if others else None,
    }


def format_noise(noise: dict | None) -> list[str]:
    """noise_summary in words: what report.md and `lzsolve explain` say of the host."""
    if not noise:
        return []
    over = ", ".join(f"{n} over {float(limit):.0%}" for limit, n in noise["spread_over"].items())
    lines = [f"{noise['noisy_decisions']} of {noise['decisions']} decisions rest on noisy data (their timings' "
             f"spread is larger than the difference they decided, {MIN_NOISE:.0%} at least)"
             + (f": {', '.join(noise['noisy_signatures'])}" if noise["noisy_signatures"] else "")]
    if noise["timings"]:
        lines.append(f"of {noise['timings']} timings, {over} (spread: IQR / median of a timing's samples; "
                     f"worst {noise['worst_spread']:.0%})")
    load = noise.get("host_load")
    if load:
        lines.append(f"host load while timing: {load['median']:.2f} per core (median), {load['max']:.2f} at most "
                     f"(1-minute load average; past {BUSY_LOAD:g}, processes waited for a core)"
                     + (f"; other programs' processes on the GPU: {noise['gpu_others_max']} at most"
                        if noise.get("gpu_others_max") is not None else ""))
    if noise.get("busy_timings"):
        lines.append(f"{noise['busy_timings']} of the {noise['timings']} timings ran on a busy machine (load per core "
                     f"past {BUSY_LOAD:g}, or other programs on the GPU): a slowdown against a baseline that rests on "
                     "them is inconclusive, not a regression (lzsolve compare, exit 5)")
    if noise["noisy_decisions"]:
        lines.append("to trust them, tune again on an idle host (its records are reused unless --fresh) or "
                     "with a longer --sample-time")
    return lines


def format_tree(node: dict, indent: str = "  ") -> list[str]:
    if "kernel_id" in node:
        parts = [node["kernel_id"]]
        if node.get("gain") is not None:
            parts.append(f"{node['gain']:.2f}x vs fallback")
        if node.get("runner_up"):
            parts.append(f"margin {node['margin'] * 100:+.1f}% over {node['runner_up']}")
        if node.get("points") is not None:
            parts.append(f"{node['points']} point{'s' if node['points'] != 1 else ''}")
        if node.get("ranked"):  # who serves if the runtime cannot use the kernel (policy, failures)
            parts.append("then " + ", ".join(f"{r['kernel_id']} ({(r['ratio'] - 1) * 100:+.0f}%)" for r in node["ranked"]))
        # faster in eager time, but an eager model that is host-bound pays their host time (the ids are
        # the table's data: only those this registry knows are printed)
        host_bound = [k for k in node.get("host_bound") or () if isinstance(k, str) and registry.known(k)]
        if host_bound:
            parts.append(f"not {', '.join(host_bound)}: more host time a call than the fallback")
        if node.get("noisy"):
            parts.append(f"NOISY: timings spread {node['noise']:.0%}")
        return [indent + parts[0] + (f"  ({', '.join(parts[1:])})" if len(parts) > 1 else "")]
    lines = [f"{indent}if {node['dim']} <= {node['threshold']:g}:"]
    lines += format_tree(node["le"], indent + "  ")
    lines.append(f"{indent}else:  # {node['dim']} > {node['threshold']:g}")
    lines += format_tree(node["gt"], indent + "  ")
    return lines


def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def format_validation(entry: dict) -> list[str]:
    """How the signature's tree did on the points it was solved on and on its validation shapes."""
    lines = []
    counts = entry.get("points_by_phase") or {}
    if counts:
        measured = ", ".join(f"{n} {phase}" for phase, n in counts.items())
        lines.append(f"  solved on {measured} point(s): regret mean {entry['grid_regret'] * 100:.1f}%, "
                     f"worst {entry['worst_regret'] * 100:.1f}%")
    v = entry.get("validation")
    if v:
        before, after = v["before"], v["after"]
        around = f" and {v['near_shapes']} around its losses" if v.get("near_shapes") else ""
        lines.append(f"  validation, {v['shapes']} random shapes{around}: regret geomean {_ratio(after['regret_geomean'])}, "
                     f"worst {_ratio(after['regret_worst'])}; vs default worst {_ratio(after['vs_default_worst'])}")
        lines.append(f"    before refinement (shapes the tree had not seen): regret geomean "
                     f"{_ratio(before['regret_geomean'])}, worst {_ratio(before['regret_worst'])}; vs default worst "
                     f"{_ratio(before['vs_default_worst'])}" + ("; the tree was refined" if v["refined"] else ""))
    return lines


def format_op(entry: dict, rejected: bool = True) -> list[str]:
    lines = [f"{entry['signature']}   roles: {', '.join(entry['roles'])}"]
    lines += format_tree(entry["tree"])
    lines += format_roofline(entry)
    lines += format_validation(entry)
    if rejected:
        for kernel_id, summary in entry["candidates"].items():
            for r in summary["rejected"]:
                lines.append(f"    rejected {kernel_id} on {r['count']} point(s): {r['code']}: {r['message']}")
    return lines


ROOFLINE_NOTE = ("- roofline: time at the roofline (max(FLOPs / compute ceiling, bytes / memory ceiling), the "
                 "device's ceilings\n  measured by this tune in its timing mode) / measured time, geomean over a "
                 "signature's points:\n  1.0 is on the roof; chosen = the table's kernel, best = the fastest "
                 "candidate timed there.")
NO_ROOFLINE_NOTE = "- roofline: not shown (no compute and memory ceilings measured in this timing mode)."


def report(table: dict, wall_s: float, n_records: int, phases: dict[str, float] | None = None,
           search: str | None = None, skipped: list[str] | None = None, ceilings: list[dict] | None = None) -> str:
    """report.md: the run, its time per phase, the search, the noise, then per op signature its points,
    validation figures and tree; `skipped`: what a quick tune left out (tune --quick); `ceilings`: the
    PerfDB's, whose rates and check against torch's own forms it states."""
    model, hw = table["model"], table["hardware"]
    lines = [
        f"# lzsolve report: {safeio.printable(model['id'])} (tp={model['tp']}, {model['dtype']})",  # a workload's name
        "",
        f"- hardware: {hw['name']} ({table['hw_slug']})",
        f"- run: {table['run_id']}, {table['created_at']}, {wall_s:.0f} s, {n_records} records",
    ]
    if phases:
        lines.append("- time per phase: " + ", ".join(f"{name.removesuffix('_s')} {s:.0f} s" for name, s in phases.items()))
    if search:
        lines.append(f"- search: {search}")
    if skipped:
        lines.append(f"- quick (tune --quick): left out {'; '.join(skipped)}. A `lzsolve tune` into this folder "
                     "measures them, reusing this run's records.")
    lines += [f"- noise: {line}" if n == 0 else f"  {line}" for n, line in enumerate(format_noise(table.get("noise")))]
    lines += [
        f"- grid: {table['grid']}; timing mode: {table['timing_mode']}",
        "- gains are geometric means of time(fallback) / time(chosen) over the points of a leaf;",
        "  margins compare the chosen kernel with the runner-up.",
        "- validation: the table's choice at random shapes inside the buckets and up to 1.5x past them;",
        "  regret = time(choice) / time(best kernel timed there), vs default = time(choice) / time(fallback).",
        ROOFLINE_NOTE if any(entry.get("roofline") for entry in table["ops"]) else NO_ROOFLINE_NOTE,
        *filter(None, [format_ceilings(ceilings_check(ceilings or [], table["hw_slug"], table["model"]["dtype"],
                                                      table["timing_mode"]), table["timing_mode"])]),
        "",
        "| signature | points (grid/probe/validation) | validation regret geomean | worst | vs default worst "
        "| roofline chosen | best |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in table["ops"]:
        counts = entry.get("points_by_phase") or {}
        after = (entry.get("validation") or {}).get("after") or {}
        roof = entry.get("roofline") or {}
        lines.append(f"| {entry['signature']} | {'/'.join(str(counts.get(p, 0)) for p in ('grid', 'probe', 'validation'))}"
                     f" | {_ratio(after.get('regret_geomean'))} | {_ratio(after.get('regret_worst'))} "
                     f"| {_ratio(after.get('vs_default_worst'))} | {format_fraction(roof.get('chosen'))} "
                     f"| {format_fraction(roof.get('best'))} |")
    lines.append("")
    for entry in table["ops"]:
        lines.append(f"## {entry['signature']}")
        lines.append("")
        lines.append("```")
        lines += format_op(entry)[1:]
        lines.append("```")
        lines.append("")
    return "\n".join(lines)


def jit_files(table: dict, records: list[dict]) -> dict[str, list[str]]:
    """Per JIT cache kind, the files the table's kernels wrote there at their first calls (their
    records' jit_files). A kind is left out, and packed whole, unless every table kernel that keeps
    it has such files and never had a slow first call that wrote nothing: that call loaded what
    another kernel had compiled (FlashInfer's norm module serves several kernels), which only the
    whole cache is sure to hold."""
    kernels = {k: v["jit_caches"] for k, v in table["kernels"].items() if v["jit_caches"]}
    written: dict[str, set[str]] = {}
    borrowed: set[str] = set()
    for r in records:
        if r.get("kernel_id") in kernels and r.get("jit_files") is not None:
            found = json.loads(r["jit_files"])
            written.setdefault(r["kernel_id"], set()).update(found)
            if not found:
                borrowed.add(r["kernel_id"])
    own = {k for k, found in written.items() if found} - borrowed
    files: dict[str, list[str]] = {}
    for kind in {kind for kinds in kernels.values() for kind in kinds}:
        users = [k for k, kinds in kernels.items() if kind in kinds]
        if all(k in own for k in users):
            files[kind] = sorted(f for k in users for f in written[k] if f.startswith(f"{kind}/"))
    return files


def write_artifact(out: Path, table: dict, report_md: str, records: list[dict] | None = None) -> None:
    """jit/ (the caches the chosen kernels compiled into: with `records`, only the files their
    first calls wrote, see jit_files), dispatch.json, report.md, and last manifest.json with every
    file's sha256: a reader that finds the manifest finds it all. Each file is replaced whole; when
    a write fails (WriteError), the manifest left behind lists the previous files' checksums, so
    `load` refuses the mix."""
    kinds = {kind for k in table["kernels"].values() for kind in k["jit_caches"]}
    files = jit_files(table, records) if records is not None else None
    tmp = out / "jit" / ".caches.tar.tmp"
    try:
        tmp.parent.mkdir(exist_ok=True)
        packed = jit.pack(out / JIT_WORK, kinds, tmp, files) if kinds else []
        if packed:
            tmp.replace(out / JIT_ARCHIVE)
        else:
            (out / JIT_ARCHIVE).unlink(missing_ok=True)
    except OSError as e:
        raise WriteError(out / JIT_ARCHIVE, e) from e
    finally:
        tmp.unlink(missing_ok=True)
    if packed:
        table = {**table, "jit": {"archive": JIT_ARCHIVE, "caches": packed}}
    atomic_write_text(out / "dispatch.json", json.dumps(table, indent=1, sort_keys=False) + "\n")
    atomic_write_text(out / "report.md", report_md)
    refresh_manifest(out)


def refresh_manifest(folder: Path) -> None:
    atomic_write_text(folder / MANIFEST, json.dumps(build_manifest(folder), indent=1) + "\n")


def find_artifact(path: str | Path | None) -> Path:
    """The artifact folder at `path`, or the newest one under ./artifacts."""
    if path is not None:
        path = Path(path)
        folder = path.parent if path.name == "dispatch.json" else path
        if not (folder / "dispatch.json").is_file():
            raise LzError(f"no dispatch.json in {folder}; pass the folder `lzsolve tune` wrote")
        return folder
    found = sorted(ARTIFACTS_ROOT.glob("*/*/dispatch.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise LzError("no artifact under ./artifacts; run `lzsolve tune` first or pass the artifact folder")
    return found[-1].parent


def read_table_json(folder: Path) -> dict:
    """dispatch.json as data (for explain and evaluate), read with the runtime's limits and held to
    its checks (runtime_loader.table.parse_table: the schema, finite numbers, walkable buckets), so
    these commands show no table load refuses. Its kernel ids are not resolved: a table of a
    plugin's kernels is explained without the plugin."""
    path = folder / "dispatch.json"
    raw = safeio.read_json(path, MAX_TABLE_BYTES, MAX_JSON_DEPTH, LzError)
    if not isinstance(raw, dict):
        raise LzError(f"{path} is not a JSON object; pass the folder `lzsolve tune` wrote")
    try:
        parse_table(raw, str(path), depth_checked=True, resolve=False)
    except TableError as e:
        raise LzError(f"{path}: {e}; run `lzsolve tune` to write it again") from None
    return raw
