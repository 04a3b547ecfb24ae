"""Tuning on several devices of one host: parsing and refusing --devices, the scheduler (largest
first, a workload never split, an error stops the others after their in-flight unit), records
tagged with their device, and older PerfDBs (without device_index) still readable."""
import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import lzsolve.measure.devices as devices
from lzsolve.cli import cli
from lzsolve.decide.validate import plan_validation, validate
from lzsolve.errors import LzError
from lzsolve.measure.tasks import CeilingTask, ParityTask
from lzsolve.measure.tuner import Session, make_plan, tune
from lzsolve.models.capture import capture
from lzsolve.store.perfdb import SCHEMA, PerfDB
from tests.tables import QUICK
from tests.test_cli import TINY_LLAMA, run_cli


@pytest.mark.parametrize("text,message", [
    ("tpu:0", "not a device"),
    ("cuda", "name each GPU with its index"),
    ("cpu,cuda:0", "one kind of device"),
    (",", "no device named"),
])
def test_bad_device_lists_are_refused(text, message):
    with pytest.raises(LzError, match=message):
        devices.parse_devices(text)


def test_cpu_lanes_for_testing():
    assert devices.parse_devices("cpu, cpu") == [torch.device("cpu")] * 2


def test_devices_of_different_models_are_refused_naming_them():
    names = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA A100-SXM4-80GB"}
    with pytest.raises(LzError, match=r"cuda:0 \(NVIDIA H100 80GB HBM3\), cuda:1 \(NVIDIA A100-SXM4-80GB\)"):
        devices.check_same_model([torch.device("cuda", 0), torch.device("cuda", 1)], lambda d: names[d.index])
    devices.check_same_model([torch.device("cuda", 0), torch.device("cuda", 1)], lambda d: "NVIDIA H100")


def test_every_unit_runs_once_largest_first_on_the_next_free_lane():
    taken = []

    def work(lane, unit):
        taken.append((lane, unit))
        time.sleep(0.01 * unit)
        return [unit]

    done = devices.run_sharded([8, 7, 3, 2, 1], ["a", "b"], work)
    assert sorted(done) == [1, 2, 3, 7, 8]
    assert [u for _, u in sorted(taken, key=lambda t: t[1], reverse=True)][:2] == [8, 7]
    assert {lane for lane, _ in taken} == {"a", "b"}, "both lanes worked"


def test_a_lane_stays_on_the_groups_it_started_then_takes_any():
    """With `group`, a lane takes the next unit of a group it has worked on (its worker made those
    kernels' first calls), and any other once its groups are done; `warm` carries that over calls."""
    taken = {"a": [], "b": []}

    def work(lane, unit):
        taken[lane].append(unit)
        time.sleep(0.05 if unit[0] == "short" else 0.1)
        return [unit]

    units = [("long", 0), ("short", 0), ("long", 1), ("long", 2), ("long", 3), ("short", 1)]
    warm = [set(), set()]
    done = devices.run_sharded(units, ["a", "b"], work, group=lambda unit: unit[0], warm=warm)
    assert sorted(done) == sorted(units)
    by_group = {lane: [g for g, _ in got] for lane, got in taken.items()}
    # the lane that started on "short" finishes it, then helps with "long"; the other never leaves "long"
    short_lane = next(lane for lane, groups in by_group.items() if groups[0] == "short")
    long_lane = "b" if short_lane == "a" else "a"
    assert by_group[short_lane][:2] == ["short", "short"], "its own group first, though longer units were queued"
    assert set(by_group[long_lane]) == {"long"}
    assert warm[["a", "b"].index(long_lane)] == {"long"} and warm[["a", "b"].index(short_lane)] == {"short", "long"}
    taken = {"a": [], "b": []}
    devices.run_sharded([("other", 0), ("short", 2)], ["a", "b"], work, group=lambda unit: unit[0],
                        warm=[{"short"}, set()])
    assert taken["a"][0] == ("short", 2), "a warm group from an earlier call is taken first"


def test_a_lane_with_nothing_left_to_begin_joins_a_unit_in_flight():
    """With `joinable`, a lane whose queue is empty takes parts of a unit another lane works on,
    every part done once; a unit without parts left is not joined."""
    parts = {"long": list(range(8)), "short": [0]}
    done_by = {"a": [], "b": []}
    lock = threading.Lock()

    def work(lane, unit):
        while True:
            with lock:
                if not parts[unit]:
                    return [unit]
                part = parts[unit].pop(0)
            time.sleep(0.02)
            done_by[lane].append((unit, part))

    done = devices.run_sharded(["long", "short"], ["a", "b"], work, joinable=lambda unit: bool(parts[unit]))
    assert sorted(done_by["a"] + done_by["b"]) == [("long", n) for n in range(8)] + [("short", 0)]
    assert all(any(unit == "long" for unit, _ in got) for got in done_by.values()), "both lanes worked on the long unit"
    assert sorted(done) == ["long", "long", "short"], "each lane's part of a unit is a result of its own"
    done_by = {"a": [], "b": []}
    parts = {"long": list(range(8)), "short": [0]}
    devices.run_sharded(["long", "short"], ["a", "b"], work)
    assert len({lane for lane, got in done_by.items() for unit, _ in got if unit == "long"}) == 1, \
        "without joinable a unit stays with the lane that took it"


