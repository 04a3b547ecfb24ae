"""Environment sensing: NVML readings, buckets, throttling; graceful absence."""
import os
import types

import pytest
import torch

from lzsolve.measure import env
from lzsolve.measure.env import HW_THERMAL, SW_POWER_CAP, EnvReading, Sensor, bucket, combine, contention, host_load


def fake_nvml(temps, reasons=0, broken=()):
    readings = iter(temps)

    def fail_or(name, value):
        def f(*args):
            if name in broken:
                raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
            return value() if callable(value) else value
        return f

    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlDeviceGetTemperature=fail_or("temp", lambda: next(readings)),
        nvmlDeviceGetClockInfo=fail_or("clock", 1980),
        nvmlDeviceGetPowerUsage=fail_or("power", 350_000),
        nvmlDeviceGetCurrentClocksEventReasons=fail_or("reasons", reasons),
    )


def test_cpu_and_missing_nvml_give_empty_fields():
    assert Sensor.for_device(torch.device("cpu")).read() == EnvReading()
    fields = combine(EnvReading(), EnvReading())
    assert all(v is None for v in fields.values())


def test_readings_and_buckets():
    sensor = Sensor(fake_nvml([40, 80]), handle=object())
    fields = combine(sensor.read(), sensor.read())
    assert fields["temp_c"] == 80 and fields["env_bucket"] == "hot"
    assert fields["sm_clock_mhz"] == 1980 and fields["power_w"] == 350.0
    assert fields["throttled"] is False and fields["throttle_reasons"] == ""
    assert [bucket(t) for t in (30, 44.9, 45, 74, 75)] == ["cold", "cold", "warm", "warm", "hot"]


@pytest.mark.parametrize("mask,throttled,text", [
    (SW_POWER_CAP, True, "sw_power_cap"),
    (HW_THERMAL | SW_POWER_CAP, True, "sw_power_cap,hw_thermal"),
    (0x1, False, ""),  # GPU idle is not throttling
])
def test_throttle_reasons(mask, throttled, text):
    sensor = Sensor(fake_nvml([60, 60], reasons=mask), handle=object())
    fields = combine(sensor.read(), sensor.read())
    assert fields["throttled"] is throttled and fields["throttle_reasons"] == text


def test_a_failing_nvml_call_leaves_only_that_field_empty():
    sensor = Sensor(fake_nvml([50], broken=("power",)), handle=object())
    reading = sensor.read()
    assert reading.power_w is None and reading.temp_c == 50


def test_host_load_is_the_load_average_per_core():
    cores = len(os.sched_getaffinity(0))
    assert host_load() == pytest.approx(os.getloadavg()[0] / cores, abs=0.01)
    assert contention(Sensor()) == {"host_load": host_load(), "gpu_others": None}  # no NVML: no GPU figure


def test_other_processes_on_the_gpu_leave_out_this_runs(monkeypatch):
    """The measuring worker (11), the tune (its parent, 10) and the tune's other children (a builder,
    12) are the run's; anything else on the GPU is another program's. Where NVML's ids are another
    namespace's (the worker is not among them), it cannot tell: None."""
    assert env._parent(os.getpid()) == os.getppid() and env._parent(1 << 30) is None
    monkeypatch.setattr(os, "getpid", lambda: 11)
    monkeypatch.setattr(os, "getppid", lambda: 10)
    monkeypatch.setattr(env, "_parent", {11: 10, 12: 10, 13: 99}.get)

    def on_gpu(*pids):
        procs = [types.SimpleNamespace(pid=pid) for pid in pids]
        return Sensor(types.SimpleNamespace(nvmlDeviceGetComputeRunningProcesses=lambda handle: procs), object())

    assert on_gpu(11, 10, 12).other_processes() == 0
    assert on_gpu(11, 12, 13, 14).other_processes() == 2
    assert on_gpu(10, 12).other_processes() is None


@pytest.mark.gpu
def test_real_nvml_on_the_device():
    reading = Sensor.for_device(torch.device("cuda")).read()
    assert reading.temp_c is not None and reading.sm_clock_mhz > 0


def test_the_cuda_home_warning_of_a_cpu_only_machine_is_dropped():
    """torch's CUDA build without a GPU logs it at Inductor's first compile in every worker, into the
    tune's progress bar (the CPU wheel, installed here, never does: the record is made as torch makes it)."""
    import inspect
    import subprocess
    import sys

    import torch.utils.cpp_extension

    assert 'logger.warning("No CUDA runtime is found, using CUDA_HOME=' in inspect.getsource(torch.utils.cpp_extension)
    code = ("import logging, lzsolve\n"
            "log = logging.getLogger('torch.utils.cpp_extension')\n"
            "log.warning(\"No CUDA runtime is found, using CUDA_HOME='%s'\", '/usr/local/cuda')\n"
            "log.warning('another warning')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stderr.splitlines() == ["another warning"]
