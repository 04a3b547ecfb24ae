"""One measurement task: parity, rotation sets, environment, bounded re-measure when throttled."""
import pytest
import torch

from lzsolve.measure.env import SW_POWER_CAP, EnvReading, Sensor
from lzsolve.measure.harness import Budget, CpuHarness
from lzsolve.measure.tasks import ParityTask, TimingTask, run_task
from runtime_loader.ops import Signature

SIG = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
CPU = torch.device("cpu")


class CountingHarness(CpuHarness):
    def __init__(self):
        super().__init__(Budget(warmup_s=0.0, min_samples=3, max_samples=3))
        self.measured = 0
        self.sets = None

    def measure(self, candidates, modes=("eager", "graph")):
        self.measured += 1
        self.sets = {len(calls) for calls in candidates.values()}
        return super().measure(candidates, modes)


class ScriptedSensor(Sensor):
    def __init__(self, masks):
        super().__init__()
        self.masks = iter(masks)

    def read(self):
        return EnvReading(temp_c=50.0, throttle_reasons=next(self.masks))


def timing(kernels, sensor=None, harness=None, sig=SIG):
    return run_task(TimingTask(sig, tuple(kernels), {"tokens": 4}, seed=1), CPU, harness or CountingHarness(),
                    sensor or Sensor())["per_kernel"]


def test_parity_task():
    out = run_task(ParityTask(SIG, "torch.rms_norm", {"tokens": 4}, seed=1), CPU, CountingHarness(), Sensor())
    assert out["stage"] == "parity" and "reason_code" not in out and out["jit_ms"] > 0 and "rel_l2" in out
    import tests.faulty_kernels  # noqa: F401
    out = run_task(ParityTask(SIG, "fault.wrong", {"tokens": 4}, seed=1), CPU, CountingHarness(), Sensor())
    assert out["stage"] == "parity" and out["reason_code"] == "PARITY_FAILED"


def test_parity_task_records_the_setup_an_adapter_reports(monkeypatch):
    """A planned kernel (FlashInfer's decode) reports its one-time plan cost apart from jit_ms."""
    import dataclasses

    from runtime_loader import registry
    seen = []

    def setup_ms(x, weight, eps):
        seen.append(tuple(x.shape))
        return 1.5
    spec = dataclasses.replace(registry.get("torch.rms_norm"), kernel_id="test.planned", setup_ms=setup_ms)
    monkeypatch.setitem(registry.REGISTRY, "test.planned", spec)
    out = run_task(ParityTask(SIG, "test.planned", {"tokens": 4}, seed=1), CPU, CountingHarness(), Sensor())
    assert out["setup_ms"] == 1.5 and seen == [(4, 64)], "asked once, for the layout the kernel ran on"
    plain = run_task(ParityTask(SIG, "torch.rms_norm", {"tokens": 4}, seed=1), CPU, CountingHarness(), Sensor())
    assert "setup_ms" not in plain


def test_timing_task_record_fields():
    harness = CountingHarness()
    out = timing(["torch.rms_norm", "eager.rms_norm"], harness=harness)
    assert harness.measured == 1, "both kernels timed in one interleaved measurement"
    for fields in out.values():
        assert fields["stage"] == "bench" and "reason_code" not in fields
        assert fields["eager_ms"] > 0 and fields["eager_samples"] == 3
        assert fields["rotation_sets"] == 32, "tiny inputs rotate over the maximum number of sets"
        assert "graph_ms" not in fields and fields["temp_c"] is None
    assert harness.sets == {32}


