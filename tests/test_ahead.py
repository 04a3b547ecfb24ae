"""Compiling ahead (lzsolve.measure.ahead): the nvcc-built kernels' first calls, made by a second worker,
so the grid finds their modules built. tests.nvcc_kernels stands in for FlashInfer."""
import dataclasses
import itertools
import json
import threading
import time

import pytest
import torch
from click.testing import CliRunner

from lzsolve.cli import cli
from lzsolve.measure.ahead import (
    CompileAhead,
    branch_points,
    builders_per_device,
    first_calls,
    imports_a_library,
    phase_calls,
    warmed_by_inductor,
)
from lzsolve.measure.tuner import Session, make_plan, ready_first, signature_of, tune
from lzsolve.measure.worker import InProcessRunner
from lzsolve.models.capture import capture
from lzsolve.store.perfdb import PerfDB, dims_key
from runtime_loader import jit

from .test_cli import TINY_LLAMA


def test_branch_points_are_the_smallest_workload_and_each_dim_past_its_minimum():
    prefill = tuple({"batch": b, "seq": s} for b in (1, 2, 8) for s in (32, 128, 512))
    assert branch_points(prefill) == [{"batch": 1, "seq": 32}, {"batch": 2, "seq": 32}, {"batch": 1, "seq": 128}]
    assert branch_points(({"tokens": 1}, {"tokens": 8}, {"tokens": 64})) == [{"tokens": 1}, {"tokens": 8}]
    assert branch_points(({"tokens": 16},)) == [{"tokens": 16}]
    assert branch_points(()) == []


def norm_plan(*only: str):
    """The tiny Llama's RMSNorm signatures on CPU, with the kernels `only` names and the fallback."""
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    plan = make_plan(model, "fp32", torch.device("cpu"), "tiny", only=only)
    return dataclasses.replace(plan, signatures=tuple(sp for sp in plan.signatures
                                                      if sp.instance.signature.op == "norm.rms"))


@pytest.fixture
def nvcc_plan(monkeypatch, tmp_path):
    import tests.nvcc_kernels  # noqa: F401  (registers built.rms_norm)
    for variable in jit.JIT_CACHES.values():  # recorded, so that the undo after the test restores them
        monkeypatch.setenv(variable, "")
    jit.point_caches(tmp_path / "jit")  # as tune does: process-wide
    return norm_plan("built.*")