def test_an_error_in_one_lane_stops_the_others_after_their_unit():
    started, finished = [], []
    gate = threading.Event()

    def work(lane, unit):
        started.append(unit)
        if unit == "boom":
            gate.wait(1)
            raise RuntimeError("worker lost")
        gate.set()
        time.sleep(0.05)
        finished.append(unit)
        return [unit]

    with pytest.raises(RuntimeError, match="worker lost"):
        devices.run_sharded(["boom", "slow", "never", "never2"], ["a", "b"], work)
    assert "slow" in finished, "the in-flight unit of the other lane completes"
    assert len(started) < 4, "no unit is taken after the error"


class LaneRunner:
    """Admits every kernel and times it at 1 ms, remembering which device ran what (taking `delay`
    seconds over each task, so that one lane cannot drain the queue before the other starts)."""

    def __init__(self, device: str, delay: float = 0.0):
        self.device, self.timer, self.restarts, self.seen, self.delay = torch.device(device), "fake", 0, [], delay

    def run(self, task):
        self.seen.append(task)
        time.sleep(self.delay)
        if isinstance(task, ParityTask):
            return {"stage": "parity"}
        if isinstance(task, CeilingTask):
            return {"ceilings": []}
        host = {"host_ms": 1.0} if "eager" in task.modes else {}  # as tasks.timing_fields reports an eager timing
        return {"per_kernel": {k: {"stage": "bench", **{f"{m}_ms": 1.0 for m in task.modes}, **host}
                              for k in task.kernel_ids}}


def test_records_are_tagged_with_their_device_and_a_workload_stays_on_one(tmp_path):
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    plan = make_plan(model, "fp32", torch.device("cpu"), "tiny")
    one = tune(plan, Session(plan, PerfDB(tmp_path / "one"), LaneRunner("cpu"), reuse=False), "eager")
    lanes = LaneRunner("cpu"), LaneRunner("cpu")
    two = tune(plan, Session(plan, PerfDB(tmp_path / "two"), lanes[0], reuse=False, more=(lanes[1],)), "eager")
    assert len(two) == len(one) and {r["device_index"] for r in one} == {0}
    assert all(lane.seen for lane in lanes), "both devices measured"
    measured = [r for r in two if r["stage"] != "capability"]
    assert {r["device_index"] for r in measured} == {0, 1}
    per_workload = {}
    for r in measured:
        per_workload.setdefault((r["signature"], r["dims"]), set()).add(r["device_index"])
    assert all(len(d) == 1 for d in per_workload.values()), "a workload's candidates never split"
    stored = PerfDB(tmp_path / "two").rows("SELECT device_index, count(*) AS n FROM records GROUP BY 1")
    assert {r["device_index"] for r in stored} >= {0, 1}


def test_validation_shares_out_its_signatures_whole_over_the_devices(tmp_path):
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    plan = make_plan(model, "fp32", torch.device("cpu"), "tiny", only=("torch.*",))
    lanes = LaneRunner("cpu", 0.002), LaneRunner("cpu", 0.002)
    session = Session(plan, PerfDB(tmp_path / "perfdb"), lanes[0], reuse=False, more=(lanes[1],))
    records = tune(plan, session, "eager")
    planned = plan_validation(plan, records, "eager", shapes=2)
    assert len(planned) >= 2
    before = [len(lane.seen) for lane in lanes]
    checked, summaries = validate(session, planned, records, "eager")
    assert all(len(lane.seen) > n for lane, n in zip(lanes, before)), "both devices validated"
    assert list(summaries) == [str(p.signature.instance.signature) for p in planned], "in the plan's order"
    where = {}
    for r in checked:  # (a validation shape that is a grid bucket reuses the grid's record, from either device)
        if r["phase"] == "validation" and r["stage"] != "capability":
            where.setdefault(r["signature"], set()).add(r["device_index"])
    assert all(len(d) == 1 for d in where.values()), "a signature's rounds stay on one device"
    assert {d for ds in where.values() for d in ds} == {0, 1}


def test_devices_start_on_different_signatures_then_take_the_largest_workloads():
    """Every signature's largest workload first (its kernels' first calls compile: on different
    devices at once), then the rest largest first."""
    from lzsolve.measure.tuner import first_calls_apart, workload_size
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    plan = make_plan(model, "fp32", torch.device("cpu"), "tiny", only=("torch.*",))
    units = [(sp, [(dims, sp.candidates)]) for sp in plan.signatures for dims in sp.workloads]
    order = first_calls_apart(units)
    signatures = [str(sp.instance.signature) for sp, _ in order]
    n = len(plan.signatures)
    assert len(order) == len(units) > n and len(set(signatures[:n])) == n, "one workload of each signature first"
    for part in (order[:n], order[n:]):
        sizes = [workload_size(u) for u in part]
        assert sizes == sorted(sizes, reverse=True)
    for sp in plan.signatures:  # and that one is the signature's largest
        mine = [u for u in units if u[0] is sp]
        assert workload_size(next(u for u in order if u[0] is sp)) == max(map(workload_size, mine))