def test_cpu_kernels_count_at_their_slower_placement(monkeypatch):
    """On CPU a workload is timed in two rounds, each on inputs allocated anew (earlier ones kept, so
    they lie elsewhere); a kernel that is fast on one placement and slow on the other counts as slow."""
    import dataclasses
    import time

    from runtime_loader import registry
    seen: dict[int, set] = {1: set(), 2: set()}

    class Rounds(CpuHarness):
        round = 0

        def measure(self, candidates, modes=("eager", "graph")):
            self.round += 1
            return super().measure(candidates, modes)

    harness = Rounds(Budget(warmup_s=0.0, min_samples=3, max_samples=3), placements=2)

    def placed(x, weight, eps):
        seen[harness.round].add(x.data_ptr())
        time.sleep(0.004 if harness.round == 2 else 0.001)
        return registry.get("torch.rms_norm").impl(x, weight, eps)
    monkeypatch.setitem(registry.REGISTRY, "test.placed",
                        dataclasses.replace(registry.get("torch.rms_norm"), kernel_id="test.placed", impl=placed))
    out = timing(["test.placed", "torch.rms_norm"], harness=harness)
    assert harness.round == 2 and seen[1] and seen[2] and not seen[1] & seen[2], "new inputs, new addresses"
    slow = out["test.placed"]
    assert slow["eager_ms"] > 3.5, "the slower round counts"
    assert slow["eager_samples"] == 6 and out["torch.rms_norm"]["eager_ms"] < 1


def test_throttled_measurement_is_retried_once_then_marked():
    harness = CountingHarness()
    out = timing(["torch.rms_norm"], ScriptedSensor([SW_POWER_CAP, 0, 0, 0]), harness)
    assert harness.measured == 2 and out["torch.rms_norm"]["throttled"] is False
    harness = CountingHarness()
    out = timing(["torch.rms_norm"], ScriptedSensor([SW_POWER_CAP] * 4), harness)
    assert harness.measured == 2 and out["torch.rms_norm"]["throttled"] is True
    assert out["torch.rms_norm"]["throttle_reasons"] == "sw_power_cap"


def test_a_kernel_failing_during_timing_gets_its_own_reason():
    import tests.faulty_kernels  # noqa: F401
    out = timing(["torch.rms_norm", "fault.raise"])
    assert out["fault.raise"]["reason_code"] == "RAISED" and out["torch.rms_norm"]["eager_ms"] > 0


def test_the_reference_is_computed_once_per_workload(monkeypatch):
    """The kernels of one workload share its inputs (one seed), so they share one fp32 reference."""
    import dataclasses

    import lzsolve.measure.tasks as measure
    contract = measure.CONTRACTS["norm.rms"]
    calls = []
    counted = dataclasses.replace(contract, reference=lambda *a: calls.append(1) or contract.reference(*a))
    monkeypatch.setitem(measure.CONTRACTS, "norm.rms", counted)
    harness = CountingHarness()
    for kernel in ("torch.rms_norm", "eager.rms_norm"):
        assert "reason_code" not in run_task(ParityTask(SIG, kernel, {"tokens": 4}, seed=7), CPU, harness, Sensor())
    assert len(calls) == 1
    run_task(ParityTask(SIG, "torch.rms_norm", {"tokens": 4}, seed=8), CPU, harness, Sensor())
    assert len(calls) == 2, "new inputs, new reference"


FIRST_COMPILE = """
import json, sys, torch
from lzsolve.measure.harness import CpuHarness
from lzsolve.measure.env import Sensor
from lzsolve.measure.tasks import ParityTask, run_task
from runtime_loader import jit
from runtime_loader.ops import Signature
jit.point_caches(sys.argv[1])
sig = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
out = [run_task(ParityTask(sig, kernel, {"tokens": 4}, seed=1), torch.device("cpu"), CpuHarness(), Sensor())
       for kernel in ("compile.rms_norm", "torch.rms_norm")]
print(json.dumps(out))
"""


def test_a_first_call_that_compiles_records_the_cache_files_it_wrote(tmp_path):
    import json
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-c", FIRST_COMPILE, str(tmp_path / "caches")], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    compiled, plain = json.loads(result.stdout.strip().splitlines()[-1])
    files = json.loads(compiled["jit_files"])
    assert files and all(f.startswith("inductor/") for f in files)
    assert all((tmp_path / "caches" / f).is_file() for f in files)
    assert "jit_files" not in plain, "a kernel without a JIT cache has none"


