"""Crash isolation: every kind of misbehaving candidate becomes a Reason while the run completes."""
import dataclasses
import os
import threading

import pytest
import torch

from lzsolve.measure.tuner import Session, make_plan, tune
from lzsolve.measure.worker import WorkerRunner, close_all, own_device
from lzsolve.models.capture import capture
from lzsolve.store.perfdb import PerfDB

from .test_cli import TINY_LLAMA

EXPECTED = {
    "fault.raise": "RAISED",
    "fault.nan": "PARITY_FAILED",
    "fault.wrong": "PARITY_FAILED",
    "fault.hang": "TIMEOUT",
    "fault.segfault": "CRASHED",
    "fault.exit": "CRASHED",
    "fault.oom": "OOM",
    "fault.oom_killed": "OOM",
    "fault.crash_later": "CRASHED",  # passes parity, dies during interleaved timing
}


def run_faults(device: str, tmp_path, expected: dict, mode: str = "eager"):
    import tests.faulty_kernels  # noqa: F401  (registers fault.* here too, for the plan)
    model = capture(TINY_LLAMA, "tiny", dtype="fp32")
    plan = make_plan(model, "fp32", torch.device(device), "tiny", only=("fault.*",))
    # one grid point per signature keeps this quick; every op still runs its fallback
    plan = dataclasses.replace(plan, signatures=tuple(dataclasses.replace(sp, workloads=sp.workloads[:1])
                                                      for sp in plan.signatures))
    db = PerfDB(tmp_path / "perfdb")
    runner = WorkerRunner(torch.device(device), plugins=("tests.faulty_kernels",), timeout_s=6)
    try:
        records = tune(plan, Session(plan, db, runner), mode)
    finally:
        runner.close()
    by_kernel = {r["kernel_id"]: r for r in records if r["op"] == "norm.rms"}
    for kernel_id, code in expected.items():
        assert by_kernel[kernel_id]["status"] == "rejected"
        assert by_kernel[kernel_id]["reason_code"] == code, by_kernel[kernel_id]["reason_message"]
    assert by_kernel["fault.crash_later"]["stage"] == "bench" and by_kernel["fault.crash_later"]["rel_l2"] is not None
    assert by_kernel["eager.rms_norm"]["status"] == "ok", "the fallback is measured between the crashes"
    assert by_kernel["torch.rms_norm"]["reason_code"] == "EXCLUDED"
    stored = db.rows("SELECT count(*) AS n, count(*) FILTER (WHERE status = 'ok') AS ok FROM records")[0]
    assert stored["n"] == len(records) == sum(len(sp.candidates) for sp in plan.signatures)
    assert stored["ok"] >= len(plan.signatures), "every op's fallback was measured despite the crashes"
    assert runner.restarts >= 4
    return by_kernel


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="POSIX scheduling priorities")
def test_a_niced_worker_runs_at_a_lower_priority():
    """The compile-ahead builders run niced (cli: BUILDER_NICE), so their nvcc jobs, which inherit
    it, take the cores the measuring workers leave."""
    runner = WorkerRunner(torch.device("cpu"), nice=5)
    plain = WorkerRunner(torch.device("cpu"))
    try:
        runner._start()
        plain._start()
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, runner._proc.pid) == min(mine + 5, 19)
        assert os.getpriority(os.PRIO_PROCESS, plain._proc.pid) == mine
    finally:
        runner.close()
        plain.close()


def test_workers_share_one_bytecode_cache_where_torch_has_none(tmp_path, monkeypatch):
    """Where torch's modules have no bytecode (read-only images, PYTHONDONTWRITEBYTECODE), each
    worker compiled them again; now the run's workers write and read one cache in its folder."""
    from lzsolve.measure import worker
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv("LZSOLVE_BYTECODE", raising=False)
    (tmp_path / "there.pyc").write_bytes(b"")
    monkeypatch.setattr(worker.importlib.util, "cache_from_source", lambda path: str(tmp_path / "there.pyc"))
    assert not worker.share_bytecode(tmp_path / "unused"), "where the bytecode is there, nothing changes"
    assert "PYTHONPYCACHEPREFIX" not in os.environ and not (tmp_path / "unused").exists()
    monkeypatch.setattr(worker.importlib.util, "cache_from_source", lambda path: str(tmp_path / "missing.pyc"))
    folder = tmp_path / "bytecode"
    assert worker.share_bytecode(folder)
    assert os.environ["PYTHONPYCACHEPREFIX"] == str(folder.resolve()) and "PYTHONDONTWRITEBYTECODE" not in os.environ
    runner = WorkerRunner(torch.device("cpu"))
    try:
        runner._start()  # the worker's own imports
    finally:
        runner.close()
    assert any(folder.rglob("*.pyc")), "the worker wrote its bytecode to the shared cache"
    assert not worker.share_bytecode(tmp_path / "other"), "a cache the user (here: the run) chose is kept"


