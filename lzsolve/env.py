"""Environment sensing: what the GPU was doing while a record was measured.

NVML (nvidia-ml-py) gives temperature, clocks, power and the reasons clocks
were held down. Every record stores them with a temperature bucket and a
`throttled` flag. Without NVML (CPU, containers without the library, no
permission) every field is None and nothing fails.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# NVML clock-event (throttle) reason bits, from nvml.h. Only these mean the
# clocks were lowered against the workload's will; idle and application-clock
# settings are not throttling.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THROTTLE_MASK = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
THERMAL_OR_POWER = {"sw_power_cap": SW_POWER_CAP, "hw_slowdown": HW_SLOWDOWN, "sw_thermal": SW_THERMAL,
                    "hw_thermal": HW_THERMAL, "hw_power_brake": HW_POWER_BRAKE}

COLD_BELOW_C = 45  # idle H100s sit at 30-40 C
HOT_FROM_C = 75  # sustained load on air-cooled parts; thermal slowdown starts in the 80s


@dataclass(frozen=True)
class EnvReading:
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None


def bucket(temp_c: float | None) -> str | None:
    if temp_c is None:
        return None
    return "cold" if temp_c < COLD_BELOW_C else "hot" if temp_c >= HOT_FROM_C else "warm"


def reasons_text(mask: int | None) -> str | None:
    if mask is None:
        return None
    return ",".join(name for name, bit in THERMAL_OR_POWER.items() if mask & bit) or ""


def combine(before: EnvReading, after: EnvReading) -> dict:
    """Record fields for a measurement bracketed by two readings (worst case of the two)."""
    def pick(a, b, f):
        values = [v for v in (a, b) if v is not None]
        return f(values) if values else None

    mask = pick(before.throttle_reasons, after.throttle_reasons, lambda v: v[0] | v[-1])
    temp = pick(before.temp_c, after.temp_c, max)
    return {
        "temp_c": temp,
        "sm_clock_mhz": pick(before.sm_clock_mhz, after.sm_clock_mhz, min),
        "mem_clock_mhz": pick(before.mem_clock_mhz, after.mem_clock_mhz, min),
        "power_w": pick(before.power_w, after.power_w, max),
        "throttle_reasons": reasons_text(mask),
        "env_bucket": bucket(temp),
        "throttled": None if mask is None else bool(mask & THROTTLE_MASK),
    }


class Sensor:
    """Reads NVML for one CUDA device; a no-op (every field None) on CPU or without NVML."""

    def __init__(self, nvml=None, handle=None):
        self._nvml, self._handle = nvml, handle

    @classmethod
    def for_device(cls, device: torch.device) -> "Sensor":
        if device.type != "cuda":
            return cls()
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(pynvml, cls._find(pynvml, device))
        except Exception:  # no NVML library, driver or permission: the fields stay empty
            return cls()

    @staticmethod
    def _find(pynvml, device: torch.device):
        """NVML's handle for the torch device: by PCI address (CUDA_VISIBLE_DEVICES may renumber)."""
        props = torch.cuda.get_device_properties(device)
        try:
            address = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return pynvml.nvmlDeviceGetHandleByPciBusId(address.encode())
        except Exception:
            return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read(self) -> EnvReading:
        if self._nvml is None:
            return EnvReading()
        n, h = self._nvml, self._handle

        def safe(f):
            try:
                return f()
            except Exception:
                return None

        reasons = safe(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:
            reasons = safe(lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return EnvReading(
            temp_c=safe(lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
            sm_clock_mhz=safe(lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))),
            mem_clock_mhz=safe(lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))),
            power_w=safe(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            throttle_reasons=reasons,
        )