def test_ceiling_sizes_leave_the_cache_within_free_memory():
    from lzsolve.measure.tasks import ceiling_sizes

    mib, gib = 1 << 20, 1 << 30
    # an H200's 60 MiB L2: 1 GiB a buffer, past 8 x L2 = 480 MiB; unbounded free memory the same
    assert ceiling_sizes("cuda", 60 * mib, 140 * gib) == (8192, gib) == ceiling_sizes("cuda", 60 * mib, None)
    # a (future) 256 MiB L2: 8 x L2 = 2 GiB a buffer
    assert ceiling_sizes("cuda", 256 * mib, 140 * gib)[1] == 2 * gib
    # 2 GiB free: a quarter, 512 MiB, still past 8 x 50 MiB
    assert ceiling_sizes("cuda", 50 * mib, 2 * gib)[1] == 512 * mib
    # a fraction of a MiB rounds down to whole MiB
    assert ceiling_sizes("cuda", 50 * mib, 4 * (600 * mib + 123))[1] == 600 * mib
    # too little free memory for a copy past 8 x L2 (or under 256 MiB): no memory probe at all
    assert ceiling_sizes("cuda", 50 * mib, gib)[1] is None
    assert ceiling_sizes("cuda", 4 * mib, 800 * mib)[1] is None
    # CPU: small, about a second of probing
    assert ceiling_sizes("cpu", 32 * mib, None) == (512, 32 * mib)


class ScriptedHarness(CpuHarness):
    """Median times per probe (ms, by mode), as a harness would measure them."""

    def __init__(self, medians, cache_bytes=32 << 20):
        super().__init__()
        self.medians, self.cache_bytes, self.asked = medians, cache_bytes, None

    def measure(self, candidates, modes=("eager", "graph")):
        from lzsolve.measure.harness import Measurement, Timing

        self.asked = (sorted(candidates), modes)

        def timing(ms):
            return None if ms is None else Timing(ms, ms, ms, 5, 0.01)
        return {name: Measurement(timing(self.medians[name].get("eager")), timing(self.medians[name].get("graph")))
                for name in candidates}


def test_ceilings_are_the_fastest_copy_and_count_read_plus_write():
    """A CUDA graph's memcpy slower than an elementwise copy (as on the H200, issue 58): the memory
    ceiling of each mode is the faster probe's, read + written bytes over its median time."""
    from lzsolve.measure.tasks import CeilingTask

    harness = ScriptedHarness({"compute": {"eager": 2.0, "graph": 1.0},
                               "memcpy": {"eager": 4.0, "graph": 16.0}, "elementwise": {"eager": 8.0, "graph": 8.0}})
    rows = run_task(CeilingTask("fp32"), CPU, harness, Sensor())["ceilings"]
    assert harness.asked == (["compute", "elementwise", "memcpy"], ("eager", "graph")), "timed like the kernels"
    got = {(r["kind"], r["mode"]): r for r in rows}
    assert set(got) == {("compute", "eager"), ("compute", "graph"), ("memory", "eager"), ("memory", "graph")}
    assert got["compute", "eager"]["per_s"] == 2 * 512 ** 3 / 2e-3 and got["compute", "graph"]["per_s"] == 2 * 512 ** 3 / 1e-3
    assert got["compute", "eager"]["probe"] == "matmul 512x512x512 fp32"
    copied = 2 * (32 << 20)  # 32 MiB read and 32 MiB written
    assert got["memory", "eager"]["per_s"] == copied / 4e-3 and "by memcpy" in got["memory", "eager"]["probe"]
    assert got["memory", "graph"]["per_s"] == copied / 8e-3 and "by elementwise" in got["memory", "graph"]["probe"]
    assert got["memory", "graph"]["probe"] == "copy 32 MiB fp32 by elementwise (read + write)"
    assert all(r["spread"] == 0.01 for r in rows)


def test_ceilings_measure_on_cpu():
    """The real probe on this CPU, briefly: a compute and a memory rate in eager mode (no graphs on CPU)."""
    from lzsolve.measure.tasks import CeilingTask

    harness = CpuHarness(Budget(warmup_s=0.0, min_samples=2, max_samples=2))
    rows = run_task(CeilingTask("fp32"), CPU, harness, Sensor())["ceilings"]
    assert sorted((r["kind"], r["mode"]) for r in rows) == [("compute", "eager"), ("memory", "eager")]
    assert all(r["per_s"] > 0 for r in rows)