def test_a_worker_started_ahead_takes_the_environment_the_run_sets_after(tmp_path, monkeypatch):
    """prestart: the worker process starts before the run has set its environment (the JIT caches'
    folders and the shared bytecode, which need the out folder the plan names); its first task
    brings the changes, so what it compiles and the bytecode it writes go where the run's do."""
    from lzsolve.measure import worker
    from lzsolve.measure.tasks import ParityTask
    from runtime_loader import jit
    from runtime_loader.ops import Signature
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    for variable in (*jit.JIT_CACHES.values(), "PYTHONPYCACHEPREFIX", "LZSOLVE_BYTECODE"):
        monkeypatch.setenv(variable, "")  # recorded, so that the undo restores them
        monkeypatch.delenv(variable)
    runner = WorkerRunner(torch.device("cpu"), plugins=("tests.nvcc_kernels",))
    runner.prestart()
    try:
        jit.point_caches(tmp_path / "jit")  # as tune does, once the plan has named the out folder
        monkeypatch.setattr(worker.importlib.util, "cache_from_source", lambda path: str(tmp_path / "missing.pyc"))
        assert worker.share_bytecode(tmp_path / "bytecode")
        sig = Signature.make("norm.rms", {"hidden": 64}, [], "fp32")
        result = runner.run(ParityTask(sig, "imported.rms_norm", {"tokens": 4}, 1))  # imports tests.slow_library
        pid = runner._proc.pid
    finally:
        runner.close()
    assert result.get("reason_code") is None, result
    assert (tmp_path / "jit" / "triton" / "slow_library" / "imports.log").read_text().split() == [str(pid)], \
        "the library compiled into the run's Triton cache"
    assert list((tmp_path / "bytecode").rglob("slow_library*.pyc")), "and its bytecode went to the run's shared cache"


def test_a_worker_started_ahead_and_never_used_is_stopped_at_once():
    """A tune that ends before its first measurement (bad input found while planning) leaves no
    worker behind, not even one still importing."""
    runner = WorkerRunner(torch.device("cpu"))
    runner.prestart()
    process = runner._proc
    runner.close(wait=False)
    process.join(timeout=10)
    assert process.exitcode is not None, "stopped, not left to finish its start"


def test_workers_are_closed_at_once():
    """A worker's exit takes seconds (CUDA teardown): closed one after another, a run on more
    devices waited longer. Each close here passes only when all three are in close() together."""
    together = threading.Barrier(3, timeout=10)
    closed = []

    class Slow:
        def close(self, wait=True):
            together.wait()
            closed.append(self)

    runners = [Slow() for _ in range(3)]
    close_all(runners)
    assert sorted(map(id, closed)) == sorted(map(id, runners))


def test_a_worker_told_to_leave_is_not_waited_for():
    """close(wait=False), at the end of a tune: the worker's exit (its CUDA teardown) goes on beside
    the solve and the write, and it leaves by itself."""
    runner = WorkerRunner(torch.device("cpu"))
    runner._start()
    process = runner._proc
    runner.close(wait=False)
    assert runner._proc is None, "the runner is done with it"
    process.join(timeout=30)
    assert process.exitcode == 0, "it left on its own, cleanly"
    runner.close()  # closing again is harmless


@pytest.mark.parametrize("device, visible, expected", [
    ("cuda:1", None, ("cuda:0", "1")),
    ("cuda:0", None, ("cuda:0", "0")),
    ("cuda:1", "2,3", ("cuda:0", "3")),  # the n-th of the devices this process was given
    ("cuda:0", "GPU-a1, GPU-b2", ("cuda:0", "GPU-a1")),
    ("cpu", "0,1", ("cpu", None)),
])
def test_a_gpu_worker_sees_its_gpu_alone_as_cuda0(device, visible, expected):
    """So that what Inductor compiled for one device's worker is found in the cache by the others."""
    assert own_device(device, visible) == expected


def test_faults_on_cpu(tmp_path):
    by_kernel = run_faults("cpu", tmp_path, {**EXPECTED, "fault.device_assert": "RAISED"})
    assert "SIGSEGV" in by_kernel["fault.segfault"]["reason_message"]
    assert by_kernel["fault.graph_unsafe"]["status"] == "ok", "host syncs are fine without CUDA graphs"


@pytest.mark.gpu
def test_faults_on_cuda(tmp_path):
    """In graph mode (a tune times its table's mode alone): a kernel whose capture fails is recorded
    with the capture's error, no graph time, and the worker replaced after it."""
    by_kernel = run_faults("cuda", tmp_path, {**EXPECTED, "fault.device_assert": "CRASHED"}, mode="graph")
    assert "CUDA context lost" in by_kernel["fault.device_assert"]["reason_message"]
    unsafe = by_kernel["fault.graph_unsafe"]
    assert unsafe["status"] == "ok" and unsafe["graph_safe"] is False and unsafe.get("graph_ms") is None
    assert unsafe["graph_error"] and unsafe.get("eager_ms") is None, "graph mode alone"
