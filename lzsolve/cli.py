"""The lzsolve command line: a thin layer over the library.

Bad input ends with one line on stderr ("error: ..."), a non-zero exit code and
nothing written.
"""
from __future__ import annotations

import atexit
import fnmatch
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from lzsolve import __version__
from lzsolve.errors import STORAGE_ERRNOS, LzError, WriteError
from lzsolve.progress import progress

# torch, transformers, DuckDB and the tuner's modules are imported by the commands that use them:
# at the top they cost every command 2.2-2.5 s and 276 MB on this project's VM, `lzsolve --help`
# and a mistyped option included (0.2 s without them; tests/test_cli.py bounds it). Option defaults
# those modules hold are read when a command runs or shows its help (Deferred).
if TYPE_CHECKING:
    from lzsolve.pipeline import ModelSource

# Choices that click checks before any import: runtime_loader.ops.DTYPES with capture.FP8, and
# lzsolve.measure.grid.GRIDS (tests/test_cli.py checks that they agree).
DTYPE_CHOICES = ("bf16", "fp16", "fp32")
FP8 = "fp8"
GRID_CHOICES = ("tiny", "small", "full")

# Exit codes a CI step can branch on.
EXIT_OK = 0
EXIT_FAILED = 1  # the run finished but its result cannot be trusted (or lzsolve itself failed)
EXIT_BAD_INPUT = 2
EXIT_REGRESSED = 3  # slower than the baseline artifact beyond --max-regression
EXIT_WRITE_FAILED = 4  # an output could not be written (disk full, quota, I/O error); records so far are kept
EXIT_INCONCLUSIVE = 5  # past --max-regression vs the baseline, within the noise (compare.py): the host was too busy
EXIT_INTERRUPTED = 130
STATUS_EXIT = {"ok": EXIT_OK, "failed": EXIT_FAILED, "regressed": EXIT_REGRESSED, "inconclusive": EXIT_INCONCLUSIVE}


def _attr(module: str, name: str):
    """lzsolve.<module>'s `name` (a dotted path: "Budget.time_cap_s"), imported now."""
    value = importlib.import_module(f"{__package__}.{module}")
    for part in name.split("."):
        value = getattr(value, part)
    return value


class Deferred(click.Option):
    """An option whose default is a function reading a module that imports torch (_attr), and whose
    help may be one: both are read when the command runs or shows its help, never at import, and
    the help shows the value, not click's "(dynamic)"."""

    def __init__(self, *decls, help=None, **kwargs):
        self.help_text = help
        super().__init__(*decls, help=None if callable(help) else help, **kwargs)

    def get_help_record(self, ctx):
        if callable(self.help_text):
            self.help = self.help_text()
        return super().get_help_record(ctx)

    def get_default(self, ctx, call=True):
        return super().get_default(ctx, call=True)