def test_a_perfdb_from_before_device_index_stays_readable(tmp_path):
    db = PerfDB(tmp_path / "perfdb")
    old_schema = pa.schema([f for f in SCHEMA if f.name != "device_index"])
    old = {name: None for name in old_schema.names} | {"kernel_id": "old", "run_id": "r0"}
    (tmp_path / "perfdb").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist([old], schema=old_schema), tmp_path / "perfdb" / "part-r0-00000.parquet")
    db.append([{"kernel_id": "new", "run_id": "r1", "device_index": 1}], "r1")
    rows = db.rows("SELECT kernel_id, device_index FROM records ORDER BY kernel_id")
    assert rows == [{"kernel_id": "new", "device_index": 1}, {"kernel_id": "old", "device_index": None}]


def run_tune(tmp_path, *extra):
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    return CliRunner().invoke(cli, ["tune", "--config", str(config), "--grid", "tiny", "--dtype", "fp32", "--no-isolate",
                                    "--no-probe", "--validate", "0", "--out", str(tmp_path / "out"), *QUICK, *extra])


def test_tune_on_two_lanes_solves_one_table_from_both(tmp_path):
    result = run_tune(tmp_path, "--devices", "cpu,cpu", "--kernels", "torch.*")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "dispatch.json").is_file()
    rows = PerfDB(tmp_path / "out" / "perfdb").rows("SELECT DISTINCT device_index FROM records WHERE stage <> 'capability'")
    assert {r["device_index"] for r in rows} == {0, 1}


def test_tune_refuses_devices_of_different_models(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "parse_devices", lambda text: [torch.device("cuda", 0), torch.device("cuda", 1)])
    monkeypatch.setattr(devices, "device_name", lambda d: f"GPU model {d.index}")
    result = run_tune(tmp_path, "--devices", "cuda:0,cuda:1")
    assert isinstance(result.exception, LzError), "main() prints an LzError as one line and exits 2"
    assert "must be the same model" in str(result.exception) and "cuda:1 (GPU model 1)" in str(result.exception)
    assert not (tmp_path / "out").exists(), "refused before anything is measured or written"


def test_a_bad_device_list_is_one_line_and_exit_2(tmp_path):
    result = run_cli("tune", "--model", "llama3-8b", "--devices", "cuda", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "name each GPU with its index" in result.stderr and "Traceback" not in result.stderr


def test_a_rerun_measures_only_the_kernels_whose_version_changed(tmp_path, monkeypatch):
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    plan = make_plan(model, "fp32", torch.device("cpu"), "tiny", only=("torch.*",))
    db = PerfDB(tmp_path / "perfdb")
    first = tune(plan, Session(plan, db, LaneRunner("cpu")), "eager")
    session = Session(plan, db, LaneRunner("cpu"))
    assert session.changes(plan) == ([], [])
    upgraded = next(c.spec for c in plan.signatures[0].candidates if c.admitted and not c.spec.kernel_id.startswith("eager."))
    real_version = type(upgraded).version
    monkeypatch.setattr(type(upgraded), "version", lambda spec, real=real_version: "99.0" if spec is upgraded
                        else real(spec))
    session = Session(plan, db, LaneRunner("cpu"))
    assert session.changes(plan) == ([upgraded.kernel_id], [])
    again = tune(plan, session, "eager")
    fresh = [r for r in again if r["run_id"] == session.run_id and r["stage"] != "capability"]
    assert fresh and {r["kernel_id"] for r in fresh} == {upgraded.kernel_id}
    assert len(again) == len(first)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_runner_for_the_second_gpu_checks_and_times_there():
    """Triton launches, and CUDA events and graphs record, on the current device: a runner for
    cuda:1 must make it current, or its kernels fault on cuda:1's tensors and its timings are
    device 0's stream."""
    from lzsolve.measure.tasks import TimingTask
    from lzsolve.measure.worker import InProcessRunner
    from runtime_loader.ops import Signature

    sig = Signature.make("norm.rms", {"hidden": 4096}, (), "bf16")
    runner = InProcessRunner(torch.device("cuda", 1))
    for kernel in ("triton.rms_norm", "eager.rms_norm"):
        assert not runner.run(ParityTask(sig, kernel, {"tokens": 64}, 0)).get("reason_code"), kernel
    timed = runner.run(TimingTask(sig, ("triton.rms_norm", "eager.rms_norm"), {"tokens": 64}, 1))["per_kernel"]
    assert all(timed[k]["graph_ms"] > 0 and timed[k]["eager_ms"] > 0 for k in timed), timed
    assert torch.cuda.current_device() == 0, "the caller's current device is left as it was"
