"""Environment sensing: NVML readings, buckets, throttling; graceful absence."""
import types

import pytest
import torch

from lzsolve.env import HW_THERMAL, SW_POWER_CAP, EnvReading, Sensor, bucket, combine


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


@pytest.mark.gpu
def test_real_nvml_on_the_device():
    reading = Sensor.for_device(torch.device("cuda")).read()
    assert reading.temp_c is not None and reading.sm_clock_mhz > 0