class Finite(click.FloatRange):
    """A FloatRange that refuses nan and the infinities, which FloatRange lets through: --max-regression
    nan turned the regression gate off (no geomean is over nan), --timeout inf waited forever."""

    name = "finite float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _patterns(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """--kernels/--exclude: the patterns of every value given, each of which must name one (an empty
    --kernels '' or ',,' was taken as no filter at all, where a pattern that matches nothing is refused)."""
    patterns = [tuple(p.strip() for p in v.split(",") if p.strip()) for v in values]
    if not all(patterns):
        raise click.BadParameter(f"{values[patterns.index(())]!r} names no kernel pattern; pass GLOB[,GLOB] "
                                 "(`lzsolve kernels` lists the ids), or leave the option out")
    return tuple(p for group in patterns for p in group)


def _named_path(ctx, param, value: str | None) -> str | None:
    """A folder option given as an empty string: refused (--out '' wrote to the default folder)."""
    if value == "":
        raise click.BadParameter("an empty path; name a folder, or leave the option out for its default")
    return value


def _source(model, config, recorded, tp, ep, dtype, fp8_kv) -> ModelSource:
    """The model options as a ModelSource: --dtype only where the command line gave it (a workload's
    dtype is its recorded one, which another contradicts; a model's is bf16)."""
    from lzsolve.pipeline import ModelSource

    given = click.get_current_context().get_parameter_source("dtype") == click.core.ParameterSource.COMMANDLINE
    return ModelSource(name=model, config=config, workload=recorded, tp=tp, ep=ep, dtype=dtype if given else None,
                       fp8_kv=fp8_kv)


def _print_table(columns: list[str], rows: list[tuple], widths: list[int] | None = None) -> list[int]:
    """Rows under their column names; given the `widths` an earlier call returned, more rows of that
    table (no header again). Returns the widths."""
    from runtime_loader.safeio import printable

    # escaped: a PerfDB is an artifact's data, and a kernel id holding ESC would clear the terminal
    cells = [[printable("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)) for v in row]
             for row in rows]
    columns = [printable(c) for c in columns]
    if widths is None:
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
        click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
        click.echo("  ".join("-" * w for w in widths))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return widths


def model_options(f):
    options = [
        click.option("--model", "model", metavar="NAME", help="a built-in model (`lzsolve models` lists them)"),
        click.option("--config", "config", metavar="PATH",
                     help="a Hugging Face config.json (or its folder) instead of --model"),
        click.option("--workload", "recorded", metavar="PATH",
                     help="a workload file runtime_loader.record wrote, instead of --model: exactly the op "
                          "signatures it recorded, with buckets placed at its shapes (as many per dim as --grid has)"),
        click.option("--tp", default=1, show_default=True, type=click.IntRange(min=1),
                     help="tensor-parallel degree: shards heads, kv heads (never below 1) and the MLP"),
        click.option("--ep", default=1, show_default=True, type=int,
                     help="expert-parallel degree of a mixture-of-experts model: its experts divided over that many "
                          "ranks, whole (not sharded by --tp); --tp's value (the experts over the tensor-parallel "
                          "group) or a multiple of it (over data-parallel replicas); the artifact is <model>-ep<N>"),
        click.option("--dtype", default="bf16", show_default=True, type=click.Choice([*DTYPE_CHOICES, FP8]),
                     help="the activations' dtype; fp8: an FP8 W8A8 deployment (bf16 activations, linears with "
                          "e4m3 weights and per-channel scales, activations quantised per token; lm_head in bf16)"),
        click.option("--fp8-kv", is_flag=True,
                     help="the KV cache in FP8 (e4m3, a scale for k and one for v): decode steps as "
                          "attention.decode_fp8kv; the artifact is <model>-fp8kv"),
        click.option("--device", default=None, metavar="cpu|cuda[:i]",
                     help="where to measure  [default: cuda if available, else cpu]"),
        click.option("--grid", type=click.Choice(GRID_CHOICES), default=None,
                     help="shape grid  [default: full on cuda, small on cpu (minutes on 2 cores)]"),
        click.option("--kernels", multiple=True, metavar="GLOB[,GLOB]", callback=_patterns,
                     help="only consider these kernel ids (fallbacks are always kept), e.g. 'sdpa.*'"),
        click.option("--exclude", multiple=True, metavar="GLOB[,GLOB]", callback=_patterns,
                     help="leave out these kernel ids"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lzsolve")
def cli():
    """Offline autotuner and dispatch-table solver for LLM inference kernels.

    \b
    lzsolve tune --model llama3-70b --tp 8     measure, solve, write the artifact
    lzsolve explain                            why each kernel was chosen
    lzsolve db query "SELECT ..."              ask the PerfDB (DuckDB SQL)
    """


@cli.command()
@model_options
@click.option("--out", type=click.Path(file_okay=False), default=None, callback=_named_path,
              help="artifact folder  [default: artifacts/<model>/<hardware-signature>-[tpN-]<dtype>]")
@click.option("--mode", type=click.Choice(["graph", "eager"]), default=None,
              help="timing the solver optimises: graph (CUDA-graph replay, GPU time) or eager (launches "
                   "from Python, host overhead included)  [default: graph on cuda, eager on cpu]")
@click.option("--fresh", is_flag=True, help="re-measure everything instead of reusing matching PerfDB records")
@click.option("--timeout", default=300.0, show_default=True, type=Finite(min=1),
              help="seconds one measurement may take (first-call JIT included) before its worker is killed")
@click.option("--isolate/--no-isolate", default=True, show_default=True,
              help="measure in a worker process, so a crash or hang costs one record, not the run")
@click.option("--sample-time", cls=Deferred, type=Finite(min=0.001), show_default=True, metavar="SECONDS",
              default=lambda: _attr("measure.harness", "Budget.time_cap_s"),
              help=lambda: f"how long one candidate's timing may sample, per timing mode, while its spread stays "
                           f"above {_attr('measure.harness', 'Budget.target_spread'):.0%} (its warm-up: a tenth of that at "
                           "most); shorter: a quicker, noisier tune (--quick: 0.1 unless given). Records sampled as long or "
                           "longer are reused, as are shorter ones whose spread fell below that target; the others are "
                           "measured again (--fresh: every one)")
@click.option("--devices", default=None, metavar="cuda:0,cuda:1|all",
              help="measure on several devices of this host, one worker each (they must be the same model): "
                   "each bucket's candidates go, whole, to the next free device, largest first, as do each "
                   "search study's buckets and each signature's validation; one table is solved from every "
                   "record  [default: --device alone]")
@click.option("--ray", "ray_address", default=None, metavar="local|auto|HOST:PORT",
              help="measure on the GPUs of a Ray cluster, one worker (a Ray actor) each, scheduled as with "
                   "--devices; this host plans the run and alone writes the PerfDB, so run it on a node like "
                   "the others (nodes of other hardware are refused). local: start Ray on this host alone; "
                   "auto: the cluster this host joined with `ray start`; HOST:PORT: its head. Needs "
                   "Ray: pip install -e '.[ray]' in the lzsolve clone")
@click.option("--ray-workers", cls=Deferred, type=click.IntRange(min=1), default=None, metavar="N",
              help=lambda: f"with --ray: how many workers  [default: one per GPU of the cluster, "
                           f"{_attr('measure.cluster', 'CPU_WORKERS')} on a CPU-only one]")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE",
              help="import MODULE first; it may register extra kernels with runtime_loader.registry.register")
@click.option("--trials", type=click.IntRange(min=0, max=100_000), default=None,
              help="optuna trials per op signature and bucket for each tunable kernel (0: no search)  "
                   "[default: each search space's own budget]")
@click.option("--spaces", type=click.Path(file_okay=False, exists=True), default=None,
              help="folder of search-space YAML files  [default: the repo's search_spaces/]")
@click.option("--patience", cls=Deferred, type=click.IntRange(min=0), show_default=True,
              default=lambda: _attr("measure.search", "SearchBudget.patience"),
              help=lambda: "stop a bucket's search after this many trials in a row that beat its best by less than "
                           f"{_attr('measure.search', 'NOISE'):.0%} (timing noise), or, eager on a GPU, after a trial "
                           "that waited on the host; 0: always spend the whole budget")
@click.option("--skip-behind", cls=Deferred, type=Finite(min=0), show_default=True,
              default=lambda: _attr("measure.search", "SearchBudget.skip_behind"),
              help="skip the search at a bucket where the family's best is more than this fraction slower than the "
                   "best other kernel at every neighbouring bucket (two at least); 0: search every bucket")
@click.option("--refine", cls=Deferred, type=click.IntRange(min=0), show_default=True,
              default=lambda: _attr("measure.search", "SearchBudget.refine"),
              help="after each bucket's search, up to this many more trials climbing from its best configuration "
                   "one parameter step at a time while that gains; 0: off")
@click.option("--full-search", is_flag=True,
              help="spend every study's whole budget: no patience, no skipped buckets, no seeding with the "
                   "neighbours' winners (to check the smarter budget against)")
@click.option("--baseline", type=click.Path(file_okay=False), default=None,
              help="a previous artifact of the same model: exit 3 if this one is slower beyond --max-regression")
@click.option("--max-regression", cls=Deferred, type=Finite(min=0), show_default=True,
              default=lambda: _attr("decide.compare", "DEFAULT_THRESHOLD"),
              help="allowed slowdown of an op signature vs --baseline (geomean over its grid points; 0.1 = 10%)")
@click.option("--min-ms", cls=Deferred, type=Finite(min=0), show_default=True,
              default=lambda: _attr("decide.compare", "DEFAULT_MIN_MS"),
              help="grid points where both tables' times are under this are reported, not gated (run-to-run "
                   "noise of microsecond kernels)")
@click.option("--probe/--no-probe", default=True, show_default=True,
              help="also time the leading kernels and the fallback at unaligned values inside each bucket and "
                   "past the last (odd lengths, where tile-aligned kernels lose what the grid shows them winning)")
@click.option("--validate", "validate_shapes", cls=Deferred, type=click.IntRange(min=0, max=10_000), show_default=True,
              default=lambda: _attr("decide.validate", "VALIDATION_SHAPES"),
              help="random shapes per dynamic dim of each op signature (inside the buckets and up to 1.5x past "
                   "them: 8 for a tokens op, 16 for attention's batch x seq) at which the "
                   "solved table is timed against the best kernels and the fallback, then refined; 0: skip")
@click.option("--routing-skew", cls=Deferred, type=Finite(min=0), show_default=True,
              default=lambda: importlib.import_module("runtime_loader.inputs").ROUTING_SKEW,
              help="mixture-of-experts layers: how unevenly the experts' inputs are routed (the expert of popularity "
                   "rank r gets -S * log(r) on its router logits; 0.3: the fullest of 128 experts gets about 2.4x "
                   "the mean load, as trained routers roughly do; 0: uniform). Recorded with each record; records "
                   "of another skew are not reused")
@click.option("--quick", is_flag=True,
              help="a first table in a minute or so: the next smaller grid than the default (unless --grid), no "
                   "search, probes or validation, and no kernel whose first call takes seconds to minutes "
                   "(compile.*, FlashInfer's, Liger's import), each candidate sampled 0.1 s at most unless "
                   "--sample-time says; "
                   "report.md says what it left out. A later `lzsolve tune` into the same --out measures the "
                   "rest, reusing this run's records that reached the target spread")
@click.option("--cache/--no-cache", default=True, show_default=True,
              help="reuse, and add to, the measurement cache every tune of this machine shares: a record any "
                   "earlier tune measured (of any model, into any --out) with the same signature, kernel and "
                   "version, shape, hardware, timing mode and a sampling as long is not measured again, and is "
                   "copied into this artifact's PerfDB (its cached_from column says where from), and the "
                   "search's studies there are continued, not run again. --no-cache neither reads nor writes it")
@click.option("--cache-dir", type=click.Path(file_okay=False), metavar="DIR", default=None, callback=_named_path,
              help="the measurement cache's folder, a PerfDB the machines of one kind may share (a mount all of "
                   "them write to: a tuner locks a signature while it measures it)  [default: $LZSOLVE_CACHE, "
                   "else ~/.cache/lzsolve/perfdb; LZSOLVE_CACHE=off turns it off]")
@click.option("--json", "as_json", is_flag=True,
              help="print a machine-readable summary on stdout (everything else goes to stderr)")
def tune(model, config, recorded, tp, ep, dtype, fp8_kv, device, grid, kernels, exclude, out, mode, fresh, timeout, isolate,
         sample_time, devices, ray_address, ray_workers, plugins, trials, spaces, patience, skip_behind, refine, full_search, baseline,
         max_regression, min_ms, probe, validate_shapes, routing_skew, quick, cache, cache_dir, as_json):
    """Gate, measure and solve every op of a model; write dispatch.json, perfdb/ and report.md.

    Every candidate kernel passes a capability gate and a parity check against an
    fp32 reference before it is timed; all records, rejections included, go to the
    PerfDB. Phases: the optuna search of tunable kernels, the grid buckets (every
    candidate), probes (unaligned in-bucket points, the leading kernels and the
    fallback), then validation: the solved table at random shapes, refined where it
    loses; report.md gives the validation figures and each phase's time. Interrupted
    runs keep their records: run the same command again to continue.

    \b
    Exit codes (for CI): 0 ok; 1 failed (an op signature has no admitted kernel at any
    grid point, so its table is blind); 2 bad input; 3 regressed vs --baseline;
    4 an output could not be written (disk full, I/O error: records so far are kept, re-run
    to continue); 5 inconclusive vs --baseline (past --max-regression, but by less than the
    timings' spread, or timed on a busy machine: the host was too busy to judge); 130
    interrupted.
    """
    entered = time.perf_counter(), time.process_time()
    from lzsolve.pipeline import GridConfig, MeasureConfig, OutputConfig, SearchConfig, Tune, TuneConfig, ValidateConfig

    settings = TuneConfig(
        model=_source(model, config, recorded, tp, ep, dtype, fp8_kv),
        grid=GridConfig(grid=grid, kernels=kernels, exclude=exclude, plugins=plugins,
                        quick=quick),
        measure=MeasureConfig(device=device, devices=devices, ray=ray_address, ray_workers=ray_workers, mode=mode,
                              sample_time=sample_time, timeout=timeout, isolate=isolate, routing_skew=routing_skew,
                              cache=cache, cache_dir=cache_dir),
        search=SearchConfig(trials=trials, spaces=spaces, patience=patience, skip_behind=skip_behind, refine=refine,
                            full=full_search),
        validate=ValidateConfig(probe=probe, shapes=validate_shapes, baseline=baseline,
                                max_regression=max_regression, min_ms=min_ms),
        output=OutputConfig(out=out, fresh=fresh, json=as_json))
    result = Tune(settings, entered).run()
    if as_json:
        click.echo(json.dumps(result.summary, indent=1, default=str))
    return STATUS_EXIT[result.status]


@cli.command()
@model_options
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE", help="import MODULE first (extra kernels)")
def plan(model, config, recorded, tp, ep, dtype, fp8_kv, device, grid, kernels, exclude, plugins):
    """Dry run: op signatures x shape buckets x candidates, with capability-gate verdicts."""
    from lzsolve.pipeline import GridConfig, load_plugins, plan_model, print_notes
    from runtime_loader.safeio import printable

    load_plugins(plugins)
    p = plan_model(_source(model, config, recorded, tp, ep, dtype, fp8_kv),
                   GridConfig(grid=grid, kernels=kernels, exclude=exclude), device)
    # escaped: a workload file names its model, and a newline there would forge lines of the plan
    click.echo(printable(f"{p.model.summary()}, tp={p.model.tp}, {p.dtype} on {p.device} ({p.hardware['name']}), "
                         f"grid {p.grid}"))
    for sp in p.signatures:
        sig = sp.instance.signature
        dims = sorted({k for w in sp.workloads for k in w})
        values = {d: sorted({w[d] for w in sp.workloads}) for d in dims}
        click.echo(f"\n{sig}  x{sp.instance.calls_per_forward} per forward  roles: {', '.join(sp.instance.roles)}")
        click.echo(f"  buckets: {len(sp.workloads)}  " + "  ".join(f"{d}={v}" for d, v in values.items()))
        for cand in sp.candidates:
            tag = " (fallback)" if cand.spec.kernel_id == sp.fallback else ""
            verdict = "admitted" if cand.admitted else "; ".join(str(r) for r in cand.reasons)
            click.echo(f"  {cand.spec.kernel_id + tag:<28} {verdict}")
    click.echo("")
    print_notes(p)
    click.echo(f"{p.measurements} measurements (parity check + timing) would run")


@cli.command()
@click.option("--model", "names", multiple=True, metavar="NAME", help="a built-in model (repeatable)  [default: all]")
@click.option("--config", "configs", multiple=True, metavar="PATH", help="a Hugging Face config.json (repeatable)")
@click.option("--tp", default=1, show_default=True, type=int, help="tensor-parallel degree the shapes are sharded to")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(DTYPE_CHOICES))
@click.option("--json", "as_json", is_flag=True, help="print one JSON object per (model, op signature)")
def matrix(names, configs, tp, dtype, as_json):
    """Model x op x required features x the kernels that support each op, from the registry.

    A kernel supports an op signature when it declares the op, the dtype, the head dim and
    every feature the signature needs (GQA, causal, sliding window, softcap, QK-norm, RoPE
    layout, bias, (1 + weight) norms...); whether it is installed or runs on this machine is
    `lzsolve kernels`' business. An op only a reference fallback supports is marked."""
    from lzsolve.models import CATALOGUE, capture
    from runtime_loader import registry
    from runtime_loader.ops import required_features

    names = names if names or configs else tuple(CATALOGUE)
    captured = [capture.load(n, None, tp, dtype) for n in names] + [capture.load(None, c, tp, dtype) for c in configs]
    rows = []
    for spec in captured:
        for instance in spec.instances:
            sig = instance.signature
            fallback = registry.fallback_for(sig).kernel_id
            supporting = [k.kernel_id for k in registry.candidates(sig.op) if not k.semantic_reasons(sig)]
            row = {"model": spec.name, "family": spec.family, "signature": str(sig), "op": sig.op,
                   "features": sorted(required_features(sig)), "kernels": supporting,
                   "reference_only": supporting == [fallback]}
            if as_json:
                click.echo(json.dumps(row))
            rows.append(row)
    if not as_json:
        _print_table(["model", "op signature", "requires", "supported by"],
                     [(r["model"], r["signature"], ",".join(r["features"]) or "-",
                       ("REFERENCE ONLY: " if r["reference_only"] else f"{len(r['kernels'])}: ") + ", ".join(r["kernels"]))
                      for r in rows])


@cli.command()
def models():
    """List the built-in models as capture sees them (unsharded): their sizes as the op signatures
    show them, how many ops and signatures one forward runs, the share of the parameters in
    modules an op covers, and what no op covers."""
    from lzsolve.models import CATALOGUE, capture

    def values(found: tuple) -> str:
        return ",".join(map(str, found)) or "-"

    rows, notes = [], []
    for name in CATALOGUE:
        m = capture.load(name, None)
        size = m.sizes()
        rows.append((name, m.family, m.layers, f"{m.parameters / 1e9:.2f}B", values(size["hidden"]),
                     f"{values(size['hq'])}/{values(size['hkv'])}", values(size["d"]), values(size["mlp"]),
                     values(size["vocab"]), len({i.signature.op for i in m.instances}), len(m.instances),
                     f"{100 * m.covered:.1f}%"))
        notes += [f"{name}: {note}" for note in m.notes]
    _print_table(["model", "family", "layers", "params", "hidden", "heads/kv", "head_dim", "mlp", "vocab", "ops",
                  "signatures", "covered"], rows)
    if notes:
        click.echo("\nnotes:")
        click.echo("\n".join(f"  {note}" for note in notes))
    click.echo("\nany Hugging Face config.json works too: lzsolve plan --config path/to/config.json")


@cli.command()
@click.option("--device", default=None, metavar="cpu|cuda[:i]", help="judge availability for this device")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object per kernel, capabilities included")
def kernels(device, as_json):
    """List every candidate kernel: its ops, library and version, whether it can run on this
    device (and the Reason when not: NOT_INSTALLED, BACKEND_IMPORT_FAILED, PLATFORM_MISMATCH,
    SM_TOO_OLD...), and for tunable kernels the search space optuna explores."""
    from lzsolve.measure.devices import resolve_device
    from lzsolve.measure.search import SPACES_DIR, load_spaces
    from runtime_loader import registry
    from runtime_loader.hardware import device_info

    here = device_info(resolve_device(device))
    spaces = load_spaces(SPACES_DIR) if SPACES_DIR.is_dir() else {}
    rows = []
    for spec in registry.REGISTRY.values():
        local = spec.local_reasons(here)
        space = spaces.get(spec.kernel_id)
        search = (f"{space.trials} trials over {math.prod(map(len, space.params.values()))} configs "
                  f"({' x '.join(space.params)})" if space else "")
        if as_json:
            click.echo(json.dumps({**spec.data(), "version": spec.version(), "available": not local,
                                   "reasons": [str(r) for r in local], "search": search or None}))
        else:
            rows.append((spec.kernel_id, ",".join(sorted(spec.ops)), spec.library, spec.version() or "-",
                         "yes" if not local else f"no: {local[0]}", search))
    if not as_json:
        _print_table(["kernel", "ops", "library", "version", f"available on {here.type}", "search"], rows)


@cli.command()
@click.argument("artifact", required=False, type=click.Path())
@click.option("--op", "op_glob", default="*", metavar="GLOB", help="only signatures matching this, e.g. 'attention*'")
def explain(artifact, op_glob):
    """Per op signature: the tree, the chosen kernels with their gains and margins, and
    every rejected candidate with its Reason. ARTIFACT defaults to the newest under ./artifacts."""
    from lzsolve.store.artifact import find_artifact, format_noise, format_op, read_table_json
    from runtime_loader.safeio import printable, shown

    folder = find_artifact(artifact)
    table = read_table_json(folder)
    model = table["model"]
    lines = [f"{folder}: {model['id']} tp={model['tp']} {model['dtype']} on {table['hardware'].get('name')}, "
             f"timing mode {table['timing_mode']}, run {table.get('run_id')}"]
    # the figures beside the schema's fields (noise, validation, candidates, roofline) are the tune's
    # own: one that does not read as the tune writes it is the file's fault, said in one line
    part = "its noise figures"
    try:
        lines += [("noise: " if n == 0 else "  ") + line for n, line in enumerate(format_noise(table.get("noise")))]
        matched = 0
        for entry in table["ops"]:
            part = f"the figures of {shown(entry.get('signature') or entry['op'])}"
            if fnmatch.fnmatchcase(entry.get("signature", ""), op_glob) or fnmatch.fnmatchcase(entry["op"], op_glob):
                lines += ["", *format_op(entry)]
                matched += 1
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:
        raise LzError(f"{folder / 'dispatch.json'}: cannot read {part} ({type(e).__name__}); run `lzsolve tune` "
                      "to write it again") from None
    if not matched:
        raise LzError(f"no op signature matches --op {op_glob!r}; try --op '*'")
    for line in lines:  # a table's strings are data: no control character reaches the terminal
        click.echo(printable(line))


@cli.command()
@click.argument("artifact", required=False, type=click.Path())
@click.option("--random", "random_n", type=click.IntRange(min=1, max=10_000), default=None, metavar="N",
              help="evaluate N random shapes per op signature, drawn inside the buckets and up to 1.5x past the "
                   "largest (mostly no power of two)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the --random shapes")
@click.option("--shapes", multiple=True, metavar="DIM=N[,DIM=N]",
              help="evaluate these shapes (e.g. tokens=24, batch=2,seq=700) instead of the midpoints between buckets")
@click.option("--op", "op_glob", default="*", metavar="GLOB", help="only signatures matching this, e.g. 'attention*'")
@click.option("--device", default=None, metavar="cpu|cuda[:i]", help="[default: the artifact's device]")
@click.option("--timeout", default=300.0, show_default=True, type=Finite(min=1),
              help="seconds one measurement may take before its worker is killed")
@click.option("--isolate/--no-isolate", default=True, show_default=True, help="measure in a worker process")
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE", help="import MODULE first (extra kernels)")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="also write the results here")
@click.option("--on-this-gpu", is_flag=True,
              help="measure a table tuned on another device of this architecture (an H100's on an H200), or under "
                   "other software, here: the choice is what load(..., allow_similar_gpu=True) serves here; its "
                   "records are not written into the artifact")
def evaluate(artifact, random_n, seed, shapes, op_glob, device, timeout, isolate, plugins, json_out, on_this_gpu):
    """Measure the table's regret on shapes it never saw: geomean and worst of
    time(table choice) / time(best kernel), and time(table choice) / time(PyTorch default),
    every admitted kernel timed at each shape in the table's timing mode. Shapes: --random N
    per op signature, --shapes, or by default the midpoints between buckets. ARTIFACT
    defaults to the newest under ./artifacts. --on-this-gpu measures a borrowed table where it
    is loaded, not where it was tuned. Exits 1 when the table's choice fails at a shape (the
    runtime would hit that failure), 4 when its records cannot be written (disk full), else 0."""
    from lzsolve.decide.evaluate import evaluate as run_evaluation
    from lzsolve.decide.evaluate import parse_shapes
    from lzsolve.decide.validate import LOSS, summarize
    from lzsolve.measure.devices import resolve_device
    from lzsolve.measure.worker import InProcessRunner, WorkerRunner
    from lzsolve.pipeline import load_plugins
    from lzsolve.store.artifact import JIT_WORK, find_artifact, read_table_json
    from lzsolve.store.fsutil import atomic_write_text
    from runtime_loader.inputs import ROUTING_SKEW, skewed_routing
    from runtime_loader.jit import point_caches

    if random_n and shapes:
        raise LzError("pass --random or --shapes, not both")
    if json_out:  # before the measurements, not after them
        parent = Path(json_out).parent
        if not parent.is_dir() or Path(json_out).exists() and not Path(json_out).is_file():
            raise LzError(f"--json {json_out}: not a file in an existing folder; name a file path to write")
    load_plugins(plugins)
    folder = find_artifact(artifact)
    table = read_table_json(folder)
    dev = resolve_device(device or _evaluation_device(folder, table["hardware"]))
    wanted = parse_shapes(shapes) if shapes else None
    if (folder / JIT_WORK).is_dir():  # the tuning run's compiled kernels: no JIT again where it ran
        point_caches(folder / JIT_WORK)
    # routings drawn as the tune drew them (before the worker starts: it inherits the setting)
    click.get_current_context().with_resource(skewed_routing(table["model"].get("routing_skew", ROUTING_SKEW)))
    runner = WorkerRunner(dev, plugins=plugins, timeout_s=timeout) if isolate else InProcessRunner(dev, plugins=plugins)
    click.echo(f"evaluating {folder} ({table['timing_mode']} timing) on {dev}", err=True)
    try:
        with progress(0, "measuring") as bar:
            results = run_evaluation(folder, dev, runner, wanted, on_step=lambda label: bar.update(1, label),
                                     random_n=random_n or 0, seed=seed, op_glob=op_glob, on_this_gpu=on_this_gpu)
    finally:
        runner.close()
    if not results:
        raise LzError("no evaluation shape fits any op signature of the table; check --shapes and --op")
    summary = summarize(results)
    rows = [(sig, s["points"], s["regret_geomean"], s["regret_worst"], s["vs_default_geomean"], s["vs_default_worst"])
            for sig, s in summary["signatures"].items()]
    o = summary["overall"]
    rows.append(("all", o["points"], o["regret_geomean"], o["regret_worst"], o["vs_default_geomean"],
                 o["vs_default_worst"]))
    _print_table(["signature", "shapes", "regret geomean", "regret worst", "vs default geomean", "vs default worst"],
                 rows)
    click.echo("regret = time(table choice) / time(best kernel); vs default = time(table choice) / time(fallback)")
    if o["retimed"]:
        click.echo(f"{o['retimed']} shape(s) where the choice lost by {LOSS:.0%} were timed again (each kernel counts "
                   "at the faster of its two timings; the first figures are the points' first_loss in --json)")
    for problem in summary["fallback_problems"]:
        click.echo(f"note: no vs-default figure at {problem}", err=True)
    for problem in summary["problems"]:
        click.echo(f"error: {problem}", err=True)
    if json_out:
        atomic_write_text(Path(json_out), json.dumps({"artifact": str(folder), "timing_mode": table["timing_mode"],
                                                      "random": random_n, "seed": seed if random_n else None,
                                                      "on_this_gpu": on_this_gpu, **summary}, indent=1, default=str) + "\n")
    return EXIT_FAILED if summary["problems"] else EXIT_OK


def _evaluation_device(folder: Path, hardware: dict) -> str:
    """Where an artifact is evaluated by default: the device type it was tuned on. A CUDA artifact
    on a machine without CUDA is refused here: --device cpu (what _device suggests) would only be
    refused as other hardware."""
    import torch

    if hardware["device"] != "cuda":
        return "cpu"
    if not torch.cuda.is_available():
        raise LzError(f"{folder} was tuned on {hardware.get('name', 'a CUDA GPU')} and no CUDA device is available "
                      "here; evaluate it on the machine it was tuned on")
    return "cuda"


@cli.command("compare")
@click.argument("artifact", type=click.Path(file_okay=False))
@click.argument("baseline", type=click.Path(file_okay=False))
@click.option("--max-regression", cls=Deferred, type=Finite(min=0), show_default=True,
              default=lambda: _attr("decide.compare", "DEFAULT_THRESHOLD"),
              help="allowed slowdown of an op signature (geomean over its grid points; 0.1 = 10%)")
@click.option("--min-ms", cls=Deferred, type=Finite(min=0), show_default=True,
              default=lambda: _attr("decide.compare", "DEFAULT_MIN_MS"),
              help="grid points where both times are under this are reported, not gated")
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON on stdout")
def compare_cmd(artifact, baseline, max_regression, min_ms, as_json):
    """Is ARTIFACT slower than BASELINE (a previous artifact of the same model, GPU and dtype)?

    Per op signature: time(new table's choice) / time(old table's choice) at every grid
    point both measured, each from its own PerfDB. Exit 3 when any signature's geomean
    exceeds 1 + --max-regression by more than its timings' spread, on a quiet machine; 5
    (inconclusive: the host was too busy to judge) when those that exceed it do so within
    the noise; else 0."""
    from lzsolve.decide.compare import compare, comparison_status, say_comparison
    from lzsolve.store.artifact import find_artifact

    result = compare(find_artifact(artifact), find_artifact(baseline), max_regression, min_ms)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        say_comparison(result, click.echo)
    return STATUS_EXIT[comparison_status(result)]


@cli.group()
def db():
    """Query the PerfDB with DuckDB SQL (views: records, admitted, rejected, ceilings)."""


QUERY_ROWS = 1000  # rows `db query` prints unless told (--limit, --all): a screenful is tens
QUERY_BATCH = 10_000  # rows fetched, and printed, at a time
QUERY_TIMEOUT_S = 10.0  # a query over a tune's PerfDB (an in-memory copy) takes well under a second


@db.command("query")
@click.argument("sql")
@click.option("--db", "db_path", type=click.Path(), default=None,
              help="artifact folder or perfdb folder  [default: newest artifact under ./artifacts]")
@click.option("--json", "as_json", is_flag=True, help="print rows as JSON objects")
@click.option("--limit", type=click.IntRange(min=1, max=1 << 40), default=QUERY_ROWS, show_default=True, metavar="N",
              help="print at most this many rows (a note on stderr says when there were more)")
@click.option("--all", "all_rows", is_flag=True, help="print every row, however many (instead of --limit)")
@click.option("--timeout", type=Finite(min=0, min_open=True), default=QUERY_TIMEOUT_S, show_default=True,
              metavar="SECONDS", help="stop the query after this long")
def db_query(sql, db_path, as_json, limit, all_rows, timeout):
    """Run SQL over the PerfDB, e.g.

    \b
    lzsolve db query "SELECT kernel_id, count(*) FROM admitted GROUP BY 1"

    The query sees an in-memory copy of the PerfDB and may use 1 GiB besides it (no spilling to disk).
    """
    from lzsolve.store.artifact import find_artifact
    from lzsolve.store.perfdb import PerfDB

    path = Path(db_path) if db_path else find_artifact(None) / "perfdb"
    if (path / "perfdb").is_dir():
        path = path / "perfdb"
    import contextlib
    import itertools

    # rows fetched and printed QUERY_BATCH at a time, so a result of any size (and any --limit) is never
    # held whole; one row past --limit tells whether there were more
    batch_rows = QUERY_BATCH if all_rows else min(limit + 1, QUERY_BATCH)
    with contextlib.closing(PerfDB(path).stream(sql, timeout_s=timeout, batch_rows=batch_rows)) as batches:
        columns, first = next(batches)
        rows = itertools.chain(first, (row for _, batch in batches for row in batch))
        printed = rows if all_rows else itertools.islice(rows, limit)
        chunks = iter(lambda: list(itertools.islice(printed, QUERY_BATCH)), [])
        if as_json:
            _echo_json_array(dict(zip(columns, row)) for chunk in chunks for row in chunk)
        else:
            widths = None
            for chunk in chunks:
                widths = _print_table(columns, chunk, widths)
            if widths is None:  # no row: the header alone
                _print_table(columns, [])
        more = not all_rows and next(rows, None) is not None
    if more:
        click.echo(f"note: the first {limit} rows of more; --limit N or --all for others", err=True)


def _echo_json_array(items) -> None:
    """json.dumps(list(items), indent=1), written an item at a time."""
    import textwrap

    first = True
    for item in items:
        click.echo(("[\n" if first else ",\n") + textwrap.indent(json.dumps(item, default=str, indent=1), " "), nl=False)
        first = False
    click.echo("[]" if first else "\n]")


def run() -> NoReturn:
    """The `lzsolve` command: main(), then an exit without the interpreter's teardown. The exit
    handlers still run (multiprocessing's ends the workers, Ray's leaves the cluster) and the
    streams are flushed; what is skipped is unloading torch, transformers and the kernel libraries
    module by module, 1.5 s after a tune's work was done on this project's VM, paid by every
    command (benchmarks/device.sh devices). An exception main() lets through ends the usual way, traceback
    and all."""
    try:
        main()
        code = 0
    except SystemExit as e:  # main's codes are ints (EXIT_*)
        code = e.code or 0
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    try:
        code = cli.main(standalone_mode=False, prog_name="lzsolve")
    except LzError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except WriteError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_WRITE_FAILED)
    except OSError as e:
        if e.errno not in STORAGE_ERRNOS:
            raise
        # a write none of our writers wrapped (a library's own file): the same line and code
        click.echo(f"error: {WriteError(e.filename or 'an output file', e)}", err=True)
        sys.exit(EXIT_WRITE_FAILED)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("\ninterrupted: measured records are kept in the PerfDB; run the same command to continue",
                   err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