def test_each_process_ahead_calls_the_kernels_of_its_caches(nvcc_plan, tmp_path):
    """The builders take the nvcc-built kernels, the warming process Inductor's (compile.*), the
    primer an optional library's kernel that neither takes, and none takes another's, nor a kernel
    of none of them (the fallback)."""
    norms = norm_plan("built.*", "compile.*", "imported.*")
    session = Session(norms, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")))
    built = first_calls(norms.signatures, session)
    warmed = first_calls(norms.signatures, session, warmed_by_inductor)
    assert {spec.kernel_id for _, spec, _ in built} == {"built.rms_norm"}
    assert {spec.kernel_id for _, spec, _ in warmed} == {"compile.rms_norm"}
    primed = first_calls(norms.signatures, session, imports_a_library)
    assert {spec.kernel_id for _, spec, _ in primed} == {"imported.rms_norm"}
    workloads = norms.signatures[0].workloads
    assert [dims for _, _, dims in warmed] == branch_points(workloads)
    every = first_calls(norms.signatures, session, warmed_by_inductor, every_workload=True)
    assert [dims["tokens"] for _, _, dims in every] == sorted((w["tokens"] for w in workloads), reverse=True), \
        "every grid workload, largest first as the grid measures"


def test_a_kernel_compiled_per_shape_is_warmed_at_every_workload_unchecked(tmp_path, monkeypatch):
    """The warming process's first calls at each grid workload (FirstCallTask) leave every shape
    compiled for the grid; they check nothing (no reference, no verdict), so their records are
    stage 'compile' and a later run reuses none of them as a measurement."""
    import tests.nvcc_kernels  # noqa: F401  (registers shaped.rms_norm)
    from tests.nvcc_kernels import COMPILE_S
    for variable in jit.JIT_CACHES.values():
        monkeypatch.setenv(variable, "")
    jit.point_caches(tmp_path / "jit")
    plan = norm_plan("shaped.*")
    db = PerfDB(tmp_path / "perfdb")
    session = Session(plan, db, InProcessRunner(torch.device("cpu")))
    ahead = CompileAhead.start(plan.signatures, session, [lambda: InProcessRunner(torch.device("cpu"))],
                               warmed_by_inductor, every_workload=True)
    warmed = ahead.wait()
    workloads = {dims_key(w) for sp in plan.signatures for w in sp.workloads}
    assert {r["dims"] for r in warmed if r["kernel_id"] == "shaped.rms_norm"} == workloads
    assert all(r["stage"] == "compile" and r["status"] == "ok" and r.get("rel_l2") is None for r in warmed), \
        "a first call alone: no parity was checked"
    assert all(r["jit_ms"] >= COMPILE_S * 1e3 and json.loads(r["jit_files"]) for r in warmed)
    grid = [r for r in tune(plan, session, "eager") if r["kernel_id"] == "shaped.rms_norm" and r["stage"] != "capability"]
    assert grid and all(r["stage"] == "bench" and r["jit_ms"] < COMPILE_S * 1e3 for r in grid), \
        "the grid checked and timed the kernel at every workload, compiling none of them"
    log = (tmp_path / "jit" / "inductor" / "shaped" / "compiles.log").read_text().split()
    assert sorted(log) == sorted({str(w["tokens"]) for sp in plan.signatures for w in sp.workloads}), "each once"
    again = Session(plan, db, InProcessRunner(torch.device("cpu")))
    assert not any(r["stage"] == "compile" for r in again.reusable.values())
    # it stays for the workloads later phases bring (probes, validation), in the worker it started with
    sp = plan.signatures[0]
    probe = [(sp, [({"tokens": 77}, sp.candidates)])]
    assert [(s.kernel_id, d) for _, s, d in phase_calls(probe, warmed_by_inductor)] == [("shaped.rms_norm", {"tokens": 77})]
    both = [(sp, [({"tokens": 77}, sp.candidates), ({"tokens": 300}, sp.candidates)])]
    assert [d["tokens"] for _, _, d in phase_calls(session.order(both), warmed_by_inductor)] == [77, 300], \
        "as one device takes them"
    two = Session(plan, db, InProcessRunner(torch.device("cpu")), more=(InProcessRunner(torch.device("cpu")),))
    assert [d["tokens"] for _, _, d in phase_calls(two.order(both), warmed_by_inductor)] == [300, 77], \
        "as two devices take them: largest first"
    ahead.begin("probe", phase_calls(probe, warmed_by_inductor))
    assert [r["dims"] for r in ahead.wait()][len(warmed):] == [dims_key({"tokens": 77})]
    assert (tmp_path / "jit" / "inductor" / "shaped" / "77").exists()
    ahead.close()
    assert not any(t.is_alive() for t in ahead._threads), "closed: its thread is gone"


def test_a_phase_begun_comes_first_and_each_call_is_made_once(nvcc_plan, tmp_path):
    """Calls queue per phase and are made once: a phase's queued calls wait behind the phases
    before it; when it begins, its own calls come next, in its order, and the calls left of the
    phases before it and those queued for it that it does not make are dropped."""
    import threading

    sp = nvcc_plan.signatures[0]
    spec = next(c.spec for c in sp.candidates if c.spec.kernel_id == "built.rms_norm")
    call = lambda tokens: (sp, spec, {"tokens": tokens})  # noqa: E731
    made, release = [], threading.Event()

    class Warmer:  # holds its first call until released, so the queue can be rearranged meanwhile
        timer = "fake"

        def run(self, task):
            made.append(task.dims["tokens"])
            release.wait(timeout=30)
            return {}

        def close(self, wait=True):
            pass

    session = Session(nvcc_plan, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")))
    ahead = CompileAhead([call(1), call(2)], session, [Warmer], checked=False, stays=True)
    ahead.add([call(11), call(12), call(13)], "probe")
    ahead.add([call(21), call(22), call(1)], "validation")  # a call already given is not queued again
    ahead.begin("probe", [call(13), call(14), call(11)])  # grid's 2 dropped; the probe's 12 too
    release.set()
    ahead.wait()
    assert made == [1, 13, 14, 11, 21, 22]
    ahead.begin("validation", [call(22), call(23)])
    ahead.wait()
    assert made == [1, 13, 14, 11, 21, 22, 23], "each call made once"
    ahead.close()


def test_a_phase_begun_keeps_the_earlier_calls_of_a_cohort_still_to_come(tmp_path):
    """begin(keep=...): the earlier phases' calls of the signatures kept stay queued, ahead of the
    phase's own (a later cohort's grid comes before this cohort's probes); the others go."""
    plan = make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny")
    first, second = plan.signatures[:2]
    made, release = [], threading.Event()

    class Warmer:
        timer = "fake"

        def run(self, task):
            made.append((str(task.signature), task.dims["tokens"]))
            release.wait(timeout=30)
            return {}

        def close(self, wait=True):
            pass

    session = Session(plan, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")))
    call = lambda sp, tokens: (sp, sp.candidates[0].spec, {"tokens": tokens})  # noqa: E731
    ahead = CompileAhead([call(sp, t) for t in (1, 2) for sp in (first, second)], session, [Warmer], checked=False,
                         stays=True)
    ahead.begin("probe", [call(first, 3)], keep=frozenset({str(second.instance.signature)}))
    release.set()
    ahead.wait()
    ahead.close()
    a, b = str(first.instance.signature), str(second.instance.signature)
    assert made == [(a, 1), (b, 1), (b, 2), (a, 3)], made


def test_the_grid_finds_built_what_was_compiled_ahead(nvcc_plan, tmp_path):
    from tests.nvcc_kernels import BUILD_S, MODULE
    db = PerfDB(tmp_path / "perfdb")
    session = Session(nvcc_plan, db, InProcessRunner(torch.device("cpu")))
    calls = first_calls(nvcc_plan.signatures, session)
    assert {spec.kernel_id for _, spec, _ in calls} == {"built.rms_norm"}, "only the nvcc-built kernel, not its fallback"
    ahead = CompileAhead.start(nvcc_plan.signatures, session, [lambda: InProcessRunner(torch.device("cpu"))])
    built = ahead.wait()
    assert len(built) == len(calls) and all(r["status"] == "ok" and r["phase"] == "compile" for r in built)
    first = min(built, key=lambda r: r["ts"])
    assert first["jit_ms"] >= BUILD_S * 1e3 and f"flashinfer/{MODULE.as_posix()}" in json.loads(first["jit_files"])
    grid = [r for r in tune(nvcc_plan, session, "eager") if r["kernel_id"] == "built.rms_norm"]
    assert grid and all(r["jit_ms"] < BUILD_S * 1e3 for r in grid), "no grid call waited for a build"
    stored = db.rows("SELECT count(*) AS n FROM records WHERE phase = 'compile'")[0]["n"]
    assert stored == len(built), "the builds' records are in the PerfDB"
    assert (tmp_path / "jit" / "flashinfer" / "builds.log").read_text().count("\n") == 1


def test_the_builders_name_the_kernels_they_hold_until_their_calls_are_made(nvcc_plan, tmp_path):
    sp = nvcc_plan.signatures[0]
    spec = next(c.spec for c in sp.candidates if c.spec.kernel_id == "built.rms_norm")
    started, release = threading.Event(), threading.Event()

    class Builder:  # holds its first call until released
        timer = "fake"

        def run(self, task):
            started.set()
            release.wait(timeout=30)
            return {}

        def close(self, wait=True):
            pass

    session = Session(nvcc_plan, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")))
    ahead = CompileAhead([(sp, spec, {"tokens": 1}), (sp, spec, {"tokens": 8})], session, [Builder])
    assert ahead.building() == {"built.rms_norm"}, "queued"
    assert started.wait(timeout=30) and ahead.building() == {"built.rms_norm"}, "in flight, one more queued"
    release.set()
    ahead.wait()
    assert ahead.building() == frozenset()
    ahead.close()


def test_the_grid_measures_first_the_signatures_no_build_holds(tmp_path):
    """A signature with a kernel still being built goes after every other, so that the grid does
    not wait on a build while it has other work; asked again at each signature, it comes back to
    plan order once the build is done, and where every signature left waits, it takes the first."""
    import tests.nvcc_kernels  # noqa: F401  (registers built.rms_norm)
    plan = make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny", only=("built.*",))
    plan = dataclasses.replace(plan, signatures=tuple(sp for sp in plan.signatures
                                                      if sp.instance.signature.op in ("norm.rms", "linear")))
    names = [str(sp.instance.signature) for sp in plan.signatures]
    norms, linears = [n for n in names if n.startswith("norm.rms")], [n for n in names if n.startswith("linear")]
    assert names.index(norms[0]) < names.index(linears[0]) and len(linears) > 1, "a norm comes before the linears"

    def grid_order(build_ends_after: int) -> list[str]:
        session = Session(plan, PerfDB(tmp_path / f"perfdb-{build_ends_after}"), InProcessRunner(torch.device("cpu")))
        order = []

        def measure(sp, work, *args, **kwargs):
            order.append(str(sp.instance.signature))
            return []

        session.measure = measure
        tune(plan, session, "eager", building=lambda: frozenset({"built.rms_norm"} if len(order) < build_ends_after else ()))
        return order

    assert grid_order(build_ends_after=len(names)) == linears + norms, "built all along: the norms last"
    # the build done after the first linear: the rest in plan order
    assert grid_order(build_ends_after=1) == linears[:1] + [n for n in names if n != linears[0]]
    # on several devices the workloads are ordered once, at the start
    units = [(sp, [(sp.workloads[0], sp.candidates)]) for sp in plan.signatures]
    assert [signature_of(unit) for unit in ready_first(units, frozenset({"built.rms_norm"}))] == linears + norms


def test_what_the_builders_built_goes_to_the_measurement_cache_with_its_files(nvcc_plan, tmp_path):
    from lzsolve.store.jit_store import store_root
    from tests.nvcc_kernels import MODULE
    cache = PerfDB(tmp_path / "cache")
    session = Session(nvcc_plan, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")), cache=cache,
                      jit_work=tmp_path / "jit")
    built = CompileAhead.start(nvcc_plan.signatures, session, [lambda: InProcessRunner(torch.device("cpu"))]).wait()
    cached = cache.rows("SELECT kernel_id, phase, jit_files FROM records")
    assert len(cached) == len(built) and {r["phase"] for r in cached} == {"compile"}
    assert (store_root(cache.path, session.recorder.hw_slug) / "flashinfer" / MODULE).is_file()


def test_the_measuring_worker_finds_the_library_the_primer_imported(nvcc_plan, tmp_path):
    """The primer's first call imports the library in a process of its own and leaves what that
    compiled in the run's cache; the measuring worker, another process, imports it again and
    reads that: no grid call pays the slow first import."""
    from lzsolve.measure.worker import WorkerRunner
    from tests.nvcc_kernels import IMPORT_S
    plan = norm_plan("imported.*")
    plugins = ("tests.nvcc_kernels",)
    measuring = WorkerRunner(torch.device("cpu"), plugins=plugins)
    session = Session(plan, PerfDB(tmp_path / "perfdb"), measuring)
    try:
        primed = CompileAhead.start(plan.signatures, session, [lambda: WorkerRunner(torch.device("cpu"), plugins=plugins)],
                                    imports_a_library).wait()
        assert primed and all(r["phase"] == "compile" and r["status"] == "ok" for r in primed)
        assert max(r["jit_ms"] for r in primed) >= IMPORT_S * 1e3, "the primer paid the first import"
        grid = [r for r in tune(plan, session, "eager") if r["kernel_id"] == "imported.rms_norm" and r["stage"] != "capability"]
    finally:
        measuring.close()
    assert grid and all(r["status"] == "ok" and r["jit_ms"] < IMPORT_S * 1e3 for r in grid), \
        "the measuring worker read what the primer compiled"
    imports = (tmp_path / "jit" / "triton" / "slow_library" / "imports.log").read_text().split()
    assert len(imports) == len(set(imports)) == 2, "imported once in each of the two processes"


def test_a_builder_per_device_shares_the_first_calls_and_each_is_made_once(nvcc_plan, tmp_path):
    """On two devices two builders take the first calls from one queue: both work, no call is made
    twice, and the module (under its lock) is still built once."""
    session = Session(nvcc_plan, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")),
                      more=(InProcessRunner(torch.device("cpu")),))  # two lanes: CPU devices 0 and 1
    calls = first_calls(nvcc_plan.signatures, session)
    assert len(calls) >= 2
    made: dict[int, list] = {0: [], 1: []}

    class Builder(InProcessRunner):  # a CPU runner that notes which builder made each call
        def run(self, task):
            made[self.lane].append(task)
            return super().run(task)

    def builder(lane):
        runner = Builder(torch.device("cpu"))
        runner.lane = lane
        return runner

    built = CompileAhead.start(nvcc_plan.signatures, session, [lambda: builder(0), lambda: builder(1)]).wait()
    assert made[0] and made[1], "the second builder took calls while the first one built"
    assert sorted((t.kernel_id, dims_key(t.dims)) for t in made[0] + made[1]) == \
        sorted((spec.kernel_id, dims_key(dims)) for _, spec, dims in calls), "each call made once"
    assert len(built) == len(calls) and all(r["status"] == "ok" for r in built)
    assert (tmp_path / "jit" / "flashinfer" / "builds.log").read_text().count("\n") == 1
    by_lane = {lane: sorted(r["dims"] for r in built if r["device_index"] == lane) for lane in made}
    assert by_lane == {lane: sorted(dims_key(task.dims) for task in made[lane]) for lane in made}, \
        "each record names its builder's device"


def test_two_builders_on_one_device_share_the_first_calls_and_each_is_made_once(nvcc_plan, tmp_path):
    """per_device=2: two builders on the one device build at once (each waits for the other at its
    first call), taking the calls from one queue, each call made once."""
    session = Session(nvcc_plan, PerfDB(tmp_path / "perfdb"), InProcessRunner(torch.device("cpu")))
    calls = first_calls(nvcc_plan.signatures, session)
    assert len(calls) >= 2
    both_building = threading.Barrier(2, timeout=30)
    made: dict[int, list] = {0: [], 1: []}
    numbers = itertools.count()

    class Builder(InProcessRunner):
        def run(self, task):
            if not made[self.number]:
                both_building.wait()  # raises, failing the builder, where no second one is there
            made[self.number].append(task)
            return super().run(task)

    def builder():
        runner = Builder(torch.device("cpu"))
        runner.number = next(numbers)
        return runner

    ahead = CompileAhead.start(nvcc_plan.signatures, session, [builder], per_device=2)
    built = ahead.wait()
    assert ahead.error is None and made[0] and made[1]
    assert sorted((t.kernel_id, dims_key(t.dims)) for t in made[0] + made[1]) == \
        sorted((spec.kernel_id, dims_key(dims)) for _, spec, dims in calls), "each call made once"
    assert len(built) == len(calls) and all(r["status"] == "ok" for r in built)


def test_a_host_of_16_cores_a_device_gets_two_builders_per_device():
    assert [builders_per_device(1, cores) for cores in (2, 8, 15, 16, 128)] == [1, 1, 1, 2, 2]
    assert [builders_per_device(2, cores) for cores in (16, 31, 32)] == [1, 1, 2]


def test_nothing_is_compiled_ahead_where_an_earlier_run_measured_the_kernel(nvcc_plan, tmp_path):
    db = PerfDB(tmp_path / "perfdb")
    tune(nvcc_plan, Session(nvcc_plan, db, InProcessRunner(torch.device("cpu"))), "eager")
    again = Session(nvcc_plan, db, InProcessRunner(torch.device("cpu")))
    assert first_calls(nvcc_plan.signatures, again) == []
    assert CompileAhead.start(nvcc_plan.signatures, again, [lambda: InProcessRunner(torch.device("cpu"))]) is None


def test_tune_builds_ahead_on_a_second_worker(tmp_path):
    """Through the CLI, with worker processes: the summary names the builds, the PerfDB holds them,
    and the module was built once, by whichever worker came first. An Inductor kernel is not
    warmed ahead on CPU, where that process would take the cores the eager timings read."""
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    args = ["tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32", "--kernels", "built.*,compile.rms_norm,imported.*",
            "--plugin", "tests.nvcc_kernels", "--trials", "0", "--no-probe", "--validate", "0",
            "--out", str(tmp_path / "out"), "--json"]
    began, began_cpu = time.perf_counter(), time.process_time()
    result = CliRunner().invoke(cli, args)
    spent, spent_cpu = time.perf_counter() - began, time.process_time() - began_cpu
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    phases = summary["phases"]
    assert (list(phases)[0], list(phases)[-1]) == ("start_s", "write_s")
    assert sum(phases.values()) == pytest.approx(spent, abs=1.0), "every second of the command is in a phase"
    assert summary["wall_s"] <= sum(phases.values()) and min(phases["start_s"], phases["write_s"]) >= 0
    parent_cpu = summary["parent_cpu_s"]  # this process's CPU seconds (the command ran in it), phase by phase
    assert list(parent_cpu) == list(phases) and sum(parent_cpu.values()) == pytest.approx(spent_cpu, abs=1.0)
    assert {c["kernel_id"] for c in summary["compiled_ahead"]} == {"built.rms_norm", "imported.rms_norm"}, \
        "the builders' and the primer's first calls (and no Inductor warmer on CPU)"
    assert all(c["status"] == "ok" for c in summary["compiled_ahead"])
    db = PerfDB(tmp_path / "out" / "perfdb")
    phases = {r["phase"] for r in db.rows("SELECT DISTINCT phase FROM records WHERE kernel_id = 'built.rms_norm'")}
    assert phases == {"compile", "grid"}
    assert (tmp_path / "out" / ".jit-work" / "flashinfer" / "builds.log").read_text().count("\n") == 1
    imports = (tmp_path / "out" / ".jit-work" / "triton" / "slow_library" / "imports.log").read_text().split()
    assert len(imports) == len(set(imports)) >= 2, "the primer and the measuring worker, each its own process"
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and json.loads(again.stdout)["compiled_ahead"] == [], "built once per out folder"
