"""One measurement task: parity, rotation sets, environment, bounded re-measure when throttled."""
import torch

from lzsolve.bench import Budget, CpuHarness
from lzsolve.env import SW_POWER_CAP, EnvReading, Sensor
from lzsolve.measure import Task, run_task
from runtime_loader.ops import Signature

SIG = Signature.make("norm.rms", {"hidden": 64}, (), "fp32")
CPU = torch.device("cpu")


class CountingHarness(CpuHarness):
    def __init__(self):
        super().__init__(Budget(warmup_s=0.0, min_samples=3, max_samples=3))
        self.measured = 0
        self.sets = None

    def measure(self, calls):
        self.measured += 1
        self.sets = len(calls)
        return super().measure(calls)


class ScriptedSensor(Sensor):
    def __init__(self, masks):
        super().__init__()
        self.masks = iter(masks)

    def read(self):
        return EnvReading(temp_c=50.0, throttle_reasons=next(self.masks))


def test_task_record_fields():
    harness = CountingHarness()
    out = run_task(Task(SIG, "torch.rms_norm", {"tokens": 4}, seed=1), CPU, harness, Sensor())
    assert out["stage"] == "bench" and "reason_code" not in out
    assert out["eager_ms"] > 0 and out["eager_samples"] == 3 and out["jit_ms"] > 0
    assert out["rotation_sets"] == harness.sets == 32, "tiny inputs rotate over the maximum number of sets"
    assert out["graph_safe"] is None and out["graph_error"] is None and out["temp_c"] is None


def test_same_seed_same_inputs_other_seed_other_inputs():
    half = Signature.make("norm.rms", {"hidden": 64}, (), "fp16")  # fp16 rounding makes the error input-specific
    a = run_task(Task(half, "eager.rms_norm", {"tokens": 4}, seed=5), CPU, CountingHarness(), Sensor())
    b = run_task(Task(half, "eager.rms_norm", {"tokens": 4}, seed=5), CPU, CountingHarness(), Sensor())
    c = run_task(Task(half, "eager.rms_norm", {"tokens": 4}, seed=6), CPU, CountingHarness(), Sensor())
    assert a["rel_l2"] == b["rel_l2"] and a["rel_l2"] != c["rel_l2"]


def test_throttled_measurement_is_retried_once_then_marked():
    harness = CountingHarness()
    out = run_task(Task(SIG, "torch.rms_norm", {"tokens": 4}, seed=1), CPU, harness,
                   ScriptedSensor([SW_POWER_CAP, 0, 0, 0]))
    assert harness.measured == 2 and out["throttled"] is False
    harness = CountingHarness()
    out = run_task(Task(SIG, "torch.rms_norm", {"tokens": 4}, seed=1), CPU, harness,
                   ScriptedSensor([SW_POWER_CAP] * 4))
    assert harness.measured == 2 and out["throttled"] is True and out["throttle_reasons"] == "sw_power_cap"


def test_parity_failure_stops_before_timing():
    import tests.faulty_kernels  # noqa: F401
    harness = CountingHarness()
    out = run_task(Task(SIG, "fault.wrong", {"tokens": 4}, seed=1), CPU, harness, Sensor())
    assert out["stage"] == "parity" and out["reason_code"] == "PARITY_FAILED" and harness.measured == 0
