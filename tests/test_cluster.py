"""Tuning on a Ray cluster (--ray): the same records as a one-host tune, an actor that dies costs
only its task in flight (records already returned are kept), nodes of other hardware are refused,
and without Ray installed --ray is one line and exit 2. The Ray tests share one local instance
(2 CPUs, no dashboard), shut down at the end of the module."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lzsolve.errors import LzError
from lzsolve.measure import cluster
from lzsolve.measure.tasks import ParityTask, TimingTask
from lzsolve.measure.tuner import make_plan
from lzsolve.models.capture import capture
from lzsolve.store.perfdb import PerfDB
from tests.test_cli import TINY_LLAMA
from tests.test_devices import run_tune

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(180)  # a Ray instance that hangs must not hang CI


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    # the actors import lzsolve and the tests' plugins from this checkout, as the driver does
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def perfdb(tmp_path, name: str) -> PerfDB:
    return PerfDB(tmp_path / name / "out" / "perfdb")


def tune_in(tmp_path, name: str, *extra):
    (tmp_path / name).mkdir()
    result = run_tune(tmp_path / name, "--trials", "0", *extra)
    assert result.exit_code == 0, result.output
    return result


def test_a_ray_tune_writes_the_records_of_a_one_host_tune(tmp_path, ray_local):
    tune_in(tmp_path, "plain", "--kernels", "torch.*")
    tune_in(tmp_path, "ray", "--kernels", "torch.*", "--ray", "local")
    query = "SELECT signature, count(*) AS n FROM records GROUP BY 1 ORDER BY 1"
    plain, ray = perfdb(tmp_path, "plain").rows(query), perfdb(tmp_path, "ray").rows(query)
    assert plain and ray == plain, "the same op signatures, each with as many records"
    assert (tmp_path / "ray" / "out" / "dispatch.json").is_file()
    lanes = perfdb(tmp_path, "ray").rows("SELECT DISTINCT device_index FROM records WHERE stage <> 'capability'")
    assert {r["device_index"] for r in lanes} == {0, 1}, "both actors measured"


def test_an_actor_that_dies_costs_only_its_task_and_the_run_finishes(tmp_path, ray_local):
    """fault.exit ends its process at parity: with --no-isolate that is the actor itself, mid-workload."""
    import tests.faulty_kernels  # noqa: F401  (registers fault.* here too, for the plan)
    result = tune_in(tmp_path, "fault", "--kernels", "torch.*,fault.exit", "--plugin", "tests.faulty_kernels",
                     "--ray", "local", "--json")
    summary = json.loads(result.stdout)
    plan = make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny",
                     only=("torch.*", "fault.exit"))
    rms = next(sp for sp in plan.signatures if sp.instance.signature.op == "norm.rms")
    assert summary["worker_restarts"] == len(rms.workloads), "one new actor after each crash"
    rows = perfdb(tmp_path, "fault").rows("SELECT signature, kernel_id, dims, stage, status, reason_code FROM records")
    keys = {(r["signature"], r["kernel_id"], r["dims"]) for r in rows}
    assert len(keys) == len(rows) == sum(len(sp.workloads) * len(sp.candidates) for sp in plan.signatures), \
        "every (workload, candidate) has its record, those returned before and after each crash included"
    crashed = [r for r in rows if r["reason_code"] == "CRASHED"]
    assert {r["kernel_id"] for r in crashed} == {"fault.exit"} and len(crashed) == len(rms.workloads)
    measured = [r for r in rows if r["signature"] == str(rms.instance.signature) and r["stage"] != "capability"]
    assert len(measured) == 3 * len(rms.workloads) and all(r["status"] == "ok" for r in measured
                                                           if r["kernel_id"] != "fault.exit"), \
        "the other kernels of the crashed workloads (torch.rms_norm, the fallback) were measured"


@pytest.mark.parametrize("isolate", [False, True])
def test_an_actor_measures_with_the_drivers_sampling_budget(isolate):
    """tune --sample-time on a cluster: the budget travels with the actor's arguments (the actor's
    body, run here without Ray)."""
    from lzsolve.measure.harness import Budget
    measurer = cluster.Measurer("cpu", isolate, (), 60, {}, Budget().sampling(0.02))
    assert measurer.runner.budget == Budget().sampling(0.02)


def test_a_killed_actor_rejects_its_task_and_the_next_starts_a_new_one(ray_local):
    import tests.faulty_kernels  # noqa: F401
    plan = make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny")
    sp = next(sp for sp in plan.signatures if sp.instance.signature.op == "norm.rms")
    sig, dims = sp.instance.signature, sp.workloads[0]
    [runner] = cluster.Cluster("local").runners(1, False, ("tests.faulty_kernels",), 60, plan.hardware)
    try:
        actor = runner._actor
        threading.Timer(2, ray_local.kill, (actor,)).start()  # while it sleeps in fault.hang
        started = time.monotonic()
        outcome = runner.run(ParityTask(sig, "fault.hang", dims, 0))
        assert outcome["reason_code"] == "CRASHED" and time.monotonic() - started < 60
        assert runner.restarts == 1
        timing = runner.run(TimingTask(sig, ("torch.rms_norm",), dims, 0, ("eager",)))
        assert runner._actor is not actor and timing["per_kernel"]["torch.rms_norm"]["eager_ms"] > 0
    finally:
        runner.close()


def test_nodes_of_other_hardware_are_refused_naming_them():
    here = {"device": "cuda", "name": "NVIDIA H100 80GB HBM3", "sm": 90, "cuda": "12.8", "torch": "2.9.0"}
    other = {**here, "name": "NVIDIA A100-SXM4-80GB", "sm": 80}
    cluster.check_same_hardware(here, [("10.0.0.1", here), ("10.0.0.2", here)])
    with pytest.raises(LzError, match=r"10\.0\.0\.2 \(NVIDIA A100-SXM4-80GB, sm80, cuda 12\.8, torch 2\.9\.0: sm/name differ\)") as e:
        cluster.check_same_hardware(here, [("10.0.0.1", here), ("10.0.0.2", other)])
    assert "10.0.0.1" not in str(e.value) and "\n" not in str(e.value)


def test_without_ray_installed_ray_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    result = subprocess.run([sys.executable, "-c", "import sys; sys.modules['ray'] = None; "
                             "from lzsolve.cli import main; main()", "tune", "--config", str(config), "--ray", "local"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --ray needs Ray, which is not installed here: pip install -e '.[ray]' in the lzsolve clone, "
        "or pip install 'ray>=2.9'")
    assert "Traceback" not in result.stderr and not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("args,message", [
    (("--ray", "local", "--devices", "cpu,cpu"), "leave out --devices and --device"),
    (("--ray-workers", "2",), "--ray-workers applies to --ray only"),
])
def test_bad_ray_options_are_refused(tmp_path, args, message):
    result = run_tune(tmp_path, *args)
    assert isinstance(result.exception, LzError) and message in str(result.exception), result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address,message", [("127.0.0.1:1", "no Ray head answers there"), ("head", "not HOST:PORT")])
def test_an_address_where_no_head_listens_is_refused_at_once(address, message):
    started = time.monotonic()
    with pytest.raises(LzError, match=message):
        cluster._check_reachable(address)
    assert time.monotonic() - started < 15, "not Ray's minutes of waiting"