@pytest.mark.gpu
def test_ceilings_on_a_gpu_come_with_torchs_own_forms_timed_apart():
    """On a GPU the probe's rows (both modes) come with a compute and a memory row of mode 'plain':
    torch's own mm / linear and copy_, timed by Triton's do_bench, for report.md's check."""
    from lzsolve.measure.harness import make_harness
    from lzsolve.measure.tasks import CeilingTask

    device = torch.device("cuda")
    rows = run_task(CeilingTask("bf16"), device, make_harness(device), Sensor())["ceilings"]
    assert sorted((r["kind"], r["mode"]) for r in rows) == [
        ("compute", "eager"), ("compute", "graph"), ("compute", "plain"),
        ("memory", "eager"), ("memory", "graph"), ("memory", "plain")]
    assert all(r["per_s"] > 0 for r in rows)
    assert all("do_bench" in r["probe"] for r in rows if r["mode"] == "plain")


def test_torchs_own_forms_count_at_their_best_burst(monkeypatch):
    """A host stall inside one do_bench burst reads as a slower GPU: each form keeps its best of
    PLAIN_BURSTS bursts, and a ceiling's row the faster of its forms there."""
    from types import SimpleNamespace

    from lzsolve.measure import tasks

    bursts = iter([{"mm": 732e12, "linear": 730e12, "copy": 3.02e12},  # a stall in the first burst
                   {"mm": 797e12, "linear": 790e12, "copy": 2.90e12},
                   {"mm": 795e12, "linear": 799e12, "copy": 3.01e12}])
    monkeypatch.setattr(tasks, "plain_rates", lambda *tensors: {tasks.PLAIN_BURST_MS: next(bursts)})
    on_gpu = SimpleNamespace(device=torch.device("cuda"))
    rows = {r["kind"]: r for r in tasks.plain_ceilings(on_gpu, on_gpu, on_gpu, on_gpu)}
    assert rows["compute"]["per_s"] == 799e12 and rows["memory"]["per_s"] == 3.02e12
    assert f"best of {tasks.PLAIN_BURSTS}" in rows["compute"]["probe"]


def test_a_warm_perfdb_measures_again_over_an_older_memory_probe(tmp_path):
    """Ceilings are measured once per machine, stack and dtype, unless the PerfDB holds only an older
    probe's (a single memcpy, named without 'by'): then once more, and the roofline reads the latest."""
    import datetime as dt
    from types import SimpleNamespace

    from lzsolve.measure.tasks import CeilingTask
    from lzsolve.measure.tuner import measure_ceilings
    from lzsolve.store.perfdb import PerfDB

    class Runner:
        asked = 0

        def run(self, task):
            assert task == CeilingTask("bf16")
            self.asked += 1
            return {"ceilings": [{"kind": "memory", "mode": "graph", "per_s": 4.4e12,
                                  "probe": "copy 1024 MiB bf16 by elementwise (read + write)", "spread": 0.01}]}
    common = {"run_id": "r2", "hw_slug": "h200", "device": "cuda:0", "timer": "cuda_events"}
    recorder = SimpleNamespace(hw_slug="h200", timer="cuda_events", common=common, run_id="r2")
    db = PerfDB(tmp_path / "perfdb")
    db.append_ceilings([{**common, "run_id": "r1", "ts": dt.datetime(2026, 11, 1), "dtype": "bf16", "kind": "memory",
                         "mode": "graph", "per_s": 2.7e12, "probe": "copy 1024 MiB bf16 (read + write)"}], "r1")
    runner = Runner()
    measure_ceilings(db, runner, recorder, "bf16")
    assert runner.asked == 1, "the older probe's ceiling is not reused"
    measure_ceilings(db, runner, recorder, "bf16")
    assert runner.asked == 1, "the newer one is"
    assert sorted(r["per_s"] for r in db.ceilings()) == [2.7e12, 4.4e12]
