"""The tuning pipeline as a library object: a TuneConfig says what to tune and how; a Tune runs it,
one method per phase, and returns a TuneResult.

    from lzsolve.pipeline import ModelSource, Tune, TuneConfig
    result = Tune(TuneConfig(ModelSource(name="qwen3-0.6b"))).run()
    result.artifact, result.status, result.summary   # the folder, ok/failed/..., what `tune --json` prints

`lzsolve tune` is this and no more: each of its options is one field of a TuneConfig, and its exit
code is the result's status. The phases, in the order `run` calls them (each a method, each timed
into the summary's `phases` from `search` on; `start` and `make_plan` together are `start_s`):

    start            check the settings; start the measuring workers, whose imports go beside the planning
    make_plan        the model's op signatures x the grid x the candidates' capability verdicts
                     (tuner.make_plan); the out folder, its PerfDB, the runners, the compile-ahead workers
    search           optuna over the tunable kernels' configurations; the winners join the candidates
    measure_grid     every candidate at every bucket: parity, then timing in the table's mode (tuner.tune)
    probe            the leading kernels and the fallback at unaligned points (tuner.probe)
    validate         the solved table at random shapes, refined where it loses (validate.validate)
                     (the grid, probe and validate run once per cohort of signatures: those whose kernels
                     are still being built ahead when the grid begins go through all three last: cohorts)
    close_measuring  the compile-ahead workers' last calls; every worker told to leave
    solve            one tree per op signature (artifact.build_table)
    write            dispatch.json, report.md, perfdb/, the JIT caches (artifact.write_artifact)
    report           the summary and its lines, the comparison with a baseline, the status

A Tune is a context manager: leaving it (an error, an interrupt) stops its workers, builders and
Ray cluster and keeps the records measured so far. Its lines and progress bars go to stderr; the
summary lines to stdout, unless the output is JSON (`OutputConfig.json`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from lzsolve.decide.compare import DEFAULT_MIN_MS, DEFAULT_THRESHOLD, compare, comparison_status, say_comparison
from lzsolve.decide.roofline import reject_implausible
from lzsolve.decide.validate import VALIDATION_SHAPES, plan_validation
from lzsolve.decide.validate import in_order as validation_order
from lzsolve.decide.validate import validate as validate_table
from lzsolve.errors import LzError
from lzsolve.measure import devices, tuner, worker
from lzsolve.measure.ahead import (
    CompileAhead,
    builders_per_device,
    built_by_nvcc,
    imports_a_library,
    phase_calls,
    warmed_by_inductor,
)
from lzsolve.measure.cluster import Cluster
from lzsolve.measure.grid import default_grid
from lzsolve.measure.harness import Budget
from lzsolve.measure.search import (
    FULL_BUDGET,
    SPACES_DIR,
    STORAGE_NAME,
    SearchBudget,
    SearchStats,
    load_spaces,
    planned_trials,
)
from lzsolve.measure.search import search as search_configurations
from lzsolve.measure.tuner import Plan, Session, SignaturePlan
from lzsolve.models import capture, workload
from lzsolve.progress import add_measurements, progress
from lzsolve.store.artifact import (
    JIT_WORK,
    build_table,
    counts,
    default_out,
    ensure_same_model,
    ensure_writable,
    format_noise,
    leaf_ids,
    write_artifact,
)
from lzsolve.store.artifact import report as report_markdown
from lzsolve.store.perfdb import PerfDB, default_cache
from runtime_loader import registry
from runtime_loader.hardware import slug
from runtime_loader.inputs import ROUTING_SKEW, skewed_routing
from runtime_loader.jit import point_caches
from runtime_loader.safeio import printable
from runtime_loader.specs import KernelSpec

# --- what to tune, and how (one field per option of `lzsolve tune`) ------------------------------


@dataclass(frozen=True)
class ModelSource:
    """The model: a built-in one (`name`), a Hugging Face config.json or its folder (`config`), or a
    workload file runtime_loader.record wrote (`workload`): exactly one. A model's deployment: its
    tensor- and expert-parallel degrees, its dtype (fp8: an FP8 W8A8 deployment) and an FP8 KV cache.
    dtype None: bf16 for a model, the recorded one for a workload (which another dtype contradicts)."""
    name: str | None = None  # --model
    config: str | Path | None = None  # --config
    workload: str | Path | None = None  # --workload
    tp: int = 1  # --tp
    ep: int = 1  # --ep
    dtype: str | None = None  # --dtype, when given
    fp8_kv: bool = False  # --fp8-kv


@dataclass(frozen=True)
class GridConfig:
    """What is measured: the shape grid (None: full on cuda, small on cpu), the candidate kernels (glob
    patterns on kernel ids; the ops' fallbacks are always kept) and modules that register more. quick:
    a first table in a minute or so (see `quick`): what it leaves out, a later tune into the same
    artifact measures, reusing what this one did."""
    grid: str | None = None  # --grid
    kernels: tuple[str, ...] = ()  # --kernels, one glob each
    exclude: tuple[str, ...] = ()  # --exclude, one glob each
    plugins: tuple[str, ...] = ()  # --plugin
    quick: bool = False  # --quick


@dataclass(frozen=True)
class MeasureConfig:
    """Where and how: one device (None: cuda if available, else cpu), several of this host, or a Ray
    cluster's; the timing mode the solver optimises (None: graph on cuda, eager on cpu); how long a
    candidate samples and may take; whether it runs in a worker process; the MoE routing skew; the
    measurement cache shared by every tune of this machine (cache_dir None: perfdb.default_cache()),
    whose records any later tune reuses, whatever model asked for them."""
    device: str | None = None  # --device
    devices: str | None = None  # --devices: "cuda:0,cuda:1" or "all"
    ray: str | None = None  # --ray: local, auto or HOST:PORT
    ray_workers: int | None = None  # --ray-workers
    mode: str | None = None  # --mode: graph or eager
    sample_time: float = Budget.time_cap_s  # --sample-time
    timeout: float = 300.0  # --timeout
    isolate: bool = True  # --isolate/--no-isolate
    routing_skew: float = ROUTING_SKEW  # --routing-skew
    cache: bool = True  # --cache/--no-cache
    cache_dir: str | Path | None = None  # --cache-dir


@dataclass(frozen=True)
class SearchConfig:
    """The optuna search of tunable kernels: trials per signature and bucket (None: each space's own
    budget; 0: no search), the spaces' folder (None: the repo's search_spaces/) and how studies stop."""
    trials: int | None = None  # --trials
    spaces: str | Path | None = None  # --spaces
    patience: int = SearchBudget.patience  # --patience
    skip_behind: float = SearchBudget.skip_behind  # --skip-behind
    refine: int = SearchBudget.refine  # --refine
    full: bool = False  # --full-search


@dataclass(frozen=True)
class ValidateConfig:
    """What checks the table beyond the grid: probes at unaligned points, random validation shapes
    (0: none), and a baseline artifact it must not be slower than beyond max_regression."""
    probe: bool = True  # --probe/--no-probe
    shapes: int = VALIDATION_SHAPES  # --validate
    baseline: str | Path | None = None  # --baseline
    max_regression: float = DEFAULT_THRESHOLD  # --max-regression
    min_ms: float = DEFAULT_MIN_MS  # --min-ms


@dataclass(frozen=True)
class OutputConfig:
    """The artifact folder (None: artifacts/<model>/<hardware>-...), whether its PerfDB's records are
    measured again (fresh), and json: stdout is left to a JSON summary (every line goes to stderr)."""
    out: str | Path | None = None  # --out
    fresh: bool = False  # --fresh
    json: bool = False  # --json


@dataclass(frozen=True)
class TuneConfig:
    """A tune's settings, by concern; only the model has no default (`lzsolve tune` with no option
    but the model is TuneConfig(ModelSource(...)))."""
    model: ModelSource
    grid: GridConfig = field(default_factory=GridConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


@dataclass(frozen=True)
class TuneResult:
    """A finished tune: its artifact folder, its status (ok; failed: a signature no kernel was admitted
    for; regressed or inconclusive against the baseline), the summary `tune --json` prints, the table
    written (dispatch.json's content) and the records it was solved from, each once."""
    artifact: Path
    status: str
    summary: dict
    table: dict
    records: list[dict]

    @property
    def blind(self) -> list[str]:
        """The signatures no kernel was admitted for at any grid point."""
        return self.summary["blind"]

    @property
    def regressed(self) -> list[str]:
        return (self.summary["comparison"] or {}).get("regressed", [])

    @property
    def inconclusive(self) -> list[str]:
        return (self.summary["comparison"] or {}).get("inconclusive", [])

    @property
    def noisy_decisions(self) -> int:
        return self.table["noise"]["noisy_decisions"]


# --- the plan -------------------------------------------------------------------------------------


def load_plugins(modules: tuple[str, ...]) -> None:
    """Import the modules that register extra kernels (--plugin), or one line saying why not."""
    if not modules:
        return
    try:
        worker.load_plugins(modules)
    except Exception as e:
        raise LzError(f"--plugin: cannot import {e.name if isinstance(e, ImportError) else ''} "
                      f"({type(e).__name__}: {e}); pass an importable module name") from None


def _recorded(source: ModelSource) -> workload.Workload:
    """The workload file, checked against the other settings (its dtype is recorded: dtype may only agree)."""
    path = source.workload
    if source.name is not None or source.config is not None:
        raise LzError("pass one of --model, --config or --workload, not several")
    if source.tp != 1:
        raise LzError("--tp does not apply to --workload: its shapes are per rank already (the process that "
                      "recorded them ran them); leave --tp out")
    recorded = workload.read(path)
    if len(recorded.dtypes) > 1:
        raise LzError(f"{path}: the workload mixes dtypes {sorted(recorded.dtypes)}; record one dtype per file")
    (recorded_dtype,) = recorded.dtypes
    if source.dtype is not None and source.dtype != recorded_dtype:
        raise LzError(f"--dtype {source.dtype}: the workload {path} recorded {recorded_dtype} calls; leave --dtype out")
    return recorded


def plan_model(source: ModelSource, grid: GridConfig, device: str | None) -> Plan:
    """The dry run (`lzsolve plan`, and a tune's first step): the model's op signatures (captured, or
    recorded), the grid's buckets on `device` and each candidate's capability verdict."""
    dev = devices.resolve_device(device)
    shapes = grid.grid or default_grid(dev.type, grid.quick)
    if source.workload is None:
        dtype = source.dtype or "bf16"
        spec = capture.load(source.name, source.config, source.tp, dtype, source.fp8_kv, source.ep)
        dtype = "bf16" if dtype == capture.FP8 else dtype  # fp8 names the linears' weights, not the activations
    else:
        if source.dtype == capture.FP8 or source.fp8_kv or source.ep != 1:
            option = "--fp8-kv" if source.fp8_kv else "--dtype fp8" if source.dtype == capture.FP8 else "--ep"
            raise LzError(f"{option} describes a model (--model, --config); a "
                          f"workload recorded its own calls")
        calls = _recorded(source)
        spec, shapes, (dtype,) = workload.captured(calls), workload.grid(calls, shapes), calls.dtypes
    for pattern in grid.kernels + grid.exclude:
        if not any(fnmatch.fnmatchcase(k, pattern) for k in registry.REGISTRY):
            raise LzError(f"kernel pattern {pattern!r} matches no kernel; see `lzsolve kernels`")
    return tuner.make_plan(spec, dtype, dev, shapes, grid.kernels, grid.exclude)


def print_notes(plan: Plan) -> None:
    """What will run on a reference fallback, and why: one line each, on stderr."""
    for line in tuner.notes(plan):
        click.echo(f"note: {line}", err=True)


def say_incremental(session: Session, plan: Plan) -> None:
    """On a PerfDB with earlier records, which kernels this run measures again, and why."""
    if not session.reusable:
        return
    changed, new = session.changes(plan)
    parts = ([f"version changed: {', '.join(changed)}"] if changed else []) + ([f"new: {', '.join(new)}"] if new else [])
    cached = sum(1 for r in session.reusable.values() if r.get("cached_from"))
    source = f" ({cached} in the measurement cache {session.cache.path})" if cached and session.cache else ""
    click.echo(f"incremental: {len(session.reusable)} earlier records{source} reused where kernel, version and shape "
               f"match; measuring again {'; '.join(parts) or 'none but what earlier runs left unmeasured'}", err=True)


# --- a quick first table ---------------------------------------------------------------------------

# a quick tune's sampling per candidate and mode, where --sample-time is left at its default: most
# GPU timings never reach the target spread and sample for the whole cap (83 of a quick tune's 153 on
# the H100, benchmarks/device.sh batch: its 66 s grid phase was mostly sampling); a timing that does
# reach it is as good as the full tune's, which reuses it (tuner._reusable) and measures the rest again
QUICK_SAMPLE_S = 0.1


def starts_slowly(spec: KernelSpec) -> bool:
    """Whether a kernel's first call takes seconds to minutes: a build by nvcc (FlashInfer's modules)
    or Inductor (the builders' and warmers' kernels), or what its spec says (KernelSpec.slow_start:
    Liger's import). A quick tune leaves these to the full one."""
    return spec.slow_start or built_by_nvcc(spec) or warmed_by_inductor(spec)


def quick(config: TuneConfig) -> tuple[TuneConfig, list[str]]:
    """`tune --quick`: `config` with what a first table can do without, and what that is, for the
    report. The next smaller grid than the device's default (unless --grid names one), no search of
    tunable kernels' parameters (their default configurations are candidates), no probes or
    validation, no candidate whose first call takes seconds to minutes, and QUICK_SAMPLE_S of
    sampling unless --sample-time says otherwise. A later `lzsolve tune` into the same --out reuses
    the records this one measured as well as it would (tuner._reusable) and measures the others."""
    if not config.grid.quick:
        return config, []
    slow = sorted({registry.family(spec.kernel_id) for spec in registry.REGISTRY.values() if starts_slowly(spec)})
    skipped = []
    if config.grid.grid is None:
        skipped.append("the default grid's buckets (the next smaller grid instead)")
    if config.search.trials != 0:
        skipped.append("the search of tunable kernels' parameters (their defaults are candidates)")
    if config.validate.probe:
        skipped.append("the probes between the buckets")
    if config.validate.shapes:
        skipped.append("the validation at random shapes")
    if slow:
        skipped.append(f"the kernels whose first call takes seconds to minutes ({', '.join(slow)})")
    sample_time = config.measure.sample_time
    if sample_time == Budget.time_cap_s:
        sample_time = QUICK_SAMPLE_S
        skipped.append(f"the full sampling ({QUICK_SAMPLE_S:g} s a candidate, not {Budget.time_cap_s:g} s, where its "
                       f"spread stays above {Budget.target_spread:.0%}: noisier; the full tune measures those again)")
    return dataclasses.replace(
        config, grid=dataclasses.replace(config.grid, exclude=config.grid.exclude + tuple(slow)),
        measure=dataclasses.replace(config.measure, sample_time=sample_time),
        search=dataclasses.replace(config.search, trials=0),
        validate=dataclasses.replace(config.validate, probe=False, shapes=0)), skipped


# --- the run --------------------------------------------------------------------------------------


class Tune:
    """One tune of one model: its workers, builders and cluster, its plan, session and records, the
    table solved from them. `run()` calls the phases in order; a test may call them one by one inside
    `with Tune(config) as tune:`, each phase reading what the ones before it left on the object.

    entered: (time.perf_counter(), time.process_time()) when the run began, if before this object
    (`lzsolve tune` passes its entry: the summary's start_s counts its imports too)."""

    def __init__(self, config: TuneConfig, entered: tuple[float, float] | None = None):
        self.config, self.skipped = quick(config)  # (a quick tune's settings, and what they leave out)
        self.entered, self.entered_cpu = entered or (time.perf_counter(), time.process_time())
        # wall seconds of each phase, and this process's CPU seconds of each, all its threads (the
        # devices' lanes): near the phase's time, this process, not the devices, is what a run on
        # more devices waits for
        self.phases: dict[str, float] = {}
        self.parent_cpu: dict[str, float] = {}
        self.started: float | None = None  # the wall's start: the search's
        self.wall: float | None = None
        self.lanes: list = []  # --devices
        self.measuring: list[worker.WorkerRunner] = []  # the measuring workers, started before the plan
        self.cluster: Cluster | None = None
        self.spaces: dict = {}
        self.budget: Budget | None = None
        self.plan: Plan | None = None
        self.mode: str | None = None
        self.out: Path | None = None
        self.session: Session | None = None
        self.where = ""
        self.ahead: list[CompileAhead] = []  # the nvcc builders, the primer, Inductor's warmer
        self.builders: CompileAhead | None = None  # the nvcc builders (the grid measures what they hold last)
        self.primer: CompileAhead | None = None  # the optional libraries' first calls (likewise)
        self.warmer: CompileAhead | None = None
        self._to_come: tuple[SignaturePlan, ...] = ()  # signatures whose grid a later cohort measures
        self.searched: SearchStats | None = None
        self.records: list[dict] = []
        self.validation: dict | None = None
        self.compiled: list[dict] = []  # the first calls made ahead
        self.jit_named: list[dict] = []  # the measurement cache's records naming the JIT files it brought
        self.table: dict | None = None
        self._resources = contextlib.ExitStack()
        self._released = False

    def __enter__(self) -> Tune:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._release()
        finally:
            self._resources.close()

    def run(self) -> TuneResult:
        with self:
            self.start()
            self.make_plan()
            self.search()
            cohorts = self.cohorts()
            for n, signatures in enumerate(cohorts):
                self._to_come = tuple(sp for later in cohorts[n + 1:] for sp in later)
                self.measure_grid(signatures)
                self.probe(signatures)
                self.validate(signatures)
            self.close_measuring()
            self.solve()
            self.write()
            return self.report()

    def _lap(self, name: str) -> None:
        """Add the time since the last lap to phase `name` (the measuring phases run once per cohort)."""
        self.phases[name] = round(self.phases.get(name, 0.0) + max(
            0.0, time.perf_counter() - self.entered - sum(self.phases.values())), 1)
        self.parent_cpu[name] = round(self.parent_cpu.get(name, 0.0) + max(
            0.0, time.process_time() - self.entered_cpu - sum(self.parent_cpu.values())), 1)

    def start(self) -> None:
        """Check the settings the plan does not (bad input ends here, not after the grid), and start
        the measuring workers: their imports and their devices' starts go on beside the planning
        (WorkerRunner.prestart); leaving the Tune stops them if the run ends before they are used."""
        grid, measure, search = self.config.grid, self.config.measure, self.config.search
        baseline = self.config.validate.baseline
        if baseline is not None and not (Path(baseline) / "dispatch.json").is_file():
            raise LzError(f"--baseline {baseline}: no dispatch.json there; pass a folder `lzsolve tune` wrote")
        load_plugins(grid.plugins)
        spaces_dir = Path(search.spaces) if search.spaces else SPACES_DIR
        self.spaces = load_spaces(spaces_dir) if spaces_dir.is_dir() else {}
        if measure.ray is not None and (measure.devices or measure.device):
            raise LzError("--ray measures on the cluster's devices: leave out --devices and --device")
        if measure.ray_workers is not None and measure.ray is None:
            raise LzError("--ray-workers applies to --ray only")
        self.lanes = devices.parse_devices(measure.devices) if measure.devices else []
        devices.check_same_model(self.lanes)
        self.budget = Budget().sampling(measure.sample_time)
        if measure.ray is None and measure.isolate:
            self.measuring = [worker.WorkerRunner(dev, self.budget, grid.plugins, measure.timeout)
                              for dev in self.lanes or [devices.resolve_device(measure.device)]]
        for runner in self.measuring:
            runner.prestart()
        self.cluster = Cluster(measure.ray) if measure.ray is not None else None

    def make_plan(self) -> None:
        """The plan (plan_model), its timing mode, the out folder and its PerfDB; the run's environment
        (JIT caches, shared bytecode, routing skew: the workers inherit it); the runners, one lane per
        device; the session (with what earlier runs measured); the compile-ahead workers. Ends the
        start phase: the wall starts after it."""
        cfg, measure = self.config, self.config.measure
        plugins = cfg.grid.plugins
        device = str(self.lanes[0]) if self.lanes else self.cluster.kind if self.cluster else measure.device
        plan = plan_model(cfg.model, cfg.grid, device)
        self.mode = measure.mode or ("graph" if plan.device.type == "cuda" else "eager")
        if self.mode == "graph" and plan.device.type != "cuda":
            raise LzError("--mode graph needs a CUDA device; use --mode eager on cpu")
        self.out = Path(cfg.output.out) if cfg.output.out else default_out(plan)
        ensure_same_model(self.out, plan)
        ensure_writable(self.out)
        db = PerfDB(self.out / "perfdb")
        point_caches(self.out / JIT_WORK)  # the worker inherits this: its JIT caches belong to the run
        worker.share_bytecode(self.out / JIT_WORK / "bytecode")  # and this, where torch's bytecode is missing
        self._resources.enter_context(skewed_routing(measure.routing_skew))  # and this
        if self.cluster:
            runner, *more = self.cluster.runners(measure.ray_workers, measure.isolate, plugins, measure.timeout,
                                                 plan.hardware, self.budget)
            self.where = f"Ray cluster, {1 + len(more)} workers"
        else:
            runner, *more = self.measuring or [worker.InProcessRunner(dev, self.budget, plugins)
                                               for dev in self.lanes or [plan.device]]
            self.where = ", ".join(map(str, self.lanes)) or str(plan.device)
        print_notes(plan)
        self.plan = plan
        cache_dir = (measure.cache_dir or default_cache()) if measure.cache else None
        self.session = session = tuner.Session(plan, db, runner, tuner.new_run_id(), reuse=not cfg.output.fresh,
                                               more=tuple(more), cache=PerfDB(cache_dir) if cache_dir else None,
                                               sample_time=self.budget.time_cap_s, jit_work=self.out / JIT_WORK)
        say_incremental(session, plan)
        self.jit_named, copied = session.bring_jit_files(plan)  # what earlier runs compiled, before the builders look
        if copied:
            click.echo(f"JIT caches: {copied} files earlier runs compiled for these kernels, from the measurement "
                       f"cache into {self.out / JIT_WORK}", err=True)
        # a Ray run's builds happen on its nodes, and --no-isolate has no second worker to spare. The
        # builders run niced: their nvcc jobs take the cores the measuring workers leave (on two H200s,
        # two builders beside the search made its trials 21% slower, benchmarks/device.sh devices)
        builders = [functools.partial(worker.WorkerRunner, dev, plugins=plugins, timeout_s=measure.timeout,
                                      nice=worker.BUILDER_NICE)
                    for dev in self.lanes or [plan.device]]
        # the nvcc builders; the primer, one for the run (bytecode and Triton's cache are the run's);
        # on a GPU, Inductor's warming processes (lzsolve/measure/ahead.py)
        if measure.isolate and not self.cluster:
            self.builders = CompileAhead.start(plan.signatures, session, builders,
                                               per_device=builders_per_device(len(builders)))
            self.primer = CompileAhead.start(plan.signatures, session, builders[:1], imports_a_library)
            self.ahead += [self.builders, self.primer]
            if plan.device.type == "cuda":  # on CPU it would take the cores eager timings read
                self.warmer = CompileAhead.start(plan.signatures, session, builders, warmed_by_inductor,
                                                 every_workload=True)
                self.ahead.append(self.warmer)
            self.ahead = [a for a in self.ahead if a is not None]
        self.started = time.perf_counter()
        # outside the wall, which starts here: planning, the gates' imports, the workers' objects
        self._lap("start_s")

    def search(self) -> None:
        """Search the tunable kernels' configurations (when any is a candidate); the plan gains the
        winners, and self.searched says what the search spent (None when there was nothing to search)."""
        cfg = self.config.search
        budget = dataclasses.replace(FULL_BUDGET if cfg.full else SearchBudget(cfg.patience, cfg.skip_behind),
                                     refine=cfg.refine)
        total = planned_trials(self.plan, self.spaces, cfg.trials)
        if total:
            storage = self._search_storage()
            click.echo(f"searching {', '.join(sorted(self.spaces))} configurations: up to {total} trials "
                       f"(studies in {storage})", err=True)
            with progress(total, "searching") as bar:  # a full disk under the studies' journal: WriteError naming it
                self.plan, self.searched = search_configurations(
                    self.plan, self.spaces, [lane.runner for lane in self.session.lanes], storage, self.mode,
                    slug(self.plan.hardware), cfg.trials, on_trial=lambda label: bar.update(1, label), budget=budget)
            click.echo(f"search: {self.searched.line()}", err=True)
        self._lap("search_s")

    def _search_storage(self) -> Path:
        """The studies' journal: the measurement cache's where this run reuses and the cache can be
        written (a study is named by what decides its trials' times, so another model's tune of the
        same signature and bucket continues it, and a study that stopped runs no trial again), else
        the artifact's own (--no-cache, --fresh: a re-run into the same --out still continues it)."""
        cache = self.session.cache
        if cache is not None and self.session.reuse:
            try:
                cache.path.mkdir(parents=True, exist_ok=True)
                if os.access(cache.path, os.W_OK):
                    return cache.path / STORAGE_NAME
            except OSError:
                pass
        return self.out / STORAGE_NAME

    def cohorts(self) -> list[tuple[SignaturePlan, ...]]:
        """The signatures in the order the measuring phases take them: those with a kernel whose
        first call is still being made ahead (an nvcc build, a library's import) when the grid
        begins go through the grid, their probes and their validation after every other signature
        has: a cold workload tune on an H100 waited 36 s of its 78 s grid for FlashInfer's prefill
        modules, built beside it (benchmarks/runs/2026-12-06-e.txt), while the other signatures'
        probes and validation, 58 s, waited behind that grid."""
        building = self._building()
        later = tuple(sp for sp in self.plan.signatures if tuner.waits(tuner.grid_work(sp), building))
        now = tuple(sp for sp in self.plan.signatures if sp not in later)
        return [cohort for cohort in (now, later) if cohort]

    def _part(self, signatures: tuple[SignaturePlan, ...] | None) -> Plan:
        """The plan of `signatures`, a cohort (None: every signature)."""
        return self.plan if signatures is None else dataclasses.replace(self.plan, signatures=signatures)

    def _warm(self, phase: str, jobs: list) -> None:
        """The Inductor warmer's calls for `phase`, in the order it measures them: they replace the
        calls still queued for earlier phases, but for the grid calls of a cohort still to come."""
        if self.warmer:
            self.warmer.begin(phase, phase_calls(jobs, warmed_by_inductor),
                              keep=frozenset(str(sp.instance.signature) for sp in self._to_come))

    def measure_grid(self, signatures: tuple[SignaturePlan, ...] | None = None) -> None:
        """Gate and time every candidate of `signatures` (None: all) at every bucket of the grid, in
        the table's mode; the device's ceilings first, once."""
        plan = self._part(signatures)
        if "grid_s" not in self.phases:  # the first cohort's
            whole = self.plan
            click.echo(f"tuning {printable(whole.model.name)} tp={whole.model.tp} {whole.dtype} on "  # (a workload names it)
                       f"{whole.hardware['name']} ({self.where}, grid {whole.grid}): {len(whole.signatures)} op "
                       f"signatures, {whole.measurements} measurements", err=True)
            tuner.measure_ceilings(self.session.db, self.session.runner, self.session.recorder, whole.dtype,
                                   self.session.reuse)
        if self._to_come:
            click.echo(f"measuring {len(plan.signatures)} op signatures through the grid, probes and validation before "
                       f"the {len(self._to_come)} whose kernels are still being built or imported ahead "
                       f"({', '.join(str(sp.instance.signature) for sp in self._to_come)})", err=True)
        with progress(plan.measurements, "measuring") as bar:
            self.records += tuner.tune(plan, self.session, self.mode, on_step=lambda label: bar.update(1, label),
                                       building=self._building)
        self._hold_to_roofline()
        self._lap("grid_s")

    def _building(self) -> frozenset[str]:
        """The kernels whose first calls the builders or the primer are still making: the grid
        measures the signatures they hold after the others. The primer's import of a library a
        quick tune's measuring worker would import at once beside it (Liger's, 6.4 s in a process
        without its bytecode on an H100 host, benchmarks/runs/2026-12-06-e.txt) is then read from
        the bytecode the primer wrote."""
        return frozenset().union(*(a.building() for a in (self.builders, self.primer) if a))

    def probe(self, signatures: tuple[SignaturePlan, ...] | None = None) -> None:
        """Unless told not to: the leading kernels and the fallback at unaligned points inside the
        buckets and past the last, where tile-aligned kernels lose what the grid shows them winning
        (of `signatures`; None: all)."""
        if self.config.validate.probe:
            probes = tuner.plan_probes(self._part(signatures), self.records, self.mode)
            self._warm("probe", self.session.order(probes))
            with progress(sum(len(c) for _, work in probes for _, c in work), "probing") as bar:
                self.records += tuner.probe(self.session, probes, self.mode, on_step=lambda label: bar.update(1, label))
            self._hold_to_roofline()
        self._lap("probe_s")

    def validate(self, signatures: tuple[SignaturePlan, ...] | None = None) -> None:
        """The table solved so far, timed at random shapes against the best kernels and the fallback,
        and refined where it loses (of `signatures`; None: all); self.validation holds the figures
        report.md gives."""
        planned = plan_validation(self._part(signatures), self.records, self.mode, self.config.validate.shapes)
        self._warm("validation", [(p.signature, p.work) for p in validation_order(planned)])
        planned_total = sum(len(c) for p in planned for _, c in p.work)
        with progress(planned_total, "validating") as bar:
            checked, validation = validate_table(
                self.session, planned, self.records, self.mode, on_step=lambda label: bar.update(1, label),
                on_more=functools.partial(add_measurements, bar, planned_total, "validating"))
        self.records += checked
        self._hold_to_roofline()
        self.validation = {**(self.validation or {}), **validation}
        self._lap("validation_s")

    def _hold_to_roofline(self) -> None:
        """Reject each kernel timed faster than the device's ceilings allow before the records decide
        anything more (roofline.reject_implausible: probes, validation and the table read them)."""
        signatures = {str(sp.instance.signature): sp.instance.signature for sp in self.plan.signatures}

        def counted(record: dict) -> tuple[float, float]:  # by the contract, as report.md's fractions
            sig = signatures.get(record.get("signature"))
            return counts(sig, json.loads(record["dims"])) if sig else (record.get("flops"), record.get("bytes"))
        self.records = reject_implausible(self.records, self.ceilings, counted)

    @functools.cached_property
    def ceilings(self) -> list[dict]:
        """The device's ceilings, as the PerfDB holds them once the first cohort's grid measured (or
        reused) them: read once, for the roofline checks, the table and report.md."""
        return self.session.db.ceilings()

    def close_measuring(self) -> None:
        """The compile-ahead workers' last calls (their records join the artifact's); then every worker
        is told to leave, and exits beside the solve and the write."""
        self.compiled = [record for a in self.ahead for record in a.close()]
        self._release()
        self._lap("close_s")

    def _release(self) -> None:
        """Stop the builders, the workers and the cluster without waiting for them (once)."""
        if self._released:
            return
        self._released = True
        try:
            for a in self.ahead:
                a.close(wait=False)
            lanes = [lane.runner for lane in self.session.lanes] if self.session else []
            worker.close_all(lanes + [r for r in self.measuring if not any(r is lane for lane in lanes)], wait=False)
        finally:
            if self.cluster:
                self.cluster.close()

    def solve(self) -> None:
        """The table: one tree per op signature, from every record of the run, each once."""
        self.records = tuner.distinct(self.records)  # a later phase's records repeat those it reused
        self.table = build_table(self.plan, self.records, self.mode, self.session.run_id, self.validation,
                                 self.ceilings)
        self._lap("solve_s")
        self.wall = time.perf_counter() - self.started

    def write(self) -> None:
        """The artifact: dispatch.json, report.md, the records (the builds' name the files they wrote,
        as do the measurement cache's records of what it brought) and the JIT caches' archive, after
        the wall."""
        searched = self.searched.line() if self.searched else None
        write_artifact(self.out, self.table, report_markdown(self.table, self.wall, len(self.records), self.phases,
                                                             searched, self.skipped, self.ceilings),
                       self.records + self.compiled + self.jit_named)
        self._lap("write_s")

    def report(self) -> TuneResult:
        """The summary (`tune --json`'s) and its lines: what was written, each signature's kernels, the
        noise, the builds, the comparison with the baseline; the status, and an error line per
        signature no kernel was admitted for."""
        checks = self.config.validate
        say = functools.partial(click.echo, err=self.config.output.json)  # with --json, stdout carries the summary alone
        table, session, wall = self.table, self.session, self.wall
        summary = run_summary(self.plan, table, self.records, self.out, wall, session.restarts, self.phases)
        summary["written"] += len(self.compiled) + len(session.copied)  # (copies of the cache's records)
        summary["cache"] = str(session.cache.path) if session.cache else None
        cached = f", {summary['cached']} of them from the measurement cache" if summary["cached"] else ""
        say(f"wrote {self.out}/dispatch.json, report.md and perfdb/ ({summary['records']} records: {summary['new']} of "
            f"this run, {summary['reused']} reused{cached}; {summary['written']} rows written; {wall:.0f} s, "
            f"{session.restarts} worker restart(s))")
        if session.cache_note:
            click.echo(f"note: {session.cache_note}", err=True)
        for entry in table["ops"]:
            say(f"  {entry['signature']}: {', '.join(sorted(set(leaf_ids(entry['tree']))))}")
        if table["noise"]["noisy_decisions"]:
            say(f"noise: {format_noise(table['noise'])[0]}; report.md says more")
        summary["search"] = self.searched.as_dict() if self.searched else None
        summary["quick"] = {"skipped": self.skipped} if self.config.grid.quick else None
        if self.skipped:
            say(f"quick: left out {'; '.join(self.skipped)}; `lzsolve tune` into {self.out} adds them, reusing "
                "this run's records")
        summary["parent_cpu_s"] = self.parent_cpu
        summary["compiled_ahead"] = [call for a in self.ahead for call in a.summary()]
        if self.ahead:
            built = ", ".join(f"{c['kernel_id']} {c['dims']} {c['jit_s']} s" for c in summary["compiled_ahead"]
                              if c["jit_s"] >= 1)
            errors = "; ".join(a.error for a in self.ahead if a.error)
            say(f"built ahead beside the measuring workers: {built or 'nothing slow'}"
                + (f" (it stopped: {errors})" if errors else ""))
        if checks.baseline is not None:
            summary["comparison"] = compare(self.out, Path(checks.baseline), checks.max_regression, checks.min_ms)
            say_comparison(summary["comparison"], say)
        summary["status"] = "failed" if summary["blind"] else comparison_status(summary["comparison"])
        for sig in summary["blind"]:
            click.echo(f"error: {sig}: no kernel was admitted at any grid point (see `lzsolve explain`)", err=True)
        return TuneResult(self.out, summary["status"], summary, table, self.records)


def run_summary(plan: Plan, table: dict, records: list[dict], out_dir: Path, wall_s: float, restarts: int,
                phases: dict[str, float]) -> dict:
    """What CI needs to know about a tune, as plain data (`tune --json`). `records` are those the
    table was solved from, each once: `new` of them this run's (its rows in the PerfDB, with
    `written` adding the first calls made ahead), `measured` those of them that cost a measurement
    (capability verdicts cost nothing, nor a timing shared with a signature that differs only in
    labels: `shared`, tuner.measured_as), `reused` earlier runs', `cached` those of them that came
    from the measurement cache (runs of other models or artifacts)."""
    ours = [r for r in records if r["run_id"] == table["run_id"]]
    rejected: dict[str, int] = {}
    for r in records:
        if r["status"] == "rejected":
            rejected[r["stage"]] = rejected.get(r["stage"], 0) + 1
    return {
        "status": None, "artifact": str(out_dir), "run_id": table["run_id"],
        "model": table["model"], "hardware": table["hardware"]["name"], "hw_slug": table["hw_slug"],
        "timing_mode": table["timing_mode"], "grid": table["grid"], "wall_s": round(wall_s, 1), "phases": phases,
        "records": len(records), "new": len(ours), "written": len(ours),
        "measured": sum(r["stage"] != "capability" and not r.get("timed_as") for r in ours),
        "shared": sum(1 for r in records if r.get("timed_as")),
        "reused": len(records) - len(ours),
        "cached": sum(1 for r in records if r.get("cached_from")),
        "rejected_by_stage": rejected, "worker_restarts": restarts,
        "noise": table["noise"],
        "notes": tuner.notes(plan),
        "signatures": [{"signature": e["signature"], "kernels": sorted(set(leaf_ids(e["tree"]))),
                        "grid_regret": e["grid_regret"], "worst_regret": e["worst_regret"],
                        "points_by_phase": e["points_by_phase"], "validation": e["validation"],
                        "fallback": e["fallback"]} for e in table["ops"]],
        "blind": [e["signature"] for e in table["ops"] if e["grid_regret"] is None],
        "comparison": None,
    }
